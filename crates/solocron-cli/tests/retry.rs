//! Failure retries with real processes (issue 22): a job that fails twice and then succeeds
//! gets its second and third attempts after the backoff (1 s, then 2 s), each once, with
//! larger fencing tokens, on each of the five stores; when the node that saw the failure is
//! SIGKILLed during the backoff, another node starts the retry; a retry that would come
//! after the tick's next instant is dropped, with the reason in the record.

mod common;

use std::time::Duration;

use chrono::{DateTime, Utc};
use common::*;
use nix::sys::signal::Signal;
use serde_json::Value;
use solocron_conformance::server::{ServerUrl, MYSQL, POSTGRES, REDIS};

/// Writes the attempt, its token and node to `attempts.txt`; fails before attempt 3.
const FLAKY: &str = r#"echo $SOLOCRON_ATTEMPT $SOLOCRON_FENCING_TOKEN $SOLOCRON_NODE_ID >> $DIR/attempts.txt; test $SOLOCRON_ATTEMPT -ge 3"#;
/// Longest wait for a triggered tick's three attempts to end: 1 s + 2 s of backoff, the
/// runs, and a recovery scan's interval (1 s at a 3 s lease) should a node die.
const ALL_ATTEMPTS_WAIT: Duration = Duration::from_secs(25);
/// How late past its backoff the node that saw the failure may start a retry (it wakes
/// its recovery scan at the not-before).
const ON_TIME_SLACK_MS: i64 = 900;

fn job(backoff: &str) -> String {
    format!(
        "[[jobs]]\nname = \"flaky\"\nschedule = \"0 0 0 1 1 *\"\nlease = \"3s\"\n\
         retry = {{ attempts = 3, backoff = \"{backoff}\", jitter = false }}\n\
         command = [\"/bin/sh\", \"-c\", \"{FLAKY}\"]\n"
    )
}

fn instant(v: &Value) -> DateTime<Utc> {
    v.as_str().unwrap_or_else(|| panic!("not an instant: {v}")).parse().unwrap()
}

/// The tick's records by attempt, once attempt 3 has ended.
fn three_attempts(f: &Fleet) -> Option<Vec<Value>> {
    let mut runs = f.history("flaky");
    runs.sort_by_key(|r| r["attempt"].as_u64());
    (runs.len() == 3 && runs.iter().all(|r| state(r) != "running" && state(r) != "waiting")).then_some(runs)
}

/// Starts two nodes, waits until they serve, and triggers the job.
fn two_nodes_triggered(store: Option<&str>, backoff: &str) -> Fleet {
    let mut f = Fleet::on(store, &job(backoff));
    f.start("n1");
    f.start("n2");
    wait_for(Duration::from_secs(10), || {
        let (code, out, _) = f.cli(&["nodes", "--format", "json"]);
        (code == 0 && out.matches("\"alive\"").count() >= 2).then_some(())
    })
    .unwrap_or_else(|| panic!("the nodes did not start:\n{}", f.log("n1")));
    let (code, _, err) = f.cli(&["trigger", "flaky"]);
    assert_eq!(code, 0, "trigger: {err}");
    f
}

/// Attempts 1 and 2 failed and 3 succeeded, each ran once with a larger token than the
/// last, triggered `manual`, `retry`, `retry`; the waits between them at least the backoff.
fn assert_retried(f: &Fleet, runs: &[Value], backoff_ms: i64) -> Vec<i64> {
    let states: Vec<&str> = runs.iter().map(state).collect();
    assert_eq!(states, ["failed", "failed", "succeeded"], "{runs:#?}");
    let triggers: Vec<&str> = runs.iter().map(|r| r["trigger"].as_str().unwrap()).collect();
    assert_eq!(triggers, ["manual", "retry", "retry"]);
    let tokens: Vec<u64> = runs.iter().map(|r| r["fencing_token"].as_u64().unwrap()).collect();
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "tokens do not grow: {tokens:?}");
    let lines = f.lines("attempts.txt");
    let ran: Vec<&str> = lines.iter().map(|l| l.split(' ').next().unwrap()).collect();
    assert_eq!(ran, ["1", "2", "3"], "each attempt runs once: {lines:?}");
    let mut waits = Vec::new();
    for (k, w) in runs.windows(2).enumerate() {
        let wait = (instant(&w[1]["started_at"]) - instant(&w[0]["finished_at"])).num_milliseconds();
        let backoff = backoff_ms << k;
        assert!(
            wait >= backoff - 5,
            "attempt {} started {wait} ms after the failure, before its backoff {backoff} ms",
            k + 2
        );
        waits.push(wait - backoff);
    }
    waits
}

fn a_failing_job_is_retried_after_its_backoff(store: Option<&str>, kind: &str) {
    let mut f = two_nodes_triggered(store, "1s");
    let runs = wait_for(ALL_ATTEMPTS_WAIT, || three_attempts(&f))
        .unwrap_or_else(|| panic!("{kind}: no third attempt: {:#?}\n{}", f.history("flaky"), f.log("n1")));
    f.stop_all();
    let late = assert_retried(&f, &runs, 1000);
    println!("{kind}: attempts 2 and 3 started {late:?} ms past their backoff");
    assert!(
        late.iter().all(|&ms| ms <= ON_TIME_SLACK_MS),
        "{kind}: a retry started late: {late:?} ms past its backoff"
    );
}

#[test]
fn sqlite_a_failing_job_is_retried_after_its_backoff() {
    a_failing_job_is_retried_after_its_backoff(None, "SQLite");
}

fn on_server(server: ServerUrl, test: fn(Option<&str>, &str)) {
    let Some(store) = server_store(server) else { return };
    test(Some(&store), server.name);
}

#[test]
fn postgres_a_failing_job_is_retried_after_its_backoff() {
    on_server(POSTGRES, a_failing_job_is_retried_after_its_backoff);
}

#[test]
fn mariadb_a_failing_job_is_retried_after_its_backoff() {
    on_server(MYSQL, a_failing_job_is_retried_after_its_backoff);
}

#[test]
fn redis_a_failing_job_is_retried_after_its_backoff() {
    on_server(REDIS, a_failing_job_is_retried_after_its_backoff);
}

#[cfg(feature = "etcd")]
#[test]
fn etcd_a_failing_job_is_retried_after_its_backoff() {
    on_server(solocron_conformance::server::ETCD, a_failing_job_is_retried_after_its_backoff);
}

/// The node that ran attempt 1 is SIGKILLed as soon as it failed: the other node's recovery
/// scan finds the waiting retry once its backoff passed and runs attempts 2 and 3.
fn a_retry_survives_the_node_that_planned_it(store: Option<&str>, kind: &str) {
    let mut f = two_nodes_triggered(store, "2s");
    let first = wait_for(Duration::from_secs(10), || f.lines("attempts.txt").first().cloned())
        .unwrap_or_else(|| panic!("{kind}: attempt 1 never ran"));
    let failed_on = first.split(' ').nth(2).unwrap().to_owned();
    // The kill comes once the node recorded the failure with its retry (attempt 2's record,
    // waiting): killed between the job's exit and that record, the node crashed mid-run,
    // and attempt 1 is recovered by its `on_crash` instead (a race the test must not run).
    wait_for(Duration::from_secs(10), || {
        f.history("flaky").iter().any(|r| r["attempt"].as_u64() == Some(2)).then_some(())
    })
    .unwrap_or_else(|| panic!("{kind}: attempt 1's failure and retry never recorded: {:#?}", f.history("flaky")));
    let i = f.nodes.iter().position(|n| n.id == failed_on).unwrap();
    f.signal(i, Signal::SIGKILL);
    let runs = wait_for(ALL_ATTEMPTS_WAIT, || three_attempts(&f))
        .unwrap_or_else(|| panic!("{kind}: no third attempt after the kill: {:#?}", f.history("flaky")));
    f.stop_all();
    let late = assert_retried(&f, &runs, 2000);
    let nodes: Vec<&str> = runs.iter().map(|r| r["node"].as_str().unwrap()).collect();
    assert!(nodes[1..].iter().all(|n| *n != failed_on), "{kind}: a retry ran on the killed node: {nodes:?}");
    println!(
        "{kind}: {failed_on} killed after attempt 1; attempts 2 and 3 on {:?}, {late:?} ms past their backoff",
        &nodes[1..]
    );
}

#[test]
fn sqlite_a_retry_survives_the_node_that_planned_it() {
    a_retry_survives_the_node_that_planned_it(None, "SQLite");
}

#[test]
fn postgres_a_retry_survives_the_node_that_planned_it() {
    on_server(POSTGRES, a_retry_survives_the_node_that_planned_it);
}

/// A job due every 2 s whose backoff is 5 s: its failures are never retried, and each
/// says why in its record.
#[test]
fn a_retry_that_would_pass_the_next_tick_is_dropped_with_the_reason() {
    let mut f = Fleet::new(
        "[[jobs]]\nname = \"often\"\nschedule = \"*/2 * * * * *\"\nlease = \"3s\"\n\
         retry = { attempts = 3, backoff = \"5s\" }\ncommand = [\"/bin/false\"]\n",
    );
    f.start("n1");
    let runs = wait_for(Duration::from_secs(15), || {
        let runs = f.history_if_ready("often")?;
        (runs.iter().filter(|r| state(r) == "failed").count() >= 2).then_some(runs)
    })
    .unwrap_or_else(|| panic!("the job never failed twice:\n{}", f.log("n1")));
    f.stop_all();
    assert!(runs.iter().all(|r| r["attempt"] == 1), "a retry ran: {runs:#?}");
    for r in runs.iter().filter(|r| state(r) == "failed") {
        let reason = r["reason"].as_str().unwrap_or_default();
        assert!(reason.starts_with("exit code 1; retry dropped: attempt 2 would wait"), "{reason}");
    }
}

/// A job paused while its retry waits: the retry is dropped when it comes due (recorded
/// `abandoned` with the reason), and never runs.
#[test]
fn a_retry_of_a_job_paused_meanwhile_is_dropped_not_run() {
    let mut f = two_nodes_triggered(None, "2s");
    wait_for(Duration::from_secs(10), || {
        f.history("flaky").iter().any(|r| r["attempt"] == 2 && state(r) == "waiting").then_some(())
    })
    .unwrap_or_else(|| panic!("no waiting retry: {:#?}", f.history("flaky")));
    let (code, _, err) = f.cli(&["pause", "flaky", "--reason", "investigating"]);
    assert_eq!(code, 0, "pause: {err}");
    let dropped = wait_for(Duration::from_secs(10), || {
        f.history("flaky").into_iter().find(|r| r["attempt"] == 2 && state(r) == "abandoned")
    })
    .unwrap_or_else(|| panic!("the retry was not dropped: {:#?}", f.history("flaky")));
    std::thread::sleep(Duration::from_secs(1));
    f.stop_all();
    assert_eq!(dropped["reason"], "retry dropped: job paused before attempt 2 started");
    assert_eq!(f.lines("attempts.txt").len(), 1, "only attempt 1 ran");
    assert_eq!(f.history("flaky").len(), 2, "no attempt 3");
}
