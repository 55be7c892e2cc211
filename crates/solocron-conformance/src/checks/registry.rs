//! The job registry: which node runs which definition of which job.

use std::collections::HashSet;
use std::time::Duration;

use solocron_core::{JobDefinition, Registration, RegistryCursor};

use super::support::{assert_between, now, Handle, LENGTH_SLACK};
use crate::StoreFactory;

/// A definition of `job` with digest `hash` (for the stores' own registry tests too).
pub fn definition(job: &str, hash: &str) -> JobDefinition {
    JobDefinition {
        job: job.into(),
        schedule: "0 * * * * *".into(),
        timezone: "Europe/Paris".into(),
        definition_hash: hash.into(),
        summary: format!("lease 30s, overlap skip ({hash})"),
    }
}

/// Every registration, as a store lists them.
async fn registrations(store: &Handle) -> Vec<Registration> {
    store.registrations().await.expect("registrations")
}

/// `register` records a node's whole job list: each registration keeps its `first_seen`
/// and advances its `last_seen` (store clock); the node's jobs no longer listed are
/// removed (registering nothing removes them all); other nodes' registrations stay.
pub async fn register_records_a_nodes_whole_list_keeping_first_seen_and_removing_unlisted_jobs(f: &impl StoreFactory) {
    let store = f.open().await;
    let before = now(&store).await;
    store.register("node-b", &[definition("backup", "h2")]).await.expect("register");
    store.register("node-a", &[definition("sync", "s1"), definition("backup", "h1")]).await.expect("register");
    let after = now(&store).await;
    let first = registrations(&store).await;
    let keys: Vec<(&str, &str, &str)> = first
        .iter()
        .map(|r| (r.definition.job.as_str(), r.node.as_str(), r.definition.definition_hash.as_str()))
        .collect();
    assert_eq!(keys, [("backup", "node-a", "h1"), ("backup", "node-b", "h2"), ("sync", "node-a", "s1")]);
    for r in &first {
        assert_between(r.first_seen, before, after, "first_seen");
        assert_between(r.last_seen, r.first_seen, r.first_seen + LENGTH_SLACK, "a new registration's last_seen");
    }
    assert_eq!(first[2].definition, definition("sync", "s1"));

    // Let the store's clock move on (it keeps milliseconds).
    tokio::time::sleep(Duration::from_millis(20)).await;
    store.register("node-a", &[definition("backup", "h3")]).await.expect("register");
    let second = registrations(&store).await;
    assert_eq!(second.len(), 2, "node-a no longer lists sync: {second:?}");
    let refreshed = &second[0];
    assert_eq!((refreshed.node.as_str(), &refreshed.definition), ("node-a", &definition("backup", "h3")));
    assert_eq!(refreshed.first_seen, first[0].first_seen, "first_seen is kept");
    assert!(refreshed.last_seen > first[0].last_seen, "last_seen advances: {refreshed:?}");
    assert_eq!(second[1], first[1], "node-b's registration is left as it was");
    assert_eq!(store.registered_jobs().await.expect("registered_jobs"), ["backup"], "sync is no longer registered");

    store.register("node-a", &[]).await.expect("registering nothing");
    let third = registrations(&store).await;
    assert_eq!(third, second[1..], "node-a runs nothing: only node-b's registration is left");
}

/// `registrations_of` answers exactly the named jobs' registrations, by job then node, as
/// `registrations` lists them (names nobody registered are not an error), and
/// `registered_jobs` each registered name once, in order.
pub async fn a_page_of_registrations_and_the_registered_names_agree_with_the_whole_registry(f: &impl StoreFactory) {
    let store = f.open().await;
    store.register("node-b", &[definition("backup", "h2"), definition("report", "r1")]).await.expect("register");
    store.register("node-a", &[definition("sync", "s1"), definition("backup", "h1")]).await.expect("register");
    let all = registrations(&store).await;
    let asked = ["sync".to_owned(), "backup".to_owned(), "nobody-registered-this".to_owned()];
    let page = store.registrations_of(&asked).await.expect("registrations_of");
    let expected: Vec<&Registration> = all.iter().filter(|r| r.definition.job != "report").collect();
    assert_eq!(page.iter().collect::<Vec<_>>(), expected, "the named jobs' registrations, by job then node");
    assert!(store.registrations_of(&[]).await.expect("registrations_of nothing").is_empty());
    let names = store.registered_jobs().await.expect("registered_jobs");
    assert_eq!(names, ["backup", "report", "sync"]);
}

/// Every registration as `(job, node, digest)`.
type Key = (String, String, String);

fn key(r: &Registration) -> Key {
    (r.definition.job.clone(), r.node.clone(), r.definition.definition_hash.clone())
}

/// `node`'s definitions of `job-{from}` to `job-{to - 1}`, each with digest `hash`.
fn jobs(from: usize, to: usize, hash: &str) -> Vec<JobDefinition> {
    (from..to).map(|i| definition(&format!("job-{i:03}"), hash)).collect()
}

/// Reads the registry in pages of about `limit` from `after` to its end (at most 100
/// pages), checking each page's size: the registrations read, and how many pages.
async fn read_pages(store: &Handle, mut after: Option<RegistryCursor>, limit: usize) -> (Vec<Key>, usize) {
    let (mut read, mut pages) = (Vec::new(), 0);
    loop {
        let page = store.registrations_page(after.as_ref(), limit).await.expect("registrations_page");
        pages += 1;
        // Redis returns whole hash buckets: a few more than asked, never twice as many.
        assert!(page.registrations.len() <= 2 * limit, "a page of {} for {limit}", page.registrations.len());
        read.extend(page.registrations.iter().map(key));
        match page.next {
            Some(next) => after = Some(next),
            None => return (read, pages),
        }
        assert!(pages < 100, "the read never ends");
    }
}

/// `registrations_page` reads the whole registry in pages of about the size asked, and
/// returns every registration that exists throughout the read at least once, and none
/// that never existed, however the registry changes between pages; a cursor the store did
/// not make is refused.
pub async fn a_registry_read_in_pages_returns_every_registration_present_throughout(f: &impl StoreFactory) {
    let store = f.open().await;
    // More than 128: a Redis sorted set that large is a hash table, scanned a step at a time.
    store.register("node-a", &jobs(0, 200, "a1")).await.expect("register");
    store.register("node-b", &jobs(0, 100, "b1")).await.expect("register");
    let whole: HashSet<Key> = registrations(&store).await.iter().map(key).collect();
    let (read, pages) = read_pages(&store, None, 40).await;
    assert_eq!(read.iter().cloned().collect::<HashSet<_>>(), whole, "the pages hold the whole registry");
    assert!(pages >= 300 / 80, "300 registrations in pages of about 40 came in {pages} pages");

    // node-b drops job-000..049 and adds job-100..149 between the first page and the rest.
    let first = store.registrations_page(None, 40).await.expect("registrations_page");
    store.register("node-b", &jobs(50, 150, "b2")).await.expect("register");
    let now: HashSet<Key> = registrations(&store).await.iter().map(key).collect();
    let (rest, _) = read_pages(&store, first.next, 40).await;
    let read: HashSet<Key> = first.registrations.iter().map(key).chain(rest).collect();
    let kept: Vec<Key> = (0..200)
        .map(|i| (format!("job-{i:03}"), "node-a".to_owned(), "a1".to_owned()))
        .chain((50..100).map(|i| (format!("job-{i:03}"), "node-b".to_owned(), "b2".to_owned())))
        .collect();
    // node-b's kept jobs were rewritten (digest b1 to b2): either version is what it was.
    let found = |k: &Key| read.contains(k) || read.contains(&(k.0.clone(), k.1.clone(), "b1".to_owned()));
    assert!(kept.iter().all(found), "a registration present throughout is read at least once");
    assert!(read.iter().all(|k| whole.contains(k) || now.contains(k)), "nothing that never existed is read");

    let foreign = RegistryCursor::new("not a cursor of this store");
    assert!(store.registrations_page(Some(&foreign), 40).await.is_err(), "a cursor the store did not make");
}
