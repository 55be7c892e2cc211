//! # solocron-mysql
//!
//! A [`Store`](solocron_core::Store) in a MySQL 8 or MariaDB 10.6+ database, shared by any number of hosts: every
//! node of a fleet connects to the same database (and prefix), and each tick runs exactly
//! once among all of them.
//!
//! ## What this store guarantees
//!
//! - **The store's clock is the server's clock.** Every comparison with "now" (lease
//!   expiry, renewal, recovery) and every recorded instant is computed inside SQL as
//!   `CAST(FLOOR(UNIX_TIMESTAMP(NOW(6)) * 1000) AS SIGNED)` on sessions whose `time_zone`
//!   is forced to `'+00:00'`; nodes only send lease *lengths*. Hosts with skewed clocks
//!   therefore agree on every lease. Instants are `BIGINT` milliseconds since the epoch.
//! - **Exactly once among any number of hosts.** Attempt 1 of a tick is created only by an
//!   `INSERT` into the primary key `(job, scheduled_at, attempt)`, which fails (and the
//!   claim with it) if the record exists, so one claimer wins and every other one reads
//!   `Taken`.
//! - **Claims of one job are serialized** by an exclusive row lock on the job's fencing
//!   counter (`{p}fences`), taken before anything about the job is read; a batch locks
//!   its jobs in sorted order, so concurrent batches do not deadlock on them. Every writer
//!   that creates a `running` row or an attempt-1 row (claim, recovery by retry, the start
//!   of a waiting retry) takes that lock first, so what a claim reads after taking it cannot
//!   change before it commits.
//!   Fencing tokens come from that counter, written in the claim's own transaction, so they
//!   strictly increase per job, even across pruning.
//! - **Each step is atomic**: one statement or one transaction. A transaction that loses a
//!   deadlock (1213) or a lock wait (1205) is retried up to 5 times.
//! - **Failover**: what a committed step wrote survives only if the replica had it; with
//!   asynchronous replication the last claims before a crash can vanish and be handed out
//!   again. Use semi-synchronous replication (or Galera/Group Replication) where a double run
//!   would hurt, and keep the servers' clocks in sync. While the server is unreachable, every
//!   step fails with [`StoreError::Unavailable`].
//!
//! ## The claim, in round trips
//!
//! A claim of **one tick** (the common case: a job's own schedule) is **one round trip**, a
//! prepared `CALL {p}claim_one_v7(...)`: a stored procedure (since schema version 2, so the
//! database user needs `CREATE ROUTINE`, `ALTER ROUTINE` and `EXECUTE`) that takes the
//! job's fence lock, decides and writes as described below for a batch of one, and
//! commits (see `claim_one.rs`).
//!
//! A scheduled tick (trigger `schedule`) more than
//! [`CLAIM_EARLY_MAX`](solocron_core::CLAIM_EARLY_MAX) ahead of the server's clock is
//! refused as [`ClaimOutcome::TooEarly`](solocron_core::ClaimOutcome::TooEarly) with that clock, before any other decision, and
//! writes nothing: the procedure checks it before its transaction (no lock, no counter
//! change); a batch checks it against the clock of its locked read, and decides its other
//! requests as if that one were not there (a fence row it created for a job of only such
//! ticks, counter 0, is as good as none; a batch with nothing to write rolls back).
//!
//! A whole batch (up to [`CLAIM_BATCH_MAX`](solocron_core::CLAIM_BATCH_MAX) requests) is one
//! transaction of **2 round trips**, whatever its size. The first sends `START TRANSACTION`;
//! one multi-row `INSERT ... ON DUPLICATE KEY UPDATE token = token` into the fences (creates
//! missing counters and X-locks every job of the batch, in sorted order); and one `UNION ALL`
//! read of the counters, the batch's existing tick records, the running runs of jobs that
//! must not overlap, the paused jobs and the server's clock (every row the batch writes is
//! claimed at that instant, so no read-back is needed: MySQL 8 has no `INSERT ... RETURNING`).
//! The outcome of each request is decided in memory, in request order, from what the locked
//! read returned, so two requests of one batch see each other exactly as if they had been
//! claimed one after the other. The second sends one multi-row `INSERT` of every new run row,
//! then (if some request won) an `UPDATE` of the counters, and `COMMIT`.
//!
//! A request asked again after a lost answer (its nonce, node and tick those of a record
//! still `running`) is won again: the existing tick row of the read carries the record's
//! nonce, owner, token and claim instant. A batch that grants runs again puts one `UPDATE`
//! of their leases first in its second round trip, and sends `COMMIT` in a third once that
//! update's count shows each of them still running (a finish or an abandon, which take no
//! fence lock, may have ended one since the read: the batch is then rolled back and tried
//! again). Batches that grant nothing again keep their 2 round trips.
//!
//! Each round trip is one multi-statement text query with its values written in as literals
//! (text as `_utf8mb4 X'…'` hex, which no input can break out of, whatever the SQL mode):
//! with prepared statements every statement would be a round trip of its own (a claim took
//! 6, and 2.8× the time of a bare insert). The server stops a multi-statement query at its
//! first error, so a failed insert never reaches the `COMMIT`: the claim rolls back and is
//! tried again. A claim cancelled between the two round trips closes its connection instead
//! of returning it to the pool, and the server rolls the transaction back.
//!
//! ## Failure retries
//!
//! [`RunStore::finish_for_retry`](solocron_core::RunStore::finish_for_retry) is one transaction in **one round trip**, a multi-statement
//! text query like a claim's: `START TRANSACTION`, the `UPDATE` of [`RunStore::finish`](solocron_core::RunStore::finish) (the
//! run `running` with the lease's node and token), `SET @solocron_finished = ROW_COUNT()`,
//! an `INSERT ... SELECT ... FROM DUAL WHERE @solocron_finished = 1` of the tick's next
//! attempt as `waiting` (trigger `retry`, the same node, no token, `claimed_at` the server's
//! now, `lease_until` now + the backoff: its not-before), and `COMMIT`. A finish that
//! matched nothing inserts nothing (answer `false`); an insert that fails stops the query
//! before its `COMMIT`, and the end is rolled back with it. The waiting row is neither
//! `running` nor attempt 1, so it needs no fence lock: claims never read it.
//!
//! [`RunStore::expired`](solocron_core::RunStore::expired) reads the expired `running` runs and the due `waiting` retries
//! (`lease_until` < now for both) as two ordered `LIMIT` ranges of the key
//! `{p}runs_expiry (state, lease_until)`, merged by a `UNION ALL` sorted by `lease_until`.
//! [`RunStore::recover`](solocron_core::RunStore::recover) by `Retry` of a due waiting retry takes the job's fence lock, then the
//! row (`FOR UPDATE`), and turns that same row `running` for the node with the job's next
//! token, a fresh lease and no nonce, then advances the counter and reads the lease's
//! instants back; by `Abandon`, one `UPDATE` ends it `abandoned` (as for an expired running
//! run). Either acts only while the row is `waiting` and due, so one recoverer wins and the
//! others find nothing to do. [`HistoryStore::prune`](solocron_core::HistoryStore::prune) never deletes a `waiting` row, and states are
//! plain `VARCHAR(16)` (no `ENUM` or `CHECK`), so no schema change was needed.
//!
//! ## MySQL 8 and MariaDB: what differs, and what this crate does about it
//!
//! - **RETURNING**: MariaDB has `INSERT ... RETURNING` (10.5+) and `DELETE ... RETURNING`;
//!   MySQL 8 has neither. Nothing here relies on them: a claim writes the server clock it
//!   read under its locks, and other steps read back with a separate `SELECT` inside the
//!   same transaction, which works on both.
//! - **The clock**: `NOW(6)` is the *statement's* start time on both (constant for all rows
//!   of one statement, so every row of a batch insert has the same `claimed_at`, and a
//!   statement that waited for a row lock judges expiry as of when it started). Both keep
//!   microseconds; `FLOOR` before the cast because both round a `DECIMAL` cast to `SIGNED`
//!   (a claim could otherwise be stamped half a millisecond in the future).
//!   `UNIX_TIMESTAMP(datetime)` reads its argument in the session time zone, hence the
//!   forced `'+00:00'` (sqlx sets it by default; this crate also overrides a `timezone`
//!   given in the URL).
//! - **Isolation and gap locks**: both default to REPEATABLE READ, where `INSERT IGNORE`,
//!   `ON DUPLICATE KEY UPDATE` and locking reads take next-key (gap) locks, which can block
//!   or deadlock claims of *different* jobs whose keys are neighbours. This crate runs its
//!   sessions at READ COMMITTED (only record locks, plus the gap locks of duplicate-key
//!   checks) unless the server logs statement-based binlogs (`log_bin` on with
//!   `binlog_format = STATEMENT`), where InnoDB refuses writes at READ COMMITTED. The claim
//!   is correct at both levels: its reads happen after its fence locks are held, so even at
//!   REPEATABLE READ the snapshot is taken after every earlier claim of those jobs committed
//!   (the test suites pass at both levels). The variable is `tx_isolation` on MariaDB 10 and
//!   `transaction_isolation` on MySQL 8 (and MariaDB 11.1+), so the level is set with `SET
//!   SESSION TRANSACTION ISOLATION LEVEL`, which both accept.
//! - **`INSERT IGNORE`** ignores more than duplicate keys: too-long values would be silently
//!   truncated. Every value it writes is therefore checked first (names of at most 191
//!   characters without trailing spaces, reasons of at most 65,535 bytes); other statements
//!   run in strict mode (`STRICT_ALL_TABLES` is added to the session's `sql_mode`).
//! - **Affected rows**: sqlx connects with `CLIENT_FOUND_ROWS`, so an `UPDATE` reports rows
//!   *matched* (a renewal within the same millisecond still counts), and a duplicate skipped
//!   by `INSERT IGNORE` counts 0.
//! - **Collation and key lengths**: tables are `utf8mb4` with `utf8mb4_bin` (exact,
//!   case-sensitive names sorted by bytes, as Rust sorts them; MySQL 8's default
//!   `utf8mb4_0900_ai_ci` and MariaDB's `utf8mb4_general_ci` would merge `Backup` and
//!   `backup`). `utf8mb4_bin` pads with spaces on both servers (`'a' = 'a '`), hence the
//!   refusal of trailing spaces. Key columns are `VARCHAR(191)`: 764 bytes, within the
//!   767-byte index limit of old row formats and the 3072-byte limit of `DYNAMIC`.
//! - **DDL auto-commits**, so [`SchemaStore::migrate`](solocron_core::SchemaStore::migrate) serializes on `GET_LOCK('{p}migrate', 30)`
//!   (named after the prefix only: namesakes in other databases of the same server merely
//!   take turns) and creates each table with its indexes in one `CREATE TABLE IF NOT
//!   EXISTS`, writing the version row last. [`SchemaStore::uninstall`](solocron_core::SchemaStore::uninstall) takes the same lock.
//! - **`ON DUPLICATE KEY UPDATE col = VALUES(col)`** is deprecated in MySQL 8.0.20 and the
//!   replacement (`AS new`) does not exist in MariaDB; upserts here use `INSERT ... SELECT
//!   ... FROM (derived table) v ON DUPLICATE KEY UPDATE col = v.col` or bind values twice.
//! - **Stalled clients**: a node stopped (SIGSTOP) inside a transaction keeps its row locks;
//!   sessions set `wait_timeout = 30`, so the server drops such a connection (rolling back)
//!   after 30 s, and `innodb_lock_wait_timeout = 3`, so others fail fast meanwhile.
//! - **Planning big `IN` lists**: a row-constructor `(job, scheduled_at) IN ((?, ?), ...)` of
//!   1000 pairs takes MariaDB 10.11 about 300 ms to *plan*, even on an empty table; the claim
//!   looks tick records up as `job IN (...) AND scheduled_at IN (...)` (primary-key ranges,
//!   planned in microseconds) and filters the superset in memory. Long `OR` chains of ranges
//!   are slow to plan too.
//! - **sqlx and `_bin` collations**: the server flags `utf8mb4_bin` columns BINARY, and sqlx
//!   0.8 then refuses to decode them as `String`; they are read as bytes and checked UTF-8.
//! - **Unreachable servers**: sqlx's pool retries a refused connection until its acquire
//!   timeout and then reports only "pool timed out"; [`MySqlStore::connect`] therefore opens
//!   (and sets up) one connection itself first, so it fails at once with the real cause.
//! - **Errors**: I/O, TLS, protocol and pool errors, and the server codes 1040 (too many
//!   connections), 1053 (shutdown), 1927 (connection killed), 2002, 2003, 2006, 2013, 2055
//!   and 4031 (gone or disconnected) are [`StoreError::Unavailable`]; so are a deadlock
//!   (1213) or lock wait timeout (1205) still lost after 5 attempts. Everything else
//!   (including a refused login, 1045) is [`StoreError::Invalid`].
//! - **Prepared statements** live on the server, which allows `max_prepared_stmt_count`
//!   (16,382 by default) across all clients; each connection caches at most 32 (8 per pool,
//!   so 256 per node, about 60 nodes per server at the default). Raise the server setting
//!   for bigger fleets, or lower the cache with `?statement-cache-capacity=N` in the URL.
//! - Only MariaDB 10.11 was tested here; the MySQL 8 statements were chosen from its
//!   documentation (every statement sticks to syntax both servers share).
//!
//! ## Layout
//!
//! Everything is named from a [`Prefix`] (`solocron` by default, so tables `solocron_runs`,
//! ...), which lets solocron live in an application's own database, and several fleets in
//! one: tables `{p}runs` (every attempt of every tick), `{p}fences` (per-job fencing
//! counters, also the claim's per-job locks), `{p}jobs` (pauses), `{p}registry` (which node
//! runs which job), `{p}requests` (manual run requests), `{p}nodes` (each node's last
//! heartbeat, by the server's clock), `{p}actions` (the audit log of operators' actions,
//! written in the transaction of the action), `{p}managed` (jobs defined in the
//! store), `{p}job_revisions` (every change of one), `{p}managed_version` (the store-wide
//! revision counter, whose row lock orders their writers) and `{p}schema` (the version);
//! the stored procedure `{p}claim_one_v7` (and version 2's `{p}claim_one` and version 5's
//! `{p}claim_one_v5`, left in place by an upgrade for the nodes still calling them); the
//! named lock `{p}migrate`. [`SchemaStore::migrate`](solocron_core::SchemaStore::migrate) creates
//! them; [`SchemaStore::uninstall`](solocron_core::SchemaStore::uninstall) drops them.
//!
//! ## Code map
//!
//! - `lib.rs`: the store type, [`MySqlStore::connect`] (with each session's settings) and
//!   [`StoreBase`] (its description and clock); each other role trait is implemented in the
//!   file of its concern.
//! - `url.rs`: the URL into connection options.
//! - `schema.rs`: the tables, the stored procedure, their versions, `migrate`, `schema`
//!   and `uninstall`.
//! - `claim.rs`: the claim of a batch, in 2 round trips (3 when it grants a run again),
//!   and which ticks are taken.
//! - `claim_one.rs`: the claim of one tick, one `CALL {p}claim_one_v7`; `claim.rs` sends
//!   a batch of one there (the arrow goes that way only).
//! - `runs.rs`: a held run after its claim: renew, finish (one, a batch, or with a waiting
//!   retry), expiry, recovery (of expired runs and due retries).
//! - `admin.rs`: what operators and housekeeping read and change: history and its counts
//!   by state, registrations, pauses, manual requests, unlock, prune.
//! - `fleet.rs`: node heartbeats (one upsert each), and the audit log, appended inside the
//!   transaction of the action it records.
//! - `managed.rs`: managed jobs and their revisions (one transaction per write, under the
//!   revision counter's row lock). This store has no request watch: nodes poll the version.
//! - `text.rs`: statements sent as SQL text: values written in as literals, multi-statement
//!   queries, transactions begun and ended by hand.
//! - `records.rs`: rows decoded into the core's types, and values checked on their way in
//!   (with how far ahead a tick may be claimed, which both claims bind).
//! - `error.rs`: MySQL errors as [`StoreError`]s, and the bounded retry of lost lock
//!   conflicts.
//!
//! ```no_run
//! use std::time::Duration;
//! use solocron_core::{
//!     ClaimMode, ClaimOutcome, ClaimRequest, ClaimStore, Prefix, SchemaStore, StoreBase, Tick, Trigger,
//! };
//! use solocron_mysql::MySqlStore;
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let store = MySqlStore::connect("mysql://cron:secret@db.internal:3306/app", &Prefix::default()).await?;
//! store.migrate().await?;
//! println!("using {}", store.describe()); // mysql://cron:***@db.internal:3306/app (prefix solocron)
//!
//! let request = ClaimRequest {
//!     tick: Tick::new("backup", "2026-01-01T00:00:00Z".parse()?),
//!     trigger: Trigger::Schedule,
//!     node: "node-a".into(),
//!     lease: Duration::from_secs(30),
//!     mode: ClaimMode::Run { skip_if_running: true },
//!     nonce: 0,
//! };
//! match store.claim(&[request]).await?.remove(0) {
//!     ClaimOutcome::Won(lease) => println!("run it, fencing token {}", lease.fencing_token),
//!     other => println!("not ours: {other:?}"),
//! }
//! # Ok(())
//! # }
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod admin;
mod claim;
mod claim_one;
mod error;
mod fleet;
mod managed;
mod records;
mod runs;
mod schema;
mod text;
mod url;

use solocron_core::StoreBase;
use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use solocron_core::{Prefix, StoreError};
use sqlx::mysql::{MySqlConnectOptions, MySqlConnection, MySqlPool, MySqlPoolOptions};
use sqlx::{Connection, Executor};

use crate::error::Failure;

/// Connections per store: claims, renewals and scans of one node rarely overlap more.
const POOL_MAX: u32 = 8;

/// How long a step waits for a connection (including opening one): the engine's 5 s
/// store-call timeout, so a server that does not answer surfaces as "unavailable".
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(5);

/// Idle connections are closed by the pool after this, before the server's `wait_timeout`
/// (set per session, below) would drop them under its feet.
const IDLE_TIMEOUT: Duration = Duration::from_secs(20);

/// A connection idle longer than this is pinged before use (a server restart leaves idle
/// connections dead); busier ones are not, which would double every step's round trips.
const PING_AFTER_IDLE: Duration = Duration::from_secs(10);

/// Connections are replaced after this, so that after a failover behind a stable name they
/// all end up on the new primary even if none broke.
const MAX_LIFETIME: Duration = Duration::from_secs(1800);

/// Session settings of every connection. `wait_timeout`: a client stalled inside a
/// transaction (SIGSTOP) loses its connection, and so its locks, after 30 s.
/// `innodb_lock_wait_timeout`: our transactions hold locks for milliseconds, so a 3 s wait
/// means a stalled holder; fail (and retry) well within the engine's 5 s call timeout.
const SESSION_SETUP: &str = "SET SESSION sql_mode = CONCAT(@@sql_mode, ',STRICT_ALL_TABLES'), \
     SESSION wait_timeout = 30, SESSION innodb_lock_wait_timeout = 3";

/// A [`Store`](solocron_core::Store) in a MySQL or MariaDB database.
///
/// Cheap to clone (clones share one connection pool). Separate instances, in one process or
/// on many hosts, coordinate through the database.
///
/// # Panics
///
/// [`RunStore::finish`](solocron_core::RunStore::finish) panics if given a `RunEnd` whose state is `running`: that is a bug in
/// the caller, not a condition of the store.
#[derive(Clone)]
pub struct MySqlStore {
    pool: MySqlPool,
    prefix: Prefix,
    /// `prefix.table_prefix()`, kept: every statement is filled with it.
    tables: String,
    description: String,
}

impl fmt::Debug for MySqlStore {
    // Not derived: the pool's options hold the password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MySqlStore").field("store", &self.description).finish()
    }
}

impl MySqlStore {
    /// Connects to `url` (`mysql://user[:password]@host:port/database`, or `mariadb://`; the
    /// query parameters of sqlx such as `ssl-mode` apply) with everything named from
    /// `prefix` (tables `{prefix}_runs`, ...). Opens one connection to check the server
    /// answers; does not create the schema: call [`SchemaStore::migrate`](solocron_core::SchemaStore::migrate).
    ///
    /// Fails with [`StoreError::Invalid`] for a bad URL (and for a server that refuses the
    /// login), and with [`StoreError::Unavailable`] if the server cannot be reached within
    /// 5 s. No error or log line ever shows the password.
    pub async fn connect(url: &str, prefix: &Prefix) -> Result<MySqlStore, StoreError> {
        let options = url::parse(url)?;
        let description = format!("{} (prefix {prefix})", solocron_core::redact_url(url));
        let tables = prefix.table_prefix();
        // Each pooled connection also prepares (and caches) the one-tick claim's `CALL` when
        // it opens: its first use would otherwise cost a round trip more (prepare, then
        // execute) on the step a tick waits for, and a lost answer to that prepare would fail
        // the claim unsent, where a prepared claim is one packet whose commit needs no answer.
        // MySQL resolves the procedure when the statement executes, so preparing it before
        // `migrate` created it is harmless.
        let claim_call: std::sync::Arc<str> = schema::fill(claim_one::CALL, &tables).into();
        probe(&options).await.map_err(|f| f.into_store(&format!("cannot connect to {description}")))?;
        let pool = MySqlPoolOptions::new()
            .max_connections(POOL_MAX)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .idle_timeout(IDLE_TIMEOUT)
            .max_lifetime(MAX_LIFETIME)
            .test_before_acquire(false)
            .before_acquire(|conn, meta| {
                Box::pin(async move {
                    if meta.idle_for > PING_AFTER_IDLE {
                        conn.ping().await?;
                    }
                    Ok(true)
                })
            })
            .after_connect(move |conn, _| {
                let claim_call = claim_call.clone();
                Box::pin(async move {
                    setup_session(conn).await?;
                    conn.prepare(&claim_call).await.map(drop)
                })
            })
            .connect_lazy_with(options);
        Ok(MySqlStore { pool, prefix: prefix.clone(), tables, description })
    }

    /// The prefix this store names its tables and procedure from.
    pub fn prefix(&self) -> &Prefix {
        &self.prefix
    }

    /// Closes the pool's connections, waiting for steps under way to finish. Dropping the
    /// last clone closes them too, less politely.
    pub async fn close(&self) {
        self.pool.close().await;
    }

    /// `template` with this store's table prefix and the server clock filled in.
    fn sql(&self, template: &str) -> String {
        schema::fill(template, &self.tables)
    }
}

/// Opens and sets up one connection, to report at once why the server cannot be used: the
/// pool would retry a refused connection until its timeout and then only say it timed out.
async fn probe(options: &MySqlConnectOptions) -> Result<(), Failure> {
    let attempt = async {
        let mut conn = MySqlConnection::connect_with(options).await?;
        setup_session(&mut conn).await?;
        conn.close().await
    };
    match tokio::time::timeout(ACQUIRE_TIMEOUT, attempt).await {
        Ok(outcome) => Ok(outcome?),
        Err(_) => Err(Failure::Store(StoreError::Unavailable(format!("no answer within {ACQUIRE_TIMEOUT:?}")))),
    }
}

/// Settings every connection gets before its first use (see [`SESSION_SETUP`]), and READ
/// COMMITTED where the server allows it (see the crate docs on isolation).
async fn setup_session(conn: &mut MySqlConnection) -> Result<(), sqlx::Error> {
    conn.execute(SESSION_SETUP).await?;
    let (log_bin, format): (i64, String) =
        sqlx::query_as("SELECT CAST(@@log_bin AS SIGNED), CAST(@@binlog_format AS CHAR)").fetch_one(&mut *conn).await?;
    if log_bin == 0 || !format.eq_ignore_ascii_case("STATEMENT") {
        conn.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED").await?;
    }
    Ok(())
}

#[async_trait]
impl StoreBase for MySqlStore {
    fn describe(&self) -> String {
        self.description.clone()
    }

    /// The server's clock.
    async fn now(&self) -> Result<DateTime<Utc>, StoreError> {
        let context = "cannot read the server clock";
        let ms: i64 = sqlx::query_scalar(&self.sql("SELECT NOW_MS"))
            .fetch_one(&self.pool)
            .await
            .map_err(|e| Failure::from(e).into_store(context))?;
        records::instant(ms).map_err(|f| f.into_store(context))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The test server's URL (see the integration tests).
    fn test_url() -> String {
        std::env::var("SOLOCRON_TEST_MYSQL_URL").unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into())
    }

    /// A store on the test server, or `None` (skip; a failure under CI) if unreachable.
    async fn test_store(url: &str) -> Option<MySqlStore> {
        match MySqlStore::connect(url, &Prefix::default()).await {
            Ok(store) => Some(store),
            Err(e) => solocron_conformance::server_unreachable("MariaDB", &e.to_string()),
        }
    }

    /// The session settings every statement relies on.
    #[tokio::test]
    async fn sessions_are_utc_strict_and_read_committed() {
        // A time zone in the URL must not win over UTC.
        let url = test_url();
        let url = format!("{url}{}timezone=%2B02:00", if url.contains('?') { '&' } else { '?' });
        let Some(store) = test_store(&url).await else { return };
        let (zone, mode, lock_wait): (String, String, i64) = sqlx::query_as(
            "SELECT CAST(@@session.time_zone AS CHAR), CAST(@@session.sql_mode AS CHAR),
                    CAST(@@session.innodb_lock_wait_timeout AS SIGNED)",
        )
        .fetch_one(&store.pool)
        .await
        .expect("session variables");
        assert_eq!((zone.as_str(), lock_wait), ("+00:00", 3));
        assert!(mode.contains("STRICT_ALL_TABLES"), "{mode}");
        // MySQL 8 and MariaDB 11.1+ call it transaction_isolation; MariaDB 10 tx_isolation.
        let isolation = match sqlx::query_scalar::<_, String>("SELECT CAST(@@session.transaction_isolation AS CHAR)")
            .fetch_one(&store.pool)
            .await
        {
            Ok(level) => level,
            Err(_) => sqlx::query_scalar("SELECT CAST(@@session.tx_isolation AS CHAR)")
                .fetch_one(&store.pool)
                .await
                .expect("tx_isolation"),
        };
        assert_eq!(isolation, "READ-COMMITTED");
        let server_ms: i64 = sqlx::query_scalar(&store.sql("SELECT NOW_MS")).fetch_one(&store.pool).await.unwrap();
        assert!((server_ms - Utc::now().timestamp_millis()).abs() < 5_000, "the server clock in UTC: {server_ms}");
        store.close().await;
    }

    /// A connection the server drops (restart, failover, KILL) fails at most one step, as
    /// `Unavailable` (never `Invalid`); the next step gets a new connection. (The pool may
    /// also notice the dead socket first and reconnect at once: then no step fails.)
    #[tokio::test]
    async fn a_killed_connection_is_unavailable_once_then_replaced() {
        let Some(store) = test_store(&test_url()).await else { return };
        let id: i64 =
            sqlx::query_scalar("SELECT CAST(CONNECTION_ID() AS SIGNED)").fetch_one(&store.pool).await.expect("id");
        assert_eq!(store.pool.size(), 1, "one pooled connection: the one to kill");
        let mut admin = MySqlConnection::connect_with(&url::parse(&test_url()).unwrap()).await.expect("connect");
        sqlx::query(&format!("KILL CONNECTION {id}")).execute(&mut admin).await.expect("kill");
        admin.close().await.expect("close");
        // KILL returns before the server has closed the socket, so the step that meets the
        // dead connection may be the first or a later one: count failures over a few steps.
        let mut failed = 0;
        for _ in 0..4 {
            if let Err(err) = store.now().await {
                assert!(
                    matches!(err, StoreError::Unavailable(_)),
                    "a dropped connection is unavailable, not invalid: {err}"
                );
                failed += 1;
            }
        }
        assert!(failed <= 1, "a dropped connection failed {failed} steps, not at most one");
        store.now().await.expect("a new connection");
        store.close().await;
    }
}
