//! # solocron-postgres
//!
//! A [`Store`](solocron_core::Store) in a PostgreSQL database, shared by any number of hosts: every node of a
//! fleet connects to the same database (and prefix), and each tick runs exactly once among
//! all of them.
//!
//! ## What PostgreSQL guarantees here
//!
//! - **The store's clock is the server's clock.** Every comparison with "now" (lease
//!   expiry, renewal, recovery) and every recorded instant is computed inside SQL from the
//!   server's `now()` / `clock_timestamp()`; nodes only ever send lease *lengths*. Hosts with
//!   skewed clocks therefore agree on every lease.
//! - **Exactly once among any number of hosts.** A claim creates attempt 1 of a tick only if
//!   the primary key `(job, scheduled_at, attempt)` has no such row (`INSERT ... ON CONFLICT
//!   DO NOTHING`), so one claimer wins and every other one reads `Taken`. Claims of the same
//!   job are serialized by a row lock on the job's fencing counter, taken before the overlap
//!   check, so two nodes claiming *different* ticks of a job with `skip_if_running` cannot
//!   both see "nothing running" under READ COMMITTED. Fencing tokens come from that counter,
//!   bumped in the claim's own transaction, so they strictly increase per job, even across
//!   pruning.
//! - **A claim whose answer was lost is won again.** The run a claim creates keeps the
//!   request's nonce; a node asking again with it (a timeout, a broken connection) finds
//!   attempt 1 still `running` as its claim, and the claim function grants it again in the
//!   same call: one update of that row (a fresh lease by the server's clock), the same
//!   token. A recovered or ended run, another nonce or another node gets `Taken`.
//! - **A scheduled claim made too early is refused.** Before any lock or write, the claim
//!   function reads the server's clock: a [`Trigger::Schedule`](solocron_core::Trigger)
//!   request for a tick more than [`CLAIM_EARLY_MAX`](solocron_core::CLAIM_EARLY_MAX) ahead
//!   of it gets [`ClaimOutcome::TooEarly`](solocron_core::ClaimOutcome::TooEarly) with that clock, and writes nothing (no record,
//!   no fencing token reserved); the batch's other requests are decided as usual, in the
//!   same call. A node whose clock runs fast thus cannot start a job early.
//! - **Each step is atomic.** A whole claim batch is one call of a PL/pgSQL function (one
//!   round trip, one transaction; a batch of one tick calls its one-tick twin, which takes
//!   scalars instead of arrays); every other method is one statement or one transaction.
//!   A batch's answer (claims, ends, renewals) comes back as one row of arrays, decoded
//!   once per column, not a row per item.
//!   A step that loses a deadlock or serialization conflict is retried a few times.
//! - **A batch of distinct jobs is claimed set-wise.** Where every job of a batch appears
//!   once (a node's batch of an instant), its requests cannot affect one another, so
//!   `{p}claim_set` decides them in a few statements for the whole batch (the fence rows
//!   locked in sorted order with one token each, one insert of every winner, one read of
//!   the taken ticks) and leaves only the others (paused, overlapping, too early, skips,
//!   claims asked again) to `{p}claim`'s request-by-request decision, in the same
//!   transaction, with the same answers.
//! - **A failure retry waits in the table.** [`RunStore::finish_for_retry`](solocron_core::RunStore::finish_for_retry) is one statement:
//!   the end, exactly as `finish` records it, and, only if that matched, the tick's next
//!   attempt as `waiting` (trigger `retry`, the same node, no token, `lease_until` its
//!   not-before: the server's now plus the backoff). `expired` lists due waiting retries
//!   beside expired runs, each read from its own partial index (`{p}runs_expiry`,
//!   `{p}runs_waiting`); `recover` locks the row as it does an expired run's, so one caller
//!   starts it in place (`running`, the job's next token from its fence counter, a fresh
//!   lease) or drops it (`abandoned`). `prune` never deletes a waiting retry.
//! - **Failover.** What a committed step wrote survives a failover only if the standby had
//!   it: with asynchronous replication, the last claims before a crash can vanish, and the
//!   new primary may then hand the same tick (and the same fencing token) out again. Use
//!   synchronous replication (`synchronous_commit = on` with a synchronous standby) where a
//!   double run would hurt. After a failover, leases are judged by the new primary's clock;
//!   keep the servers' clocks in sync (NTP), since a jump between them shortens or stretches
//!   live leases. While the database is unreachable, every step fails with
//!   [`StoreError::Unavailable`]: nodes start nothing new, and holders stop their jobs at
//!   their lease deadline.
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
//! the functions `{p}claim_set`, `{p}claim`, `{p}claim_one` and `{p}claim_taken_first`
//! (which builds before schema version 12 call), `{p}finish_all` and `{p}renew_all` (a
//! batch's runs found by their key, whatever the statistics say: no statement that looks
//! a run up by key or job reads every running run); the notification
//! channel `{p}requests` (run requests and managed job changes). [`SchemaStore::migrate`](solocron_core::SchemaStore::migrate)
//! creates them; [`SchemaStore::uninstall`](solocron_core::SchemaStore::uninstall) drops them.
//!
//! ## Code map
//!
//! - `lib.rs`: the store type, [`PgStore::connect`], and [`StoreBase`] (its description
//!   and clock); each other role trait is implemented in the file of its concern.
//! - `url.rs`: the URL into connection options.
//! - `schema.rs` ([`SchemaStore`](solocron_core::SchemaStore)): `migrate`, `schema`,
//!   `uninstall`; the current tables and routines in `schema/sql/`, the released
//!   migrations, frozen, in `schema/migrations.rs` and `schema/migrations/`.
//! - `claim.rs`: the claim of a batch, one call of `{p}claim_set`, and which ticks are taken.
//! - `claim_one.rs`: the claim of one tick, one call of `{p}claim_one`.
//! - `runs.rs`: a held run after its claim: renew, finish (one or a batch, or for a retry),
//!   expiry, recovery (of expired runs and due retries). A run is found by its key, never
//!   by reading the running runs' partial indexes (see the schema's `BY_KEY`).
//! - `admin.rs`: what operators and housekeeping read and change: history and its counts
//!   by state, the clock, registrations, pauses, manual requests, unlock, prune.
//! - `fleet.rs`: node heartbeats (one upsert each), and the audit log, appended inside the
//!   transaction of the action it records.
//! - `managed.rs`: managed jobs and their revisions (one transaction per write, under the
//!   revision counter's row lock; it notifies `{p}requests`).
//! - `watch.rs`: the request watch (`LISTEN` on `{p}requests`).
//! - `records.rs`: rows decoded into the core's types, and values checked on their way in.
//! - `error.rs`: sqlx errors as [`StoreError`]s, and the bounded retry of lost conflicts.
//!
//! ```no_run
//! use std::time::Duration;
//! use solocron_core::{ClaimMode, ClaimOutcome, ClaimRequest, ClaimStore, Prefix, SchemaStore, StoreBase, Tick, Trigger};
//! use solocron_postgres::PgStore;
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let store = PgStore::connect("postgres://cron:secret@db.internal:5432/app", &Prefix::default()).await?;
//! store.migrate().await?;
//! println!("using {}", store.describe()); // postgres://cron:***@db.internal:5432/app (prefix solocron)
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
#![warn(missing_docs)]
#![forbid(unsafe_code)]

mod admin;
mod claim;
mod claim_one;
mod error;
mod fleet;
mod managed;
mod records;
mod runs;
mod schema;
mod url;
mod watch;

use solocron_core::StoreBase;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use solocron_core::{Prefix, StoreError};
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, PgPoolOptions};
use sqlx::{ConnectOptions, Connection, Executor};

use crate::error::Failure;

/// Connections per store: claims, renewals and scans of one node rarely overlap more.
const POOL_MAX: u32 = 8;

/// How long a step waits for a connection (including opening one); at the engine's 5 s
/// store-call timeout, so a server that does not answer surfaces as "unavailable".
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(5);

/// Idle connections are closed after this, so a fleet at rest holds few server slots.
const IDLE_TIMEOUT: Duration = Duration::from_secs(300);

/// Connections are replaced after this, so that after a failover behind a stable name they
/// all end up on the new primary even if none broke.
const MAX_LIFETIME: Duration = Duration::from_secs(1800);

/// A [`Store`](solocron_core::Store) in a PostgreSQL database.
///
/// Cheap to clone (clones share one connection pool). Separate instances, in one process or
/// on many hosts, coordinate through the database.
///
/// # Panics
///
/// [`RunStore::finish`](solocron_core::RunStore::finish) and [`RunStore::finish_for_retry`](solocron_core::RunStore::finish_for_retry) panic if given a `RunEnd` whose state
/// is not terminal (`running`, `waiting`): that is a bug in the caller, not a condition of
/// the store.
#[derive(Clone)]
pub struct PgStore {
    pool: PgPool,
    prefix: Prefix,
    /// `prefix.table_prefix()`, kept: every statement is filled with it.
    tables: String,
    description: String,
}

impl fmt::Debug for PgStore {
    // Not derived: the pool's options hold the password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgStore").field("store", &self.description).finish()
    }
}

impl PgStore {
    /// Connects to `url` (`postgres://user[:password]@host:port/database`, or
    /// `postgresql://`; libpq's query parameters such as `sslmode` apply) with everything
    /// named from `prefix` (tables `{prefix}_runs`, ...). Opens one connection to check the
    /// server answers; does not create the schema: call [`SchemaStore::migrate`](solocron_core::SchemaStore::migrate).
    ///
    /// Fails with [`StoreError::Invalid`] for a bad URL (and for a server that refuses the
    /// login), and with [`StoreError::Unavailable`] if the server cannot be reached within
    /// 5 s. No error or log line ever shows the password.
    pub async fn connect(url: &str, prefix: &Prefix) -> Result<PgStore, StoreError> {
        let mut options = url::parse(url)?;
        if options.get_application_name().is_none() {
            options = options.application_name("solocron");
        }
        let description = format!("{} (prefix {prefix})", solocron_core::redact_url(url));
        let tables = prefix.table_prefix();
        let pool = open_pool(options, &description, schema::fill(claim_one::CALL, &tables).into()).await?;
        Ok(PgStore { pool, prefix: prefix.clone(), tables, description })
    }

    /// The prefix this store names its tables and functions from.
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

/// A pool with one connection open, or why there is none. Each connection prepares (and
/// caches) the one-tick claim, `claim_call`, when it opens (see [`prepare_claim`]).
async fn open_pool(options: PgConnectOptions, description: &str, claim_call: Arc<str>) -> Result<PgPool, StoreError> {
    // No ping before handing out a pooled connection: it would double the round trips of
    // every step. A connection that broke fails one step (Unavailable), which the engine
    // retries, and sqlx then drops it.
    let opened = PgPoolOptions::new()
        .max_connections(POOL_MAX)
        .acquire_timeout(ACQUIRE_TIMEOUT)
        .idle_timeout(IDLE_TIMEOUT)
        .max_lifetime(MAX_LIFETIME)
        .test_before_acquire(false)
        .after_connect(move |conn, _| {
            let claim_call = claim_call.clone();
            Box::pin(async move { prepare_claim(conn, &claim_call).await })
        })
        .connect_with(options.clone())
        .await;
    let context = format!("cannot connect to {description}");
    match opened {
        Ok(pool) => Ok(pool),
        // The pool keeps retrying a refused connection until its timeout and then only
        // says it timed out; one direct attempt tells the operator what actually fails.
        Err(sqlx::Error::PoolTimedOut) => {
            let why = match tokio::time::timeout(Duration::from_secs(1), options.connect()).await {
                Ok(Err(e)) => e.to_string(),
                Ok(Ok(conn)) => {
                    let _ = conn.close().await;
                    "it answers only slowly".to_owned()
                }
                Err(_) => "no answer".to_owned(),
            };
            Err(StoreError::Unavailable(format!("{context}: no connection within {ACQUIRE_TIMEOUT:?} ({why})")))
        }
        Err(e) => Err(Failure::from(e).into_store(&context)),
    }
}

/// Prepares the one-tick claim on a new connection. Its first use would otherwise cost a
/// round trip more (parse, then bind and execute) on the step a tick waits for, and a lost
/// answer to that parse would fail the claim unsent, where a prepared claim is one message
/// whose commit needs no answer. Before `migrate` has created the function the server
/// refuses the statement: the connection then prepares it at its first claim.
async fn prepare_claim(conn: &mut PgConnection, claim_call: &str) -> Result<(), sqlx::Error> {
    match conn.prepare(claim_call).await {
        Ok(_) => Ok(()),
        Err(sqlx::Error::Database(e)) => {
            tracing::debug!(error = %e, "the claim function is not there yet; not prepared");
            Ok(())
        }
        Err(e) => Err(e),
    }
}

#[async_trait]
impl StoreBase for PgStore {
    fn describe(&self) -> String {
        self.description.clone()
    }

    async fn now(&self) -> Result<DateTime<Utc>, StoreError> {
        admin::now(self).await
    }
}
