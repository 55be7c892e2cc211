//! What a newcomer to the admin CLI ran into, each pinned by a real `solocron` process on a
//! real SQLite store: pipes closed early, history's columns and zone, staleness by
//! heartbeats, the nodes, pause reasons and the audit trail, unlock's exit code, `prune
//! --older-than never`, and a failed `trigger --here` said once.
#![forbid(unsafe_code)]

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use chrono::{Offset as _, TimeZone as _};
use common::*;
use serde_json::Value;

const YEARLY: &str = "0 0 0 1 1 *";

fn job(name: &str, schedule: &str, extra: &str, cmd: &str) -> String {
    format!("\n[[jobs]]\nname = \"{name}\"\nschedule = \"{schedule}\"\n{extra}\ncommand = [\"/bin/sh\", \"-c\", \"{cmd}\"]\n")
}

fn ok(f: &Fleet, args: &[&str]) -> String {
    let (code, out, err) = f.cli(args);
    assert_eq!(code, 0, "solocron {args:?}: {err}");
    out
}

fn of_job<'a>(status: &'a Value, job: &str) -> &'a Value {
    status.as_array().unwrap().iter().find(|j| j["name"] == job).unwrap_or_else(|| panic!("{job} not in {status:#}"))
}

/// The column where the values of `solocron status JOB` start on each line: after the
/// label and its padding, or after the indentation of a continuation line.
fn value_columns(detail: &str) -> Vec<usize> {
    detail
        .lines()
        .map(|l| {
            let label_end =
                if l.starts_with(' ') { 0 } else { l.find("  ").unwrap_or_else(|| panic!("no value: {l}")) };
            label_end + l[label_end..].find(|c| c != ' ').unwrap()
        })
        .collect()
}

fn assert_aligned(detail: &str) {
    let columns = value_columns(detail);
    assert!(columns.windows(2).all(|w| w[0] == w[1]), "values must start in one column ({columns:?}):\n{detail}");
}

#[test]
fn no_command_panics_when_its_reader_closes_the_pipe_first() {
    let f = Fleet::new(&job("quiet", YEARLY, "", "true"));
    ok(&f, &["migrate"]);
    let config = f.config().display().to_string();
    let with_config = |args: &[&str]| [args, &["--config", &config]].concat().iter().map(|s| s.to_string()).collect();
    let commands: Vec<Vec<String>> = vec![
        with_config(&["check"]),
        with_config(&["status"]),
        with_config(&["status", "quiet"]),
        with_config(&["status", "--format", "json"]),
        with_config(&["history"]),
        with_config(&["history", "--format", "json"]),
        with_config(&["nodes"]),
        with_config(&["prune", "--older-than", "never"]),
        vec!["completions".into(), "bash".into()],
        vec!["man".into()],
    ];
    for args in commands {
        // A real pipe whose reader is gone before the command writes a byte, as with
        // `solocron check | head -0`, or `| head -1` once head has its line.
        let (reader, writer) = nix::unistd::pipe().unwrap();
        drop(reader);
        let out = Command::new(BIN).args(&args).stdin(Stdio::null()).stdout(writer).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("panicked"), "{args:?} panicked on a closed pipe: {err}");
        assert_eq!(out.status.code(), Some(0), "{args:?} ends quietly with 0 on a closed pipe: {err}");
        assert!(err.is_empty(), "{args:?}: nothing to say about a reader that left: {err}");
    }
}

#[test]
fn history_shows_run_ids_one_zone_for_the_table_and_each_runs_lateness() {
    let f = Fleet::new(&format!(
        "{}{}",
        job("berlin", YEARLY, "timezone = \"Europe/Berlin\"", "echo from berlin"),
        job("utc", YEARLY, "", "true")
    ));
    f.migrate();
    for j in ["berlin", "berlin", "utc"] {
        ok(&f, &["trigger", j, "--here"]);
    }
    let runs = f.cli_items(&["history", "--format", "json"]);
    let runs = runs.as_array().unwrap();
    assert_eq!(runs.len(), 3);
    for r in runs {
        let at = |k: &str| r[k].as_str().unwrap().parse::<chrono::DateTime<chrono::Utc>>().unwrap();
        let late = (at("started_at") - at("scheduled_at")).num_milliseconds();
        assert_eq!(r["lateness_ms"].as_i64(), Some(late), "lateness is start minus instant: {r:#}");
    }

    // One job: its zone, named in the header; the first column is the run id --output takes.
    let berlin = ok(&f, &["history", "--job", "berlin"]);
    let lines: Vec<&str> = berlin.lines().collect();
    let header: Vec<&str> = lines[0].split("  ").map(str::trim).filter(|c| !c.is_empty()).collect();
    assert_eq!(
        header[..4],
        ["RUN ID", "SCHEDULED (Europe/Berlin)", "STARTED", "LATE"],
        "the run id, the instant in the named zone, when it started and how late:\n{berlin}"
    );
    let id = lines[1].split_whitespace().next().unwrap();
    assert!(id.starts_with("berlin@") && id.contains('#'), "{berlin}");
    assert_eq!(ok(&f, &["history", "--output", id]).trim(), "from berlin");
    let offset = chrono_tz::Europe::Berlin.offset_from_utc_datetime(&chrono::Utc::now().naive_utc()).fix().to_string();
    assert!(lines[1..].iter().all(|l| l.contains(&offset)), "Berlin's offset {offset}:\n{berlin}");
    let late = lines[1].split_whitespace().nth(5).unwrap();
    assert!(late.starts_with('+') && late.ends_with('s'), "LATE reads like +12ms: `{late}` in\n{berlin}");

    // Jobs of different zones: one zone for every row, UTC, said in the header.
    let mixed = ok(&f, &["history"]);
    assert!(mixed.lines().next().unwrap().contains("SCHEDULED (UTC)"), "{mixed}");
    assert!(mixed.lines().skip(1).all(|l| l.contains("+00:00")), "every row in UTC:\n{mixed}");
    let tokyo = ok(&f, &["history", "--zone", "Asia/Tokyo"]);
    assert!(tokyo.lines().next().unwrap().contains("SCHEDULED (Asia/Tokyo)"), "{tokyo}");
    assert!(tokyo.lines().skip(1).all(|l| l.contains("+09:00")), "{tokyo}");
    let (code, _, err) = f.cli(&["history", "--zone", "Mars/Olympus"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--zone") && err.contains("Mars/Olympus"), "{err}");
}

#[test]
fn staleness_comes_from_heartbeats_and_nodes_show_alive_then_gone() {
    let mut f = Fleet::new(&job("beat", "* * * * * *", "", "true"));
    f.start("n1");
    // Longer than --stale-after: a node's registration is this old, its heartbeat is not.
    std::thread::sleep(Duration::from_secs(12));
    let s = f.cli_items(&["status", "--stale-after", "10s", "--format", "json"]);
    assert_eq!(of_job(&s, "beat")["stale"], false, "n1 beats every 5 s: {s:#}");
    assert_eq!(of_job(&s, "beat")["nodes"], serde_json::json!(["n1"]), "{s:#}");
    let judged = f.cli_items(&["nodes", "--stale-after", "10s", "--format", "json"]);
    assert_eq!(judged[0]["liveness"], "alive", "the node that registered it, by --stale-after: {judged:#}");
    let nodes = f.cli_items(&["nodes", "--format", "json"]);
    let n1 = &nodes[0];
    assert_eq!(
        (n1["node"].as_str(), n1["liveness"].as_str(), n1["jobs"].as_u64()),
        (Some("n1"), Some("alive"), Some(1))
    );
    assert!(!n1["version"].as_str().unwrap().is_empty() && n1["last_seen_ago_ms"].as_i64().unwrap() < 10_000, "{n1:#}");
    let table = ok(&f, &["status"]);
    let node_line = table.lines().find(|l| l.starts_with("n1 ")).unwrap_or_else(|| panic!("no node in:\n{table}"));
    assert!(node_line.contains("alive") && node_line.contains("ago"), "{table}");
    let detail = ok(&f, &["status", "beat"]);
    assert_aligned(&detail);
    assert!(detail.lines().any(|l| l.starts_with("nodes ") && l.contains("n1") && l.contains("alive")), "{detail}");
    let nodes_table = ok(&f, &["nodes"]);
    for column in ["NODE", "LIVENESS", "LAST SEEN", "VERSION", "JOBS", "RUNS HELD"] {
        assert!(nodes_table.lines().next().unwrap().contains(column), "{nodes_table}");
    }

    f.stop_all();
    let s = f.cli_items(&["status", "--format", "json"]);
    assert_eq!(of_job(&s, "beat")["stale"], true, "its only node said goodbye: {s:#}");
    assert_eq!(f.cli_items(&["nodes", "--format", "json"])[0]["liveness"], "gone");
    let (code, _, err) = f.cli(&["status", "--stale-after", "2s"]);
    assert_eq!(code, 2, "shorter than the heartbeat would flag healthy nodes: {err}");
    assert!(err.contains("heartbeat"), "{err}");
}

#[test]
fn pausing_again_keeps_the_reason_and_status_shows_who_did_what_and_why() {
    let f = Fleet::new(&job("backup", YEARLY, "", "true"));
    f.migrate();
    ok(&f, &["pause", "backup", "--reason", "disk full"]);
    let again = ok(&f, &["pause", "backup"]);
    assert!(again.starts_with("backup was already paused by "), "{again}");
    assert!(again.contains("@") && again.contains(": disk full"), "who paused it and why: {again}");
    let s = f.cli_json(&["status", "backup", "--format", "json"]);
    assert_eq!((s["paused"].is_object(), s["paused"]["reason"].as_str()), (true, Some("disk full")), "{s:#}");
    ok(&f, &["resume", "backup", "--reason", "disk replaced"]);
    let detail = ok(&f, &["status", "backup"]);
    assert_aligned(&detail);
    let actions: Vec<&str> = detail.lines().skip_while(|l| !l.starts_with("actions")).collect();
    assert_eq!(actions.len(), 3, "three actions, newest first:\n{detail}");
    assert!(actions[0].contains("resume") && actions[0].contains("\"disk replaced\""), "{detail}");
    assert!(actions[1].contains("pause") && actions[1].contains("already paused"), "{detail}");
    assert!(
        actions[2].contains("pause") && actions[2].contains("\"disk full\"") && actions[2].contains("ago"),
        "{detail}"
    );
    let s = f.cli_json(&["status", "backup", "--format", "json"]);
    let kinds: Vec<&str> = s["actions"].as_array().unwrap().iter().map(|a| a["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["resume", "pause", "pause"]);
    assert!(ok(&f, &["resume", "backup"]).contains("was not paused"));
}

#[test]
fn an_unconfirmed_unlock_exits_1_says_how_to_confirm_and_changes_nothing() {
    let mut f = Fleet::new(&job("slow", YEARLY, "", "sleep 30"));
    f.start("n1");
    std::thread::sleep(Duration::from_millis(800));
    ok(&f, &["trigger", "slow"]);
    wait_for(Duration::from_secs(10), || f.history("slow").first().filter(|r| state(r) == "running").map(|_| ()))
        .expect("slow never ran");
    let (code, out, err) = f.cli(&["unlock", "slow", "--reason", "stuck"]);
    assert_eq!(code, 1, "README: an unconfirmed unlock exits 1: {out} {err}");
    assert!(err.contains("--yes") && err.contains("nothing changed"), "{err}");
    assert_eq!(state(&f.history("slow")[0]), "running", "not confirmed: nothing changed");
    let (code, out, err) = f.cli(&["unlock", "slow", "--reason", "stuck", "--yes"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("abandoned slow@"), "{out}");
    let s = f.cli_json(&["status", "slow", "--format", "json"]);
    let unlock = &s["actions"][0];
    assert_eq!((unlock["kind"].as_str(), unlock["reason"].as_str()), (Some("unlock"), Some("stuck")), "{s:#}");
}

#[test]
fn prune_older_than_never_prunes_nothing_and_says_so() {
    let f = Fleet::new(&job("kept", YEARLY, "", "true"));
    f.migrate();
    ok(&f, &["trigger", "kept", "--here"]);
    let (code, out, err) = f.cli(&["prune", "--older-than", "never"]);
    assert_eq!(code, 0, "`never`, as history_retention accepts it: {err}");
    assert!(out.contains("nothing pruned"), "{out}");
    assert_eq!(f.history("kept").len(), 1);
}

#[test]
fn a_failed_run_under_trigger_here_is_reported_once() {
    let f = Fleet::new(&job("adhoc", YEARLY, "", "echo working; exit 3"));
    f.migrate();
    let (code, out, err) = f.cli(&["trigger", "adhoc", "--here"]);
    assert_eq!(code, 1, "{out} {err}");
    assert!(out.contains("working") && out.contains("failed"), "{out}");
    assert_eq!(format!("{out}{err}").matches("failed").count(), 1, "said once:\nstdout: {out}\nstderr: {err}");
}
