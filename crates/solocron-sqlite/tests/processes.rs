//! Separate OS processes on one database file: this test binary re-runs itself as the
//! children, which migrate the fresh file and claim the same tick at the same instant.
#![forbid(unsafe_code)]

use solocron_core::ClaimStore;
use solocron_core::SchemaStore;
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use solocron_core::{ClaimMode, ClaimOutcome, ClaimRequest, Prefix, Tick, Trigger};
use solocron_sqlite::SqliteStore;

const TEST: &str = "eight_processes_migrate_at_once_and_exactly_one_wins_the_tick";
const CHILD_URL: &str = "SOLOCRON_SQLITE_TEST_CHILD_URL";
const START_AT: &str = "SOLOCRON_SQLITE_TEST_START_AT_MS";

fn epoch_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

/// In a child: connect, migrate, wait for the common start instant, claim, print the outcome.
async fn child(url: &str) {
    let store = SqliteStore::connect(url, &Prefix::default()).await.unwrap();
    store.migrate().await.unwrap();
    let start: u64 = std::env::var(START_AT).unwrap().parse().unwrap();
    tokio::time::sleep(Duration::from_millis(start.saturating_sub(epoch_ms()))).await;
    let request = ClaimRequest {
        tick: Tick::new("backup", "2026-01-01T00:00:00Z".parse().unwrap()),
        trigger: Trigger::Schedule,
        node: format!("pid-{}", std::process::id()),
        lease: Duration::from_secs(60),
        mode: ClaimMode::Run { skip_if_running: false },
        nonce: 0,
    };
    let outcome = match store.claim(&[request]).await.unwrap().remove(0) {
        ClaimOutcome::Won(_) => "won",
        ClaimOutcome::Taken => "taken",
        ClaimOutcome::Skipped { .. } => "skipped",
        ClaimOutcome::TooEarly { .. } => "too early",
    };
    println!("OUTCOME {outcome}");
}

#[tokio::test]
async fn eight_processes_migrate_at_once_and_exactly_one_wins_the_tick() {
    if let Ok(url) = std::env::var(CHILD_URL) {
        return child(&url).await;
    }
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("shared.db").display());
    // Far enough ahead that every child has connected and migrated by then.
    let start_at = (epoch_ms() + 1500).to_string();
    let children: Vec<_> = (0..8)
        .map(|_| {
            Command::new(std::env::current_exe().unwrap())
                .args(["--exact", TEST, "--nocapture", "--test-threads=1"])
                .env(CHILD_URL, &url)
                .env(START_AT, &start_at)
                .stdout(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut outcomes = Vec::new();
    for child in children {
        let output = child.wait_with_output().unwrap();
        assert!(output.status.success(), "child failed: {output:?}");
        let stdout = String::from_utf8(output.stdout).unwrap();
        // libtest prints `test <name> ... ` with no newline before the test's own output.
        let line = stdout.lines().find_map(|l| l.split_once("OUTCOME ")).map(|(_, o)| o.split_whitespace().next());
        outcomes.push(line.flatten().unwrap_or_else(|| panic!("no outcome in {stdout:?}")).to_owned());
    }
    outcomes.sort();
    assert_eq!(outcomes, [vec!["taken"; 7], vec!["won"]].concat());
}
