//! # solocron-redis
//!
//! The Redis [`Store`] of solocron: a fleet of nodes shares one Redis (6.2 or later; tested
//! on 7.0), and every tick runs on exactly one node while that Redis keeps its data.
//!
//! ```no_run
//! use std::time::Duration;
//! use solocron_core::{ClaimMode, ClaimOutcome, ClaimRequest, Store, Tick, Trigger};
//! use solocron_redis::{RedisStore, DEFAULT_KEY_PREFIX};
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let store = RedisStore::connect("redis://:secret@127.0.0.1:6379/0", DEFAULT_KEY_PREFIX).await?;
//! assert!(!store.describe().contains("secret"));
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
//!
//! ## One atomic step per method
//!
//! Every [`Store`] method is one call of solocron's Lua code (or one single command:
//! `TIME` for [`Store::now`]). The code is a Redis Functions library that the store loads
//! with `FUNCTION LOAD` on its first call, and calls with `FCALL`; where the server refuses
//! to load it (an ACL without `FUNCTION`, a proxy), the same code runs as one script per
//! method with `EVALSHA`, at a higher cost per call on the server
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
//! ones.
//!
//! ## Keys
//!
//! Every key starts with the key prefix ([`DEFAULT_KEY_PREFIX`] = `{solocron}:`), so
//! several applications (or several solocron fleets, with different prefixes) can share one
//! Redis. The braces make `solocron` the key's *hash tag*: Redis Cluster puts every key with
//! the same tag in the same slot, so the scripts, which touch many keys, stay valid on a
//! cluster. This crate itself connects to one endpoint (a `redis://` URL: a standalone
//! server, a primary, or a proxy); the tag is what makes the layout usable behind a cluster
//! proxy. Give every fleet its own prefix with a tag, like `{billing_cron}:`.
//!
//! With the default prefix, and `<id>` = `<scheduled_at ms>:<attempt, 10 digits>:<job>`:
//!
//! | key | type | holds |
//! |-----|------|-------|
//! | `{solocron}:run:<id>` | hash | one run record: `job at att trig node tok state reason claimed started finished lease exit out` |
//! | `{solocron}:hist` | sorted set | every record's `<id>`, scored by `scheduled_at` (history across jobs, pruning) |
//! | `{solocron}:jhist:<job>` | sorted set | the job's record ids, scored by `scheduled_at` (history of one job) |
//! | `{solocron}:expiry` | sorted set | ids of running runs, scored by `lease_until` ([`Store::expired`]) |
//! | `{solocron}:jrun:<job>` | sorted set | ids of the job's running runs (overlap check, unlock) |
//! | `{solocron}:fences` | hash | job → last fencing token |
//! | `{solocron}:ctl:<job>` / `…ctls` | hash / set | a job's pause switch / the jobs ever switched |
//! | `{solocron}:reg:<len(job)>:<job>:<node>` / `…regs` | hash / sorted set | a registration / their ids by `last_seen` |
//! | `{solocron}:req` / `…reqpend` / `…reqby` | sorted sets / hash | manual requests (`<ms>:<job>`), those with no record yet, who asked |
//! | `{solocron}:epoch` | string | when the present memory began (ms), see below |
//! | `{solocron}:schema` | string | the layout version (`1`) |
//!
//! Instants are integer milliseconds since the Unix epoch (UTC). Keys have no TTL; run Redis
//! with `maxmemory-policy noeviction` (or a `volatile-*` policy): an evicted key is
//! forgotten like after a restart.
//!
//! ## Cost
//!
//! Claim, renew, finish, recover, request and pause touch a handful of keys per run:
//! `O(log n)` each. [`Store::history`] walks the job's (or all jobs') history newest first
//! from the `until` bound: without a state or node filter it reads exactly the records it
//! returns; with one it examines records one by one, at most 50 000 per call (about 0.1 s
//! of Redis time), and returns the matches found among them (a warning is logged when it
//! stops there). [`Store::prune`] deletes at most a batch of records per call, plus at most
//! [`PRUNE_BATCH_MAX`] old requests and stale registrations; it also removes registrations
//! not refreshed within the retention (Redis keeps everything in memory, so the registry of
//! long-gone nodes is not kept forever as in the SQL stores).
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
//! - **Lost:** the run history, the job registry, pause switches (paused jobs run again)
//!   and pending manual run requests. Operators must pause again what they had paused.
//! - **Runs running at the restart:** their records are gone, so their holders' next
//!   renewal fails; each holder then stops its job and records nothing (the run is lost).
//!   The jobs' downstream writes stay fenced: see the next point.
//! - **Fencing tokens stay monotonic:** a job whose counter was lost restarts at Redis's
//!   clock in microseconds, which is larger than every token handed out before the
//!   restart (provided the server clock did not go back).
//! - **No tick that already ran is re-run by a starting node's catch-up:** the first write
//!   after the restart marks the `epoch` key with Redis's clock, and
//!   [`Store::memory_since`] returns that instant (marking it if nobody did yet). A node
//!   starting afterwards never treats a tick before that instant as unclaimed: no record
//!   there may mean "forgotten", not "missed". The store itself does not refuse old ticks:
//!   a claim of a tick from before the restart finds no record and is won; the engine is
//!   what refuses to look back past `memory_since`.
//! - **Ticks missed during the outage itself are not caught up** by a node that starts
//!   after it, because they cannot be told apart from ticks that ran and were forgotten.
//!   (A node that stayed up through the outage keeps its own position in the schedule and
//!   handles the ticks it could not claim by its misfire policy; a tick another node ran
//!   just before the restart may then run again.)
//! - **A tick due at the moment of the restart** can run twice: once before it, once after
//!   (it was forgotten), as with a failover.
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
//! `controls`, `pending_requests`) still answer. Script errors, replies of
//! an unexpected shape and refused credentials are [`StoreError::Invalid`]. An unknown
//! function or `NOSCRIPT` (after a restart, `FUNCTION FLUSH` or `SCRIPT FLUSH`) is handled
//! by loading the code again. Passwords never appear in [`Store::describe`] or in error messages.
#![warn(missing_docs)]

mod call;
mod decode;
mod scripts;
mod watch;

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{RedisError, Value};
use solocron_core::{
    output_tail, ClaimMode, ClaimOutcome, ClaimRequest, Ending, HistoryQuery, JobControl, JobDefinition, Lease,
    RecoverAction, RecoverOutcome, Registration, Renewal, RequestWatch, RunEnd, RunId, RunRecord, RunRequest, Store,
    StoreError, Tick, FINISH_BATCH_MAX, PRUNE_BATCH_MAX, RECORDS_PAGE_MAX, RENEW_BATCH_MAX,
};

use call::{Call, Caller};
use decode::{convert, instant, invalid};
use scripts::{Method, CODE};

/// The key prefix used unless configured otherwise. `{solocron}` is the hash tag that keeps
/// every key of the store in one Redis Cluster slot (see the crate documentation).
pub const DEFAULT_KEY_PREFIX: &str = "{solocron}:";

/// Longest key prefix accepted.
const KEY_PREFIX_LEN_MAX: usize = 64;

/// How long connecting, and then each reply, may take before the store is unavailable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);

/// Reconnection attempts per call once a connection broke: few, so that a down server
/// surfaces quickly as "unavailable" and the engine's own backoff takes over.
const RECONNECT_RETRIES: usize = 1;

/// Longest duration (lease, start delay, retention) accepted: 100 years. Keeps every
/// instant the scripts compute far below 2^53 ms, where Lua's doubles stop being exact.
const DURATION_MS_MAX: u128 = 100 * 365 * 24 * 3600 * 1000;

/// Most records one filtered [`Store::history`] call examines (see "Cost").
const HISTORY_EXAMINED_MAX: usize = 50_000;

/// How many successive milliseconds [`Store::request_run`] tries before giving up.
const REQUEST_SLOTS_MAX: usize = 100;

/// A [`Store`] kept in Redis under a key prefix.
///
/// Cheap to clone: clones share one multiplexed connection, which reconnects by itself
/// after it breaks. Separate instances (in one process or many) coordinate through Redis.
///
/// # Panics
///
/// [`Store::finish`] panics if given a `RunEnd` whose state is `running`: that is a bug in
/// the caller, not a condition of the store.
#[derive(Clone)]
pub struct RedisStore {
    conn: ConnectionManager,
    /// For the request watch's own (subscribed) connection.
    client: redis::Client,
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
    /// its keys under `key_prefix` (usually [`DEFAULT_KEY_PREFIX`]). Does not write
    /// anything: call [`Store::migrate`].
    ///
    /// Fails with [`StoreError::Unavailable`] if the server cannot be reached within 5 s,
    /// and with [`StoreError::Invalid`] if the URL or the prefix is malformed or the server
    /// refuses the credentials. A prefix is 1 to 64 characters among `A-Z a-z 0-9 _ - . :`
    /// with at most one hash tag in braces, like `{solocron}:`.
    pub async fn connect(url: &str, key_prefix: &str) -> Result<RedisStore, StoreError> {
        check_prefix(key_prefix)?;
        let description = format!("{} (keys {key_prefix}*)", mask_url(url));
        let client = redis::Client::open(url)
            .map_err(|e| StoreError::Invalid(format!("bad Redis URL {}: {e}", mask_url(url))))?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(CONNECT_TIMEOUT))
            .set_response_timeout(Some(RESPONSE_TIMEOUT))
            .set_number_of_retries(RECONNECT_RETRIES)
            .set_max_delay(Duration::from_millis(500));
        let conn = ConnectionManager::new_with_config(client.clone(), config)
            .await
            .map_err(|e| redis_error(e, &format!("cannot connect to {description}")))?;
        Ok(RedisStore {
            conn,
            client,
            prefix: key_prefix.to_owned(),
            caller: Caller::new(format!("{key_prefix}epoch")),
            description,
        })
    }

    /// Whether this store's calls go to its Redis Functions library (`Some(true)`), or to
    /// scripts with `EVALSHA` because the server refused to load the library (`Some(false)`;
    /// a warning said why). `None` before the first call, which decides. Clones share it.
    ///
    /// ```no_run
    /// # async fn f(store: solocron_redis::RedisStore) -> Result<(), solocron_core::StoreError> {
    /// use solocron_core::Store;
    /// store.migrate().await?;
    /// println!("library: {:?}", store.calls_library());
    /// # Ok(())
    /// # }
    /// ```
    pub fn calls_library(&self) -> Option<bool> {
        self.caller.calls_library()
    }

    /// The key prefix this store's keys start with.
    pub fn key_prefix(&self) -> &str {
        &self.prefix
    }

    /// A call of `method` on this store's keys.
    fn invocation(&self, method: &'static Method) -> Call {
        Call::new(method, &self.prefix)
    }

    /// Runs `call`; errors say which operation failed on which store.
    async fn run(&self, call: &Call, operation: &str) -> Result<Value, StoreError> {
        let mut conn = self.conn.clone();
        self.caller
            .send(&mut conn, call)
            .await
            .map_err(|e| redis_error(e, &format!("{operation} on {}", self.description)))
    }

    /// Runs `calls`, each answering 1 or 0, as one pipeline (each call atomic by itself):
    /// one flag per call, in order.
    async fn run_flags(&self, calls: &[Call], operation: &str) -> Result<Vec<bool>, StoreError> {
        if calls.is_empty() {
            return Ok(Vec::new());
        }
        let mut conn = self.conn.clone();
        let context = || format!("{operation} on {}", self.description);
        let replies = self.caller.send_all(&mut conn, calls).await.map_err(|e| redis_error(e, &context()))?;
        if replies.len() != calls.len() {
            return Err(StoreError::Invalid(format!(
                "{operation} answered {} of {} calls",
                replies.len(),
                calls.len()
            )));
        }
        replies
            .into_iter()
            .map(|reply| {
                let done: i64 = convert(reply.map_err(|e| redis_error(e, &context()))?, "reply")?;
                Ok(done == 1)
            })
            .collect()
    }

    /// The `renew` script's call for one lease.
    fn renew_call(&self, lease: &Lease, length: Duration) -> Result<Call, StoreError> {
        let mut call = self.invocation(&CODE.renew);
        Self::lease_args(&mut call, lease);
        call.arg(millis(length)?);
        Ok(call)
    }

    /// The `finish` script's call for one end.
    fn finish_call(&self, lease: &Lease, end: &RunEnd) -> Result<Call, StoreError> {
        assert!(end.state.is_terminal(), "a run cannot finish as `{}`", end.state);
        let started_after = end.started_after.map(millis).transpose()?;
        let mut call = self.invocation(&CODE.finish);
        Self::lease_args(&mut call, lease);
        call.arg(end.state.as_str())
            .arg(optional(end.reason.as_deref()))
            .arg(optional(end.exit_code))
            .arg(output_tail(&end.output))
            .arg(optional(started_after));
        Ok(call)
    }

    /// The identity of a run and its holder's proof, as renew and finish send them.
    fn lease_args(call: &mut Call, lease: &Lease) {
        call.arg(&lease.run.tick.job)
            .arg(lease.run.tick.scheduled_at.timestamp_millis())
            .arg(lease.run.attempt)
            .arg(&lease.owner)
            .arg(lease.fencing_token.to_string());
    }
}

/// Checks a key prefix (see [`RedisStore::connect`]).
fn check_prefix(prefix: &str) -> Result<(), StoreError> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || "_-.:{}".contains(c);
    let tag_ok = match (prefix.matches('{').count(), prefix.matches('}').count()) {
        (0, 0) => true,
        // Redis hashes the text between the first `{` and the next `}`, if not empty.
        (1, 1) => prefix.find('{').zip(prefix.find('}')).is_some_and(|(open, close)| close > open + 1),
        _ => false,
    };
    if (1..=KEY_PREFIX_LEN_MAX).contains(&prefix.len()) && prefix.chars().all(allowed) && tag_ok {
        return Ok(());
    }
    Err(StoreError::Invalid(format!(
        "invalid Redis key prefix `{prefix}`: expected 1 to {KEY_PREFIX_LEN_MAX} characters among \
         A-Z a-z 0-9 _ - . : with at most one non-empty {{hash tag}}, like `{DEFAULT_KEY_PREFIX}`"
    )))
}

/// `url` with any password (in the user part or a `password=` parameter) replaced by `***`.
fn mask_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        // Not a URL Redis accepts; it may still hold a secret.
        return "<a Redis URL without `://`>".to_owned();
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let authority = match authority.rsplit_once('@') {
        // `user:password@` keeps the user; a lone `secret@` may be a password put there.
        Some((user, host)) => match user.split_once(':') {
            Some((name, _)) => format!("{name}:***@{host}"),
            None => format!("***@{host}"),
        },
        None => authority.to_owned(),
    };
    let Some((path, query)) = tail.split_once('?') else { return format!("{scheme}://{authority}{tail}") };
    let query: Vec<String> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((k, _)) if k.to_ascii_lowercase().contains("pass") => format!("{k}=***"),
            _ => pair.to_owned(),
        })
        .collect();
    format!("{scheme}://{authority}{path}?{}", query.join("&"))
}

/// True for errors a retry may cure: the connection, timeouts, a server loading or busy,
/// a cluster or replication in transition, a full memory.
pub(crate) fn is_transient(e: &RedisError) -> bool {
    use redis::{ErrorKind, ServerErrorKind as Server};
    const CODES: [&str; 9] =
        ["BUSY", "LOADING", "TRYAGAIN", "CLUSTERDOWN", "MASTERDOWN", "READONLY", "NOREPLICAS", "OOM", "MISCONF"];
    e.is_io_error()
        || e.is_timeout()
        || e.is_connection_refusal()
        || e.is_connection_dropped()
        || e.is_cluster_error()
        || matches!(
            e.kind(),
            ErrorKind::Server(
                Server::BusyLoading | Server::TryAgain | Server::ClusterDown | Server::MasterDown | Server::ReadOnly
            ) | ErrorKind::ClusterConnectionNotFound
        )
        || e.code().is_some_and(|code| CODES.contains(&code))
}

/// Maps a Redis error (see "Errors" in the crate documentation), prefixed with `context`.
fn redis_error(e: RedisError, context: &str) -> StoreError {
    if is_transient(&e) {
        StoreError::Unavailable(format!("{context}: {e}"))
    } else {
        StoreError::Invalid(format!("{context}: {e}"))
    }
}

/// Milliseconds of a duration, refusing absurd ones (see [`DURATION_MS_MAX`]).
fn millis(d: Duration) -> Result<i64, StoreError> {
    let ms = d.as_millis();
    if ms > DURATION_MS_MAX {
        return Err(StoreError::Invalid(format!("duration {d:?} is too long")));
    }
    Ok(ms as i64)
}

/// An optional argument as the scripts take it: `''` for none, `'='` + the value.
fn optional(value: Option<impl fmt::Display>) -> String {
    value.map_or_else(String::new, |v| format!("={v}"))
}

/// The store's scripts' mode names.
fn mode(mode: &ClaimMode) -> (&'static str, &str) {
    match mode {
        ClaimMode::Skip { reason } => ("skip", reason),
        ClaimMode::Run { skip_if_running: true } => ("exclusive", ""),
        ClaimMode::Run { skip_if_running: false } => ("run", ""),
    }
}

/// Attempt 1 of a request's tick, at the millisecond precision the store keeps.
fn first_attempt(request: &ClaimRequest) -> RunId {
    RunId { tick: Tick::new(request.tick.job.clone(), request.tick.scheduled_at), attempt: 1 }
}

#[async_trait]
impl Store for RedisStore {
    fn describe(&self) -> String {
        self.description.clone()
    }

    async fn migrate(&self) -> Result<(), StoreError> {
        // One script: concurrent migrations take turns, and each later one finds the
        // version and the epoch marked. There are no structures to create.
        self.run(&self.invocation(&CODE.migrate), "migrate").await.map(drop)
    }

    async fn claim(&self, requests: &[ClaimRequest]) -> Result<Vec<ClaimOutcome>, StoreError> {
        if requests.is_empty() {
            return Ok(Vec::new());
        }
        let mut call = self.invocation(&CODE.claim);
        call.arg(requests.len());
        for request in requests {
            let (mode, reason) = mode(&request.mode);
            call.arg(&request.tick.job)
                .arg(request.tick.scheduled_at.timestamp_millis())
                .arg(request.trigger.as_str())
                .arg(&request.node)
                .arg(millis(request.lease)?)
                .arg(mode)
                .arg(reason);
        }
        let replies: Vec<Vec<String>> = convert(self.run(&call, "claim").await?, "claim outcomes")?;
        if replies.len() != requests.len() {
            return Err(invalid(
                "claim outcomes",
                format!("{} outcomes for {} requests", replies.len(), requests.len()),
            ));
        }
        let outcomes = requests
            .iter()
            .zip(&replies)
            .map(|(request, reply)| decode::claim_outcome(reply, first_attempt(request), &request.node))
            .collect::<Result<Vec<_>, _>>()?;
        for outcome in &outcomes {
            if let ClaimOutcome::Won(lease) = outcome {
                tracing::debug!(run = %lease.run, node = %lease.owner, token = lease.fencing_token, "run claimed");
            }
        }
        Ok(outcomes)
    }

    async fn renew(&self, lease: &Lease, length: Duration) -> Result<bool, StoreError> {
        let renewed: i64 = convert(self.run(&self.renew_call(lease, length)?, "renew").await?, "renew reply")?;
        Ok(renewed == 1)
    }

    async fn renew_all(&self, renewals: &[Renewal]) -> Result<Vec<bool>, StoreError> {
        assert!(renewals.len() <= RENEW_BATCH_MAX, "{} renewals in one batch", renewals.len());
        let calls = renewals.iter().map(|r| self.renew_call(&r.lease, r.length)).collect::<Result<Vec<_>, _>>()?;
        self.run_flags(&calls, "renew").await
    }

    async fn finish(&self, lease: &Lease, end: &RunEnd) -> Result<bool, StoreError> {
        let call = self.finish_call(lease, end)?;
        let finished: i64 = convert(self.run(&call, "finish").await?, "finish reply")?;
        Ok(finished == 1)
    }

    async fn finish_all(&self, endings: &[Ending]) -> Result<Vec<bool>, StoreError> {
        assert!(endings.len() <= FINISH_BATCH_MAX, "{} endings in one batch", endings.len());
        let calls = endings.iter().map(|e| self.finish_call(&e.lease, &e.end)).collect::<Result<Vec<_>, _>>()?;
        self.run_flags(&calls, "finish").await
    }

    async fn expired(&self, limit: usize) -> Result<Vec<RunRecord>, StoreError> {
        let limit = limit.min(RECORDS_PAGE_MAX);
        if limit == 0 {
            return Ok(Vec::new());
        }
        let mut call = self.invocation(&CODE.expired);
        call.arg(limit);
        let records = decode::each(self.run(&call, "expired").await?, "expired runs", decode::record)?;
        // A record this version cannot read (written by a newer one, say) must not stop the
        // recovery of every other run.
        Ok(records
            .into_iter()
            .filter_map(|r| r.map_err(|e| tracing::error!(error = %e, "skipping an unreadable expired run")).ok())
            .collect())
    }

    async fn recover(&self, run: &RunId, action: &RecoverAction) -> Result<RecoverOutcome, StoreError> {
        // Checked before the call: the script may end the run before it starts the next one.
        if matches!(action, RecoverAction::Retry { .. }) && run.attempt == u32::MAX {
            return Err(StoreError::Invalid(format!("run {run} has no next attempt")));
        }
        let next = RunId { tick: run.tick.clone(), attempt: run.attempt.saturating_add(1) };
        let mut call = self.invocation(&CODE.recover);
        call.arg(&run.tick.job).arg(run.tick.scheduled_at.timestamp_millis()).arg(run.attempt);
        match action {
            RecoverAction::Abandon { reason } => call.arg("abandon").arg(reason).arg(0),
            RecoverAction::Retry { node, lease } => call.arg("retry").arg(node).arg(millis(*lease)?),
        };
        let reply: Vec<String> = convert(self.run(&call, "recover").await?, "recover reply")?;
        let outcome = match (reply.first().map(String::as_str), action) {
            (Some("not_needed"), _) => RecoverOutcome::NotNeeded,
            (Some("abandoned"), RecoverAction::Abandon { .. }) => RecoverOutcome::Abandoned,
            (Some("won"), RecoverAction::Retry { node, .. }) => {
                RecoverOutcome::Retried(decode::won(&reply, next, node)?)
            }
            _ => return Err(invalid("recover reply", format!("{reply:?}"))),
        };
        if outcome != RecoverOutcome::NotNeeded {
            tracing::debug!(%run, ?outcome, "expired run recovered");
        }
        Ok(outcome)
    }

    async fn history(&self, query: &HistoryQuery) -> Result<Vec<RunRecord>, StoreError> {
        let limit = match query.limit {
            0 => RECORDS_PAGE_MAX,
            n => n.min(RECORDS_PAGE_MAX),
        };
        let mut call = self.invocation(&CODE.history);
        call.arg(optional(query.job.as_deref()))
            .arg(optional(query.state.map(|s| s.as_str())))
            .arg(optional(query.node.as_deref()))
            .arg(optional(query.since.map(|t| t.timestamp_millis())))
            .arg(optional(query.until.map(|t| t.timestamp_millis())))
            .arg(limit)
            .arg(HISTORY_EXAMINED_MAX);
        let (bounded, records): (i64, Value) = convert(self.run(&call, "history").await?, "history reply")?;
        let records = decode::each(records, "history", decode::record)?.into_iter().collect::<Result<Vec<_>, _>>()?;
        if bounded == 1 {
            tracing::warn!(
                examined = HISTORY_EXAMINED_MAX,
                found = records.len(),
                "history query stopped after examining its most records; older matches are not listed"
            );
        }
        Ok(records)
    }

    async fn now(&self) -> Result<DateTime<Utc>, StoreError> {
        let mut conn = self.conn.clone();
        let (secs, micros): (i64, i64) = redis::cmd("TIME")
            .query_async(&mut conn)
            .await
            .map_err(|e| redis_error(e, &format!("now on {}", self.description)))?;
        instant(secs * 1000 + micros / 1000)
    }

    async fn register(&self, node: &str, jobs: &[JobDefinition]) -> Result<(), StoreError> {
        if jobs.is_empty() {
            return Ok(());
        }
        let mut call = self.invocation(&CODE.register);
        call.arg(node).arg(jobs.len());
        for job in jobs {
            call.arg(&job.job).arg(&job.schedule).arg(&job.timezone).arg(&job.definition_hash).arg(&job.summary);
        }
        self.run(&call, "register").await.map(drop)
    }

    async fn registrations(&self) -> Result<Vec<Registration>, StoreError> {
        let reply = self.run(&self.invocation(&CODE.registrations), "registrations").await?;
        let mut all =
            decode::each(reply, "registrations", decode::registration)?.into_iter().collect::<Result<Vec<_>, _>>()?;
        all.sort_by(|a, b| (&a.definition.job, &a.node).cmp(&(&b.definition.job, &b.node)));
        Ok(all)
    }

    async fn set_paused(&self, job: &str, paused: bool, by: &str, reason: Option<&str>) -> Result<(), StoreError> {
        let mut call = self.invocation(&CODE.set_paused);
        call.arg(job).arg(if paused { "1" } else { "0" }).arg(by).arg(optional(reason));
        self.run(&call, "set_paused").await.map(drop)
    }

    async fn controls(&self) -> Result<Vec<JobControl>, StoreError> {
        let reply = self.run(&self.invocation(&CODE.controls), "controls").await?;
        let mut all =
            decode::each(reply, "job controls", decode::control)?.into_iter().collect::<Result<Vec<_>, _>>()?;
        all.sort_by(|a, b| a.job.cmp(&b.job));
        Ok(all)
    }

    async fn request_run(&self, job: &str, by: &str) -> Result<Tick, StoreError> {
        let mut call = self.invocation(&CODE.request_run);
        call.arg(job).arg(by).arg(REQUEST_SLOTS_MAX);
        let at: i64 = convert(self.run(&call, "request_run").await?, "requested instant")?;
        Ok(Tick::new(job, instant(at)?))
    }

    fn request_watch(&self) -> Option<Box<dyn RequestWatch>> {
        Some(Box::new(watch::RedisRequestWatch::new(self.client.clone(), format!("{}requests", self.prefix))))
    }

    async fn pending_requests(&self, limit: usize) -> Result<Vec<RunRequest>, StoreError> {
        let limit = limit.min(RECORDS_PAGE_MAX);
        if limit == 0 {
            return Ok(Vec::new());
        }
        let mut call = self.invocation(&CODE.pending);
        call.arg(limit);
        let flat: Vec<String> = convert(self.run(&call, "pending_requests").await?, "pending requests")?;
        flat.chunks(2)
            .map(|pair| {
                let (member, by) = match pair {
                    [member, by] => (member, by),
                    _ => return Err(invalid("pending requests", format!("{flat:?}"))),
                };
                let (at, job) = member.split_once(':').ok_or_else(|| invalid("run request", member))?;
                let at = at.parse::<i64>().map_err(|e| invalid("run request", format!("{member}: {e}")))?;
                Ok(RunRequest { tick: Tick::new(job, instant(at)?), requested_by: by.clone() })
            })
            .collect()
    }

    async fn unlock(&self, job: &str, reason: &str) -> Result<Vec<RunId>, StoreError> {
        let mut call = self.invocation(&CODE.unlock);
        call.arg(job).arg(reason);
        let ids: Vec<String> = convert(self.run(&call, "unlock").await?, "unlocked runs")?;
        let runs = ids.iter().map(|id| decode::run_id(id)).collect::<Result<Vec<_>, _>>()?;
        tracing::debug!(job, runs = runs.len(), "job unlocked");
        Ok(runs)
    }

    async fn memory_since(&self) -> Result<Option<DateTime<Utc>>, StoreError> {
        let reply = self.run(&self.invocation(&CODE.memory_since), "memory_since").await?;
        let ms: i64 = convert(reply, "epoch")?;
        Ok(Some(instant(ms)?))
    }

    async fn prune(&self, older_than: Duration, batch: usize) -> Result<u64, StoreError> {
        let mut call = self.invocation(&CODE.prune);
        call.arg(millis(older_than)?).arg(batch.min(PRUNE_BATCH_MAX)).arg(PRUNE_BATCH_MAX);
        let deleted: i64 = convert(self.run(&call, "prune").await?, "pruned count")?;
        u64::try_from(deleted).map_err(|e| invalid("pruned count", e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_are_checked() {
        for good in [DEFAULT_KEY_PREFIX, "{solocron_t0123456789abcdef}:", "app:cron:", "a"] {
            assert!(check_prefix(good).is_ok(), "{good}");
        }
        for bad in ["", "{}:", "{a}{b}:", "}a{", "with space", "star*", &"x".repeat(65)] {
            let err = check_prefix(bad).unwrap_err();
            assert!(matches!(err, StoreError::Invalid(_)) && err.to_string().contains("{solocron}:"), "{bad}: {err}");
        }
    }

    #[test]
    fn passwords_are_masked() {
        assert_eq!(mask_url("redis://:s3cret@host:6379/0"), "redis://:***@host:6379/0");
        assert_eq!(mask_url("redis://alice:s3cret@host"), "redis://alice:***@host");
        assert_eq!(mask_url("redis://s3cret@host"), "redis://***@host");
        assert_eq!(mask_url("redis://host:6379"), "redis://host:6379");
        assert_eq!(
            mask_url("redis+unix:///run/redis.sock?db=1&pass=s3cret"),
            "redis+unix:///run/redis.sock?db=1&pass=***"
        );
        assert!(!mask_url("s3cret@host").contains("s3cret"));
    }

    #[test]
    fn absurd_durations_are_refused() {
        assert_eq!(millis(Duration::from_millis(1500)).unwrap(), 1500);
        assert!(millis(Duration::from_secs(u64::MAX)).is_err());
    }

    #[test]
    fn optional_arguments_tell_none_from_empty() {
        assert_eq!(optional(None::<&str>), "");
        assert_eq!(optional(Some("")), "=");
        assert_eq!(optional(Some(3)), "=3");
    }
}
