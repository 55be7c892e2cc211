//! The daemon's life with the outside world: signals, and a store that is not there yet.
//! Real processes: the `solocron` binary, and a real `redis-server` started late.
#![forbid(unsafe_code)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// The daemon's stderr, line by line, as it comes.
type Log = Arc<Mutex<Vec<String>>>;

fn config(dir: &Path, store_url: &str, command: &str) -> std::path::PathBuf {
    let path = dir.join("solocron.toml");
    let text = format!(
        "[store]\nurl = \"{store_url}\"\n\n[node]\nshutdown_grace = \"10s\"\n\n[[jobs]]\nname = \"tick\"\nschedule = \"* * * * * *\"\nlease = \"6s\"\ncommand = [\"/bin/sh\", \"-c\", {command:?}]\n"
    );
    std::fs::write(&path, text).unwrap();
    path
}

fn start(config: &Path, extra: &[&str]) -> (Child, Log) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_solocron"))
        .arg("run")
        .arg("--config")
        .arg(config)
        .args(extra)
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the daemon");
    let log: Log = Arc::default();
    let lines = log.clone();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            lines.lock().unwrap().push(line);
        }
    });
    (child, log)
}

fn wait_for(log: &Log, what: &str, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if log.lock().unwrap().iter().any(|l| l.contains(what)) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

fn exit_within(child: &mut Child, within: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    None
}

fn signal(child: &Child, sig: Signal) {
    kill(Pid::from_raw(child.id() as i32), sig).unwrap();
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A store that is down when the node starts (a host booting, a database restarting) is
/// waited for, with the wait in the log; once it comes up, the node runs its ticks.
#[test]
fn a_store_that_comes_up_after_the_node_is_waited_for() {
    if Command::new("redis-server").arg("--version").output().is_err() {
        assert!(std::env::var_os("CI").is_none(), "redis-server is needed under CI");
        eprintln!("skipping: no redis-server");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let out = dir.path().join("ran");
    let cfg = config(dir.path(), &format!("redis://127.0.0.1:{port}"), &format!("echo ran >> {}", out.display()));
    let (mut node, log) = start(&cfg, &[]);
    assert!(wait_for(&log, "waiting for it", Duration::from_secs(10)), "no wait logged: {:?}", log.lock().unwrap());
    std::thread::sleep(Duration::from_millis(1500));
    assert!(node.try_wait().unwrap().is_none(), "the node gave up: {:?}", log.lock().unwrap());
    let mut redis = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
        .stdout(Stdio::null())
        .spawn()
        .expect("start redis-server");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !out.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    signal(&node, Signal::SIGTERM);
    let status = exit_within(&mut node, Duration::from_secs(15));
    let _ = redis.kill();
    let _ = redis.wait();
    assert!(out.exists(), "no tick ran once the store came up: {:?}", log.lock().unwrap());
    assert!(status.is_some_and(|s| s.success()), "exit {status:?}: {:?}", log.lock().unwrap());
}

/// `--fail-fast` keeps the old behaviour: an unreachable store at start is bad input.
#[test]
fn fail_fast_exits_at_once_when_the_store_is_unreachable() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), &format!("redis://127.0.0.1:{}", free_port()), "true");
    let (mut node, log) = start(&cfg, &["--fail-fast"]);
    let status = exit_within(&mut node, Duration::from_secs(15)).expect("the node exits");
    assert_eq!(status.code(), Some(2), "{:?}", log.lock().unwrap());
    std::thread::sleep(Duration::from_millis(100));
    assert!(log.lock().unwrap().iter().any(|l| l.contains("store.url")), "{:?}", log.lock().unwrap());
}

/// A SQLite path in a directory that does not exist is a typo, not a store that may come
/// up later: `run` exits 2 at once (without `--fail-fast`), naming the directory, and
/// creates nothing.
#[test]
fn a_sqlite_file_in_a_missing_directory_exits_2_at_once_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("typo");
    let cfg = config(dir.path(), &format!("sqlite://{}/solocron.db", missing.display()), "true");
    let started = Instant::now();
    let (mut node, log) = start(&cfg, &[]);
    let status = exit_within(&mut node, Duration::from_secs(10)).expect("the node exits instead of waiting");
    let took = started.elapsed();
    assert_eq!(status.code(), Some(2), "{:?}", log.lock().unwrap());
    std::thread::sleep(Duration::from_millis(100));
    let said = log.lock().unwrap().join("\n");
    assert!(said.contains(&format!("directory {} does not exist", missing.display())), "{said}");
    assert!(!said.contains("waiting for it"), "{said}");
    assert!(took < Duration::from_secs(3), "exited after {took:?}");
    assert!(!missing.exists(), "nothing created");
}

/// With `store.migrate = false` the schema is someone else's job: the daemon neither
/// creates nor upgrades it (nor does the library's scheduler behind it), and on a store
/// without it stops at once, saying what to run.
#[test]
fn a_node_told_not_to_migrate_leaves_the_schema_alone() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("s.db");
    let cfg = config(dir.path(), &format!("sqlite://{}", db.display()), "true");
    let text = std::fs::read_to_string(&cfg).unwrap().replace("[store]\n", "[store]\nmigrate = false\n");
    std::fs::write(&cfg, text).unwrap();
    let (mut node, log) = start(&cfg, &[]);
    let status = exit_within(&mut node, Duration::from_secs(15));
    assert_eq!(status.and_then(|s| s.code()), Some(2), "{:?}", log.lock().unwrap());
    std::thread::sleep(Duration::from_millis(100));
    let said = log.lock().unwrap().join("\n");
    assert!(said.contains("has no solocron schema") && said.contains("`solocron migrate`"), "{said}");
    let tables = Command::new("sqlite3").arg(&db).arg(".tables").output();
    let listed = match tables {
        Ok(out) => String::from_utf8_lossy(&out.stdout).into_owned(),
        // No sqlite3 CLI: an untouched schema leaves the file empty or absent.
        Err(_) => String::from_utf8_lossy(&std::fs::read(&db).unwrap_or_default()).into_owned(),
    };
    assert!(!listed.contains("solocron_"), "the node created its schema: {listed}");
}

/// A second process with the id of a live node refuses to start (they would renew each
/// other's leases), while a node restarted at once after a SIGKILL starts after checking.
#[test]
fn a_node_id_in_use_by_a_live_process_is_refused_and_a_dead_ones_is_taken() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/s.db", dir.path().display());
    let cfg = config(dir.path(), &url, "true");
    let (mut first, first_log) = start(&cfg, &["--node-id", "same"]);
    assert!(wait_for(&first_log, "run started", Duration::from_secs(15)), "{:?}", first_log.lock().unwrap());

    let (mut second, second_log) = start(&cfg, &["--node-id", "same"]);
    let status = exit_within(&mut second, Duration::from_secs(20)).expect("the second process exits");
    let lines = second_log.lock().unwrap().clone();
    assert_eq!(status.code(), Some(2), "{lines:?}");
    assert!(lines.iter().any(|l| l.contains("node id `same` is in use")), "{lines:?}");

    first.kill().unwrap();
    first.wait().unwrap();
    let (mut third, third_log) = start(&cfg, &["--node-id", "same"]);
    assert!(
        wait_for(&third_log, "run started", Duration::from_secs(25)),
        "a node restarted after a SIGKILL takes its id back: {:?}",
        third_log.lock().unwrap()
    );
    assert!(third_log.lock().unwrap().iter().any(|l| l.contains("checking that it is not still running")));
    signal(&third, Signal::SIGTERM);
    assert!(exit_within(&mut third, Duration::from_secs(15)).is_some_and(|s| s.success()));
}
