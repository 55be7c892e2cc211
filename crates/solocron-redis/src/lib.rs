//! # solocron-redis
//!
//! The Redis [`Store`](solocron_core::Store) of solocron: a fleet of nodes shares one Redis (6.2 or later; tested
//! on 7.0), and every tick runs on exactly one node while that Redis keeps its data.
//!
//! ```no_run
//! use std::time::Duration;
//! use solocron_core::{
//!     ClaimMode, ClaimOutcome, ClaimRequest, ClaimStore, Prefix, SchemaStore, StoreBase, Tick, Trigger,
//! };
//! use solocron_redis::RedisStore;
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let store = RedisStore::connect("redis://:secret@127.0.0.1:6379/0", &Prefix::default()).await?;
//! assert!(!store.describe().contains("secret"));
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
//! ## One atomic step per method
//!
//! Every [`Store`](solocron_core::Store) method is one call of solocron's Lua code (or one
//! single command: `TIME` for [`StoreBase::now`]). The code is a Redis Functions library
//! that the store loads with `FUNCTION LOAD` on its first call, and calls with `FCALL`;
//! where the server refuses to load it (an ACL without `FUNCTION`, a proxy), the same code
//! runs as one script per method with `EVALSHA`, at a higher cost per call on the server
//! ([`RedisStore::calls_library`] says which). Redis runs one function or script at a
//! time, entirely, so a claim, a renewal, a recovery or an unlock never interleaves with
//! another node's. Renew, finish, recover and unlock compare the owner and fencing token
//! (or the state and lease expiry) inside the same call that writes: there is no
//! read-then-write from the node.
//!
//! The library is named `solocron_<16 hex digits of its code's hash>`, so nodes of
//! different builds sharing one Redis each load and call their own; a library no node uses
//! any more stays loaded (a few tens of KB) until removed with `FUNCTION DELETE`. A server
//! that forgot the library (a restart without persistence, a failover to a replica that
//! never had it, `FUNCTION FLUSH`) is given it again by the next call.
//!
//! The store's clock is Redis's: each call reads `TIME` once and uses it as "now" (Redis
//! 7 replicates a script's or function's effects, not its code, so this is allowed and
//! replicas agree). Nodes send lease *lengths*, never instants.
//!
//! A batch claim is one script call for the whole batch (up to
//! [`CLAIM_BATCH_MAX`](solocron_core::CLAIM_BATCH_MAX) requests): one round trip, and one
//! outcome per request in request order, each request seeing the effect of the earlier
//! ones. A scheduled request for a tick more than
//! [`CLAIM_EARLY_MAX`](solocron_core::CLAIM_EARLY_MAX) ahead of the call's `TIME` is
//! decided first, in the same call: [`TooEarly`](solocron_core::ClaimOutcome::TooEarly)
//! with that clock, nothing written for it (no record, no fencing token taken).
//!
//! A batch claim and a batch of ends gather their writes to the prefix-wide keys (`hist`,
//! `expiry`, `fences`, see below) and make them at the end of the call, one command per
//! key, and read the batch's fences with one command: Redis's cost per command (lookup, ACL
//! check, argument objects) is paid once per batch instead of once per run. Nothing in the
//! call reads what it gathered, and the call is one atomic step, so no reader sees the
//! difference; a call that fails part way still makes the writes it gathered, so a record
//! it wrote is never left out of `expiry` (where recovery finds it).
//!
//! ## Keys
//!
//! Every key starts with the store's [`Prefix`] spelt as a key prefix,
//! [`Prefix::redis_key_prefix`]: `{solocron}:` for the default `solocron`, so several
//! applications (or several solocron fleets, with different prefixes) can share one Redis.
//! The braces make the name the key's *hash tag*: Redis Cluster puts every key with the
//! same tag in the same slot, so the scripts, which touch many keys, stay valid on a
//! cluster. This crate itself connects to one endpoint (a `redis://` URL: a standalone
//! server, a primary, or a proxy); the tag is what makes the layout usable behind a cluster
//! proxy. Give every fleet its own prefix, like `billing_cron` (keys `{billing_cron}:...`).
//! [`SchemaStore::uninstall`](solocron_core::SchemaStore::uninstall) deletes every key under the prefix (see `schema.rs` for why the
//! Functions library stays).
//!
//! With the default prefix, and `<id>` = `<scheduled_at ms>:<attempt, 10 digits>:<job>`:
//!
//! | key | type | holds |
//! |-----|------|-------|
//! | `{solocron}:run:<id>` | hash | one run record: `job at att trig node tok state reason claimed started finished lease exit out nonce` (`nonce`: the creating claim's, in decimal; `0` or absent: none; `lease`: the lease's end while `running`, the not-before while `waiting`, left as it was once ended) |
//! | `{solocron}:hist` | sorted set | every record's `<id>`, scored by `scheduled_at` (history across jobs, pruning) |
//! | `{solocron}:jhist:<job>` | sorted set | the job's record ids, scored by `scheduled_at` (history of one job) |
//! | `{solocron}:expiry` | sorted set | ids of running runs and of waiting retries, scored by `lease_until` (a retry's not-before) ([`RunStore::expired`](solocron_core::RunStore::expired)) |
//! | `{solocron}:jrun:<job>` | sorted set | ids of the job's running runs, never of waiting retries (overlap check, unlock) |
//! | `{solocron}:fences` | hash | job → last fencing token |
//! | `{solocron}:ctl:<job>` / `…ctls` | hash / set | a job's pause switch / the jobs ever switched |
//! | `{solocron}:reg:<len(job)>:<job>:<node>` / `…regs` | hash / sorted set | a registration / their ids by `last_seen` |
//! | `{solocron}:nregs:<node>` | set | the node's registration ids, and the member `""` once they are all there (see "Cost") |
//! | `{solocron}:regstage:<len(node)>:<node>:<id>` | list | a long job list on its way to one registration (see "Cost"); expires after a minute |
//! | `{solocron}:req` / `…reqpend` / `…reqby` | sorted sets / hash | manual requests (`<ms>:<job>`), those with no record yet, who asked |
//! | `{solocron}:node:<node>` / `…nodes` / `…nodeseen` | hash / sorted sets | a node's last heartbeat / node ids by id (all scored 0) / by `last_seen` |
//! | `{solocron}:act:<id>` / `…acts` / `…actseq` | hash / sorted set / string | an operator's action / action ids by instant / the id counter |
//! | `{solocron}:mjob:<job>` / `…mjobs` | hash / sorted set | a managed job: `job spec rev by at` / their names (all scored 0) |
//! | `{solocron}:mrev:<rev>` / `…mrevs` / `…mjrevs:<job>` / `…mrevseq` | hash / sorted sets / string | a revision of a managed job (`job rev by at`, and `spec` unless it deleted the job) / revisions by number, of all jobs / of one job / the revision counter |
//! | `{solocron}:epoch` | string | when the present memory began (ms), see below |
//! | `{solocron}:schema` | string | the layout version (`1`) |
//!
//! Instants are integer milliseconds since the Unix epoch (UTC). Keys have no TTL; run Redis
//! with `maxmemory-policy noeviction` (or a `volatile-*` policy): an evicted key is
//! forgotten like after a restart.
//!
//! ## Failure retries
//!
//! [`RunStore::finish_for_retry`](solocron_core::RunStore::finish_for_retry) is one call: it records the end exactly as
//! [`RunStore::finish`](solocron_core::RunStore::finish) does (same owner and token check) and, only if that matched, creates
//! the tick's next attempt as a `waiting` record (trigger `retry`, the same node, no `tok`,
//! `claimed` = now, `lease` = now + the backoff: its not-before), in `hist`, `jhist:<job>`
//! and `expiry` (by its not-before), never in `jrun:<job>`: a waiting retry is not a
//! running run, so it neither makes a claim skip for overlap nor is ended by an unlock.
//! [`RunStore::expired`](solocron_core::RunStore::expired) reads `expiry` once for both kinds, so due retries and lapsed runs
//! come merged, oldest first. [`RunStore::recover`](solocron_core::RunStore::recover) of a due retry turns that same record
//! `running` (the job's next token from `fences`, a fresh lease, back in `jrun:<job>`) or
//! ends it `abandoned`; before its not-before, `NotNeeded`. [`HistoryStore::prune`](solocron_core::HistoryStore::prune) never deletes
//! a waiting record, like a running one.
//!
//! The layout version stays `1`: a waiting record is a run hash like any other, with a
//! state value older builds do not know. In a fleet mixing builds, an older one skips a due
//! retry in its expiry scan (logging that it cannot read it), fails a history read that
//! meets one, and may prune one whose tick is older than the retention; finish upgrading
//! before giving jobs a retry policy.
//!
//! ## Cost
//!
//! Claim, renew, finish (for a retry too), recover, request and pause touch a handful of keys per run:
//! `O(log n)` each. [`HistoryStore::history`](solocron_core::HistoryStore::history) walks the job's (or all jobs') history newest first
//! from the `until` bound: without a state, node or namespace filter it reads exactly the
//! records it returns; with one it examines records one by one (another namespace's by
//! their ids alone), at most 50 000 per call (about 0.1 s of Redis time), and returns the
//! matches found among them (a warning is logged when it stops there). [`HistoryStore::prune`](solocron_core::HistoryStore::prune) deletes at most a batch of records per call, plus at most
//! [`PRUNE_BATCH_MAX`](solocron_core::PRUNE_BATCH_MAX) old requests, stale registrations, old actions and silent nodes; it also removes registrations
//! not refreshed within the retention (Redis keeps everything in memory, so the registry of
//! long-gone nodes is not kept forever as in the SQL stores). The audit log keeps at most
//! [`ACTIONS_KEPT_MAX`] actions per prefix whether pruned or not: each pause, resume,
//! trigger or unlock appends its action in its own call and drops the oldest beyond that.
//! A heartbeat is one call that writes one hash and two sorted-set entries.
//!
//! ## Namespaces
//!
//! A job's full name holds its namespace (`billing/sync`; see [`solocron_core::Namespaces`]),
//! and so does every id that names a job: a run's `<ms>:<attempt>:<job>`, a request's
//! `<ms>:<job>`. [`RunStore::expired`](solocron_core::RunStore::expired), [`RequestStore::pending_requests`](solocron_core::RequestStore::pending_requests) and [`HistoryStore::prune`](solocron_core::HistoryStore::prune) send
//! the namespaces asked for to their Lua, which reads each entry's namespace from its id
//! (the part of the job before its first `/`, or `default`) without reading its record,
//! and walks its sorted set oldest first, a page of ranks at a time, until it has `limit`
//! entries of those namespaces: other namespaces' entries take no place in the limit. For
//! every namespace it reads exactly the entries it returns, as before namespaces.
//! [`HistoryStore::history`](solocron_core::HistoryStore::history) asked for one namespace reads the namespace of each record it
//! examines from its id the same way, and counts other namespaces' records against its own
//! bound of examined records (see "Cost"), as it does other jobs' records.
//!
//! One call examines at most [`SCAN_EXAMINED_MAX`] entries of each set it scans (some
//! 50 ms of Redis time for the ids alone). An application whose nodes are all gone leaves expired runs and
//! pending requests behind that nobody of another namespace acts on; were there more of
//! them than that ahead of this namespace's, the call returns the matches found among the
//! entries it examined (none, at worst) and logs a warning, and this namespace's later
//! entries are listed only once enough of those ahead are gone (recovered, claimed or
//! pruned by nodes or operators serving their namespace). Prune likewise deletes nothing of
//! this namespace beyond the first [`SCAN_EXAMINED_MAX`] old records (or requests) that it
//! cannot delete.
//!
//! [`RegistryStore::register`](solocron_core::RegistryStore::register) is one call: it upserts each listed job's registration and deletes
//! the node's others, which it finds in the node's `nregs` set (so a refresh that changes
//! nothing reads the node's ids once and writes what it wrote before). A list of more than
//! 500 jobs is first staged in a `regstage` list, 500 jobs a call, which that one call
//! reads and deletes: no call, and no buffer of the node's, holds the whole list. A node whose set is
//! absent or lacks its `""` mark (new to this layout, or forgotten by prune as silent) is
//! looked for once in the whole registry instead, which also finds the registrations
//! written by builds that kept no such set; such a call costs one read of every
//! registration id of the prefix. A registration an older build writes for a node whose
//! set is already marked (a node taken back to that build) is not in the set: it stays
//! until prune removes it as stale.
//!
//! Managed jobs ([`ManagedStore::put_job`](solocron_core::ManagedStore::put_job), [`ManagedStore::delete_job`](solocron_core::ManagedStore::delete_job)): a write is one call that
//! compares the job's revision with the expected one, takes the next revision from the
//! `mrevseq` counter (`INCR`: revisions follow the order the calls ran in), writes the job,
//! appends the revision and publishes on the request channel (see `watch.rs`), so that
//! nodes waiting on their request watch read the change at once. At most [`JOB_REVISIONS_KEPT_MAX`]
//! revisions are kept per prefix: each write drops the oldest beyond that (of any job; a
//! job's present definition stays however old it is), so [`ManagedStore::job_revisions`](solocron_core::ManagedStore::job_revisions) may end
//! before a job's first revision. [`ManagedStore::managed_version`](solocron_core::ManagedStore::managed_version) reads the counter.
//!
//! ## What Redis guarantees, and what it does not
//!
//! On one Redis server every step is atomic and judged by one clock: one winner per tick,
//! one recoverer per expired run, leases that only their owner renews.
//!
//! Redis replicates **asynchronously**. When a primary fails and a replica is promoted, the
//! writes of the last moments before the failure may be missing on the new primary: a lease
//! that was just granted can vanish, another node can claim the same tick, and **two nodes
//! can then hold the same run at once**. The fencing token is the protection: the next
//! token of a job from a server that did not hand out its previous one is taken from that
//! server's clock (see below), so the second holder's token is larger than the first's, and
//! a downstream system that rejects writes carrying a smaller token than it has seen keeps
//! the first holder out. Where two runs of one job must never overlap even through a
//! failover, use the PostgreSQL or etcd store, which only acknowledge what survives one.
//!
//! ## Fencing tokens
//!
//! A job's token is its counter plus one, but never less than Redis's clock in
//! microseconds (`max(counter + 1, now µs)`). Tokens thus never run ahead of the clock
//! (while no job takes more than one token per microsecond on average), so a later clock
//! reading is larger than every token handed out before: a counter that lags behind them
//! (lost in a restart, rolled back to a snapshot, or missing on a promoted replica) still
//! yields a larger token, even than tokens the present server never heard of; and the
//! counter keeps tokens rising if the clock steps back on a server that lost nothing. This
//! relies on two things: the server clock does not go back across restarts and failovers
//! by more than the outage lasted, and no job ever takes more than one token per
//! microsecond on average. (Earlier versions took the counter alone while the same server
//! answered, recognized through `INFO`, and kept a `fenceby` hash for it; the floor makes
//! both unnecessary, and a leftover `fenceby` key is ignored.)
//!
//! ## Amnesia: a Redis that restarts without persistence
//!
//! A Redis without persistence (no RDB, no AOF) forgets every key when it restarts; one
//! with RDB snapshots forgets the writes since the last snapshot. solocron on such a Redis
//! keeps these guarantees and loses these things:
//!
//! - **Lost:** the run history, the job registry, pause switches (paused jobs run again),
//!   pending manual run requests, and managed jobs' revisions. The managed jobs themselves
//!   come back: the daemons see the revision counter go back (it only grows otherwise),
//!   keep running the jobs they knew, and write them back where absent. Operators must
//!   pause again what they had paused.
//! - **Runs running at the restart:** their records are gone, so their holders' next
//!   renewal fails; each holder then stops its job and records nothing (the run is lost).
//!   The jobs' downstream writes stay fenced: see the next point.
//! - **Fencing tokens stay monotonic:** a job whose counter was lost restarts at Redis's
//!   clock in microseconds, which is larger than every token handed out before the
//!   restart (provided the server clock did not go back).
//! - **No tick that already ran is run again:** the first write after the restart marks
//!   the `epoch` key with Redis's clock, and [`ClaimStore::memory_since`](solocron_core::ClaimStore::memory_since) returns that instant
//!   (marking it if nobody did yet): a node starting afterwards never looks back before it.
//!   A write other than `migrate` that finds the keys gone also marks `forgot`, and from
//!   then on a claim (not a manual one) of a tick from before that instant is recorded
//!   `skipped`, saying the store forgot its data and the tick may have run: no record
//!   there may mean "forgotten", not "missed". (`migrate` of a new prefix marks no such
//!   thing: a fresh store claims any tick.)
//! - **Ticks missed during the outage itself are not caught up** by a node that starts
//!   after it, because they cannot be told apart from ticks that ran and were forgotten.
//!   (A node that stayed up through the outage keeps its own position in the schedule and
//!   handles the ticks it could not claim by its misfire policy, which the claim records
//!   skipped.)
//! - **A tick due at the moment of the restart** runs once or not at all (recorded skipped);
//!   a failover to a replica that missed the last writes, which marks no `forgot`, can
//!   still run it twice.
//!
//! ## Errors
//!
//! I/O errors, refused connections, timeouts (connect and response: 5 s), `LOADING`,
//! `BUSY`, `TRYAGAIN`, `CLUSTERDOWN`, `MASTERDOWN`, `READONLY`, `NOREPLICAS`, `OOM` and
//! `MISCONF` (a failed snapshot stops writes) are [`StoreError::Unavailable`]: the engine
//! backs off and retries. While the server refuses writes (`OOM` at `maxmemory`,
//! `MISCONF`, too few replicas), every method that may write fails so, even a call that
//! would have written nothing (a renewal of a lost lease, say): Redis refuses a function
//! that may write before it runs. The reads (`expired`, `history`, `registrations`,
//! `controls`, `pending_requests`, `managed_jobs`, `managed_version`, `job_revisions`)
//! still answer. Script errors, replies of
//! an unexpected shape and refused credentials are [`StoreError::Invalid`]. An unknown
//! function or `NOSCRIPT` (after a restart, `FUNCTION FLUSH` or `SCRIPT FLUSH`) is handled
//! by loading the code again. Passwords never appear in [`StoreBase::describe`] or in error
//! messages: what is shown of the URL goes through [`solocron_core::redact_url`].
//!
//! ## Code map
//!
//! - `lib.rs`: the store type, [`RedisStore::connect`], and [`StoreBase`] (its description
//!   and clock, Redis's `TIME`); each other role trait is implemented in the file of its
//!   concern.
//! - `url.rs`: the URL into a client; what is shown of it (redacted).
//! - `schema.rs`: `migrate` (layout version, epoch), `schema` (reads the version) and
//!   `uninstall`.
//! - `claim.rs`: the claim, a whole batch in one call; which ticks are taken; where the
//!   present memory begins (`memory_since`). Nothing else claims.
//! - `runs.rs`: a held run's life: renew, finish, finish for a retry, expired, recover.
//! - `admin.rs`: history, registry, pause switches and unlock, manual requests, prune.
//! - `fleet.rs`: node heartbeats and the audit log's reads (actions are appended by the Lua
//!   of the step they record).
//! - `managed.rs`: managed jobs and their revisions.
//! - `watch.rs`: the request watch (a pub/sub subscription), woken by run requests and
//!   managed job changes.
//! - `error.rs`: Redis errors as [`StoreError`]s.
//! - `scripts.rs`, `lua/`: the Lua code, as a Functions library and as scripts.
//! - `call.rs`: how a call is sent (`FCALL`, or `EVALSHA` where the library is refused),
//!   and how arguments are spelled.
//! - `decode.rs`: the scripts' replies as solocron's types.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod admin;
mod call;
mod claim;
mod decode;
mod error;
mod fleet;
mod managed;
mod runs;
mod schema;
mod scripts;
mod url;
mod watch;

use solocron_core::StoreBase;
use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use solocron_core::{Prefix, StoreError};

pub use fleet::ACTIONS_KEPT_MAX;

/// Most entries one [`RunStore::expired`](solocron_core::RunStore::expired), [`RequestStore::pending_requests`](solocron_core::RequestStore::pending_requests) or [`HistoryStore::prune`](solocron_core::HistoryStore::prune)
/// call examines in each sorted set it scans for the namespaces asked (the expiry set; the
/// pending requests; the history and the requests): see "Namespaces" in the crate docs for
/// what happens past it. Far above the most entries a call returns
/// ([`RECORDS_PAGE_MAX`](solocron_core::RECORDS_PAGE_MAX),
/// [`PRUNE_BATCH_MAX`](solocron_core::PRUNE_BATCH_MAX)), so that a scan for every namespace
/// never reaches it.
pub const SCAN_EXAMINED_MAX: usize = 100_000;
pub use managed::JOB_REVISIONS_KEPT_MAX;

use call::Caller;
use error::redis_error;

/// How long connecting, and then each reply, may take before the store is unavailable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);

/// Reconnection attempts per call once a connection broke: few, so that a down server
/// surfaces quickly as "unavailable" and the engine's own backoff takes over.
const RECONNECT_RETRIES: usize = 1;

/// Longest pause between reconnection attempts.
const RECONNECT_DELAY_MAX: Duration = Duration::from_millis(500);

/// A [`Store`](solocron_core::Store) kept in Redis under a key prefix.
///
/// Cheap to clone: clones share one multiplexed connection, which reconnects by itself
/// after it breaks. Separate instances (in one process or many) coordinate through Redis.
///
/// # Panics
///
/// [`RunStore::finish`](solocron_core::RunStore::finish), [`RunStore::finish_all`](solocron_core::RunStore::finish_all) and [`RunStore::finish_for_retry`](solocron_core::RunStore::finish_for_retry) panic if given
/// a `RunEnd` whose state is not terminal (`running`, `waiting`): that is a bug in the
/// caller, not a condition of the store.
#[derive(Clone)]
pub struct RedisStore {
    conn: ConnectionManager,
    /// For the request watch's own (subscribed) connection.
    client: redis::Client,
    /// The key prefix, `{name}:` ([`Prefix::redis_key_prefix`]).
    prefix: String,
    /// Sends the calls of the store's Lua code (library or scripts).
    caller: Caller,
    description: String,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore").field("description", &self.description).finish_non_exhaustive()
    }
}

impl RedisStore {
    /// Connects to the Redis at `url` (`redis://[[user]:password@]host:port[/db]`) and keeps
    /// its keys under `prefix` (`{name}:...`, see [`Prefix::redis_key_prefix`]). Does not
    /// write anything: call [`SchemaStore::migrate`](solocron_core::SchemaStore::migrate).
    ///
    /// Fails with [`StoreError::Unavailable`] if the server cannot be reached within 5 s,
    /// and with [`StoreError::Invalid`] if the URL is malformed or the server refuses the
    /// credentials. No error shows the URL's password.
    pub async fn connect(url: &str, prefix: &Prefix) -> Result<RedisStore, StoreError> {
        let key_prefix = prefix.redis_key_prefix();
        let description = url::description(url, &key_prefix);
        let client = url::client(url)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(CONNECT_TIMEOUT))
            .set_response_timeout(Some(RESPONSE_TIMEOUT))
            .set_number_of_retries(RECONNECT_RETRIES)
            .set_max_delay(RECONNECT_DELAY_MAX);
        let conn = ConnectionManager::new_with_config(client.clone(), config)
            .await
            .map_err(|e| redis_error(e, &format!("cannot connect to {description}")))
            .map_err(|e| error::redacted(e, url))?;
        let caller = Caller::new(format!("{key_prefix}epoch"));
        Ok(RedisStore { conn, client, prefix: key_prefix, caller, description })
    }

    /// Whether this store's calls go to its Redis Functions library (`Some(true)`), or to
    /// scripts with `EVALSHA` because the server refused to load the library (`Some(false)`;
    /// a warning said why). `None` before the first call, which decides. Clones share it.
    ///
    /// ```no_run
    /// # async fn f(store: solocron_redis::RedisStore) -> Result<(), solocron_core::StoreError> {
    /// use solocron_core::SchemaStore;
    /// store.migrate().await?;
    /// println!("library: {:?}", store.calls_library());
    /// # Ok(())
    /// # }
    /// ```
    pub fn calls_library(&self) -> Option<bool> {
        self.caller.calls_library()
    }

    /// The key prefix this store's keys start with: `{name}:`.
    pub fn key_prefix(&self) -> &str {
        &self.prefix
    }
}

#[async_trait]
impl StoreBase for RedisStore {
    fn describe(&self) -> String {
        self.description.clone()
    }

    /// Redis's clock (`TIME`).
    async fn now(&self) -> Result<DateTime<Utc>, StoreError> {
        let mut conn = self.conn.clone();
        let (secs, micros): (i64, i64) = redis::cmd("TIME")
            .query_async(&mut conn)
            .await
            .map_err(|e| redis_error(e, &format!("now on {}", self.description)))?;
        decode::instant(secs * 1000 + micros / 1000)
    }
}
