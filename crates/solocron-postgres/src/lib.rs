//! # solocron-postgres
//!
//! A [`Store`](solocron_core::Store) in a PostgreSQL database, shared by any number of hosts: every node of a
//! fleet connects to the same database (and table prefix), and each tick runs exactly once
//! among all of them.
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
//! - **Each step is atomic.** A whole claim batch is one call of a PL/pgSQL function (one
//!   round trip, one transaction; a batch of one tick calls its one-tick twin, which takes
//!   scalars instead of arrays); every other method is one statement or one transaction.
//!   A step that loses a deadlock or serialization conflict is retried a few times.
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
//! Tables are named from a prefix (default [`DEFAULT_TABLE_PREFIX`]), so solocron can live
//! in an application's own database; [`Store::migrate`](solocron_core::Store::migrate) creates them and the claim functions.
//!
//! ```no_run
//! use std::time::Duration;
//! use solocron_core::{ClaimMode, ClaimOutcome, ClaimRequest, Store, Tick, Trigger};
//! use solocron_postgres::{PgStore, DEFAULT_TABLE_PREFIX};
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let store = PgStore::connect("postgres://cron:secret@db.internal:5432/app", DEFAULT_TABLE_PREFIX).await?;
//! store.migrate().await?;
//! println!("using {}", store.describe()); // postgres://cron:***@db.internal:5432/app (prefix solocron_)
//!
//! let request = ClaimRequest {
//!     tick: Tick::new("backup", "2026-01-01T00:00:00Z".parse()?),
//!     trigger: Trigger::Schedule,
//!     node: "node-a".into(),
//!     lease: Duration::from_secs(30),
//!     mode: ClaimMode::Run { skip_if_running: true },
//! };
//! match store.claim(&[request]).await?.remove(0) {
//!     ClaimOutcome::Won(lease) => println!("run it, fencing token {}", lease.fencing_token),
//!     other => println!("not ours: {other:?}"),
//! }
//! # Ok(())
//! # }
//! ```
#![warn(missing_docs)]

mod claim;
mod error;
mod methods;
mod records;
mod schema;
mod url;
mod watch;

use std::fmt;
use std::time::Duration;

use solocron_core::StoreError;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::{ConnectOptions, Connection};

use crate::error::Failure;

/// The table prefix callers use unless configured otherwise.
pub const DEFAULT_TABLE_PREFIX: &str = "solocron_";

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
/// [`Store::finish`](solocron_core::Store::finish) panics if given a `RunEnd` whose state is
/// `running`: that is a bug in the caller, not a condition of the store.
#[derive(Clone)]
pub struct PgStore {
    pool: PgPool,
    prefix: String,
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
    /// `postgresql://`; libpq's query parameters such as `sslmode` apply) with tables named
    /// `{table_prefix}runs`, ... (`table_prefix` must match `^[a-z_][a-z0-9_]{0,40}$`; most
    /// callers pass [`DEFAULT_TABLE_PREFIX`]). Opens one connection to check the server
    /// answers; does not create the schema: call [`Store::migrate`](solocron_core::Store::migrate).
    ///
    /// Fails with [`StoreError::Invalid`] for a bad URL or prefix (and for a server that
    /// refuses the login), and with [`StoreError::Unavailable`] if the server cannot be
    /// reached within 5 s. No error or log line ever shows the password.
    pub async fn connect(url: &str, table_prefix: &str) -> Result<PgStore, StoreError> {
        url::validate_prefix(table_prefix)?;
        let mut options = url::parse(url)?;
        if options.get_application_name().is_none() {
            options = options.application_name("solocron");
        }
        let description = format!("{} (prefix {table_prefix})", url::describe(url, &options));
        let pool = open_pool(options, &description).await?;
        Ok(PgStore { pool, prefix: table_prefix.to_owned(), description })
    }

    /// The table prefix this store uses.
    pub fn table_prefix(&self) -> &str {
        &self.prefix
    }

    /// Closes the pool's connections, waiting for steps under way to finish. Dropping the
    /// last clone closes them too, less politely.
    pub async fn close(&self) {
        self.pool.close().await;
    }

    /// `template` with this store's prefix and the server clock filled in.
    fn sql(&self, template: &str) -> String {
        schema::fill(template, &self.prefix)
    }
}

/// A pool with one connection open, or why there is none.
async fn open_pool(options: PgConnectOptions, description: &str) -> Result<PgPool, StoreError> {
    // No ping before handing out a pooled connection: it would double the round trips of
    // every step. A connection that broke fails one step (Unavailable), which the engine
    // retries, and sqlx then drops it.
    let opened = PgPoolOptions::new()
        .max_connections(POOL_MAX)
        .acquire_timeout(ACQUIRE_TIMEOUT)
        .idle_timeout(IDLE_TIMEOUT)
        .max_lifetime(MAX_LIFETIME)
        .test_before_acquire(false)
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
