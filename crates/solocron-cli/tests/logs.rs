//! `solocron run --log-format json` is what an operator's log pipeline reads: every line a
//! JSON object with a time, a level and a message, and a run's start and end carrying the
//! fields that tie them to the run's record. A real node on a real SQLite file.
#![forbid(unsafe_code)]

mod common;

use std::time::Duration;

use chrono::{DateTime, Utc};
use common::*;
use serde_json::{Map, Value};

const LEVELS: [&str; 5] = ["TRACE", "DEBUG", "INFO", "WARN", "ERROR"];

/// Every line of `log` as a JSON object (panics on any other line).
fn parse_lines(log: &str) -> Vec<Map<String, Value>> {
    log.lines()
        .map(|l| match serde_json::from_str::<Value>(l) {
            Ok(Value::Object(o)) => o,
            other => panic!("not a JSON object ({other:?}): {l}"),
        })
        .collect()
}

fn str_field<'a>(line: &'a Map<String, Value>, key: &str) -> &'a str {
    line.get(key).and_then(Value::as_str).unwrap_or_else(|| panic!("no string `{key}` in {line:?}"))
}

/// The scheduled instant a log line names (the tick's `Display`, e.g. `2026-01-01 06:00:00 UTC`).
fn instant(line: &Map<String, Value>) -> DateTime<Utc> {
    let text = str_field(line, "scheduled_at");
    chrono::NaiveDateTime::parse_from_str(text, "%Y-%m-%d %H:%M:%S%.f UTC")
        .unwrap_or_else(|e| panic!("scheduled_at `{text}` is not a UTC instant: {e}"))
        .and_utc()
}

#[test]
fn json_logs_are_one_object_per_line_and_runs_carry_their_record_fields() {
    let mut f = Fleet::new(
        "[[jobs]]\nname = \"tick\"\nschedule = \"* * * * * *\"\ncommand = [\"/bin/sh\", \"-c\", \"echo ran\"]\n",
    );
    f.start("n1");
    wait_for(Duration::from_secs(15), || f.log("n1").contains("run ended").then_some(()))
        .unwrap_or_else(|| panic!("no run ended:\n{}", f.log("n1")));
    let status = f.stop(0, Duration::from_secs(15)).expect("the node exits on SIGTERM");
    assert!(status.success(), "{status:?}");
    let text = f.log("n1");
    assert!(!text.contains('\u{1b}'), "no terminal colours in a log file:\n{text}");
    let lines = parse_lines(&text);
    for l in &lines {
        let at = str_field(l, "timestamp");
        DateTime::parse_from_rfc3339(at).unwrap_or_else(|e| panic!("timestamp `{at}` is not RFC 3339 ({e}): {l:?}"));
        assert!(LEVELS.contains(&str_field(l, "level")), "{l:?}");
        assert!(!str_field(l, "message").is_empty(), "{l:?}");
        assert!(!str_field(l, "target").is_empty(), "{l:?}");
    }
    let with = |message: &str| -> Vec<&Map<String, Value>> {
        lines.iter().filter(|l| l.get("message").and_then(Value::as_str) == Some(message)).collect()
    };
    let starting = with("scheduler starting");
    assert_eq!(starting.len(), 1, "{text}");
    assert_eq!(str_field(starting[0], "node"), "n1");
    assert_eq!(str_field(starting[0], "level"), "INFO");
    assert!(str_field(starting[0], "store").starts_with("sqlite://"), "{:?}", starting[0]);
    assert_eq!(with("SIGTERM: draining").len(), 1, "the drain is logged: {text}");

    let hist = f.history("tick");
    let (started, ended) = (with("run started"), with("run ended"));
    assert!(!ended.is_empty() && started.len() >= ended.len(), "{text}");
    for end in &ended {
        let at = instant(end);
        let token = end.get("token").and_then(Value::as_u64).unwrap_or_else(|| panic!("no numeric token: {end:?}"));
        let start = started
            .iter()
            .find(|s| instant(s) == at)
            .unwrap_or_else(|| panic!("a run ended at {at} that never started: {text}"));
        for key in ["job", "node", "token", "attempt"] {
            assert_eq!(start.get(key), end.get(key), "start and end of the run at {at} disagree on `{key}`");
        }
        assert_eq!((str_field(end, "job"), str_field(end, "node")), ("tick", "n1"));
        assert_eq!(end.get("attempt").and_then(Value::as_u64), Some(1));
        assert_eq!(str_field(start, "trigger"), "schedule");
        assert!(str_field(start, "run").starts_with("tick@"), "{start:?}");
        assert_eq!(str_field(end, "state"), "succeeded", "{end:?}");
        assert!(end.contains_key("duration"), "{end:?}");
        assert_eq!(end.get("exit_code").and_then(Value::as_i64), Some(0), "the exit code is a number: {end:?}");
        // The job's own output comes as lines naming its run, so a pipeline can join them.
        assert!(
            lines
                .iter()
                .any(|l| l.get("message").and_then(Value::as_str) == Some("ran") && l.get("run") == start.get("run")),
            "the output of the run at {at} is not in the log under its run id: {text}"
        );
        // The log's fields lead to the very record `history` shows.
        let record = hist
            .iter()
            .find(|r| r["scheduled_at"].as_str().and_then(|s| s.parse::<DateTime<Utc>>().ok()) == Some(at))
            .unwrap_or_else(|| panic!("no record of the run at {at}: {hist:#?}"));
        assert_eq!(record["fencing_token"].as_u64(), Some(token), "{record:#}");
        assert_eq!(record["state"].as_str(), Some("succeeded"), "{record:#}");
        assert_eq!(record["id"].as_str(), Some(str_field(start, "run")), "{record:#}");
    }
}
