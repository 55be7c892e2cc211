//! # solocron-etcd
//!
//! The etcd [`Store`] of solocron (etcd v3 API, 3.4 or later), for a fleet of hosts that
//! already runs etcd. Everything lives under one key prefix (default
//! [`DEFAULT_KEY_PREFIX`]), so solocron can share a cluster with other applications.
//!
//! ## What etcd guarantees, and what this store builds on it
//!
//! - **Linearizable transactions.** Every write is one `Txn` (compare-and-swap) that the
//!   cluster applies through Raft, in one total order, on a quorum; every read is a
//!   linearizable range. A claim creates a tick's record only if a compare shows it absent
//!   (`create_revision == 0`), so two nodes can never both win a tick. Decisions that read
//!   more than the record (overlap, pause, the fencing token) compare the `mod_revision` of
//!   the job's guard and pause keys as read just before: if another node changed them in
//!   between, the whole `Txn` fails, nothing is written, and the step is decided again from
//!   what the `Txn` re-read (bounded). No step is ever read-then-written without that compare.
//! - **Leases judged by the server's TTL.** A won run's *alive key* is attached, in the
//!   claim's `Txn`, to an etcd lease of the run's length rounded up to whole seconds (etcd's
//!   unit; etcd may raise it to its minimum TTL, by default 2 s — see below). The holder
//!   renews with a keep-alive (which etcd refuses once the TTL ran out) plus a `Txn`
//!   checking its record is still running under its owner and token. When the TTL runs out,
//!   etcd itself deletes the alive key: a running run without an alive key is expired, and
//!   only then can [`Store::recover`] act on it, so exactly one node recovers it. Expiry is
//!   decided by etcd's leader, never by a node's clock.
//! - **One lease per node and length.** A node's runs of one length share one etcd lease
//!   (a new one every 10 s): each claim refreshes it with a keep-alive sent beside its read
//!   or its `Txn` (claims within 5 ms of a confirmed keep-alive share it),
//!   instead of granting a lease per run (a grant is a consensus write; in a herd of
//!   thousands of ticks they were most of the claim's cost). A keep-alive for any of the
//!   runs keeps all of them alive, which changes nothing while their node lives (it renews
//!   them all) or after it dies or stalls (it renews none). A run's end deletes its alive
//!   key and leaves the lease to expire. The cost: a run whose end could not be recorded
//!   (the store unreachable until the engine gave up) stays alive, instead of being
//!   recovered, while its node keeps renewing other runs on the same lease.
//! - **Fencing tokens** come from a per-job counter kept in the job's guard key and
//!   advanced in the same `Txn` as the claim (or the retry), under the guard's compare:
//!   strictly larger for every later claim of the job, whoever makes it, and never reused
//!   (pruning leaves guards alone).
//! - **Leader changes.** Writes and linearizable reads need a quorum: while the cluster
//!   elects a leader they fail (as [`StoreError::Unavailable`]) and nothing is decided, so no
//!   guarantee above weakens; the engine retries. A `Txn` whose answer was lost may or may
//!   not have been applied, exactly like a lost SQL `COMMIT`: a claim reported failed may
//!   have won runs that nobody runs, which expire and are recovered. A new leader restarts
//!   every lease's TTL (etcd 3.4 keeps no remaining TTL unless lease checkpointing is on),
//!   so expiries come late after a leader change, never early. A keep-alive served by a
//!   deposed leader cannot make a renewal succeed: the renewal's `Txn` needs the quorum.
//!   With several endpoints in the URL, calls are balanced over them; a call that could not
//!   reach a member (a dead one) is sent again at once, as it was never applied; a read,
//!   which changes nothing, is also sent again after a connection reset or any other
//!   failure a retry may cure.
//!
//! ## What etcd lacks: a clock
//!
//! etcd has no time API. Instants recorded for information (`claimed_at`, `finished_at`,
//! `lease_until`, registrations' `first_seen`/`last_seen`, `changed_at`, manual request
//! ticks) and [`Store::now`] come from **this process's clock**, and prune's cutoff too.
//! `lease_until` is an estimate: this clock just before the lease was granted or kept
//! alive, plus the length, so it ends no later than etcd's TTL (which starts when etcd
//! receives the request and is the length rounded up); a claim that reuses a keep-alive
//! confirmed in the 5 ms before it counts from its own instant, so its estimate may end up
//! to 5 ms after the TTL when the length is whole seconds. Nothing that decides who holds a run
//! reads these instants. Consequences:
//!
//! - Lease precision is etcd's: whole-second TTLs, at least the cluster's minimum TTL
//!   (`ceil(1.5 × election timeout)`, 2 s with default settings), and expiry seen up to
//!   ~0.5 s after the TTL (etcd's expiry scan). Leases of under a few seconds are
//!   effectively longer. Use leases of several seconds with this store.
//! - Nodes' clocks only skew informational instants and the retention cutoff.
//!
//! ## Data layout
//!
//! Under the prefix `{p}` (`{job}` and `{node}` with `%` and `/` escaped):
//!
//! | key | value |
//! | --- | --- |
//! | `{p}schema` | key layout version, written once by [`Store::migrate`] |
//! | `{p}run/{at}/{attempt}/{job}` | a run record (JSON); `at` and `attempt` inverted so that ascending key order is newest first |
//! | `{p}alive/{at}/{attempt}/{job}` | the owner; attached to the run's etcd lease, present while it runs and the lease lives |
//! | `{p}job/{job}` | the job's guard (JSON): its last fencing token and its running runs |
//! | `{p}control/{job}` | the job's pause switch (JSON) |
//! | `{p}registry/{node}/{job}` | a registration (JSON) |
//! | `{p}request/{at}/{job}` | a manual run request (JSON), oldest first |
//!
//! [`Store::migrate`] writes (or checks) the layout version; the other steps do not read it.
//!
//! ## Cost per step (round trips)
//!
//! - claim: per chunk, one read together with a keep-alive of the node's lease per lease
//!   length (a grant instead when it is older than 10 s; nothing when one was confirmed in
//!   the last 5 ms), then one `Txn`. A chunk of at most 8 ticks whose jobs this instance has
//!   seen before skips the read (**one round trip**, the keep-alive beside the `Txn`): it is
//!   planned from the guards and switches last seen, and the `Txn`'s compares, the same as
//!   after a read, send it back to the read path if anything changed. A chunk holds as many ticks as fit etcd's 128 operations per
//!   `Txn` ([`TXN_OPS_MAX`]): 42 ticks of distinct jobs to 63 of one job, so a 1000-tick
//!   batch takes 16 to 24 chunks, each atomic on its own (a failure part-way leaves earlier
//!   chunks' runs won; they expire unrun and are recovered). Chunks of disjoint jobs are
//!   sent 4 at a time, each node starting at a different chunk.
//! - renew: a keep-alive and a `Txn` (a read first if this store instance did not claim or
//!   last renew the run; a lease grant if the length's whole seconds change).
//! - finish: a read, a `Txn` (which deletes the alive key; the lease, perhaps shared, is
//!   left to expire). recover: a read, (a grant for a retry), a `Txn`.
//! - expired: one read of every job guard and alive key, one of the candidate records.
//! - history: filters are applied here over pages of 500 records read newest first in
//!   key order, within the `since`/`until` window, at one revision; at most
//!   [`HISTORY_SCAN_MAX`] records are read per call. Queries for `running` runs read the
//!   job guards instead.
//!
//! ## Example
//!
//! ```no_run
//! use std::time::Duration;
//! use solocron_core::{ClaimMode, ClaimOutcome, ClaimRequest, Store, Tick, Trigger};
//! use solocron_etcd::{EtcdStore, DEFAULT_KEY_PREFIX};
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let store = EtcdStore::connect("etcd://10.0.0.1:2379,10.0.0.2:2379", DEFAULT_KEY_PREFIX).await?;
//! store.migrate().await?;
//!
//! let request = ClaimRequest {
//!     tick: Tick::new("backup", "2026-01-01T00:00:00Z".parse()?),
//!     trigger: Trigger::Schedule,
//!     node: "node-a".into(),
//!     lease: Duration::from_secs(30),
//!     mode: ClaimMode::Run { skip_if_running: true },
//! };
//! let outcomes = store.claim(&[request.clone()]).await?;
//! assert!(matches!(outcomes[0], ClaimOutcome::Won(_)));
//! // The same tick is never won twice, by any node.
//! assert_eq!(store.claim(&[request]).await?, vec![ClaimOutcome::Taken]);
//! # Ok(())
//! # }
//! ```
#![warn(missing_docs)]

mod admin;
mod claim;
mod codec;
mod etcd;
mod keys;
mod runs;
mod watch;

use std::collections::HashMap;
use std::fmt;
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use etcd_client::{Client, ConnectOptions};
use solocron_core::{
    ClaimOutcome, ClaimRequest, Ending, HistoryQuery, JobControl, JobDefinition, Lease, RecoverAction, RecoverOutcome,
    Registration, Renewal, RequestWatch, RunEnd, RunId, RunRecord, RunRequest, Store, StoreError, Tick,
};

pub use admin::HISTORY_SCAN_MAX;
pub use etcd::TXN_OPS_MAX;

use codec::StoredRun;
use keys::Keys;

/// The key prefix used when none is configured.
pub const DEFAULT_KEY_PREFIX: &str = "/solocron/";

/// How long connecting (and the first request, which checks the cluster answers) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How late etcd may see a lease run out: its leader revokes expired leases in a scan
/// every 500 ms.
const EXPIRY_LAG: Duration = Duration::from_millis(500);

/// Longest lease etcd grants: 9,000,000,000 s (its `MaxLeaseTTL`).
const LEASE_SECS_MAX: i64 = 9_000_000_000;

/// Most runs whose lease this store remembers between renewals; beyond, it forgets them all
/// (renewals then read first). Only the engine's own running runs are remembered.
const HELD_MAX: usize = 100_000;

/// A [`Store`] kept in etcd under a key prefix.
///
/// Separate instances (in one process or many) coordinate through etcd alone; an instance
/// only remembers, as a shortcut for renewals, the runs it claimed or renewed.
///
/// # Panics
///
/// [`Store::finish`] panics if given a `RunEnd` whose state is `running`: that is a bug in
/// the caller, not a condition of the store.
pub struct EtcdStore {
    client: Client,
    keys: Keys,
    /// `host:port` of each endpoint, for [`Store::describe`].
    hosts: Vec<String>,
    user: Option<String>,
    /// Runs this instance claimed or renewed, as last written: lets a renewal skip a read.
    held: Mutex<HashMap<RunId, Held>>,
    /// The etcd lease new runs of each TTL are attached to (see `claim`).
    shared: Mutex<HashMap<i64, claim::SharedLease>>,
    /// Jobs' guards and switches as last seen: lets a short claim skip its read.
    known: claim::Known,
}

/// A running record as this store last wrote it, at `revision`.
#[derive(Debug, Clone)]
struct Held {
    record: StoredRun,
    revision: i64,
}

impl fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdStore").field("target", &self.describe_target()).finish_non_exhaustive()
    }
}

/// Where to connect, parsed from an `etcd://` URL.
#[derive(Debug, PartialEq)]
struct Target {
    hosts: Vec<String>,
    user: Option<(String, String)>,
}

impl EtcdStore {
    /// Connects to the etcd cluster at `url`, `etcd://host:port[,host:port...]` with an
    /// optional `user:password@` (percent-encoded), keeping every key under `key_prefix`
    /// (ASCII letters, digits and `_-./`, ending with `/`, at most 128 bytes; usually
    /// [`DEFAULT_KEY_PREFIX`]). Checks that the cluster answers a linearizable read within
    /// 5 s. Does not write anything: call [`Store::migrate`].
    ///
    /// Fails with [`StoreError::Invalid`] for a malformed URL or prefix, and with
    /// [`StoreError::Unavailable`] if the cluster cannot be reached or has no leader.
    pub async fn connect(url: &str, key_prefix: &str) -> Result<EtcdStore, StoreError> {
        let target = parse_url(url)?;
        validate_prefix(key_prefix)?;
        let endpoints: Vec<String> = target.hosts.iter().map(|h| format!("http://{h}")).collect();
        let mut options = ConnectOptions::new()
            .with_connect_timeout(CONNECT_TIMEOUT)
            .with_timeout(etcd::CALL_TIMEOUT)
            .with_keep_alive(Duration::from_secs(10), Duration::from_secs(5))
            // A member cut off from the quorum refuses at once instead of waiting.
            .with_require_leader(true);
        if let Some((user, password)) = &target.user {
            options = options.with_user(user, password).with_auto_token_refresh(true);
        }
        let store = EtcdStore {
            hosts: target.hosts.clone(),
            user: target.user.as_ref().map(|(user, _)| user.clone()),
            keys: Keys::new(key_prefix),
            client: connect_client(&endpoints, options).await?,
            held: Mutex::new(HashMap::new()),
            shared: Mutex::new(HashMap::new()),
            known: claim::Known::default(),
        };
        // The client connects lazily: one linearizable read proves a member answers and the
        // cluster has a leader.
        let probe = etcd_client::GetOptions::new().with_count_only();
        etcd::range(&store.client, "a first read", &store.keys.schema(), probe)
            .await
            .map_err(|e| in_context(e, &store.describe_target()))?;
        Ok(store)
    }

    /// `etcd://[user:***@]hosts (key prefix ...)`: safe to log.
    fn describe_target(&self) -> String {
        let user = self.user.as_ref().map(|u| format!("{u}:***@")).unwrap_or_default();
        format!("etcd://{user}{} (key prefix {})", self.hosts.join(","), self.keys.prefix())
    }

    fn remember(&self, held: Held) {
        let Ok(id) = held.record.id() else { return };
        let mut map = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if map.len() >= HELD_MAX {
            map.clear();
        }
        map.insert(id, held);
    }

    fn recall(&self, run: &RunId) -> Option<Held> {
        self.held.lock().unwrap_or_else(|e| e.into_inner()).get(run).cloned()
    }

    fn forget(&self, run: &RunId) {
        self.held.lock().unwrap_or_else(|e| e.into_inner()).remove(run);
    }
}

/// A client for `endpoints`, within [`CONNECT_TIMEOUT`] (authentication, if any, happens here).
async fn connect_client(endpoints: &[String], options: ConnectOptions) -> Result<Client, StoreError> {
    let hosts = endpoints.join(",");
    match tokio::time::timeout(CONNECT_TIMEOUT, Client::connect(endpoints, Some(options))).await {
        Ok(Ok(client)) => Ok(client),
        Ok(Err(e)) => Err(in_context(etcd::etcd_err(e), &format!("cannot connect to etcd at {hosts}"))),
        Err(_) => Err(StoreError::Unavailable(format!("etcd at {hosts} did not answer within {CONNECT_TIMEOUT:?}"))),
    }
}

/// The same error, its message prefixed with `context`.
fn in_context(e: StoreError, context: &str) -> StoreError {
    match e {
        StoreError::Unavailable(m) => StoreError::Unavailable(format!("{context}: {m}")),
        StoreError::Invalid(m) => StoreError::Invalid(format!("{context}: {m}")),
    }
}

/// A lease length as etcd's TTL: whole seconds, rounded up (at least 1).
fn lease_secs(length: Duration) -> Result<i64, StoreError> {
    let secs = length.as_secs() + u64::from(length.subsec_nanos() > 0);
    i64::try_from(secs.max(1))
        .ok()
        .filter(|s| *s <= LEASE_SECS_MAX)
        .ok_or_else(|| StoreError::Invalid(format!("lease of {length:?} is longer than etcd grants")))
}

/// Decodes `%XX` escapes (for credentials in the URL).
fn percent_decode(s: &str) -> Result<String, StoreError> {
    let bad = || StoreError::Invalid("bad percent-encoding in the etcd URL's credentials".into());
    let mut out = Vec::with_capacity(s.len());
    let mut bytes = s.bytes();
    while let Some(b) = bytes.next() {
        if b == b'%' {
            let hex = [bytes.next().ok_or_else(bad)?, bytes.next().ok_or_else(bad)?];
            let hex = std::str::from_utf8(&hex).map_err(|_| bad())?;
            out.push(u8::from_str_radix(hex, 16).map_err(|_| bad())?);
        } else {
            out.push(b);
        }
    }
    String::from_utf8(out).map_err(|_| bad())
}

/// Parses `etcd://[user[:password]@]host:port[,host:port...][/]`.
fn parse_url(url: &str) -> Result<Target, StoreError> {
    let invalid = |why: &str| StoreError::Invalid(format!("{why}; expected etcd://host:port[,host:port...]"));
    let rest = url.strip_prefix("etcd://").ok_or_else(|| invalid("not an etcd URL"))?;
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.contains(['/', '?', '#']) {
        return Err(invalid("an etcd URL takes no path or query (the key prefix is configured apart)"));
    }
    let (user, hosts) = match rest.rsplit_once('@') {
        Some((credentials, hosts)) => {
            let (user, password) = credentials.split_once(':').unwrap_or((credentials, ""));
            (Some((percent_decode(user)?, percent_decode(password)?)), hosts)
        }
        None => (None, rest),
    };
    let hosts: Vec<String> = hosts.split(',').map(str::trim).map(str::to_owned).collect();
    for host in &hosts {
        let port = host.rsplit_once(':').map(|(h, p)| (h, p.parse::<u16>()));
        if !matches!(port, Some((h, Ok(_))) if !h.is_empty()) {
            return Err(StoreError::Invalid(format!(
                "etcd endpoint `{host}` is not host:port; expected etcd://host:port[,host:port...]"
            )));
        }
    }
    Ok(Target { hosts, user })
}

/// Checks a key prefix: ASCII letters, digits and `_-./`, ending with `/` (so that no other
/// prefix's keys fall in its ranges), 1 to 128 bytes.
fn validate_prefix(prefix: &str) -> Result<(), StoreError> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || "_-./".contains(c);
    if prefix.is_empty() || prefix.len() > 128 || !prefix.ends_with('/') || !prefix.chars().all(allowed) {
        return Err(StoreError::Invalid(format!(
            "bad etcd key prefix `{prefix}`: use ASCII letters, digits and _-./, end with /, at most 128 bytes (like {DEFAULT_KEY_PREFIX})"
        )));
    }
    Ok(())
}

#[async_trait]
impl Store for EtcdStore {
    fn describe(&self) -> String {
        self.describe_target()
    }

    async fn migrate(&self) -> Result<(), StoreError> {
        admin::migrate(self).await
    }

    async fn claim(&self, requests: &[ClaimRequest]) -> Result<Vec<ClaimOutcome>, StoreError> {
        claim::claim(self, requests).await
    }

    async fn renew(&self, lease: &Lease, length: Duration) -> Result<bool, StoreError> {
        runs::renew(self, lease, length).await
    }

    async fn renew_all(&self, renewals: &[Renewal]) -> Result<Vec<bool>, StoreError> {
        runs::renew_all(self, renewals).await
    }

    async fn finish(&self, lease: &Lease, end: &RunEnd) -> Result<bool, StoreError> {
        runs::finish(self, lease, end).await
    }

    async fn finish_all(&self, endings: &[Ending]) -> Result<Vec<bool>, StoreError> {
        runs::finish_all(self, endings).await
    }

    async fn expired(&self, limit: usize) -> Result<Vec<RunRecord>, StoreError> {
        runs::expired(self, limit).await
    }

    async fn recover(&self, run: &RunId, action: &RecoverAction) -> Result<RecoverOutcome, StoreError> {
        runs::recover(self, run, action).await
    }

    async fn history(&self, query: &HistoryQuery) -> Result<Vec<RunRecord>, StoreError> {
        admin::history(self, query).await
    }

    /// The client's clock: etcd has none to offer (see the crate docs). Nothing that decides
    /// who holds a run depends on it.
    async fn now(&self) -> Result<DateTime<Utc>, StoreError> {
        Ok(Utc::now())
    }

    async fn register(&self, node: &str, jobs: &[JobDefinition]) -> Result<(), StoreError> {
        admin::register(self, node, jobs).await
    }

    async fn registrations(&self) -> Result<Vec<Registration>, StoreError> {
        admin::registrations(self).await
    }

    async fn set_paused(&self, job: &str, paused: bool, by: &str, reason: Option<&str>) -> Result<(), StoreError> {
        admin::set_paused(self, job, paused, by, reason).await
    }

    async fn controls(&self) -> Result<Vec<JobControl>, StoreError> {
        admin::controls(self).await
    }

    async fn request_run(&self, job: &str, by: &str) -> Result<Tick, StoreError> {
        admin::request_run(self, job, by).await
    }

    fn expiry_lag(&self) -> Duration {
        EXPIRY_LAG
    }

    fn request_watch(&self) -> Option<Box<dyn RequestWatch>> {
        Some(Box::new(watch::EtcdRequestWatch::new(self.client.clone(), self.keys.family("request"))))
    }

    async fn pending_requests(&self, limit: usize) -> Result<Vec<RunRequest>, StoreError> {
        admin::pending_requests(self, limit).await
    }

    async fn unlock(&self, job: &str, reason: &str) -> Result<Vec<RunId>, StoreError> {
        runs::unlock(self, job, reason).await
    }

    async fn prune(&self, older_than: Duration, batch: usize) -> Result<u64, StoreError> {
        admin::prune(self, older_than, batch).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_hosts_and_optional_credentials() {
        let t = parse_url("etcd://a:2379,b:2380/").unwrap();
        assert_eq!((t.hosts, t.user), (vec!["a:2379".to_owned(), "b:2380".to_owned()], None));
        let t = parse_url("etcd://root:p%40ss@127.0.0.1:2379").unwrap();
        assert_eq!(t.user, Some(("root".into(), "p@ss".into())));
        for bad in ["http://a:2379", "etcd://a", "etcd://a:x", "etcd://a:1/prefix", "etcd://:1", "etcd://a:1,"] {
            assert!(matches!(parse_url(bad), Err(StoreError::Invalid(_))), "{bad}");
        }
    }

    #[test]
    fn prefixes_must_be_plain_and_end_with_a_slash() {
        for good in [DEFAULT_KEY_PREFIX, "/", "app/solocron-1/", "/a.b_c/"] {
            assert!(validate_prefix(good).is_ok(), "{good}");
        }
        for bad in ["", "/solocron", "/so locron/", "/é/", &format!("/{}/", "x".repeat(200))] {
            assert!(validate_prefix(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn lease_lengths_round_up_to_whole_seconds() {
        assert_eq!(lease_secs(Duration::from_millis(1)).unwrap(), 1);
        assert_eq!(lease_secs(Duration::from_millis(800)).unwrap(), 1);
        assert_eq!(lease_secs(Duration::from_millis(1001)).unwrap(), 2);
        assert_eq!(lease_secs(Duration::from_secs(30)).unwrap(), 30);
        assert!(lease_secs(Duration::from_secs(u64::MAX)).is_err());
    }
}
