//! What the test binaries share: the test etcd, as `solocron_conformance::server` needs it
//! (how to reach it, how to list the key prefixes of tests), and etcd processes that die
//! with the test binary.
//!
//! The etcd is the one at `SOLOCRON_TEST_ETCD_URL` if set; else one already answering on
//! 127.0.0.1:2379 (CI starts one); else one this binary starts there, on a data directory
//! of its own, killed when the binary exits. If none can be had: skipped, or failed under CI.
#![allow(dead_code)] // each test binary uses its own part of this module

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use etcd_client::{Client, GetOptions};
use solocron_conformance::server::{self, Failure, TestServer};
use solocron_core::{Prefix, StoreError};
use solocron_etcd::EtcdStore;

/// The default test member's client address.
const DEFAULT_CLIENT: &str = "127.0.0.1:2379";

/// The etcd of `SOLOCRON_TEST_ETCD_URL`, or the one on [`DEFAULT_CLIENT`] (started if none
/// answers there).
pub struct Etcd;

/// A fresh prefix on the test etcd (keys `/solocron_t<tag>/...`), uninstalled when
/// dropped.
pub type Namespace = solocron_conformance::server::Namespace<Etcd>;

#[async_trait]
impl TestServer for Etcd {
    type Store = EtcdStore;
    const NAME: &'static str = server::ETCD.name;
    const URL_VAR: &'static str = server::ETCD.var;
    const URL_DEFAULT: &'static str = server::ETCD.default;
    /// etcd's leases are whole seconds (at least 2 s on a default cluster) and its leader
    /// scans for expired ones every 500 ms: the suite uses etcd-sized short leases.
    const LEASE_RESOLUTION: Duration = Duration::from_secs(2);
    // "Now" is the client's: nothing for the store to judge a claim's instant by.
    const HAS_CLOCK: bool = false;

    async fn connect(url: &str, prefix: &Prefix) -> Result<EtcdStore, StoreError> {
        EtcdStore::connect(url, prefix).await
    }

    /// The first segments of keys `/root.../...`: their prefixes.
    async fn names(url: &str, root: &str) -> Result<Vec<String>, Failure> {
        let mut client = client(url).await?;
        let options = GetOptions::new().with_prefix().with_keys_only();
        let resp = client.get(format!("/{root}"), Some(options)).await?;
        let mut names: Vec<String> = resp
            .kvs()
            .iter()
            .filter_map(|kv| Some(String::from_utf8_lossy(kv.key()).strip_prefix('/')?.split_once('/')?.0.to_owned()))
            .collect();
        names.dedup();
        Ok(names)
    }

    async fn serve_default() -> Result<(), String> {
        let served =
            tokio::task::spawn_blocking(|| if healthy(DEFAULT_CLIENT) { Ok(()) } else { start_default_member() });
        served.await.map_err(|e| format!("cannot start etcd: {e}"))?
    }
}

/// A plain client of the etcd at `url` (`etcd://host:port,...`), for what tests do behind
/// the store's back.
pub async fn client(url: &str) -> Result<Client, Failure> {
    let hosts = url.trim_start_matches("etcd://").trim_end_matches('/');
    let hosts = hosts.rsplit_once('@').map_or(hosts, |(_, h)| h);
    let endpoints: Vec<String> = hosts.split(',').map(|h| format!("http://{h}")).collect();
    Ok(tokio::time::timeout(Duration::from_secs(5), Client::connect(endpoints, None)).await??)
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
    solocron_os::die_with_parent(&mut cmd);
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
