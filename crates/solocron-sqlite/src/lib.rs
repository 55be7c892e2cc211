//! # solocron-sqlite
//!
//! The embedded [`Store`](solocron_core::Store) of solocron: one SQLite file shared by the processes of **one
//! host**. The store's clock is SQLite's `unixepoch()`, evaluated inside each process, so
//! it is the host clock: every process on the host judges leases by the same clock. Do
//! not share the file between hosts (their clocks differ, and network file systems do not
//! honour SQLite's locks); use a server store for a fleet of hosts.
//!
//! Each [`Store`](solocron_core::Store) method is one `BEGIN IMMEDIATE` transaction, or one statement where one
//! suffices (a read, or a renewal's or a finish's `UPDATE`), so concurrent processes
//! serialize on SQLite's write lock and wait up to the busy timeout instead of failing. A
//! claim decides its whole batch from one read ([`solocron_sql::plan`]), so it holds the
//! lock for a few statements however many ticks it claims; a claim of one tick is one
//! statement that decides in SQL. Both refuse a scheduled tick claimed more than
//! [`solocron_core::CLAIM_EARLY_MAX`] ahead of SQLite's clock before deciding anything else
//! ([`ClaimOutcome::TooEarly`](solocron_core::ClaimOutcome::TooEarly), with that clock; nothing written, no counter advanced): the
//! batch from its read's clock, the one-tick statement in its `WHERE` (a `SELECT` in the
//! same call reads the clock back when it wrote nothing). Every comparison with "now"
//! (lease expiry, a claim's earliness) uses SQLite's own clock, and all instants are stored
//! as integer milliseconds since the Unix epoch (UTC).
//!
//! ## Layout
//!
//! Every name starts with the store's [`Prefix`] as a table prefix (`solocron_` by
//! default, the names of every earlier release), so several prefixes share one file:
//! `{p}runs` (one record per attempt of a tick), `{p}fences` (each job's fencing counter,
//! advanced by the trigger `{p}runs_fence`), `{p}jobs` (pause switches), `{p}registry`
//! (which node runs which job), `{p}requests` (manual runs), `{p}nodes` (each node's last
//! heartbeat), `{p}actions` (the audit log of operators' actions), `{p}managed` and
//! `{p}job_revisions` (jobs defined in the store, and each change), `{p}schema` (the
//! version); the indexes `{p}runs_expiry`, `{p}runs_running`, `{p}runs_newest`,
//! `{p}runs_running_newest`, `{p}registry_node`, `{p}requests_oldest`, `{p}actions_newest`,
//! `{p}actions_job`, `{p}job_revisions_job`.
//! Every statement's text is built once, when the store connects.
//!
//! ## Code map
//!
//! - `lib.rs`: the store type, [`SqliteStore::connect`], and [`StoreBase`] (its
//!   description and clock); each other role trait is implemented in the file of its
//!   concern.
//! - `url.rs`: a `sqlite:` URL into the driver's options and the file's path.
//! - `schema.rs`: the tables, `migrate`, `schema` and `uninstall`.
//! - `claim.rs`: the batch claim (one transaction, decided in memory), and which ticks are
//!   taken; `claim_one.rs`: the one-tick claim (one statement, decided in SQL), where
//!   `claim.rs` sends a batch of one (the arrow goes that way only). Nothing else claims.
//! - `runs.rs`: a held run's life: renew, finish, expired, recover.
//! - `admin.rs`: history and its counts by state, registry, pause and unlock, manual
//!   requests, prune.
//! - `managed.rs`: managed jobs and their revisions (one write transaction each).
//! - `fleet.rs`: node heartbeats (one upsert each), and the audit log, appended inside the
//!   transaction of the action it records.
//! - `watch.rs`: the request watch (inotify on the database's files).
//! - `records.rs`: rows into records, durations and instants into milliseconds (with how
//!   far ahead a tick may be claimed, which both claims compare).
//! - `error.rs`: SQLite's errors into [`StoreError`]s.
//!
//! ```
//! use std::time::Duration;
//! use solocron_core::{ClaimMode, ClaimOutcome, ClaimRequest, ClaimStore, Prefix, SchemaStore, Tick, Trigger};
//! use solocron_sqlite::SqliteStore;
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! # let path = dir.path().join("solocron.db");
//! let store = SqliteStore::connect(&format!("sqlite://{}", path.display()), &Prefix::default()).await?;
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
#![warn(missing_docs)]
#![forbid(unsafe_code)]

/// The store's "now" in SQL: SQLite's clock, in integer milliseconds since the epoch.
/// A macro rather than a `const` so that it can be spliced into `concat!`-built
/// statement templates.
macro_rules! now {
    () => {
        "CAST(unixepoch('subsec') * 1000 AS INTEGER)"
    };
}

/// Whether a row's `job` is in the namespaces bound, twice, as
/// [`solocron_sql::namespace_list`] (`NULL`: every namespace): the part of the full name
/// before its first `/`, or `default`, found between commas in the list.
macro_rules! in_namespaces {
    () => {
        "(? IS NULL OR instr(?, ',' || CASE WHEN instr(job, '/') = 0 THEN 'default' \
         ELSE substr(job, 1, instr(job, '/') - 1) END || ',') > 0)"
    };
}

/// The columns a [`RunRecord`] is read from, in
/// `records::record`'s order. `"trigger"` is quoted because TRIGGER is an SQL keyword.
macro_rules! columns {
    () => {
        r#"job, scheduled_at, attempt, "trigger", node, token, state, reason, claimed_at, started_at, finished_at, lease_until, exit_code, output"#
    };
}

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
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use solocron_core::{redact_url, Prefix, StoreError};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Sqlite, Transaction};

use crate::error::{db_err, in_context, is_busy};

/// How long a connection waits for another process's write lock before giving up; below
/// the engine's 5 s store-call timeout, so a long lock surfaces as "unavailable" from here.
const BUSY_TIMEOUT: Duration = Duration::from_secs(4);
/// Pause between attempts to open a database another process holds locked.
const OPEN_RETRY_PAUSE: Duration = Duration::from_millis(50);

/// Connections per store: writers serialize on the file lock anyway, so one more lets a
/// read (history, expiry scans, the registry) proceed beside one writer. Each connection is
/// a thread with its own allocator arena, page cache and prepared statements: an idle node
/// of 10,000 jobs held 1.3 MiB more with four (opened at start-up, kept in rotation), and
/// herds of 10 nodes started no sooner with them.
const POOL_MAX: u32 = 2;
/// Each connection's page cache, in KiB (SQLite's `cache_size`, negative for KiB). In WAL
/// mode a connection drops its cache whenever another one wrote since its last read (a
/// heartbeat does every few seconds), so SQLite's default, 2 MiB a connection, kept little
/// for long but set each connection thread's allocator high-water mark: several MB of an
/// idle node of 10,000 jobs, whose registry refresh reads and writes every page of the
/// registry. Claims were as fast with this (the benchmark's claim scenario: 117 µs a claim,
/// 115 with the default; herds within their noise).
const CACHE_KIB: i64 = 256;

/// A [`Store`](solocron_core::Store) kept in one SQLite file, under one [`Prefix`].
///
/// Cheap to clone (clones share one connection pool). Separate instances on the same file,
/// in one process or many, coordinate through SQLite's locks.
///
/// # Panics
///
/// [`RunStore::finish`](solocron_core::RunStore::finish) panics if given a `RunEnd` whose state is `running`: that is a bug in
/// the caller, not a condition of the store.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
    path: PathBuf,
    description: Arc<str>,
    sql: Arc<Statements>,
}

impl SqliteStore {
    /// The absolute path of the database file a `sqlite:` URL names (relative paths are
    /// relative to the current directory), without opening or creating it: for callers
    /// that must not create a store where none is (read commands of a CLI).
    ///
    /// ```
    /// let path = solocron_sqlite::SqliteStore::database_path("sqlite:///var/lib/app/solocron.db").unwrap();
    /// assert_eq!(path, std::path::Path::new("/var/lib/app/solocron.db"));
    /// ```
    pub fn database_path(url: &str) -> Result<std::path::PathBuf, StoreError> {
        url::parse(url).map(|(_, path)| path)
    }

    /// Opens (creating it if missing) the database at `url`: `sqlite://path/to/file.db`,
    /// `sqlite:///abs/path.db` or `sqlite:path`; relative paths are relative to the current
    /// directory. Its tables are named with `prefix` ([`Prefix::table_prefix`]; the default
    /// gives the `solocron_*` tables of every earlier release). Does not create the schema:
    /// call [`SchemaStore::migrate`](solocron_core::SchemaStore::migrate).
    ///
    /// Fails with [`StoreError::Invalid`] if the file's directory does not exist (a typo in
    /// a path: waiting would never help), if `url` is not a file-backed `sqlite:` URL (an
    /// in-memory database cannot be shared by a fleet) or carries a password, and with
    /// [`StoreError::Unavailable`] if the file cannot be opened. Errors show the URL masked.
    pub async fn connect(url: &str, prefix: &Prefix) -> Result<SqliteStore, StoreError> {
        let (options, path) = url::parse(url)?;
        Self::open(options, path, prefix).await
    }

    /// Opens (creating it if missing) the database file at `path`, like [`connect`](Self::connect).
    pub async fn open_path(path: &Path, prefix: &Prefix) -> Result<SqliteStore, StoreError> {
        let path = std::path::absolute(path)
            .map_err(|e| StoreError::Unavailable(format!("cannot resolve SQLite path {}: {e}", path.display())))?;
        Self::open(SqliteConnectOptions::new(), path, prefix).await
    }

    async fn open(options: SqliteConnectOptions, path: PathBuf, prefix: &Prefix) -> Result<SqliteStore, StoreError> {
        // SQLite's own error for a missing directory is a bare "unable to open database
        // file"; say which path, since that is what the operator has to fix. It is bad
        // input, not an outage: a node waiting for the directory to appear would wait forever.
        let dir = path.parent().unwrap_or(Path::new("/"));
        if !dir.is_dir() {
            return Err(StoreError::Invalid(format!(
                "cannot open SQLite database {}: directory {} does not exist",
                path.display(),
                dir.display()
            )));
        }
        let options = options
            .filename(&path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .busy_timeout(BUSY_TIMEOUT)
            .synchronous(SqliteSynchronous::Normal)
            .pragma("cache_size", format!("-{CACHE_KIB}"));
        // Switching a new file to WAL can answer SQLITE_BUSY at once, without waiting in the
        // busy handler, while another process is opening the same file: nodes started
        // together retry for up to the busy timeout.
        let started = tokio::time::Instant::now();
        let pool = loop {
            // No ping before handing out a pooled connection: it is one more round trip to
            // the connection's worker thread (~30 µs, as long as a whole `SELECT 1`), and a
            // connection to a local file has no peer that could have gone away.
            let pool_options = SqlitePoolOptions::new().max_connections(POOL_MAX).test_before_acquire(false);
            match pool_options.connect_with(options.clone()).await {
                Ok(pool) => break pool,
                Err(e) if is_busy(&e) && started.elapsed() < BUSY_TIMEOUT => {
                    tokio::time::sleep(OPEN_RETRY_PAUSE).await;
                }
                Err(e) => {
                    return Err(in_context(db_err(e), &format!("cannot open SQLite database {}", path.display())));
                }
            }
        };
        let description = describe(&path, prefix).into();
        Ok(SqliteStore { pool, path, description, sql: Arc::new(Statements::new(prefix)) })
    }

    /// A write transaction. `BEGIN IMMEDIATE` takes the write lock up front, waiting up to
    /// the busy timeout; a deferred transaction that reads first and then writes can fail
    /// with SQLITE_BUSY at once when another process wrote in between.
    async fn write_tx(&self) -> Result<Transaction<'static, Sqlite>, StoreError> {
        self.pool.begin_with("BEGIN IMMEDIATE").await.map_err(db_err)
    }
}

/// `sqlite://` and the file's absolute path, and the prefix unless it is the default (so
/// that a default store reads as it always did).
fn describe(path: &Path, prefix: &Prefix) -> String {
    let file = redact_url(&format!("sqlite://{}", path.display()));
    if *prefix == Prefix::default() {
        file
    } else {
        format!("{file} (prefix {prefix})")
    }
}

/// Every statement of one store, its tables named with the store's prefix: built once when
/// the store connects, so that no call formats SQL (the claim is the hot path, and sqlx
/// keeps each text's prepared statement per connection).
struct Statements {
    schema: schema::Sql,
    claim: claim::Sql,
    claim_one: claim_one::Sql,
    runs: runs::Sql,
    admin: admin::Sql,
    fleet: fleet::Sql,
    managed: managed::Sql,
}

impl Statements {
    fn new(prefix: &Prefix) -> Statements {
        let tables = prefix.table_prefix();
        Statements {
            schema: schema::Sql::new(&tables),
            claim: claim::Sql::new(&tables),
            claim_one: claim_one::Sql::new(&tables),
            runs: runs::Sql::new(&tables),
            admin: admin::Sql::new(&tables),
            fleet: fleet::Sql::new(&tables),
            managed: managed::Sql::new(&tables),
        }
    }
}

impl fmt::Debug for Statements {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Statements").finish_non_exhaustive()
    }
}

/// A statement template with `{p}` replaced by the table prefix `tables` (letters, digits
/// and `_` only, so safe to splice in unquoted).
fn fill(template: &str, tables: &str) -> String {
    template.replace("{p}", tables)
}

#[async_trait]
impl StoreBase for SqliteStore {
    fn describe(&self) -> String {
        self.description.to_string()
    }

    /// SQLite's clock (see [`StoreBase::now`]).
    async fn now(&self) -> Result<DateTime<Utc>, StoreError> {
        let ms: i64 =
            sqlx::query_scalar(concat!("SELECT ", now!())).fetch_one(&self.pool).await.map_err(error::db_err)?;
        records::instant(ms)
    }
}
