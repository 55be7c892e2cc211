//! What the test binaries share: an etcd to test against, fresh key prefixes and their
//! cleanup, and etcd processes that die with the test binary.
//!
//! The etcd is the one at `SOLOCRON_TEST_ETCD_URL` if set; else one already answering on
//! 127.0.0.1:2379 (CI starts one); else one this binary starts there, on a data directory
//! of its own, killed when the binary exits. If none can be had: skipped, or failed under CI.
#![allow(dead_code)] // each test binary uses its own part of this module

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use etcd_client::{Client, DeleteOptions, GetOptions};
use solocron_etcd::EtcdStore;

/// Every test prefix starts with this.
const TEST_ROOT: &str = "/solocron-test/";

/// The default test member's client address.
const DEFAULT_CLIENT: &str = "127.0.0.1:2379";

/// The etcd to test against as an `etcd://` URL, or why there is none. Found (or started)
/// once per test binary.
pub fn etcd_url() -> Result<String, String> {
    static URL: OnceLock<Result<String, String>> = OnceLock::new();
    URL.get_or_init(|| {
        if let Ok(url) = std::env::var("SOLOCRON_TEST_ETCD_URL") {
            return Ok(url);
        }
        let url = format!("etcd://{DEFAULT_CLIENT}");
        if healthy(DEFAULT_CLIENT) {
            return Ok(url);
        }
        start_default_member()?;
        Ok(url)
    })
    .clone()
}

/// Starts the default member on 127.0.0.1:2379 and waits until it answers. Tries again if
/// it exits at once: the member of the previous test binary may still hold the ports for a
/// moment while it dies with that binary.
fn start_default_member() -> Result<(), String> {
    let member = Member { name: "default".into(), client: 2379, peer: 2380 };
    let cluster = member.initial_cluster_entry();
    let mut why = String::new();
    for _ in 0..3 {
        let mut child = member.start(&cluster).map_err(|e| format!("cannot start etcd: {e}"))?;
        let deadline = Instant::now() + Duration::from_secs(20);
        why.clear();
        while Instant::now() < deadline {
            if healthy(DEFAULT_CLIENT) {
                return Ok(());
            }
            if let Ok(Some(status)) = child.try_wait() {
                why = format!("etcd exited at once ({status}); see etcd.log in its data directory");
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        if healthy(DEFAULT_CLIENT) {
            return Ok(());
        }
        if why.is_empty() {
            why = format!("etcd on {DEFAULT_CLIENT} not healthy within 20 s");
        }
        let _ = child.kill();
        std::thread::sleep(Duration::from_millis(500));
    }
    Err(why)
}

/// Whether the etcd member at `addr` answers `/health` with a leader.
pub fn healthy(addr: &str) -> bool {
    let Ok(addr) = addr.parse::<SocketAddr>() else { return false };
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_millis(300)) else { return false };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    if stream.write_all(b"GET /health HTTP/1.0\r\nHost: etcd\r\n\r\n").is_err() {
        return false;
    }
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer.contains("\"health\":\"true\"")
}

/// Waits until every member in `addrs` is healthy.
pub fn wait_healthy(addrs: &[String], within: Duration) -> Result<(), String> {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if addrs.iter().all(|a| healthy(a)) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Err(format!("etcd at {addrs:?} not healthy within {within:?}"))
}

/// One etcd member on loopback ports.
pub struct Member {
    pub name: String,
    pub client: u16,
    pub peer: u16,
}

impl Member {
    /// `name=http://127.0.0.1:peer`, for `--initial-cluster`.
    pub fn initial_cluster_entry(&self) -> String {
        format!("{}=http://127.0.0.1:{}", self.name, self.peer)
    }

    pub fn client_addr(&self) -> String {
        format!("127.0.0.1:{}", self.client)
    }

    /// Starts the member of `initial_cluster` on a fresh data directory; it dies with this
    /// process. Its output goes to `etcd.log` in the data directory.
    pub fn start(&self, initial_cluster: &str) -> std::io::Result<Child> {
        let dir = fresh_data_dir()?;
        let log = std::fs::File::create(dir.join("etcd.log"))?;
        let (client, peer) = (format!("http://127.0.0.1:{}", self.client), format!("http://127.0.0.1:{}", self.peer));
        let binary = std::env::var("SOLOCRON_TEST_ETCD_BIN").unwrap_or_else(|_| "etcd".into());
        let mut cmd = Command::new(binary);
        cmd.arg("--name").arg(&self.name);
        cmd.arg("--data-dir").arg(dir.join("data"));
        cmd.args(["--listen-client-urls", &client, "--advertise-client-urls", &client]);
        cmd.args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer]);
        cmd.args(["--initial-cluster", initial_cluster, "--initial-cluster-state", "new"]);
        cmd.stdin(Stdio::null()).stdout(log.try_clone()?).stderr(log);
        spawn_tied(cmd)
    }
}

/// Spawns `cmd` so that it dies with this process: from a thread that lives as long as the
/// process, with `PR_SET_PDEATHSIG` (which fires when the *thread* that forked the child
/// exits, so a test's own thread would kill it too early).
pub fn spawn_tied(mut cmd: Command) -> std::io::Result<Child> {
    type Job = (Command, mpsc::Sender<std::io::Result<Child>>);
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<Job>>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("etcd-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
            })
            .expect("spawner thread");
        Mutex::new(tx)
    });
    // SAFETY: the closure only calls prctl(2), which is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL).map_err(std::io::Error::from)
        });
    }
    let (reply, answer) = mpsc::channel();
    spawner.lock().unwrap().send((cmd, reply)).expect("spawner alive");
    answer.recv().expect("spawner answers")
}

/// A new data directory under the temp dir, named after this process; removes those of
/// processes that are gone (their etcd died with them).
fn fresh_data_dir() -> std::io::Result<PathBuf> {
    static N: AtomicU64 = AtomicU64::new(0);
    let tmp = std::env::temp_dir();
    if let Ok(entries) = std::fs::read_dir(&tmp) {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let pid = name.strip_prefix("solocron-etcd-test-").and_then(|r| r.split('-').next());
            if pid.is_some_and(|p| !Path::new("/proc").join(p).exists()) {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
    let dir = tmp.join(format!("solocron-etcd-test-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed)));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// `n` free loopback ports (bound and released at once: free for a moment).
pub fn free_ports(n: usize) -> Vec<u16> {
    let listeners: Vec<_> = (0..n).map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("bind")).collect();
    listeners.iter().map(|l| l.local_addr().expect("addr").port()).collect()
}

/// `/solocron-test/<8 hex of creation second><8 random hex>/`: unique, datable by cleanup.
pub fn fresh_prefix() -> String {
    format!("{TEST_ROOT}{}/", solocron_conformance::naming::fresh_tag())
}

/// The host list of an `etcd://` URL as client endpoints.
fn endpoints(url: &str) -> Vec<String> {
    let hosts = url.trim_start_matches("etcd://").trim_end_matches('/');
    let hosts = hosts.rsplit_once('@').map_or(hosts, |(_, h)| h);
    hosts.split(',').map(|h| format!("http://{h}")).collect()
}

/// Deletes every key under `prefix`, and (with `stale`) test prefixes older than
/// [`STALE_AFTER`](solocron_conformance::naming::STALE_AFTER); ignores (but prints) failures: cleanup must never fail a test.
async fn delete_prefix(url: &str, prefix: &str, stale: bool) {
    let connect = Client::connect(endpoints(url), None);
    let mut client = match tokio::time::timeout(Duration::from_secs(5), connect).await {
        Ok(Ok(client)) => client,
        _ => return eprintln!("cleanup of {prefix}: cannot connect to {url}"),
    };
    let mut doomed = vec![prefix.to_owned()];
    if stale {
        let options = GetOptions::new().with_prefix().with_keys_only();
        if let Ok(resp) = client.get(TEST_ROOT, Some(options)).await {
            for kv in resp.kvs() {
                let key = String::from_utf8_lossy(kv.key());
                let Some(id) = key.strip_prefix(TEST_ROOT).and_then(|r| r.get(..16)) else { continue };
                if solocron_conformance::naming::is_stale(id) {
                    doomed.push(format!("{TEST_ROOT}{id}/"));
                }
            }
        }
        doomed.dedup();
    }
    for prefix in doomed {
        if let Err(e) = client.delete(prefix.as_str(), Some(DeleteOptions::new().with_prefix())).await {
            eprintln!("cleanup of {prefix}: {e}");
        }
    }
}

/// A fresh key prefix on the test etcd, deleted when this guard is (even when the test
/// panics).
pub struct Namespace {
    pub url: String,
    pub prefix: String,
}

impl Namespace {
    /// A new, empty prefix; `None` (or a panic under CI) if no etcd can be had.
    pub async fn new() -> Option<Namespace> {
        let url = match tokio::task::spawn_blocking(etcd_url).await.expect("etcd lookup") {
            Ok(url) => url,
            Err(why) => return solocron_conformance::server_unreachable("etcd", &why),
        };
        static STALE: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
        STALE.get_or_init(|| delete_prefix(&url, "/solocron-test/none/", true)).await;
        Some(Namespace { url, prefix: fresh_prefix() })
    }

    /// A new, independent store (its own client) on this prefix, not migrated.
    pub async fn open(&self) -> EtcdStore {
        EtcdStore::connect(&self.url, &self.prefix).await.expect("connect")
    }

    /// A new store on this prefix, migrated.
    pub async fn migrated(&self) -> EtcdStore {
        let store = self.open().await;
        solocron_core::Store::migrate(&store).await.expect("migrate");
        store
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        if std::env::var_os("SOLOCRON_TEST_KEEP").is_some() {
            return eprintln!("keeping keys under {} (SOLOCRON_TEST_KEEP)", self.prefix);
        }
        // Drop cannot await, and may run inside the test's runtime: clean up from a thread
        // with a runtime of its own.
        let (url, prefix) = (self.url.clone(), self.prefix.clone());
        let cleanup =
            std::thread::spawn(move || match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(runtime) => runtime.block_on(delete_prefix(&url, &prefix, false)),
                Err(e) => eprintln!("cleanup of {prefix}: no runtime: {e}"),
            });
        let _ = cleanup.join();
    }
}
