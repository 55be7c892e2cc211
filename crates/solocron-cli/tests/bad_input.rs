//! Bad input: a clear message naming the file and the key, exit code 2, nothing written.
#![forbid(unsafe_code)]

mod common;

use std::process::Command;

use common::BIN;

const GOOD_JOB: &str = r#"
[[jobs]]
name = "a"
schedule = "*/5 * * * * *"
command = ["/bin/true"]
"#;

/// Runs `solocron <cmd> --config FILE` on `toml`; returns (exit code, stderr, db created).
fn run_with(cmd: &str, toml: &str) -> (i32, String, bool) {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("s.db");
    let cfg = dir.path().join("bad.toml");
    let text = toml.replace("$DB", &db.display().to_string());
    std::fs::write(&cfg, text).unwrap();
    let mut c = Command::new(BIN);
    c.args(cmd.split_whitespace()).arg("--config").arg(&cfg);
    let out = c.output().unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stderr).into_owned(), db.exists())
}

#[test]
fn every_bad_config_is_refused_with_file_key_and_exit_2_and_nothing_written() {
    let store = "[store]\nurl = \"sqlite://$DB\"\n";
    let cases = [
        (GOOD_JOB.replace("*/5 * * * * *", "*/5 * * * * * * *"), "has 8 fields"),
        (
            GOOD_JOB.replace("*/5 * * * * *", "0 99 * * *"),
            "the hour field `99` is invalid: Number out of bounds. (allowed: 0-23)",
        ),
        (format!("{GOOD_JOB}timezone = \"Europe/Nowhere\""), "jobs[0] (a).timezone"),
        (format!("{GOOD_JOB}timeout = \"ten minutes\""), "jobs[0] (a).timeout"),
        (format!("{GOOD_JOB}{GOOD_JOB}"), "already used by jobs[0]"),
        (format!("{GOOD_JOB}retries = 3"), "jobs[0] (a).retries: unknown key (line 8)"),
        (
            GOOD_JOB.replace("schedule =", "schedul ="),
            "jobs[0] (a).schedul: unknown key (line 6); did you mean `schedule`?",
        ),
        (
            GOOD_JOB.replace("[\"/bin/true\"]", "\"echo hi\""),
            "jobs[0] (a).command: must be an array, not a string \"echo hi\" (line 7)",
        ),
        (format!("{GOOD_JOB}max_attempts = \"3\""), "jobs[0] (a).max_attempts: must be a whole number"),
        (format!("{GOOD_JOB}overlap = \"sometimes\""), "jobs[0] (a).overlap"),
        (format!("{GOOD_JOB}lease = \"10ms\""), "jobs[0] (a).lease"),
        ("[[jobs]]\nname = \"x\"\ncommand = [\"/bin/true\"]\n".to_owned(), "jobs[0] (x).schedule: is required"),
        ("[jobs\n".to_owned(), "bad.toml"),
    ];
    for (jobs, want) in cases {
        for cmd in ["check", "run"] {
            let (code, err, db_written) = run_with(cmd, &format!("{store}{jobs}"));
            assert_eq!(code, 2, "{cmd}: expected exit 2 for `{want}`, got {code}: {err}");
            assert!(err.contains("bad.toml"), "{cmd}: the file is named: {err}");
            assert!(err.contains(want), "{cmd}: expected `{want}` in: {err}");
            assert!(!db_written, "{cmd}: nothing may be written for bad input ({want})");
        }
    }
}

#[test]
fn an_unknown_key_is_reported_once_with_every_key_its_table_takes() {
    let (code, err, _) = run_with("check", &format!("{GOOD_JOB}retries = 3"));
    assert_eq!(code, 2, "{err}");
    assert_eq!(err.matches("retries").count(), 1, "the key is named once: {err}");
    assert!(err.contains("the keys here are: name, schedule, command, timezone"), "{err}");
    assert!(err.contains("max_attempts"), "{err}");
    let (_, err, _) = run_with("check", "[nodes]\nid = \"n1\"\n");
    assert!(err.contains("bad.toml: nodes: unknown key (line 1); did you mean `node`?"), "{err}");
}

#[test]
fn an_unreachable_or_unknown_store_is_refused_with_exit_2() {
    let cases = [
        ("[store]\nurl = \"sqlite:///no/such/dir/s.db\"\n", "/no/such/dir"),
        ("[store]\nurl = \"ftp://x\"\n", "not a store URL"),
        ("[store]\nurl = \"postgres://app:hunter2@127.0.0.1:1/db\"\n", "unavailable"),
        ("[store]\nurl = \"mysql://app:hunter2@127.0.0.1:1/db\"\n", "unavailable"),
    ];
    // `--fail-fast`: without it the daemon waits for an unreachable store (tests/daemon.rs).
    for (store, want) in cases {
        let (code, err, _) = run_with("run --fail-fast", &format!("{store}{GOOD_JOB}"));
        assert_eq!(code, 2, "{err}");
        assert!(err.contains("store.url"), "the key is named: {err}");
        assert!(err.contains(want), "expected `{want}` in: {err}");
        assert!(!err.contains("hunter2"), "a password must never be printed: {err}");
    }
}

#[test]
fn check_prints_the_next_five_fires_in_the_zone_and_in_utc() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("ok.toml");
    std::fs::write(&cfg, "[[jobs]]\nname = \"daily\"\nschedule = \"0 0 1 * * *\"\ntimezone = \"Asia/Shanghai\"\ncommand = [\"/bin/true\"]\n").unwrap();
    let out = Command::new(BIN).args(["check", "--config"]).arg(&cfg).output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    let fires: Vec<&str> = text.lines().filter(|l| l.contains("01:00:00 +08:00")).collect();
    assert_eq!(fires.len(), 5, "{text}");
    assert!(fires.iter().all(|l| l.contains("T17:00:00Z")), "{text}");
}
