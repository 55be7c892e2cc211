//! Managed jobs with real processes: three `solocron run` nodes on one store, and
//! `solocron jobs apply | rm | log | export` writing to it. A job applied runs within two
//! seconds, each tick once; its schedule changed and then its deletion drop no tick and run
//! none twice. What the job wrote is the evidence.
#![forbid(unsafe_code)]

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use common::*;
use solocron_core::Schedule;

/// A node's configuration beside the store: managed command jobs allowed, and one declared job.
const NODE: &str = "[http]\nallow_command_jobs = true\n\n[[jobs]]\nname = \"declared\"\nschedule = \"0 0 0 1 1 *\"\ncommand = [\"true\"]\n";
/// The job's schedules: every second, then even seconds.
const FIRST: &str = "* * * * * *";
const SECOND: &str = "*/2 * * * * *";

fn document(dir: &std::path::Path, schedule: &str) -> String {
    let record = format!(r#"echo \"$SOLOCRON_SCHEDULED_AT $SOLOCRON_NODE_ID\" >> {}/m.txt"#, dir.display());
    format!("[[jobs]]\nname = \"m\"\nschedule = \"{schedule}\"\nlease = \"4s\"\ncommand = [\"/bin/sh\", \"-c\", \"{record}\"]\n")
}

fn apply(f: &Fleet, text: &str) -> (i32, String, String) {
    let file = f.path("jobs.toml");
    std::fs::write(&file, text).unwrap();
    f.cli(&["jobs", "apply", "-f", file.to_str().unwrap()])
}

fn ticks(f: &Fleet) -> BTreeMap<DateTime<Utc>, Vec<String>> {
    let mut per_tick: BTreeMap<DateTime<Utc>, Vec<String>> = BTreeMap::new();
    for line in f.lines("m.txt") {
        let mut it = line.split_whitespace();
        per_tick.entry(it.next().unwrap().parse().unwrap()).or_default().push(it.next().unwrap().to_owned());
    }
    per_tick
}

fn managed_jobs_follow_apply_and_rm(store: Option<&str>) {
    let mut f = Fleet::on(store, NODE);
    for id in ["n1", "n2", "n3"] {
        f.start(id);
    }
    std::thread::sleep(Duration::from_millis(1500));

    // Refused whole, naming the file and key; nothing written.
    let (code, _, err) = apply(&f, &document(f.dir.path(), "every minute"));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("jobs.toml") && err.contains("jobs[0] (m).schedule"), "{err}");
    let clash = apply(&f, "[[jobs]]\nname = \"declared\"\nschedule = \"* * * * * *\"\ncommand = [\"true\"]\n");
    assert!(clash.0 == 2 && clash.2.contains("declared in"), "a declared job cannot be managed: {clash:?}");
    assert!(f.cli_json(&["jobs", "log", "--format", "json"]).as_array().unwrap().is_empty());

    let (code, out, err) = apply(&f, &document(f.dir.path(), FIRST));
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("m created: revision"), "{out}");
    let applied_at = Utc::now();
    let first = wait_for(Duration::from_secs(5), || ticks(&f).keys().next().copied());
    let first = first.unwrap_or_else(|| panic!("the applied job never ran; n1:\n{}", f.log("n1")));
    assert!(first <= applied_at + chrono::Duration::seconds(2), "first tick {first}, applied at {applied_at}");
    let again = apply(&f, &document(f.dir.path(), FIRST));
    assert!(again.1.contains("m unchanged"), "apply is idempotent: {again:?}");
    std::thread::sleep(Duration::from_millis(3000));

    let (code, out, err) = apply(&f, &document(f.dir.path(), SECOND));
    assert!(code == 0 && out.contains("m changed: revision"), "{out}{err}");
    let changed_at = Utc::now();
    std::thread::sleep(Duration::from_millis(4500));
    let (code, out, err) = f.cli(&["jobs", "rm", "m"]);
    assert!(code == 0 && out.contains("m deleted"), "{out}{err}");
    let removed_at = Utc::now();
    std::thread::sleep(Duration::from_millis(2500));
    f.stop_all();

    let per_tick = ticks(&f);
    let twice: Vec<_> = per_tick.iter().filter(|(_, nodes)| nodes.len() > 1).collect();
    assert!(twice.is_empty(), "ticks run twice: {twice:?}");
    let (a, b) = (Schedule::parse(FIRST, "UTC").unwrap(), Schedule::parse(SECOND, "UTC").unwrap());
    let instants: Vec<_> = per_tick.keys().copied().collect();
    let follows = |x: DateTime<Utc>, y: DateTime<Utc>| a.next_after(x) == Some(y) || b.next_after(x) == Some(y);
    assert!(instants.windows(2).all(|w| follows(w[0], w[1])), "a tick dropped: {instants:?}");
    let odd_after_change = instants.iter().filter(|t| **t > changed_at + chrono::Duration::seconds(2));
    assert!(odd_after_change.clone().all(|t| t.timestamp() % 2 == 0), "the new schedule took over: {instants:?}");
    assert!(instants.iter().all(|t| *t <= removed_at + chrono::Duration::seconds(1)), "ran after rm: {instants:?}");
    let nodes: std::collections::BTreeSet<&String> = per_tick.values().flatten().collect();
    println!("{} ticks on {nodes:?}", instants.len());

    let log = f.cli_json(&["jobs", "log", "m", "--format", "json"]);
    let log = log.as_array().unwrap();
    assert_eq!(log.len(), 3, "created, changed, deleted: {log:#?}");
    assert_eq!(log[0]["deleted"], true);
    assert_eq!(log[1]["spec"]["schedule"], SECOND);
    let (code, out, _) = f.cli(&["jobs", "export"]);
    assert!(code == 0 && out.trim().is_empty(), "a deleted job is not exported: {out}");
}

#[test]
fn managed_jobs_on_sqlite() {
    managed_jobs_follow_apply_and_rm(None);
}

#[test]
fn managed_jobs_on_postgres() {
    let Some(store) = server_store(solocron_conformance::server::POSTGRES) else { return };
    managed_jobs_follow_apply_and_rm(Some(&store));
}

#[test]
fn managed_jobs_on_mariadb() {
    let Some(store) = server_store(solocron_conformance::server::MYSQL) else { return };
    managed_jobs_follow_apply_and_rm(Some(&store));
}

#[test]
fn managed_jobs_on_redis() {
    let Some(store) = server_store(solocron_conformance::server::REDIS) else { return };
    managed_jobs_follow_apply_and_rm(Some(&store));
}

#[cfg(feature = "etcd")]
#[test]
fn managed_jobs_on_etcd() {
    let Some(store) = server_store(solocron_conformance::server::ETCD) else { return };
    managed_jobs_follow_apply_and_rm(Some(&store));
}

/// A Redis without persistence restarted forgets every key of the prefix, managed jobs
/// included: the nodes keep running the jobs they knew, write them back, and the operator
/// sees them again (written back, by whom) once the schema is migrated again.
#[test]
fn managed_jobs_forgotten_by_redis_are_written_back_and_keep_running() {
    let Some(store) = server_store(solocron_conformance::server::REDIS) else { return };
    let prefix = store.split("prefix = \"").nth(1).and_then(|p| p.split('"').next()).unwrap().to_owned();
    let mut f = Fleet::on(Some(&store), NODE);
    for id in ["n1", "n2"] {
        f.start(id);
    }
    std::thread::sleep(Duration::from_millis(1500));
    let (code, _, err) = apply(&f, &document(f.dir.path(), FIRST));
    assert_eq!(code, 0, "{err}");
    wait_for(Duration::from_secs(5), || ticks(&f).keys().next().copied()).expect("the applied job never ran");

    // What a restart without persistence does to this prefix: every key is gone.
    let keys = std::process::Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "--scan", "--pattern", &format!("{{{prefix}}}*")])
        .output()
        .unwrap();
    let keys: Vec<String> = String::from_utf8(keys.stdout).unwrap().lines().map(str::to_owned).collect();
    assert!(!keys.is_empty(), "no key of {prefix} found");
    let del = std::process::Command::new("redis-cli").args(["-h", "127.0.0.1", "DEL"]).args(&keys).output().unwrap();
    assert!(del.status.success());
    let forgot_at = Utc::now();
    // Deleting keys breaks no connection, so no change hint comes: the nodes' backstop read
    // (every 10 s) finds the version gone back. A real restart breaks the hint's connection,
    // which makes the nodes read at once.
    let logs = |f: &Fleet| format!("{}{}", f.log("n1"), f.log("n2"));
    wait_for(Duration::from_secs(15), || logs(&f).contains("the store forgot its managed jobs").then_some(()))
        .unwrap_or_else(|| panic!("no node noticed:\n{}", logs(&f)));
    // The backstop read may come at once or 10 s later: wait for the ticks the job must run
    // after the store forgot (bounded), not a fixed time after the nodes noticed.
    let ran_after = |f: &Fleet| ticks(f).keys().filter(|t| **t > forgot_at + chrono::Duration::seconds(1)).count();
    let _ = wait_for(Duration::from_secs(20), || (ran_after(&f) >= 10).then_some(()));
    f.stop_all();

    let per_tick = ticks(&f);
    let twice: Vec<_> = per_tick.iter().filter(|(_, nodes)| nodes.len() > 1).collect();
    assert!(twice.is_empty(), "ticks run twice: {twice:?}");
    let after: Vec<_> = per_tick.keys().filter(|t| **t > forgot_at + chrono::Duration::seconds(1)).collect();
    assert!(after.len() >= 10, "the job stopped when the store forgot it: {per_tick:?}\n{}", f.log("n1"));
    f.migrate();
    let log = f.cli_json(&["jobs", "log", "m", "--format", "json"]);
    let newest = &log.as_array().unwrap()[0];
    assert!(newest["changed_by"].as_str().unwrap().starts_with("solocron (written back"), "{log:#}");
    assert_eq!(newest["spec"]["schedule"], FIRST);
}
