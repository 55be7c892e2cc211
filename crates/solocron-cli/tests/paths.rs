//! Where a SQLite store is: read commands (`status`, `history`) never create one, and a path in a configuration
//! file is relative to that file, whatever directory a command runs from.
#![forbid(unsafe_code)]

use std::path::Path;
use std::process::{Command, Output};

fn solocron(cwd: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_solocron")).current_dir(cwd).args(args).env("NO_COLOR", "1").output().unwrap()
}

#[test]
fn a_read_command_on_a_missing_store_says_so_and_creates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let typo = dir.path().join("typo.db");
    let url = format!("sqlite://{}", typo.display());
    for cmd in [&["history", "--store", &url][..], &["status", "--store", &url]] {
        let out = solocron(dir.path(), cmd);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{cmd:?}: {err}");
        assert!(err.contains("no store at") && err.contains("typo.db"), "{cmd:?}: {err}");
        assert!(!typo.exists(), "{cmd:?} created the store");
    }
    // `migrate` creates it; then reads work.
    assert!(solocron(dir.path(), &["migrate", "--store", &url]).status.success());
    assert!(typo.exists());
    assert!(solocron(dir.path(), &["history", "--store", &url]).status.success());
}

#[test]
fn a_relative_sqlite_path_in_a_configuration_is_relative_to_that_file() {
    let dir = tempfile::tempdir().unwrap();
    let sub = dir.path().join("sub");
    let elsewhere = dir.path().join("elsewhere");
    std::fs::create_dir_all(&sub).unwrap();
    std::fs::create_dir_all(&elsewhere).unwrap();
    let cfg = sub.join("solocron.toml");
    std::fs::write(
        &cfg,
        "[store]\nurl = \"sqlite://solocron.db\"\n\n[[jobs]]\nname = \"j\"\nschedule = \"@daily\"\ncommand = [\"/bin/true\"]\n",
    )
    .unwrap();
    let out = solocron(dir.path(), &["migrate", "--config", "sub/solocron.toml"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(sub.join("solocron.db").exists(), "the store is beside its configuration");
    assert!(!dir.path().join("solocron.db").exists(), "not in the directory the command ran from");
    let cfg = cfg.display().to_string();
    let out = solocron(&elsewhere, &["history", "--config", &cfg]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!elsewhere.join("solocron.db").exists(), "a read from elsewhere created a store there");
}

#[test]
fn a_command_without_a_configuration_says_how_to_name_one() {
    let dir = tempfile::tempdir().unwrap();
    for (cmd, how) in [
        (&["status"][..], &["--config FILE", "--store URL"][..]),
        (&["history", "--job", "x"], &["--config FILE", "--store URL"]),
        (&["check"], &["--config FILE"]),
        (&["run"], &["--config FILE"]),
    ] {
        let out = solocron(dir.path(), cmd);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{cmd:?}: {err}");
        assert!(err.contains("solocron.toml: no configuration file there"), "{cmd:?}: {err}");
        for flag in how {
            assert!(err.contains(flag), "{cmd:?}: expected `{flag}` in: {err}");
        }
    }
    assert!(!dir.path().join("solocron.db").exists(), "nothing is created");
}
