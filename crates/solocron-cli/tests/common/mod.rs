//! Helpers for tests that run real `solocron` processes on a shared store: a SQLite file
//! in a test directory, or a fresh prefix on a test server.
#![allow(dead_code)]

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::Value;
use solocron_conformance::proxy::FaultProxy;
use solocron_conformance::server::{self, ServerUrl};
use solocron_conformance::server_unreachable;
use solocron_stores::{OpenError, Prefix, StoreError};

pub const BIN: &str = env!("CARGO_BIN_EXE_solocron");

/// A test directory with a config, a database and files the jobs write.
pub struct Fleet {
    pub dir: tempfile::TempDir,
    pub nodes: Vec<Node>,
}

pub struct Node {
    pub id: String,
    pub child: Child,
}

impl Fleet {
    /// A directory with `solocron.toml` holding `jobs` (TOML `[[jobs]]` entries) over
    /// `sqlite://DIR/solocron.db`. `$DIR` in `jobs` is replaced by the directory.
    pub fn new(jobs: &str) -> Fleet {
        Fleet::on(None, jobs)
    }

    /// Like [`Fleet::new`] on `store` (a `[store]` table's body), or SQLite in the directory.
    pub fn on(store: Option<&str>, jobs: &str) -> Fleet {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().display().to_string();
        let store = store.map_or(format!("url = \"sqlite://{d}/solocron.db\""), str::to_owned);
        let config = format!("[store]\n{store}\n[node]\nshutdown_grace = \"5s\"\n{}", jobs.replace("$DIR", &d));
        std::fs::write(dir.path().join("solocron.toml"), config).unwrap();
        Fleet { dir, nodes: Vec::new() }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn config(&self) -> PathBuf {
        self.path("solocron.toml")
    }

    /// Starts one `solocron run` node, logging to `DIR/<id>.log`.
    pub fn start(&mut self, id: &str) -> usize {
        self.start_with_env(id, &[])
    }

    /// Like [`Fleet::start`], with more environment variables for the node's process.
    pub fn start_with_env(&mut self, id: &str, env: &[(&str, &str)]) -> usize {
        let log = std::fs::File::create(self.path(&format!("{id}.log"))).unwrap();
        let child = Command::new(BIN)
            .args(["run", "--config"])
            .arg(self.config())
            .args(["--node-id", id, "--log-format", "json"])
            .env("RUST_LOG", "info")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.nodes.push(Node { id: id.to_owned(), child });
        self.nodes.len() - 1
    }

    pub fn signal(&self, i: usize, sig: Signal) {
        kill(Pid::from_raw(self.nodes[i].child.id() as i32), sig).unwrap();
    }

    /// SIGTERM to node `i`; returns its exit status (waits at most `within`).
    pub fn stop(&mut self, i: usize, within: Duration) -> Option<std::process::ExitStatus> {
        let _ = kill(Pid::from_raw(self.nodes[i].child.id() as i32), Signal::SIGTERM);
        wait_exit(&mut self.nodes[i].child, within)
    }

    pub fn stop_all(&mut self) {
        for i in 0..self.nodes.len() {
            let _ = kill(Pid::from_raw(self.nodes[i].child.id() as i32), Signal::SIGTERM);
        }
        for n in &mut self.nodes {
            if wait_exit(&mut n.child, Duration::from_secs(15)).is_none() {
                let _ = n.child.kill();
            }
        }
    }

    /// Run records, newest first, read through `solocron history --format json`; none while
    /// the store is still being made (see [`Fleet::history_if_ready`]).
    pub fn history(&self, job: &str) -> Vec<Value> {
        self.history_if_ready(job).unwrap_or_default()
    }

    /// [`Fleet::history`], or `None` while the store is still being made (a node creates
    /// the SQLite file, then its schema: read commands refuse a store without one).
    pub fn history_if_ready(&self, job: &str) -> Option<Vec<Value>> {
        let out = Command::new(BIN)
            .args(["history", "--config"])
            .arg(self.config())
            .args(["--job", job, "--limit", "10000", "--format", "json"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        if !out.status.success() && (err.contains("has no solocron schema") || err.contains("no store at")) {
            return None;
        }
        assert!(out.status.success(), "history failed: {err}");
        Some(serde_json::from_slice::<Value>(&out.stdout).unwrap()["items"].as_array().unwrap().clone())
    }

    /// Runs `solocron ARGS --config DIR/solocron.toml`; (exit code, stdout, stderr).
    pub fn cli(&self, args: &[&str]) -> (i32, String, String) {
        let out =
            Command::new(BIN).args(args).arg("--config").arg(self.config()).stdin(Stdio::null()).output().unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// Creates the store's schema (`solocron migrate`), as a first `run` would: read and
    /// admin commands need it.
    pub fn migrate(&self) {
        let (code, _, err) = self.cli(&["migrate"]);
        assert_eq!(code, 0, "solocron migrate failed: {err}");
    }

    /// The items of a list command's JSON (`status`, `history`, `nodes`): the API's envelope,
    /// `{items, next_cursor, …}`, whose items this returns.
    pub fn cli_items(&self, args: &[&str]) -> Value {
        let page = self.cli_json(args);
        assert!(page.get("next_cursor").is_some(), "solocron {args:?}: not a list's envelope: {page}");
        page["items"].clone()
    }

    /// Like [`Fleet::cli`], parsing stdout as JSON (the command must succeed).
    pub fn cli_json(&self, args: &[&str]) -> Value {
        let (code, out, err) = self.cli(args);
        assert_eq!(code, 0, "solocron {args:?} failed: {err}");
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("solocron {args:?}: not JSON ({e}): {out}"))
    }

    /// Starts a node with another configuration file (same store), e.g. to show drift.
    pub fn start_with(&mut self, id: &str, config: &Path) -> usize {
        let log = std::fs::File::create(self.path(&format!("{id}.log"))).unwrap();
        let child = Command::new(BIN)
            .args(["run", "--config"])
            .arg(config)
            .args(["--node-id", id, "--log-format", "json"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.nodes.push(Node { id: id.to_owned(), child });
        self.nodes.len() - 1
    }

    pub fn lines(&self, name: &str) -> Vec<String> {
        std::fs::read_to_string(self.path(name)).unwrap_or_default().lines().map(str::to_owned).collect()
    }

    pub fn log(&self, id: &str) -> String {
        std::fs::read_to_string(self.path(&format!("{id}.log"))).unwrap_or_default()
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        self.drop_server_tables();
        for n in &mut self.nodes {
            let _ = kill(Pid::from_raw(n.child.id() as i32), Signal::SIGCONT);
            let _ = n.child.kill();
            let _ = n.child.wait();
        }
    }
}

impl Fleet {
    /// Removes what this fleet's prefix holds on a server store (`solocron migrate --drop
    /// --yes`), so test runs do not pile tables and keys up in the shared servers. Only
    /// fresh test prefixes (`solocron_t...`, from [`server_store`]) are ever dropped.
    fn drop_server_tables(&self) {
        let cfg = std::fs::read_to_string(self.config()).unwrap_or_default();
        let is_test_prefix = cfg.lines().any(|l| l.starts_with(&format!("prefix = \"{}", server::TEST_ROOT)));
        if !is_test_prefix || cfg.contains("sqlite://") {
            return;
        }
        let out = Command::new(BIN).args(["migrate", "--drop", "--yes", "--config"]).arg(self.config()).output();
        if let Some(out) = out.ok().filter(|o| !o.status.success()) {
            eprintln!("cleanup: migrate --drop failed: {}", String::from_utf8_lossy(&out.stderr));
        }
    }
}

pub fn wait_exit(child: &mut Child, within: Duration) -> Option<std::process::ExitStatus> {
    let until = Instant::now() + within;
    while Instant::now() < until {
        if let Some(st) = child.try_wait().unwrap() {
            return Some(st);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

/// Polls `f` every 50 ms until it returns `Some`, at most `within`.
pub fn wait_for<T>(within: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let until = Instant::now() + within;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() >= until {
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A `[store]` body for a server store with a fresh prefix, or `None` (the test skips;
/// under CI, it fails) when the server is unreachable: see
/// [`server_unreachable`](solocron_conformance::server_unreachable).
///
/// The prefix is the shared datable `solocron_t<tag>`: [`Fleet`]'s drop removes it, and
/// what a killed run leaves behind is removed, once stale, by the store crates' tests
/// (their namespaces sweep every stale `solocron_t` prefix on the server).
pub fn server_store(server: ServerUrl) -> Option<String> {
    let url = reachable_url(server)?;
    Some(format!("url = \"{url}\"\nprefix = \"{}\"", server::fresh_prefix()))
}

/// `server`'s URL if a store connects to it, else what [`server_unreachable`] decides.
/// Found out once per test binary, as the store crates' tests do: a missing server costs
/// one connect timeout, and a server restarted by a test is not asked again mid-start.
fn reachable_url(server: ServerUrl) -> Option<String> {
    static PROBED: Mutex<Vec<(ServerUrl, Result<String, String>)>> = Mutex::new(Vec::new());
    let mut probed = PROBED.lock().unwrap_or_else(PoisonError::into_inner);
    let known = probed.iter().find(|(s, _)| *s == server).map(|(_, answer)| answer.clone());
    let answer = known.unwrap_or_else(|| {
        let answer = probe(server);
        probed.push((server, answer.clone()));
        answer
    });
    drop(probed); // server_unreachable panics under CI: never with the lock held
    answer.map_or_else(|why| server_unreachable(server.name, &why), Some)
}

/// Connects a store (the one the CLI would open) to `server`'s URL: `Err(why)` if the
/// server is unavailable; a panic if it answers but refuses (bad URL or credentials), or
/// if this build has no such store, since skipping would hide either.
fn probe(server: ServerUrl) -> Result<String, String> {
    let url = server.url();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a tokio runtime");
    runtime.block_on(async {
        match solocron_stores::open(&url, &Prefix::default()).await {
            Ok(_store) => Ok(url),
            Err(OpenError::Store(StoreError::Unavailable(why))) => Err(why),
            Err(e) => panic!("cannot use the {} test server: {e}", server.name),
        }
    })
}

/// Three nodes, a job every second for `secs`: every tick in the window ran exactly once
/// (read from what the job wrote), with no gap, and history agrees.
pub fn three_nodes_exactly_once(store: Option<&str>, secs: u64) {
    let record = r#"echo \"$SOLOCRON_SCHEDULED_AT $SOLOCRON_NODE_ID $SOLOCRON_FENCING_TOKEN\" >> $DIR/ticks.txt"#;
    let mut f = Fleet::on(
        store,
        &format!("[[jobs]]\nname = \"every-second\"\nschedule = \"* * * * * *\"\nlease = \"3s\"\ncommand = [\"/bin/sh\", \"-c\", \"{record}\"]\n"),
    );
    for id in ["n1", "n2", "n3"] {
        f.start(id);
    }
    std::thread::sleep(Duration::from_secs(secs));
    f.stop_all();
    let lines = f.lines("ticks.txt");
    let mut per_tick: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for l in &lines {
        let mut it = l.split_whitespace();
        per_tick.entry(it.next().unwrap().to_owned()).or_default().push(it.next().unwrap().to_owned());
    }
    let dups: Vec<_> = per_tick.iter().filter(|(_, v)| v.len() > 1).collect();
    assert!(dups.is_empty(), "ticks ran more than once: {dups:?}");
    let instants: Vec<chrono::DateTime<chrono::Utc>> = per_tick.keys().map(|k| k.parse().unwrap()).collect();
    assert!(instants.len() as u64 >= secs - 4, "only {} ticks in {secs} s; n1's log:\n{}", instants.len(), f.log("n1"));
    for w in instants.windows(2) {
        assert_eq!((w[1] - w[0]).num_milliseconds(), 1000, "a tick is missing between {} and {}", w[0], w[1]);
    }
    let hist = f.history("every-second");
    assert_eq!(hist.len(), lines.len(), "history and job output disagree");
    assert!(hist.iter().all(|r| state(r) == "succeeded"), "{hist:#?}");
    let mut per_node: std::collections::BTreeMap<&str, usize> = Default::default();
    for v in per_tick.values() {
        *per_node.entry(v[0].as_str()).or_default() += 1;
    }
    println!("{} ticks exactly once; runs per node: {per_node:?}", instants.len());
}

/// The instant at `key` of a JSON object (a run, a job). The JSON spells instants as the
/// API does, RFC 3339 in UTC with as many fractional digits as they have (`…:05Z`,
/// `…:05.120Z`): they compare as instants, never as text.
pub fn at(v: &Value, key: &str) -> chrono::DateTime<chrono::Utc> {
    let text = v[key].as_str().unwrap_or_else(|| panic!("no instant at `{key}` in {v}"));
    text.parse().unwrap_or_else(|e| panic!("`{key}`: `{text}` is not an RFC 3339 instant: {e}"))
}

pub fn state(r: &Value) -> &str {
    r["state"].as_str().unwrap()
}

pub fn exists(p: &Path) -> bool {
    p.exists()
}

/// One HTTP/1.1 request read from `stream` by the tests' small servers: its path, its
/// headers (names in lower case) and its body (by `Content-Length`).
pub fn read_http_request(stream: &std::net::TcpStream) -> (String, std::collections::HashMap<String, String>, Vec<u8>) {
    use std::io::{BufRead, Read};
    let mut reader = std::io::BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    let path = line.split_whitespace().nth(1).unwrap_or_default().to_owned();
    let mut headers = std::collections::HashMap::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).unwrap_or(0) == 0 || h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_owned());
        }
    }
    let len: usize = headers.get("content-length").and_then(|l| l.parse().ok()).unwrap_or(0);
    let mut body = vec![0u8; len];
    reader.read_exact(&mut body).unwrap();
    (path, headers, body)
}

/// A fault proxy in front of the server of `store` (a `[store]` body from
/// [`server_store`]), and the same body with its URL pointing at the proxy.
pub fn proxied(store: &str) -> (FaultProxy, String) {
    let url = store.lines().find_map(|l| l.strip_prefix("url = \"")).and_then(|l| l.strip_suffix('"'));
    let mut url = url::Url::parse(url.expect("a url line")).expect("a valid store URL");
    let host = url.host_str().expect("a server URL has a host").to_owned();
    let port = url.port().expect("the test servers' URLs name their port");
    let target: SocketAddr = (host.as_str(), port).to_socket_addrs().unwrap().next().expect("an address");
    let proxy = FaultProxy::start(target).unwrap();
    url.set_host(Some("127.0.0.1")).unwrap();
    url.set_port(Some(proxy.port())).unwrap();
    let body = store.lines().map(|l| if l.starts_with("url = ") { format!("url = \"{url}\"") } else { l.to_owned() });
    (proxy, body.collect::<Vec<_>>().join("\n"))
}
