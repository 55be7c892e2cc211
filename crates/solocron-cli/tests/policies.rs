//! Misfire (catch-up) and overlap policies, observed through real `solocron run` processes.
#![forbid(unsafe_code)]

mod common;

use std::time::Duration;

use chrono::{DateTime, Utc};
use common::*;
use serde_json::Value;

fn misfire_fleet(misfire: &str) -> Vec<Value> {
    // A 16 s catch-up window: every tick of the window older than the late tolerance
    // (10 s) that no node claimed is "missed" and goes to the misfire policy; the younger
    // ones run late, as on-time ticks.
    let mut f = Fleet::new(&format!(
        r#"
[[jobs]]
name = "m"
schedule = "* * * * * *"
misfire = "{misfire}"
catchup = "16s"
max_catchup = 3
command = ["/bin/sh", "-c", "echo $SOLOCRON_SCHEDULED_AT >> $DIR/ran.txt"]
"#
    ));
    // The job runs a moment, then no node runs it for 15 s: the ticks of the gap older
    // than the late tolerance were missed (a job the store never saw missed nothing).
    f.start("n1");
    std::thread::sleep(Duration::from_millis(1500));
    f.stop_all();
    std::thread::sleep(Duration::from_secs(15));
    f.start("n2");
    std::thread::sleep(Duration::from_millis(2500));
    f.stop_all();
    let mut hist = f.history("m");
    hist.reverse(); // oldest first
    hist
}

fn missed(hist: &[Value]) -> Vec<&Value> {
    hist.iter().filter(|r| r["trigger"] == "catchup").collect()
}

#[test]
fn misfire_skip_records_missed_ticks_without_running_them() {
    let hist = misfire_fleet("skip");
    let m = missed(&hist);
    assert!(!m.is_empty(), "{hist:#?}");
    assert!(m.len() <= 3, "max_catchup bounds the records: {m:#?}");
    for r in &m {
        assert_eq!(state(r), "skipped");
        assert!(r["reason"].as_str().unwrap().contains("missed"), "{r}");
    }
}

#[test]
fn misfire_once_runs_only_the_latest_missed_tick() {
    let hist = misfire_fleet("once");
    let m = missed(&hist);
    let ran: Vec<_> = m.iter().filter(|r| state(r) == "succeeded").collect();
    assert_eq!(ran.len(), 1, "{m:#?}");
    let latest_missed = m.iter().map(|r| at(r, "scheduled_at")).max().unwrap();
    assert_eq!(at(ran[0], "scheduled_at"), latest_missed);
    assert!(m.iter().filter(|r| state(r) != "succeeded").all(|r| state(r) == "skipped"));
}

#[test]
fn misfire_all_runs_every_missed_tick_oldest_first_up_to_max_catchup() {
    let hist = misfire_fleet("all");
    let m = missed(&hist);
    assert_eq!(m.len(), 3, "max_catchup = 3: {m:#?}");
    assert!(m.iter().all(|r| state(r) == "succeeded"), "{m:#?}");
    let started: Vec<DateTime<Utc>> = m.iter().map(|r| at(r, "started_at")).collect();
    assert!(started.windows(2).all(|w| w[0] <= w[1]), "oldest first: {started:?}");
}

fn overlap_fleet(overlap: &str) -> Vec<Value> {
    let mut f = Fleet::new(&format!(
        r#"
[[jobs]]
name = "o"
schedule = "* * * * * *"
overlap = "{overlap}"
command = ["/bin/sh", "-c", "sleep 2.5"]
"#
    ));
    f.start("n1");
    f.start("n2");
    std::thread::sleep(Duration::from_secs(7));
    f.stop_all();
    f.history("o")
}

fn intervals(hist: &[Value]) -> Vec<(DateTime<Utc>, DateTime<Utc>)> {
    let mut v: Vec<_> = hist
        .iter()
        .filter(|r| r["started_at"].is_string() && r["finished_at"].is_string())
        .map(|r| (at(r, "started_at"), at(r, "finished_at")))
        .collect();
    v.sort();
    v
}

#[test]
fn overlap_skip_records_ticks_that_come_while_the_job_runs_anywhere() {
    let hist = overlap_fleet("skip");
    let skipped: Vec<_> = hist.iter().filter(|r| state(r) == "skipped").collect();
    assert!(skipped.len() >= 2, "{hist:#?}");
    assert!(skipped.iter().all(|r| r["reason"].as_str().unwrap().contains("overlap")));
    let runs = intervals(&hist);
    assert!(runs.len() >= 2, "{hist:#?}");
    for w in runs.windows(2) {
        assert!(w[1].0 >= w[0].1, "runs overlapped across nodes: {w:?}");
    }
}

#[test]
fn overlap_allow_runs_ticks_while_the_previous_run_is_running() {
    let hist = overlap_fleet("allow");
    assert!(hist.iter().all(|r| state(r) != "skipped"), "{hist:#?}");
    let runs = intervals(&hist);
    assert!(runs.windows(2).any(|w| w[1].0 < w[0].1), "no two runs overlapped: {runs:?}");
}
