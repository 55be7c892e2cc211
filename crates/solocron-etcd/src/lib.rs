//! # solocron-etcd
//!
//! The etcd [`Store`](solocron_core::Store) of solocron (etcd v3 API, 3.4 or later), for a fleet of hosts that
//! already runs etcd. Everything lives under one key prefix, the store's [`Prefix`] spelt
//! `/name/` ([`Prefix::etcd_key_prefix`]; `/solocron/` by default), so solocron can share a
//! cluster with other applications and other fleets. [`SchemaStore::uninstall`](solocron_core::SchemaStore::uninstall) deletes that
//! prefix's range and nothing else.
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
//! - **A claim asked again.** A run record keeps the nonce of the claim that created it.
//!   A `Run` request of the same node with the same nonce, finding that record still
//!   `running`, is granted it again: the claim's `Txn` compares the record's `mod_revision`
//!   as read (a finish, renewal or recovery in between fails it, and the request is decided
//!   again from the re-read) and puts the record with a fresh lease, its alive key on the
//!   node's etcd lease as for a won tick. The token and `claimed_at` stay; nothing else
//!   changes, so every other request for an existing record still finds it taken.
//! - **Leases judged by the server's TTL.** A won run's *alive key* is attached, in the
//!   claim's `Txn`, to an etcd lease of the run's length rounded up to whole seconds (etcd's
//!   unit; etcd may raise it to its minimum TTL, by default 2 s — see below). The holder
//!   renews with a keep-alive (which etcd refuses once the TTL ran out) plus a `Txn`
//!   checking its record is still running under its owner and token. When the TTL runs out,
//!   etcd itself deletes the alive key: a running run without an alive key is expired, and
//!   only then can [`RunStore::recover`](solocron_core::RunStore::recover) act on it, so exactly one node recovers it. Expiry is
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
//! etcd has no time API. [`StoreBase::now`], which schedules follow, is **the fleet's clock**:
//! this process's clock plus the median offset of the clocks of every process using the
//! prefix, which they tell each other through two watched keys (`clock.rs`), so a node
//! whose clock is off among three or more runs no tick early or late. Instants recorded for
//! information (`claimed_at`, `finished_at`, `lease_until`, registrations'
//! `first_seen`/`last_seen`, pause switches' and managed jobs' `changed_at`, manual request
//! ticks, nodes' heartbeats, actions' instants) come from **this process's clock**, and
//! prune's cutoff too.
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
//! - Nodes' clocks only skew informational instants, the retention cutoff, and when a
//!   failure retry becomes due (see below).
//!
//! ## Failure retries
//!
//! [`RunStore::finish_for_retry`](solocron_core::RunStore::finish_for_retry) records a failed run's end exactly as [`RunStore::finish`](solocron_core::RunStore::finish)
//! does and, in the same `Txn` (only if that end's compares hold), creates the tick's next
//! attempt as a `waiting` record (trigger `retry`, the same node, no token, no etcd lease,
//! `lease_until` = this process's clock + the backoff: its not-before) and its index key
//! `{p}wait/{not_before}/...`. A retry is due once the clock of the node looking passes its
//! not-before (etcd has no clock to ask; skew moves when a retry starts, never who starts
//! it). [`RunStore::expired`](solocron_core::RunStore::expired) lists the due ones (a range of the index up to now) beside the
//! expired running runs, oldest `lease_until` first. [`RunStore::recover`](solocron_core::RunStore::recover) on a due one starts
//! that same record (`running`, the job's next token from its guard, a fresh etcd lease as a
//! recovery's retry gets) or ends it `abandoned`, deleting its index key, in one `Txn`
//! comparing the record's revision (and the guard's for a token): exactly one recoverer
//! wins. A waiting retry is not in its job guard's running runs (overlap checks, the runs
//! in progress do not see it), and prune keeps its record.
//!
//! ## Data layout
//!
//! Under the prefix `{p}` (`{job}` and `{node}` with `%` and `/` escaped):
//!
//! | key | value |
//! | --- | --- |
//! | `{p}schema` | key layout version, written once by [`SchemaStore::migrate`](solocron_core::SchemaStore::migrate) |
//! | `{p}run/{at}/{attempt}/{job}` | a run record (JSON); `at` and `attempt` inverted so that ascending key order is newest first |
//! | `{p}alive/{at}/{attempt}/{job}` | the owner; attached to the run's etcd lease, present while it runs and the lease lives |
//! | `{p}wait/{not_before}/{at}/{attempt}/{job}` | the run key of a `waiting` retry, present while it waits; due ones first |
//! | `{p}job/{job}` | the job's guard (JSON): its last fencing token and its running runs |
//! | `{p}control/{job}` | the job's pause switch (JSON) |
//! | `{p}registry/{node}/{job}` | a registration (JSON) |
//! | `{p}request/{at}/{job}` | a manual run request (JSON), oldest first |
//! | `{p}node/{node}/beat`, `…/start`, `…/left` | a node's last heartbeat (JSON), its start, its goodbye |
//! | `{p}action/{at↓}/{tag}` | an operator's action (JSON), newest first: the audit log |
//! | `{p}managed/job/{job}` | a managed job: who and when (a JSON line), then its definition as given |
//! | `{p}managed/rev/{job}/{read↓}` | a revision of a managed job, the same way (no definition: a delete), newest first |
//! | `{p}managed/count`, `…/version` | how many managed jobs there are; the key every write of one puts |
//!
//! [`SchemaStore::migrate`](solocron_core::SchemaStore::migrate) writes (or checks) the layout version; the other steps do not read it.
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
//!   sent 4 at a time, each node starting at a different chunk. The read (and a failed
//!   `Txn`'s re-read) gets the records of `Run` requests with a nonce in full, not keys
//!   only: finding a tick taken costs bytes, not a round trip, even when the request could
//!   have been its own claim asked again.
//! - renew: a keep-alive and a `Txn` (a read first if this store instance did not claim or
//!   last renew the run; a lease grant if the length's whole seconds change).
//! - finish: a read, a `Txn` (which deletes the alive key; the lease, perhaps shared, is
//!   left to expire). finish_for_retry: the same, its `Txn` also creating the waiting
//!   retry. recover: a read, (a grant for a retry), a `Txn`.
//! - expired: one read of every job guard and alive key, one of the candidate records; one
//!   read of the due retries' index keys (at most `limit`; for some namespaces, pages of
//!   500 until `limit` of theirs), one of their records.
//! - pending_requests: pages of 128 requests, each with one read of their record keys.
//! - prune: one read of every job guard and waiting retry's index key, pages of 1000 old
//!   record keys (at most [`PRUNE_SCAN_MAX`] per call), one delete `Txn` per
//!   [`TXN_OPS_MAX`] records; the old requests in one range delete (for some namespaces,
//!   a read of their keys and deletes of theirs); old actions and silent nodes.
//! - history: filters are applied here over pages of 500 records read newest first in
//!   key order, within the `since`/`until` window, at one revision; at most
//!   [`HISTORY_SCAN_MAX`] records are read per call, other namespaces' counted like other
//!   jobs'. Queries for `running` runs read the job guards instead.
//! - register: one read of the node's registrations (pages of 500), then one `Txn` per
//!   [`TXN_OPS_MAX`] writes (see below).
//!
//! ## Namespaces
//!
//! A job's full name holds its namespace (`billing/sync`; see [`Namespaces`](solocron_core::Namespaces)), and the last
//! segment of every key of a job's run, guard or request is that name, escaped: the
//! namespace is read from the key alone (the part of the job before its first `/`, or
//! `default`). [`RunStore::expired`](solocron_core::RunStore::expired), [`RequestStore::pending_requests`](solocron_core::RequestStore::pending_requests) and [`HistoryStore::prune`](solocron_core::HistoryStore::prune) pass
//! over other namespaces' keys before they count anything against their `limit` (or
//! `batch`), and read no record of them. They read the ranges they read for every
//! namespace (every guard; the due retries' index and the requests in pages until enough
//! are found); prune's scan of the old records stops at [`PRUNE_SCAN_MAX`] keys, so another
//! namespace's old records beyond that many, which only its own nodes prune, can leave this
//! namespace's older ones unpruned until those are gone (a warning says so).
//! [`HistoryStore::history`](solocron_core::HistoryStore::history) asked for one namespace passes over other namespaces' records (or
//! guards) by their keys too, without decoding them, but reads them: they count against
//! [`HISTORY_SCAN_MAX`] as other jobs' records do.
//!
//! ## Registrations
//!
//! [`RegistryStore::register`](solocron_core::RegistryStore::register) records that a node runs exactly the jobs listed: it reads the
//! node's registrations (its own range, `{p}registry/{node}/`), then puts each listed job's
//! (`first_seen` kept, `last_seen` from this process's clock) and deletes each other one
//! found. Every key written is compared with the revision read; a lost compare reads that
//! `Txn`'s keys again and decides it again (bounded).
//!
//! etcd limits a `Txn` to [`TXN_OPS_MAX`] operations, so the step is **atomic only up to
//! that many writes** (listed jobs plus unlisted ones found): one `Txn`. A longer list is
//! written in several `Txn`s of that size, each atomic on its own, the puts (by job) before
//! the deletes. A reader in between sees some registrations refreshed and others not yet,
//! and the jobs no longer listed still there, but never misses a job the node listed before
//! and still lists. A failure part-way leaves the earlier `Txn`s applied; the node's next
//! registration completes the change. Once a call returns `Ok`, the node's registrations
//! are its list exactly (unless the same node registered another list at the same time:
//! the two then mix key by key).
//!
//! ## Managed jobs
//!
//! A revision of a managed job is the etcd revision of the `Txn` that wrote it: etcd numbers
//! its transactions in the order it applies them, so revisions follow commit order and are
//! never reused (they are not 1, 2, 3: every other write in the cluster takes a number too).
//! [`ManagedStore::put_job`](solocron_core::ManagedStore::put_job) and [`ManagedStore::delete_job`](solocron_core::ManagedStore::delete_job) are a read and one `Txn` comparing the job
//! key's revision (and, when they create or delete a job, the count key's, which keeps
//! [`MANAGED_JOBS_MAX`](solocron_core::MANAGED_JOBS_MAX) exact), decided again on a lost
//! compare (bounded); the `Txn` also appends the revision and puts the version key, which
//! the request watch watches, so nodes waiting on it read the change at once. Then a count
//! of the revisions: at most [`JOB_REVISIONS_KEPT_MAX`] are kept per prefix, the oldest (of
//! any job; a job's present definition stays however old it is) dropped beyond that.
//! [`ManagedStore::managed_version`](solocron_core::ManagedStore::managed_version) is one read of the version key's revision;
//! [`ManagedStore::managed_jobs`](solocron_core::ManagedStore::managed_jobs) reads pages of 200 at one revision; [`ManagedStore::job_revisions`](solocron_core::ManagedStore::job_revisions)
//! of one job reads its keys in order, of every job has etcd sort the whole (bounded)
//! range by revision; then one read of the values.
//!
//! ## Example
//!
//! ```no_run
//! use std::time::Duration;
//! use solocron_core::{ClaimMode, ClaimOutcome, ClaimRequest, ClaimStore, Prefix, SchemaStore, Tick, Trigger};
//! use solocron_etcd::EtcdStore;
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let store = EtcdStore::connect("etcd://10.0.0.1:2379,10.0.0.2:2379", &Prefix::default()).await?;
//! store.migrate().await?;
//!
//! let request = ClaimRequest {
//!     tick: Tick::new("backup", "2026-01-01T00:00:00Z".parse()?),
//!     trigger: Trigger::Schedule,
//!     node: "node-a".into(),
//!     lease: Duration::from_secs(30),
//!     mode: ClaimMode::Run { skip_if_running: true },
//!     nonce: 0,
//! };
//! let outcomes = store.claim(&[request.clone()]).await?;
//! assert!(matches!(outcomes[0], ClaimOutcome::Won(_)));
//! // The same tick is never won twice, by any node.
//! assert_eq!(store.claim(&[request]).await?, vec![ClaimOutcome::Taken]);
//! # Ok(())
//! # }
//! ```
//!
//! ## Code map
//!
//! - `lib.rs`: the store type, [`EtcdStore::connect`], and [`StoreBase`] (its
//!   description and clock); each other role trait is implemented in the file of its concern.
//! - `url.rs`: the `etcd://` URL into endpoints and credentials; what is shown of it.
//! - `schema.rs`: `migrate` (the layout version), `schema` (reads it) and `uninstall`.
//! - `claim.rs`: the claim, in chunks of one `Txn` each, and which ticks are taken.
//!   Nothing else claims.
//! - `memory.rs`: what an instance remembers as never-trusted shortcuts: jobs' guards and
//!   switches (a short claim skips its read), its running records (a renewal skips its read).
//! - `leases.rs`: the node's shared etcd leases that claims attach runs to.
//! - `runs.rs`: a held run's life: renew, finish, expired, recover.
//! - `retry.rs`: failure retries: finish for a retry; start or drop a due waiting retry.
//! - `cas.rs`: what every writing step shares: the bound on lost compares, a `Txn` with
//!   its re-reads, a record's and a guard's revision as read. A leaf, so `runs.rs` →
//!   `retry.rs` is the only arrow between those two.
//! - `admin.rs`: history, registry, pause switches, unlock, manual requests, prune;
//!   `prune.rs`: which old records and requests a prune deletes, in bounded pages.
//! - `clock.rs`: the fleet's clock (the median of the processes' clocks), [`StoreBase::now`].
//! - `fleet.rs`: node heartbeats (one `Txn`, no read) and the audit log (an action is one
//!   more put in the `Txn` of the step it records; at most [`ACTIONS_KEPT_MAX`] are kept).
//! - `managed.rs`: managed jobs and their revisions.
//! - `watch.rs`: the request watch (etcd watches of the request keys and of the managed
//!   jobs' version key, on one stream).
//! - `error.rs`: etcd client errors as [`StoreError`]s.
//! - `keys.rs`: the key layout; `codec.rs`: the stored values (JSON).
//! - `etcd.rs`: bounded calls, transactions, paged reads and lease primitives.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod admin;
mod cas;
mod claim;
mod clock;
mod codec;
mod error;
mod etcd;
mod fleet;
mod keys;
mod leases;
mod managed;
mod memory;
mod prune;
mod retry;
mod runs;
mod schema;
mod url;
mod watch;

use solocron_core::StoreBase;
use std::collections::HashMap;
use std::fmt;
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use etcd_client::{Client, ConnectOptions};
use solocron_core::{Prefix, RunId, StoreError};

pub use admin::HISTORY_SCAN_MAX;
pub use etcd::TXN_OPS_MAX;
pub use fleet::ACTIONS_KEPT_MAX;
pub use managed::JOB_REVISIONS_KEPT_MAX;
pub use prune::PRUNE_SCAN_MAX;

use error::in_context;
use keys::Keys;
use memory::{Held, Known};

/// How long connecting (and the first request, which checks the cluster answers) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How often the client pings an idle connection, and how long it waits for the answer
/// before it counts the connection as broken.
const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(10);
const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(5);

/// How late etcd may see a lease run out: its leader revokes expired leases in a scan
/// every 500 ms.
const EXPIRY_LAG: Duration = Duration::from_millis(500);

/// A [`Store`](solocron_core::Store) kept in etcd under a key prefix.
///
/// Separate instances (in one process or many) coordinate through etcd alone; an instance
/// only remembers, as a shortcut for renewals, the runs it claimed or renewed.
///
/// # Panics
///
/// [`RunStore::finish`](solocron_core::RunStore::finish) and [`RunStore::finish_for_retry`](solocron_core::RunStore::finish_for_retry) panic if given a `RunEnd` whose state
/// is not terminal (`running`, `waiting`): that is a bug in the caller, not a condition of
/// the store.
pub struct EtcdStore {
    client: Client,
    keys: Keys,
    /// The URL without its password, and the key prefix: safe to log.
    description: String,
    /// Runs this instance claimed or renewed, as last written: lets a renewal skip a read.
    held: Mutex<HashMap<RunId, Held>>,
    /// The etcd lease new runs of each TTL are attached to (see `leases`).
    shared: Mutex<HashMap<i64, leases::SharedLease>>,
    /// Jobs' guards and switches as last seen: lets a short claim skip its read.
    known: Known,
    /// The fleet's clock, which [`StoreBase::now`] answers (etcd has none).
    clock: clock::FleetClock,
}

impl fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdStore").field("target", &self.description).finish_non_exhaustive()
    }
}

impl EtcdStore {
    /// Connects to the etcd cluster at `url`, `etcd://host:port[,host:port...]` with an
    /// optional `user:password@` (percent-encoded), keeping every key under `prefix`
    /// (`/name/...`, see [`Prefix::etcd_key_prefix`]). Checks that the cluster answers a
    /// linearizable read within 5 s. Does not write anything: call [`SchemaStore::migrate`](solocron_core::SchemaStore::migrate).
    ///
    /// Fails with [`StoreError::Invalid`] for a malformed URL, and with
    /// [`StoreError::Unavailable`] if the cluster cannot be reached or has no leader. No
    /// error shows the URL's password.
    pub async fn connect(url: &str, prefix: &Prefix) -> Result<EtcdStore, StoreError> {
        let target = url::parse_url(url)?;
        let key_prefix = prefix.etcd_key_prefix();
        let endpoints: Vec<String> = target.hosts.iter().map(|h| format!("http://{h}")).collect();
        let mut options = ConnectOptions::new()
            .with_connect_timeout(CONNECT_TIMEOUT)
            .with_timeout(etcd::CALL_TIMEOUT)
            .with_keep_alive(KEEP_ALIVE_INTERVAL, KEEP_ALIVE_TIMEOUT)
            // A member cut off from the quorum refuses at once instead of waiting.
            .with_require_leader(true);
        if let Some((user, password)) = &target.user {
            options = options.with_user(user, password).with_auto_token_refresh(true);
        }
        let store = EtcdStore {
            keys: Keys::new(&key_prefix),
            description: url::description(url, &key_prefix),
            client: connect_client(&endpoints, options).await?,
            held: Mutex::new(HashMap::new()),
            shared: Mutex::new(HashMap::new()),
            known: Known::default(),
            clock: clock::FleetClock::new(),
        };
        // The client connects lazily: one linearizable read proves a member answers and the
        // cluster has a leader.
        let probe = etcd_client::GetOptions::new().with_count_only();
        etcd::range(&store.client, "a first read", &store.keys.schema(), probe)
            .await
            .map_err(|e| in_context(e, &store.description))?;
        Ok(store)
    }
}

/// A client for `endpoints`, within [`CONNECT_TIMEOUT`] (authentication, if any, happens here).
async fn connect_client(endpoints: &[String], options: ConnectOptions) -> Result<Client, StoreError> {
    let hosts = endpoints.join(",");
    match tokio::time::timeout(CONNECT_TIMEOUT, Client::connect(endpoints, Some(options))).await {
        Ok(Ok(client)) => Ok(client),
        Ok(Err(e)) => Err(in_context(error::etcd_err(e), &format!("cannot connect to etcd at {hosts}"))),
        Err(_) => Err(StoreError::Unavailable(format!("etcd at {hosts} did not answer within {CONNECT_TIMEOUT:?}"))),
    }
}

#[async_trait]
impl StoreBase for EtcdStore {
    fn describe(&self) -> String {
        self.description.clone()
    }

    /// The client's clock: etcd has none to offer (see the crate docs). Nothing that decides
    /// who holds a run depends on it.
    async fn now(&self) -> Result<DateTime<Utc>, StoreError> {
        Ok(self.clock.now(&self.client, &self.keys).await)
    }
}
