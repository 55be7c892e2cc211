//! The admin commands against real `solocron run` processes on one SQLite file.
#![forbid(unsafe_code)]

mod common;

use std::time::Duration;

use common::*;
use nix::sys::signal::Signal;
use serde_json::Value;

const YEARLY: &str = "0 0 0 1 1 *";

fn job(name: &str, schedule: &str, extra: &str, cmd: &str) -> String {
    format!("\n[[jobs]]\nname = \"{name}\"\nschedule = \"{schedule}\"\n{extra}\ncommand = [\"/bin/sh\", \"-c\", \"{cmd}\"]\n")
}

fn status_of<'a>(status: &'a Value, job: &str) -> &'a Value {
    status.as_array().unwrap().iter().find(|j| j["name"] == job).unwrap_or_else(|| panic!("{job} not in {status:#}"))
}

#[test]
fn drift_is_flagged_when_two_nodes_define_a_job_differently() {
    let mut f = Fleet::new(&job("report", "*/5 * * * * *", "", "true"));
    f.start("n1");
    let other = f.path("other.toml");
    let text = std::fs::read_to_string(f.config()).unwrap().replace("*/5 * * * * *", "*/7 * * * * *");
    std::fs::write(&other, text).unwrap();
    std::thread::sleep(Duration::from_millis(800));
    f.start_with("n2", &other);
    let drift = wait_for(Duration::from_secs(10), || {
        let s = f.cli_items(&["status", "--format", "json"]);
        status_of(&s, "report")["drift"].as_bool().unwrap().then_some(s)
    })
    .expect("status never showed drift");
    assert_eq!(status_of(&drift, "report")["nodes"].as_array().unwrap().len(), 2, "{drift:#}");
    // How each node registered it: the job's detail, as `GET /api/v1/jobs/report` has it.
    let nodes = f.cli_json(&["status", "report", "--format", "json"])["registrations"].as_array().unwrap().clone();
    let schedules: Vec<&str> = nodes.iter().map(|n| n["schedule"].as_str().unwrap()).collect();
    assert!(schedules.contains(&"*/5 * * * * *") && schedules.contains(&"*/7 * * * * *"), "{nodes:#?}");
    assert!(
        wait_for(Duration::from_secs(5), || f.log("n2").contains("drift").then_some(())).is_some(),
        "n2 logged no drift"
    );
    let (code, table, _) = f.cli(&["status"]);
    assert_eq!(code, 0);
    assert!(table.lines().any(|l| l.starts_with("report") && l.contains("drift")), "{table}");
}

#[test]
fn pause_stops_runs_fleet_wide_within_a_tick_and_resume_restores_them() {
    let mut f = Fleet::new(&job("beat", "* * * * * *", "", "echo $SOLOCRON_SCHEDULED_AT >> $DIR/beats.txt"));
    f.start("n1");
    f.start("n2");
    wait_for(Duration::from_secs(10), || (f.lines("beats.txt").len() >= 2).then_some(())).expect("never ran");
    let (code, _, err) = f.cli(&["pause", "beat", "--reason", "maintenance"]);
    assert_eq!(code, 0, "{err}");
    let paused_at = chrono::Utc::now();
    std::thread::sleep(Duration::from_secs(3));
    let late: Vec<String> = f
        .lines("beats.txt")
        .into_iter()
        .filter(|l| l.parse::<chrono::DateTime<chrono::Utc>>().unwrap() > paused_at + chrono::Duration::seconds(1))
        .collect();
    assert!(late.is_empty(), "ran while paused: {late:?}");
    let s = f.cli_json(&["status", "beat", "--format", "json"]);
    assert!(s["paused"].is_object(), "{s:#}");
    assert_eq!(s["paused"]["reason"], "maintenance");
    let skipped = f.history("beat").into_iter().filter(|r| state(r) == "skipped").collect::<Vec<_>>();
    assert!(skipped.len() >= 2, "paused ticks are recorded skipped");
    assert!(skipped.iter().all(|r| r["reason"].as_str().unwrap().contains("paused by")), "{skipped:#?}");
    let before = f.lines("beats.txt").len();
    assert_eq!(f.cli(&["resume", "beat"]).0, 0);
    wait_for(Duration::from_secs(5), || (f.lines("beats.txt").len() >= before + 2).then_some(()))
        .expect("resume did not restore runs");
}

#[test]
fn unlock_of_a_stopped_holder_ends_the_run_and_the_woken_holder_stops_its_job() {
    let mut f = Fleet::new(&job(
        "long",
        &once_in(2),
        "lease = \"12s\"",
        "echo started >> $DIR/long.txt; sleep 20; echo done >> $DIR/long.txt",
    ));
    f.start("n1");
    wait_for(Duration::from_secs(10), || f.lines("long.txt").first().cloned()).expect("never started");
    f.signal(0, Signal::SIGSTOP);
    let (code, out, err) = f.cli(&["unlock", "long", "--reason", "stuck since the deploy", "--yes"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("abandoned long@"), "{out}");
    let h = f.history("long");
    assert_eq!(state(&h[0]), "abandoned");
    assert!(h[0]["reason"].as_str().unwrap().contains("stuck since the deploy"));
    f.signal(0, Signal::SIGCONT);
    wait_for(Duration::from_secs(10), || f.log("n1").contains("lease lost").then_some(()))
        .expect("holder never noticed");
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(f.lines("long.txt"), vec!["started"], "the unlocked job must not finish its work");
    f.stop_all();
    let h = f.history("long");
    assert_eq!((h.len(), state(&h[0])), (1, "abandoned"), "the holder must not overwrite the unlock: {h:#?}");
}

fn once_in(secs: i64) -> String {
    let t = chrono::Utc::now() + chrono::Duration::seconds(secs);
    format!("{} {} {} * * *", t.format("%-S"), t.format("%-M"), t.format("%-H"))
}

#[test]
fn trigger_runs_exactly_once_with_three_nodes_up() {
    let mut f = Fleet::new(&job("adhoc", YEARLY, "", "echo $SOLOCRON_RUN_ID $SOLOCRON_NODE_ID >> $DIR/adhoc.txt"));
    for id in ["n1", "n2", "n3"] {
        f.start(id);
    }
    std::thread::sleep(Duration::from_secs(1));
    for round in 1..=2 {
        let (code, out, err) = f.cli(&["trigger", "adhoc", "--wait", "--timeout", "10s"]);
        assert_eq!(code, 0, "round {round}: {out} {err}");
        assert!(out.contains("succeeded"), "{out}");
        assert_eq!(f.lines("adhoc.txt").len(), round, "{:?}", f.lines("adhoc.txt"));
    }
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(f.lines("adhoc.txt").len(), 2, "a manual run ran twice");
    let h = f.history("adhoc");
    assert_eq!(h.len(), 2);
    assert!(h.iter().all(|r| r["trigger"] == "manual" && state(r) == "succeeded"));
    let ms = |r: &Value| at(r, "scheduled_at").timestamp_subsec_millis();
    assert!(h.iter().all(|r| ms(r) != 0), "manual ticks never fall on a whole second");
}

#[test]
fn trigger_here_runs_in_this_process_and_reports_the_end() {
    let f = Fleet::new(&job("adhoc", YEARLY, "", "echo hello from $SOLOCRON_NODE_ID; exit 3"));
    f.migrate();
    let (code, out, err) = f.cli(&["trigger", "adhoc", "--here"]);
    assert_eq!(code, 1, "a failed run exits 1: {out} {err}");
    assert!(out.contains("hello from") && out.contains("failed"), "{out}");
    let h = f.history("adhoc");
    assert_eq!(
        (state(&h[0]), h[0]["exit_code"].as_i64(), h[0]["trigger"].as_str()),
        ("failed", Some(3), Some("manual"))
    );
}

#[test]
fn prune_deletes_only_old_ended_records_never_a_running_one() {
    let f = Fleet::new(&job("old", YEARLY, "", "true"));
    let url = format!("sqlite://{}/solocron.db", f.dir.path().display());
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        use solocron_core::*;
        let s = solocron_sqlite::SqliteStore::connect(&url, &Prefix::default()).await.unwrap();
        s.migrate().await.unwrap();
        let now = chrono::Utc::now();
        let claim = |days: i64| ClaimRequest {
            tick: Tick::new("old", now - chrono::Duration::days(days)),
            trigger: Trigger::Schedule,
            node: "n".into(),
            lease: Duration::from_secs(3600),
            mode: ClaimMode::Run { skip_if_running: false },
            nonce: 0,
        };
        let outcomes = s.claim(&[claim(40), claim(39), claim(35), claim(2)]).await.unwrap();
        let end = RunEnd {
            state: RunState::Succeeded,
            reason: None,
            exit_code: Some(0),
            output: String::new(),
            started_after: None,
        };
        for (i, o) in outcomes.into_iter().enumerate() {
            let ClaimOutcome::Won(lease) = o else { panic!() };
            if i != 1 {
                assert!(s.finish(&lease, &end).await.unwrap());
            }
        }
    });
    let (code, out, err) = f.cli(&["prune", "--older-than", "30d"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("deleted 2"), "{out}");
    let h = f.history("old");
    let states: Vec<&str> = h.iter().map(state).collect();
    assert_eq!(states, vec!["succeeded", "running"], "the recent and the running one stay: {h:#?}");
    let (code, _, err) = f.cli(&["prune", "--older-than", "2h"]);
    assert_eq!(code, 2);
    assert!(err.contains("too short"), "{err}");
}

#[test]
fn bad_admin_input_is_refused_with_exit_2_and_changes_nothing() {
    let f = Fleet::new(&job("real", YEARLY, "", "true"));
    f.migrate();
    let cases: [(&[&str], &str); 7] = [
        (&["trigger", "nope"], "unknown job `nope`"),
        (&["pause", "nope"], "unknown job `nope`"),
        (&["unlock", "nope", "--yes"], "unknown job `nope`"),
        (&["status", "nope"], "unknown job `nope`"),
        (&["prune", "--older-than", "3 weeks-ish"], "--older-than"),
        (&["history", "--since", "yesterday-ish"], "--since"),
        (&["history", "--state", "exploded"], "--state"),
    ];
    for (args, want) in cases {
        let (code, _, err) = f.cli(args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: expected `{want}` in {err}");
    }
    let s = f.cli_items(&["status", "--format", "json"]);
    assert!(s.as_array().unwrap().iter().all(|j| j["paused"].is_null()), "nothing changed");
    let out =
        std::process::Command::new(BIN).args(["status", "--store", "sqlite:///no/such/dir/x.db"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--store"));
}

#[test]
fn history_filters_and_shows_one_runs_output() {
    let mut f = Fleet::new(&job("talk", "* * * * * *", "", "echo said $SOLOCRON_RUN_ID"));
    f.start("n1");
    std::thread::sleep(Duration::from_millis(3500));
    f.stop_all();
    let all = f.cli_items(&["history", "--job", "talk", "--format", "json"]);
    let first = &all.as_array().unwrap()[0];
    let id = first["id"].as_str().unwrap();
    let (code, out, _) = f.cli(&["history", "--output", id]);
    assert_eq!(code, 0);
    assert_eq!(out.trim(), format!("said {id}"));
    let by_node =
        f.cli_items(&["history", "--node", "n1", "--state", "succeeded", "--since", "1h", "--format", "json"]);
    assert_eq!(by_node.as_array().unwrap().len(), all.as_array().unwrap().len());
    let none = f.cli_items(&["history", "--node", "nobody", "--format", "json"]);
    assert!(none.as_array().unwrap().is_empty());
    let (code, table, _) = f.cli(&["history"]);
    assert_eq!(code, 0);
    assert!(!table.contains('\x1b'), "no colour when stdout is not a terminal");
    assert!(table.contains("+00:00"), "times carry their offset: {table}");
}

/// Every name in a SQLite file's schema (tables, indexes, triggers), sorted.
fn schema_names(db: &std::path::Path) -> Vec<String> {
    use sqlx::Connection as _;
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let options = sqlx::sqlite::SqliteConnectOptions::new().filename(db).create_if_missing(true);
        let mut conn = sqlx::SqliteConnection::connect_with(&options).await.unwrap();
        sqlx::query("CREATE TABLE IF NOT EXISTS app_users (id INTEGER PRIMARY KEY)").execute(&mut conn).await.unwrap();
        let sql = r"SELECT name FROM sqlite_master WHERE name NOT LIKE 'sqlite\_%' ESCAPE '\' ORDER BY name";
        sqlx::query_scalar(sql).fetch_all(&mut conn).await.unwrap()
    })
}

#[test]
fn migrate_drop_removes_one_prefix_and_leaves_every_other_table_in_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("shared.db");
    let url = format!("sqlite://{}", db.display());
    // In the directory, with no solocron.toml there: only --store and --prefix count.
    let cli = |args: &[&str]| {
        let out = std::process::Command::new(BIN)
            .args(args)
            .args(["--store", &url])
            .current_dir(dir.path())
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    // `solocron_b`'s tables start with `solocron_` too: a prefix test by pattern would take them.
    for prefix in [None, Some("billing"), Some("solocron_b")] {
        let (code, err) = cli(&[&["migrate"][..], &prefix.map_or(vec![], |p| vec!["--prefix", p])].concat());
        assert_eq!(code, 0, "{prefix:?}: {err}");
    }
    let before = schema_names(&db);
    let of_default = |n: &String| n.starts_with("solocron_") && !n.starts_with("solocron_b_");
    assert!(before.iter().any(of_default) && before.iter().any(|n| n.starts_with("billing_")), "{before:?}");
    assert!(before.iter().any(|n| n.starts_with("solocron_b_")), "{before:?}");

    let (code, err) = cli(&["migrate", "--drop"]);
    assert_eq!(code, 2, "{err}");
    for said in ["would remove", "`solocron_*`", "prefix `solocron`", "Nothing changed", "--yes"] {
        assert!(err.contains(said), "expected `{said}` in: {err}");
    }
    assert_eq!(schema_names(&db), before, "refused: nothing changed");

    let (code, err) = cli(&["migrate", "--drop", "--yes"]);
    assert_eq!(code, 0, "{err}");
    let after = schema_names(&db);
    let others: Vec<String> = before.iter().filter(|n| !of_default(n)).cloned().collect();
    assert_eq!(after, others, "only the default prefix's tables, indexes and triggers go");
    assert!(after.contains(&"app_users".to_owned()));

    assert_eq!(cli(&["migrate", "--drop", "--yes"]).0, 0, "a second drop finds nothing and is fine");
    assert_eq!(schema_names(&db), others);
    let (code, err) = cli(&["status", "--prefix", "billing"]);
    assert_eq!(code, 0, "the other prefix still works: {err}");
    let (code, err) = cli(&["migrate", "--yes"]);
    assert_eq!(code, 2, "--yes alone is refused: {err}");
}
