//! Only `run` (when `[store] migrate` allows) and `migrate` change a store's schema. Read
//! and admin commands check it and say what to do: a missing or older schema names
//! `solocron migrate`, a newer one asks for a newer solocron; none of them creates or
//! upgrades anything (a newer CLI's `status` must not upgrade the schema under older nodes).
#![forbid(unsafe_code)]

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::{server_store, wait_exit, Fleet, BIN};
use solocron_conformance::server::POSTGRES;

const JOB: &str = "[[jobs]]\nname = \"a\"\nschedule = \"* * * * * *\"\ncommand = [\"/bin/true\"]\n";

/// (exit code, stderr) of `solocron ARGS` on `f`'s configuration.
fn refused(f: &Fleet, args: &[&str]) -> (i32, String) {
    let (code, _, err) = f.cli(args);
    (code, err)
}

#[test]
fn commands_other_than_run_and_migrate_leave_a_missing_schema_missing_and_name_migrate() {
    let Some(store) = server_store(POSTGRES) else { return };
    let f = Fleet::on(Some(&store), JOB);
    let commands: [&[&str]; 6] =
        [&["status"], &["history"], &["nodes"], &["pause", "a"], &["trigger", "a"], &["jobs", "export"]];
    for _round in 0..2 {
        // Twice: the first round must not have created anything the second would find.
        for args in commands {
            let (code, err) = refused(&f, args);
            assert_eq!(code, 2, "{args:?}: {err}");
            assert!(err.contains("has no solocron schema") && err.contains("`solocron migrate`"), "{args:?}: {err}");
        }
    }
    // `run` with `migrate = false` refuses too, at once, with the same advice.
    let no_migrate = f.path("no-migrate.toml");
    let text = std::fs::read_to_string(f.config()).unwrap().replace("[node]", "migrate = false\n[node]");
    std::fs::write(&no_migrate, text).unwrap();
    let mut run = Command::new(BIN)
        .args(["run", "--config"])
        .arg(&no_migrate)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let status = wait_exit(&mut run, Duration::from_secs(20)).expect("run with migrate = false must not wait");
    let mut err = String::new();
    std::io::Read::read_to_string(&mut run.stderr.take().unwrap(), &mut err).unwrap();
    assert_eq!(status.code(), Some(2), "{err}");
    assert!(err.contains("`solocron migrate`"), "{err}");
    // `migrate` creates it; then the same commands work.
    let (code, out, err) = f.cli(&["migrate"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("schema is current"), "{out}");
    for args in [&["status"][..], &["history"], &["nodes"]] {
        let (code, _, err) = f.cli(args);
        assert_eq!(code, 0, "{args:?}: {err}");
    }
}

/// Sets the SQLite store's schema version to `version`.
fn set_version(f: &Fleet, version: i64) {
    let url = format!("sqlite://{}", f.path("solocron.db").display());
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let mut conn = <sqlx::SqliteConnection as sqlx::Connection>::connect(&url).await.unwrap();
        sqlx::query("UPDATE solocron_schema SET version = ?").bind(version).execute(&mut conn).await.unwrap();
    });
}

/// The SQLite store's schema version.
fn version(f: &Fleet) -> i64 {
    let url = format!("sqlite://{}", f.path("solocron.db").display());
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let mut conn = <sqlx::SqliteConnection as sqlx::Connection>::connect(&url).await.unwrap();
        sqlx::query_scalar("SELECT max(version) FROM solocron_schema").fetch_one(&mut conn).await.unwrap()
    })
}

#[test]
fn a_schema_newer_or_older_than_the_binary_is_refused_with_what_to_do_and_left_as_it_is() {
    let f = Fleet::new(JOB);
    let (code, _, err) = f.cli(&["migrate"]);
    assert_eq!(code, 0, "{err}");
    let current = version(&f);
    set_version(&f, current + 1);
    let (code, err) = refused(&f, &["status"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("newer than this solocron understands") && err.contains("upgrade solocron"), "{err}");
    set_version(&f, current - 1);
    for args in [&["status"][..], &["pause", "a"]] {
        let (code, err) = refused(&f, args);
        assert_eq!(code, 2, "{err}");
        assert!(
            err.contains(&format!("schema version {}", current - 1)) && err.contains("`solocron migrate`"),
            "{err}"
        );
    }
    assert_eq!(version(&f), current - 1, "read and admin commands upgraded the schema");
    let (code, _, err) = f.cli(&["migrate"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(version(&f), current);
    let (code, _, err) = f.cli(&["status"]);
    assert_eq!(code, 0, "{err}");
}
