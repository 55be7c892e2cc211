//! Namespaces through real daemons on every store: two applications on one store, each
//! with a job of the same name, run their own ticks exactly once, never recover each
//! other's runs, never flag each other's jobs as drift, and are listed apart.
#![forbid(unsafe_code)]

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{server_store, state, wait_for, Fleet};
use nix::sys::signal::Signal;
use solocron_conformance::server::{MYSQL, POSTGRES, REDIS};

/// How long both applications run side by side before one is killed.
const SIDE_BY_SIDE: Duration = Duration::from_secs(8);

/// The jobs of application `ns`: `sync` every second (writing its tick and full name), and
/// for `shipping` also `long`, a run that outlives its node.
fn jobs(ns: &str) -> String {
    let record = format!(r#"echo \"$SOLOCRON_SCHEDULED_AT $SOLOCRON_JOB\" >> $DIR/{ns}.txt"#);
    let mut jobs = format!(
        "namespaces = [\"{ns}\"]\n[[jobs]]\nname = \"sync\"\nnamespace = \"{ns}\"\nschedule = \"* * * * * *\"\nlease = \"3s\"\ncommand = [\"/bin/sh\", \"-c\", \"{record}\"]\n"
    );
    if ns == "shipping" {
        // A different `sync` than billing's (another lease): were the two one job, that
        // would be drift.
        jobs = jobs.replace("lease = \"3s\"", "lease = \"4s\"");
        jobs += "[[jobs]]\nname = \"long\"\nnamespace = \"shipping\"\nschedule = \"*/5 * * * * *\"\nlease = \"2s\"\non_crash = \"abandon\"\nmisfire = \"skip\"\ncommand = [\"/bin/sleep\", \"60\"]\n";
    }
    jobs
}

fn two_applications(store: Option<String>) {
    let mut f = Fleet::on(store.as_deref(), &jobs("billing"));
    let billing_config = std::fs::read_to_string(f.config()).unwrap();
    let (start, _) = billing_config.split_once("namespaces").unwrap();
    let shipping = f.path("shipping.toml");
    std::fs::write(
        &shipping,
        format!("{start}{}", jobs("shipping").replace("$DIR", &f.dir.path().display().to_string())),
    )
    .unwrap();
    let b1 = f.start("b1");
    f.start("b2");
    let s1 = f.start_with("s1", &shipping);
    std::thread::sleep(SIDE_BY_SIDE);

    // Each application ran its own `sync` every second, each tick once.
    for ns in ["billing", "shipping"] {
        let ticks = once_each(&f.lines(&format!("{ns}.txt")), &format!("{ns}/sync"));
        assert!(ticks >= SIDE_BY_SIDE.as_secs() as usize - 4, "{ns}: only {ticks} ticks; log:\n{}", f.log("b1"));
    }

    // Shipping's node dies while its `long` run holds a lease: billing's nodes, which scan
    // for expired runs all along, leave it alone.
    let long = wait_for(Duration::from_secs(10), || running(&f, "shipping/long")).expect("shipping/long started");
    f.signal(s1, Signal::SIGKILL);
    let _ = f.nodes[s1].child.wait();
    std::thread::sleep(Duration::from_secs(6));
    assert_eq!(running(&f, "shipping/long").as_deref(), Some(long.as_str()), "billing recovered shipping's run");

    // Drift is judged within a job, and `billing/sync` is not `shipping/sync`.
    for id in ["b1", "b2"] {
        assert!(!f.log(id).contains("drift"), "{id} saw drift:\n{}", f.log(id));
    }
    // The jobs are listed apart.
    let billing = f.cli_items(&["status", "--namespace", "billing", "--format", "json"]);
    let names: Vec<&str> = billing.as_array().unwrap().iter().map(|j| j["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["billing/sync"]);
    assert!(billing.as_array().unwrap().iter().all(|j| j["namespace"] == "billing"));
    let every = f.cli_items(&["status", "--format", "json"]);
    assert_eq!(every.as_array().unwrap().len(), 3, "{every:#}");
    let runs = f.cli_items(&["history", "--namespace", "shipping", "--limit", "10000", "--format", "json"]);
    let mut jobs: Vec<&str> = runs.as_array().unwrap().iter().map(|r| r["job"].as_str().unwrap()).collect();
    jobs.dedup();
    jobs.sort();
    jobs.dedup();
    assert_eq!(jobs, ["shipping/long", "shipping/sync"], "shipping's history alone");

    // A shipping node comes back and recovers its own run.
    f.start_with("s2", &shipping);
    let ended = wait_for(Duration::from_secs(15), || {
        let run = f.history("shipping/long").into_iter().find(|r| r["id"] == long.as_str())?;
        (state(&run) != "running").then_some(run)
    })
    .expect("shipping recovered its run");
    assert_eq!(state(&ended), "abandoned", "{ended:#}");
    f.signal(b1, Signal::SIGTERM);
    f.stop_all();
}

/// The run id of `job`'s run in progress, if any.
fn running(f: &Fleet, job: &str) -> Option<String> {
    let runs = f.history(job);
    runs.iter().find(|r| state(r) == "running").map(|r| r["id"].as_str().unwrap().to_owned())
}

/// Checks every line (`instant job`) names `job` and no instant comes twice; how many.
fn once_each(lines: &[String], job: &str) -> usize {
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    for line in lines {
        let (at, named) = line.split_once(' ').unwrap();
        assert_eq!(named, job, "{line}");
        *seen.entry(at).or_default() += 1;
    }
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "{job}: ticks ran twice: {twice:?}");
    seen.len()
}

#[test]
fn sqlite_two_applications_never_touch_each_others_jobs() {
    two_applications(None);
}

#[test]
fn postgres_two_applications_never_touch_each_others_jobs() {
    let Some(store) = server_store(POSTGRES) else { return };
    two_applications(Some(store));
}

#[test]
fn mysql_two_applications_never_touch_each_others_jobs() {
    let Some(store) = server_store(MYSQL) else { return };
    two_applications(Some(store));
}

#[test]
fn redis_two_applications_never_touch_each_others_jobs() {
    let Some(store) = server_store(REDIS) else { return };
    two_applications(Some(store));
}

#[cfg(feature = "etcd")]
#[test]
fn etcd_two_applications_never_touch_each_others_jobs() {
    let Some(store) = server_store(solocron_conformance::server::ETCD) else { return };
    two_applications(Some(store));
}
