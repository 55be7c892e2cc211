//! The fleet's ticks are spread over its nodes (issue 23), with real processes: three
//! `solocron run` nodes carry the same 30 jobs due every second. Each node claims first
//! the ticks it ranks first among the live nodes and the others only as a backup, so each
//! runs about a third of them instead of the first node to wake running all. Then one node
//! is SIGKILLed: the survivors take its share at once (as backups, then as the only live
//! nodes once its heartbeat is stale), every tick still runs once, and none is missed.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use chrono::{DateTime, Utc};
use common::*;
use nix::sys::signal::Signal;
use solocron_conformance::proxy::Mode;
use solocron_conformance::server::{ServerUrl, POSTGRES};

const JOBS: usize = 30;
/// From the start until every node has seen the others' heartbeats (one beat every 5 s).
const WARM_UP: Duration = Duration::from_secs(8);
/// How long the shares are measured, before and after the kill.
const MEASURE: Duration = Duration::from_secs(10);
/// The busiest node's share of the runs with three nodes (a third each, give or take).
const SHARE_MAX: f64 = 0.45;
/// From stopping n2 until n1's store connections are refused, and for how long (both well
/// within n2's heartbeat's staleness: n1 keeps ranking it).
const CUT_AFTER: Duration = Duration::from_millis(1500);
const CUT: Duration = Duration::from_secs(3);
/// From the heal until the records are read.
const AFTER_HEAL: Duration = Duration::from_secs(6);

fn jobs() -> String {
    (0..JOBS)
        .map(|j| {
            format!(
                "[[jobs]]\nname = \"job-{j}\"\nschedule = \"* * * * * *\"\nlease = \"5s\"\n\
                 catchup = \"1m\"\nmisfire = \"skip\"\n\
                 command = [\"/bin/sh\", \"-c\", \"echo $SOLOCRON_JOB $SOLOCRON_SCHEDULED_AT $SOLOCRON_NODE_ID >> $DIR/runs.txt\"]\n"
            )
        })
        .collect()
}

/// (job, tick) → the nodes that ran it, from what the jobs wrote.
fn runs(f: &Fleet) -> BTreeMap<(String, DateTime<Utc>), Vec<String>> {
    let mut runs: BTreeMap<(String, DateTime<Utc>), Vec<String>> = BTreeMap::new();
    for line in f.lines("runs.txt") {
        let parts: Vec<&str> = line.split_whitespace().collect();
        runs.entry((parts[0].to_owned(), parts[1].parse().unwrap())).or_default().push(parts[2].to_owned());
    }
    runs
}

/// Each node's share of the runs of the ticks in `[from, to)`.
fn shares(
    runs: &BTreeMap<(String, DateTime<Utc>), Vec<String>>,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> BTreeMap<String, f64> {
    let window: Vec<&String> =
        runs.iter().filter(|((_, t), _)| *t >= from && *t < to).map(|(_, nodes)| &nodes[0]).collect();
    let mut counts: BTreeMap<String, f64> = BTreeMap::new();
    for n in &window {
        *counts.entry((*n).clone()).or_default() += 1.0;
    }
    counts.values_mut().for_each(|c| *c /= window.len() as f64);
    counts
}

/// One fleet at a time: two at once on a 2-core host would measure the host.
static SERIAL: Mutex<()> = Mutex::new(());

fn spread_and_failover(store: Option<&str>, kind: &str) {
    let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    let mut f = Fleet::on(store, &jobs());
    for id in ["n1", "n2", "n3"] {
        f.start(id);
    }
    std::thread::sleep(WARM_UP);
    let before_from = Utc::now();
    std::thread::sleep(MEASURE);
    let killed_at = Utc::now();
    f.signal(2, Signal::SIGKILL);
    std::thread::sleep(MEASURE + Duration::from_secs(2));
    let after_to = Utc::now() - chrono::Duration::seconds(2);
    f.stop_all();

    let runs = runs(&f);
    let twice: Vec<_> = runs.iter().filter(|(_, nodes)| nodes.len() > 1).collect();
    assert!(twice.is_empty(), "{kind}: ticks ran more than once: {twice:?}");
    let before = shares(&runs, before_from, killed_at);
    let after = shares(&runs, killed_at + chrono::Duration::seconds(1), after_to);
    println!("{kind}: shares before the kill {before:?}; after it {after:?}");
    assert_eq!(before.len(), 3, "{kind}: every node ran ticks: {before:?}");
    let busiest = before.values().copied().fold(0.0, f64::max);
    assert!(busiest <= SHARE_MAX, "{kind}: the busiest node ran {busiest:.2} of the runs: {before:?}");
    assert!(!after.contains_key("n3"), "{kind}: the killed node ran ticks after its death: {after:?}");
    assert!(after.values().all(|s| *s >= 0.25), "{kind}: both survivors took a share: {after:?}");

    // Nothing missed: every job's every tick from the warm-up to the end has a record (a
    // run the killed node had in progress is recorded by recovery), and ran at most once.
    let missing = missing(&f, before_from, after_to);
    assert!(missing.is_empty(), "{kind}: ticks with no record: {missing:?}");
}

/// The ticks of every job in `[from, to)` (whole seconds) with no record in the store.
fn missing(f: &Fleet, from: DateTime<Utc>, to: DateTime<Utc>) -> Vec<String> {
    let records: BTreeSet<(String, DateTime<Utc>)> = (0..JOBS)
        .flat_map(|j| {
            let job = format!("job-{j}");
            f.history(&job)
                .into_iter()
                .map(move |r| (job.clone(), r["scheduled_at"].as_str().unwrap().parse().unwrap()))
        })
        .collect();
    let first = DateTime::from_timestamp(from.timestamp() + 1, 0).unwrap();
    let last = DateTime::from_timestamp(to.timestamp(), 0).unwrap();
    let mut missing = Vec::new();
    for j in 0..JOBS {
        let mut t = first;
        while t < last {
            if !records.contains(&(format!("job-{j}"), t)) {
                missing.push(format!("job-{j}@{t}"));
            }
            t += chrono::Duration::seconds(1);
        }
    }
    missing
}

#[test]
fn sqlite_ticks_are_spread_over_the_nodes_and_a_killed_nodes_share_moves_to_the_others() {
    spread_and_failover(None, "SQLite");
}

#[test]
fn postgres_ticks_are_spread_over_the_nodes_and_a_killed_nodes_share_moves_to_the_others() {
    let server: ServerUrl = POSTGRES;
    let Some(store) = server_store(server) else { return };
    spread_and_failover(Some(&store), server.name);
}

/// A backup claim that fails is made again: n2 is stopped (SIGSTOP), so it looks alive
/// until its heartbeat is stale and n1 claims the ticks ranked to n2 only as backups, past
/// their instant; then n1's store connections are refused for a while, so those backup
/// claims fail. Every tick must still end with a record (run late, or recorded skipped by
/// the misfire policy once past the tolerance), none dropped because its claim was a
/// backup's.
#[test]
fn postgres_a_backup_claim_that_fails_while_the_store_is_cut_off_is_made_again() {
    let server: ServerUrl = POSTGRES;
    let Some(store) = server_store(server) else { return };
    let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    let mut f = Fleet::on(Some(&store), &jobs());
    let (proxy, via_proxy) = proxied(&store);
    let n1 = std::fs::read_to_string(f.config()).unwrap().replace(&store, &via_proxy);
    std::fs::write(f.path("n1.toml"), n1).unwrap();
    f.start_with("n1", &f.path("n1.toml"));
    f.start("n2");
    std::thread::sleep(WARM_UP);
    let stopped_at = Utc::now();
    f.signal(1, Signal::SIGSTOP);
    std::thread::sleep(CUT_AFTER);
    proxy.set_mode(Mode::Refuse);
    std::thread::sleep(CUT);
    proxy.set_mode(Mode::Pass);
    let healed_at = Utc::now();
    // Past the cut's ticks: n1 claims them again as soon as it reaches the store, and
    // records their ends within seconds.
    std::thread::sleep(AFTER_HEAL);
    f.signal(1, Signal::SIGKILL);
    f.stop_all();
    let ran_by_n1 = runs(&f).into_iter().filter(|((_, t), nodes)| *t > stopped_at && nodes == &["n1"]).count();
    assert!(ran_by_n1 > 0, "n1 ran ticks after n2 stopped");
    // From a second after n2 stopped (its share is then n1's backups) to past the heal.
    let missing = missing(&f, stopped_at + chrono::Duration::seconds(1), healed_at + chrono::Duration::seconds(2));
    assert!(missing.is_empty(), "ticks with no record after a cut: {missing:?}\nn1's log:\n{}", f.log("n1"));
}
