//! Spawning benchmark nodes as processes and reading their reports.

use std::io::BufRead as _;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::Value;
use solocron_core::Prefix;

use crate::node::NodeArgs;

/// A node process, its report file and (with `announce`) a channel of its stdout lines.
pub struct Proc {
    pub child: Child,
    pub report: String,
    pub id: String,
}

impl Proc {
    /// Asks the node to drain and write its report now (SIGTERM), instead of at the end
    /// of its `--seconds`.
    pub fn stop(&self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
    }
}

/// A fresh namespace per scenario round: its own prefix (each store derives its tables' or
/// keys' names from it) and, on SQLite, a new database file in `dir`.
pub fn fresh(store: &str, dir: &std::path::Path, tag: &str) -> (String, Prefix) {
    let n: u32 = std::process::id()
        ^ (std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos());
    let prefix = Prefix::parse(&format!("solocron_b{n:08x}")).expect("`solocron_b` and 8 hex digits is a valid prefix");
    if store.starts_with("sqlite") {
        (format!("sqlite://{}/{tag}-{n:08x}.db", dir.display()), prefix)
    } else {
        (store.to_owned(), prefix)
    }
}

/// Starts one benchmark node (this binary, as `node`); with `lines`, its stdout lines are
/// sent there as they come (failover reads who started what).
pub fn spawn(a: &NodeArgs, lines: Option<mpsc::Sender<String>>) -> Proc {
    let exe = std::env::current_exe().expect("own path");
    let mut cmd = Command::new(exe);
    cmd.arg("node")
        .args(["--store", &a.store, "--prefix", a.prefix.as_str(), "--node-id", &a.node_id])
        .args(["--jobs", &a.jobs.to_string(), "--schedule", &a.schedule, "--mode", &a.mode])
        .args(["--seconds", &a.seconds.to_string(), "--lease-ms", &a.lease_ms.to_string(), "--report", &a.report])
        .args(["--overlap", a.overlap.as_str()])
        .env("RUST_LOG", "error")
        .stdin(Stdio::null())
        .stderr(Stdio::null());
    if a.retry {
        cmd.arg("--retry");
    }
    if a.announce {
        cmd.arg("--announce");
    }
    if let Some(journal) = &a.journal {
        cmd.args(["--journal", journal]);
    }
    for schedule in &a.side_schedule {
        cmd.args(["--side-schedule", schedule]);
    }
    cmd.stdout(if lines.is_some() { Stdio::piped() } else { Stdio::null() });
    let mut child = cmd.spawn().expect("spawn a node");
    if let (Some(tx), Some(out)) = (lines, child.stdout.take()) {
        std::thread::spawn(move || {
            for l in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send(l);
            }
        });
    }
    Proc { child, report: a.report.clone(), id: a.node_id.clone() }
}

/// Waits for every node (at most `within`), then reads their reports.
pub fn reports(procs: Vec<Proc>, within: Duration) -> Vec<Value> {
    let until = std::time::Instant::now() + within;
    let mut out = Vec::new();
    for mut p in procs {
        loop {
            if p.child.try_wait().ok().flatten().is_some() {
                break;
            }
            if std::time::Instant::now() > until {
                let _ = p.child.kill();
                let _ = p.child.wait();
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        if let Ok(bytes) = std::fs::read(&p.report) {
            if let Ok(v) = serde_json::from_slice(&bytes) {
                out.push(v);
            }
        }
    }
    out
}

/// A 6-field expression firing once at `t` (UTC, whole second).
pub fn once_at(t: chrono::DateTime<chrono::Utc>) -> String {
    format!("{} {} {} * * *", t.format("%-S"), t.format("%-M"), t.format("%-H"))
}

/// The next whole second at least `secs` from now.
pub fn instant_in(secs: i64) -> chrono::DateTime<chrono::Utc> {
    let t = chrono::Utc::now() + chrono::Duration::seconds(secs);
    chrono::DateTime::from_timestamp(t.timestamp() + 1, 0).expect("in range")
}

/// CPU time (user + system, every thread's) of a process, in milliseconds, from
/// /proc/PID/stat; 0 if it is gone.
pub fn cpu_ms(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    crate::cpu::parse_stat(&stat).map_or(0, |(ticks, _)| crate::cpu::ticks_ms(ticks))
}
