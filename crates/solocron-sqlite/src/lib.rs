//! # solocron-sqlite
//!
//! The embedded [`Store`] of solocron: one SQLite file shared by the processes of **one
//! host**. The store's clock is SQLite's `unixepoch()`, evaluated inside each process, so
//! it is the host clock: every process on the host judges leases by the same clock. Do
//! not share the file between hosts (their clocks differ, and network file systems do not
//! honour SQLite's locks); use a server store for a fleet of hosts.
//!
//! Each [`Store`] method is one `BEGIN IMMEDIATE` transaction, or one statement where one
//! suffices (a read, or a renewal's or a finish's `UPDATE`), so concurrent processes
//! serialize on SQLite's write lock and wait up to the busy timeout instead of failing. A
//! claim decides its whole batch from one read ([`solocron_sql::plan`]), so it holds the
//! lock for a few statements however many ticks it claims; a claim of one tick is one
//! statement that decides in SQL. Every comparison with "now" (lease expiry) uses SQLite's
//! own clock, and all instants are stored as integer milliseconds since the Unix epoch
//! (UTC).
//!
//! ```
//! use std::time::Duration;
//! use solocron_core::{ClaimMode, ClaimOutcome, ClaimRequest, Store, Tick, Trigger};
//! use solocron_sqlite::SqliteStore;
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! # let path = dir.path().join("solocron.db");
//! let store = SqliteStore::connect(&format!("sqlite://{}", path.display())).await?;
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

mod watch;

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use solocron_core::{
    ClaimOutcome, ClaimRequest, Ending, HistoryQuery, JobControl, JobDefinition, Lease, RecoverAction, RecoverOutcome,
    Registration, Renewal, RequestWatch, RunEnd, RunId, RunRecord, RunRequest, Store, StoreError, Tick, Trigger,
    FINISH_BATCH_MAX, PRUNE_BATCH_MAX, RECORDS_PAGE_MAX, RENEW_BATCH_MAX,
};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteRow,
    SqliteSynchronous,
};
use sqlx::{QueryBuilder, Row, Sqlite, Transaction};

/// The store's "now" in SQL: SQLite's clock, in integer milliseconds since the epoch.
/// A macro rather than a `const` so that it can be spliced into `concat!`-built static
/// SQL, which keeps every statement a `&'static str` (and so cached as prepared).
macro_rules! now {
    () => {
        "CAST(unixepoch('subsec') * 1000 AS INTEGER)"
    };
}

/// The columns a [`RunRecord`] is read from, in [`record`]'s order. `"trigger"` is quoted
/// because TRIGGER is an SQL keyword.
macro_rules! columns {
    () => {
        r#"job, scheduled_at, attempt, "trigger", node, token, state, reason, claimed_at, started_at, finished_at, lease_until, exit_code, output"#
    };
}

mod claim;
mod claim_one;

/// The schema version this crate writes and understands. Version 1 lacked the jobs,
/// registry and requests tables; [`SCHEMA`] adds them, so migrating a version 1 database
/// only has to record the new version.
const SCHEMA_VERSION: i64 = 2;

/// How many successive milliseconds [`Store::request_run`] tries before giving up: only
/// that many requests of one job within a few milliseconds can exhaust it.
const REQUEST_SLOTS_MAX: usize = 100;

/// How long a connection waits for another process's write lock before giving up; below
/// the engine's 5 s store-call timeout, so a long lock surfaces as "unavailable" from here.
const BUSY_TIMEOUT: Duration = Duration::from_secs(4);
/// Pause between attempts to open a database another process holds locked.
const OPEN_RETRY_PAUSE: Duration = Duration::from_millis(50);

/// Connections per store: writers serialize on the file lock anyway, so a few suffice for
/// reads (history, expiry scans) to proceed beside one writer.
const POOL_MAX: u32 = 4;

/// Longest duration (lease, start delay) accepted: 100 years. Far beyond any sane value,
/// and far from the point where `now + ms` would overflow SQLite's 64-bit integers (which
/// would silently turn into a REAL).
const DURATION_MS_MAX: i64 = 100 * 365 * 24 * 3600 * 1000;

/// Schema statements, each idempotent; [`Store::migrate`] runs them in one transaction.
const SCHEMA: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS solocron_schema (version INTEGER NOT NULL)",
    r#"CREATE TABLE IF NOT EXISTS solocron_runs (
        job TEXT NOT NULL,
        scheduled_at INTEGER NOT NULL,
        attempt INTEGER NOT NULL CHECK (attempt >= 1),
        "trigger" TEXT NOT NULL,
        node TEXT NOT NULL,
        token INTEGER NULL,
        state TEXT NOT NULL,
        reason TEXT NULL,
        claimed_at INTEGER NOT NULL,
        started_at INTEGER NULL,
        finished_at INTEGER NULL,
        lease_until INTEGER NULL,
        exit_code INTEGER NULL,
        output TEXT NOT NULL DEFAULT '',
        PRIMARY KEY (job, scheduled_at, attempt)
    )"#,
    // Per-job fencing counters: a separate row per job, so a token is never reused even
    // after run records are pruned.
    "CREATE TABLE IF NOT EXISTS solocron_fences (job TEXT PRIMARY KEY, token INTEGER NOT NULL)",
    // Serves `expired`: running runs by lease expiry, oldest first.
    "CREATE INDEX IF NOT EXISTS solocron_runs_expiry ON solocron_runs (lease_until) WHERE state = 'running'",
    // Serves the overlap check of `claim` (skip_if_running): the newest running run of a
    // job. Ordered like the primary key, or the planner prefers walking the job's whole
    // history through the primary key to avoid a sort.
    "CREATE INDEX IF NOT EXISTS solocron_runs_running ON solocron_runs (job, scheduled_at, attempt) WHERE state = 'running'",
    // Serves `history` across jobs, newest first (per-job history uses the primary key).
    "CREATE INDEX IF NOT EXISTS solocron_runs_newest ON solocron_runs (scheduled_at, attempt)",
    // Version 2: fleet-wide job switches (pause), the job registry, manual run requests.
    r#"CREATE TABLE IF NOT EXISTS solocron_jobs (
        job TEXT PRIMARY KEY,
        paused INTEGER NOT NULL,
        changed_by TEXT NOT NULL,
        reason TEXT NULL,
        changed_at INTEGER NOT NULL
    )"#,
    r#"CREATE TABLE IF NOT EXISTS solocron_registry (
        job TEXT NOT NULL,
        node TEXT NOT NULL,
        schedule TEXT NOT NULL,
        timezone TEXT NOT NULL,
        definition_hash TEXT NOT NULL,
        summary TEXT NOT NULL,
        first_seen INTEGER NOT NULL,
        last_seen INTEGER NOT NULL,
        PRIMARY KEY (job, node)
    )"#,
    r#"CREATE TABLE IF NOT EXISTS solocron_requests (
        job TEXT NOT NULL,
        requested_at INTEGER NOT NULL,
        requested_by TEXT NOT NULL,
        PRIMARY KEY (job, requested_at)
    )"#,
    // Serves `pending_requests` (oldest first) and the request side of `prune`.
    "CREATE INDEX IF NOT EXISTS solocron_requests_oldest ON solocron_requests (requested_at, job)",
    // Every run inserted with a token advances its job's fencing counter to at least that
    // token, within the inserting statement: the one-statement claim (`claim_one`) relies
    // on it, and batched claims no longer write the counters themselves. Added to version 2
    // without a new version number: solocron builds that predate it write the counter
    // themselves, to the same value, and work beside it.
    r#"CREATE TRIGGER IF NOT EXISTS solocron_runs_fence AFTER INSERT ON solocron_runs
       WHEN NEW.token IS NOT NULL
       BEGIN
           INSERT INTO solocron_fences (job, token) VALUES (NEW.job, NEW.token)
               ON CONFLICT (job) DO UPDATE SET token = max(token, excluded.token);
       END"#,
];

/// A [`Store`] kept in one SQLite file.
///
/// Cheap to clone (clones share one connection pool). Separate instances on the same file,
/// in one process or many, coordinate through SQLite's locks.
///
/// # Panics
///
/// [`Store::finish`] panics if given a `RunEnd` whose state is `running`: that is a bug in
/// the caller, not a condition of the store.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
    path: PathBuf,
}

impl SqliteStore {
    /// Opens (creating it if missing) the database at `url`: `sqlite://path/to/file.db`,
    /// `sqlite:///abs/path.db` or `sqlite:path`; relative paths are relative to the current
    /// directory. Does not create the schema: call [`Store::migrate`].
    ///
    /// Fails with [`StoreError::Unavailable`] if the file's directory does not exist or the
    /// file cannot be opened, and with [`StoreError::Invalid`] if `url` is not a file-backed
    /// `sqlite:` URL (an in-memory database cannot be shared by a fleet).
    pub async fn connect(url: &str) -> Result<SqliteStore, StoreError> {
        let options = parse_url(url)?;
        let path = std::path::absolute(options.get_filename())
            .map_err(|e| StoreError::Unavailable(format!("cannot resolve SQLite path in `{url}`: {e}")))?;
        Self::open(options, path).await
    }

    /// Opens (creating it if missing) the database file at `path`, like [`connect`](Self::connect).
    pub async fn open_path(path: &Path) -> Result<SqliteStore, StoreError> {
        let path = std::path::absolute(path)
            .map_err(|e| StoreError::Unavailable(format!("cannot resolve SQLite path {}: {e}", path.display())))?;
        Self::open(SqliteConnectOptions::new(), path).await
    }

    async fn open(options: SqliteConnectOptions, path: PathBuf) -> Result<SqliteStore, StoreError> {
        // SQLite's own error for a missing directory is a bare "unable to open database
        // file"; say which path, since that is what the operator has to fix.
        let dir = path.parent().unwrap_or(Path::new("/"));
        if !dir.is_dir() {
            return Err(StoreError::Unavailable(format!(
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
            .synchronous(SqliteSynchronous::Normal);
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
        Ok(SqliteStore { pool, path })
    }

    /// A write transaction. `BEGIN IMMEDIATE` takes the write lock up front, waiting up to
    /// the busy timeout; a deferred transaction that reads first and then writes can fail
    /// with SQLITE_BUSY at once when another process wrote in between.
    async fn write_tx(&self) -> Result<Transaction<'static, Sqlite>, StoreError> {
        self.pool.begin_with("BEGIN IMMEDIATE").await.map_err(db_err)
    }
}

/// Parses a `sqlite:` URL into connection options, refusing what cannot be a shared file.
fn parse_url(url: &str) -> Result<SqliteConnectOptions, StoreError> {
    let rest = url.strip_prefix("sqlite:").ok_or_else(|| {
        StoreError::Invalid(format!("`{url}` is not a SQLite URL; expected sqlite://path/to/file.db"))
    })?;
    let file = rest.trim_start_matches("//").split('?').next().unwrap_or_default();
    if file.is_empty() || file == ":memory:" || rest.contains("mode=memory") {
        return Err(StoreError::Invalid(format!(
            "`{url}` names no database file; solocron needs a file every node can open, like sqlite://path/to/file.db"
        )));
    }
    SqliteConnectOptions::from_str(url).map_err(|e| StoreError::Invalid(format!("bad SQLite URL `{url}`: {e}")))
}

/// SQLite's primary result code of a database error (the low byte of an extended code).
fn primary_code(e: &sqlx::Error) -> Option<i64> {
    let sqlx::Error::Database(d) = e else { return None };
    d.code()?.parse::<i64>().ok().map(|c| c & 0xff)
}

/// Whether `e` is SQLite's BUSY or LOCKED: another connection holds a lock we need.
fn is_busy(e: &sqlx::Error) -> bool {
    matches!(primary_code(e), Some(5 | 6))
}

/// The `UPDATE` that extends a live lease held by its owner, judged by SQLite's clock.
fn renew_query(
    lease: &Lease,
    length: Duration,
) -> Result<sqlx::query::Query<'_, Sqlite, sqlx::sqlite::SqliteArguments<'_>>, StoreError> {
    let query = sqlx::query(concat!(
        "UPDATE solocron_runs SET lease_until = ",
        now!(),
        " + ? WHERE job = ? AND scheduled_at = ? AND attempt = ? AND node = ? AND token = ?
           AND state = 'running' AND lease_until > ",
        now!()
    ))
    .bind(millis(length)?);
    solocron_sql::bind_lease(query, lease, i64::from(lease.run.attempt))
}

/// The `UPDATE` that records a held run's end. No expiry check: a run whose lease lapsed
/// but that nobody recovered yet still records its true end. `claimed_at + NULL` is NULL:
/// never started.
fn finish_query<'q>(
    lease: &'q Lease,
    end: &'q RunEnd,
) -> Result<sqlx::query::Query<'q, Sqlite, sqlx::sqlite::SqliteArguments<'q>>, StoreError> {
    assert!(end.state.is_terminal(), "a run cannot finish as `{}`", end.state);
    let started_after = end.started_after.map(millis).transpose()?;
    let query = solocron_sql::bind_end(
        sqlx::query(concat!(
            "UPDATE solocron_runs SET state = ?, reason = ?, exit_code = ?, output = ?, finished_at = ",
            now!(),
            ", lease_until = NULL, started_at = claimed_at + ?
             WHERE job = ? AND scheduled_at = ? AND attempt = ? AND node = ? AND token = ? AND state = 'running'"
        )),
        end,
        started_after,
    );
    solocron_sql::bind_lease(query, lease, i64::from(lease.run.attempt))
}

/// Maps an sqlx error: what a retry may cure (I/O, locks held past the busy timeout, a full
/// pool or disk, a file that cannot be opened) is `Unavailable`; the rest is `Invalid`.
fn db_err(e: sqlx::Error) -> StoreError {
    // Primary SQLite result codes: BUSY, LOCKED, READONLY, IOERR, FULL, CANTOPEN.
    const TRANSIENT: [i64; 6] = [5, 6, 8, 10, 13, 14];
    let transient = match &e {
        sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::WorkerCrashed => true,
        _ => primary_code(&e).is_some_and(|c| TRANSIENT.contains(&c)),
    };
    if transient {
        StoreError::Unavailable(e.to_string())
    } else {
        StoreError::Invalid(e.to_string())
    }
}

/// The same error, its message prefixed with `context`.
fn in_context(e: StoreError, context: &str) -> StoreError {
    match e {
        StoreError::Unavailable(m) => StoreError::Unavailable(format!("{context}: {m}")),
        StoreError::Invalid(m) => StoreError::Invalid(format!("{context}: {m}")),
    }
}

/// Milliseconds of a duration, refusing absurd ones (see [`DURATION_MS_MAX`]).
fn millis(d: Duration) -> Result<i64, StoreError> {
    i64::try_from(d.as_millis())
        .ok()
        .filter(|ms| *ms <= DURATION_MS_MAX)
        .ok_or_else(|| StoreError::Invalid(format!("duration {d:?} is too long")))
}

/// An instant from stored milliseconds.
fn instant(ms: i64) -> Result<DateTime<Utc>, StoreError> {
    DateTime::from_timestamp_millis(ms)
        .ok_or_else(|| StoreError::Invalid(format!("stored instant {ms} ms is out of range")))
}

/// One column of a run row, with decoding failures reported as [`StoreError::Invalid`].
fn get<'r, T>(row: &'r SqliteRow, column: &str) -> Result<T, StoreError>
where
    T: sqlx::Decode<'r, Sqlite> + sqlx::Type<Sqlite>,
{
    get_in(row, "solocron_runs", column)
}

/// One column of a row of `table`, with decoding failures reported as [`StoreError::Invalid`].
fn get_in<'r, T>(row: &'r SqliteRow, table: &str, column: &str) -> Result<T, StoreError>
where
    T: sqlx::Decode<'r, Sqlite> + sqlx::Type<Sqlite>,
{
    row.try_get(column).map_err(|e| StoreError::Invalid(format!("{table}.{column}: {e}")))
}

/// A stored state or trigger name parsed back.
fn parse_name<T: FromStr<Err = String>>(row: &SqliteRow, column: &str) -> Result<T, StoreError> {
    get::<String>(row, column)?.parse().map_err(|e| StoreError::Invalid(format!("solocron_runs.{column}: {e}")))
}

/// The run identity in the first three columns of `row` (job, scheduled_at, attempt).
fn run_id(row: &SqliteRow) -> Result<RunId, StoreError> {
    let attempt: i64 = get(row, "attempt")?;
    let attempt = u32::try_from(attempt)
        .ok()
        .filter(|a| *a >= 1)
        .ok_or_else(|| StoreError::Invalid(format!("solocron_runs.attempt {attempt} is not a positive attempt")))?;
    let tick = Tick::new(get::<String>(row, "job")?, instant(get(row, "scheduled_at")?)?);
    Ok(RunId { tick, attempt })
}

/// A run record from a row selected with [`columns!`].
fn record(row: &SqliteRow) -> Result<RunRecord, StoreError> {
    let optional_instant = |column| get::<Option<i64>>(row, column)?.map(instant).transpose();
    let token = get::<Option<i64>>(row, "token")?
        .map(|t| u64::try_from(t).map_err(|_| StoreError::Invalid(format!("solocron_runs.token {t} is negative"))))
        .transpose()?;
    let exit_code = get::<Option<i64>>(row, "exit_code")?
        .map(|c| {
            i32::try_from(c).map_err(|_| StoreError::Invalid(format!("solocron_runs.exit_code {c} is out of range")))
        })
        .transpose()?;
    Ok(RunRecord {
        id: run_id(row)?,
        trigger: parse_name(row, "trigger")?,
        node: get(row, "node")?,
        fencing_token: token,
        state: parse_name(row, "state")?,
        reason: get(row, "reason")?,
        claimed_at: instant(get(row, "claimed_at")?)?,
        started_at: optional_instant("started_at")?,
        finished_at: optional_instant("finished_at")?,
        lease_until: optional_instant("lease_until")?,
        exit_code,
        output: get(row, "output")?,
    })
}

/// Creates `id` as `running` for `node` unless it exists, and hands it the job's next
/// fencing token; the lease, or `None` if a record of `id` already exists.
async fn start_run(
    conn: &mut SqliteConnection,
    id: &RunId,
    trigger: Trigger,
    node: &str,
    lease: Duration,
) -> Result<Option<Lease>, StoreError> {
    let (job, at) = (&id.tick.job, id.tick.scheduled_at.timestamp_millis());
    // RETURNING gives the instants exactly as stored (both `now`s are the same within one
    // statement), and no row when the record already exists.
    let row = sqlx::query(concat!(
        r#"INSERT INTO solocron_runs (job, scheduled_at, attempt, "trigger", node, state, claimed_at, lease_until)
           VALUES (?, ?, ?, ?, ?, 'running', "#,
        now!(),
        ", ",
        now!(),
        " + ?) ON CONFLICT (job, scheduled_at, attempt) DO NOTHING RETURNING claimed_at, lease_until"
    ))
    .bind(job)
    .bind(at)
    .bind(i64::from(id.attempt))
    .bind(trigger.as_str())
    .bind(node)
    .bind(millis(lease)?)
    .fetch_optional(&mut *conn)
    .await
    .map_err(db_err)?;
    let Some(row) = row else { return Ok(None) };
    let token = next_token(conn, job).await?;
    let updated = sqlx::query("UPDATE solocron_runs SET token = ? WHERE job = ? AND scheduled_at = ? AND attempt = ?")
        .bind(solocron_sql::token_param(token)?)
        .bind(job)
        .bind(at)
        .bind(i64::from(id.attempt))
        .execute(conn)
        .await
        .map_err(db_err)?
        .rows_affected();
    assert_eq!(updated, 1, "the run just inserted must take its token");
    let lease = Lease {
        run: id.clone(),
        owner: node.to_owned(),
        fencing_token: token,
        claimed_at: instant(get(&row, "claimed_at")?)?,
        lease_until: instant(get(&row, "lease_until")?)?,
    };
    tracing::debug!(run = %lease.run, node, token, "run claimed");
    Ok(Some(lease))
}

/// The job's next fencing token, from its counter (created at 1).
async fn next_token(conn: &mut SqliteConnection, job: &str) -> Result<u64, StoreError> {
    let token: i64 = sqlx::query_scalar(
        "INSERT INTO solocron_fences (job, token) VALUES (?, 1)
         ON CONFLICT (job) DO UPDATE SET token = token + 1 RETURNING token",
    )
    .bind(job)
    .fetch_one(conn)
    .await
    .map_err(db_err)?;
    assert!(token > 0, "fencing tokens start at 1 and only grow, got {token}");
    Ok(token as u64)
}

/// A registration from a row of `solocron_registry`.
fn registration(row: &SqliteRow) -> Result<Registration, StoreError> {
    let col = |column| get_in::<String>(row, "solocron_registry", column);
    let at = |column| get_in::<i64>(row, "solocron_registry", column).and_then(instant);
    Ok(Registration {
        definition: JobDefinition {
            job: col("job")?,
            schedule: col("schedule")?,
            timezone: col("timezone")?,
            definition_hash: col("definition_hash")?,
            summary: col("summary")?,
        },
        node: col("node")?,
        first_seen: at("first_seen")?,
        last_seen: at("last_seen")?,
    })
}

/// A job's switches from a row of `solocron_jobs`.
fn control(row: &SqliteRow) -> Result<JobControl, StoreError> {
    const TABLE: &str = "solocron_jobs";
    Ok(JobControl {
        job: get_in(row, TABLE, "job")?,
        paused: get_in::<i64>(row, TABLE, "paused")? != 0,
        changed_by: get_in(row, TABLE, "changed_by")?,
        reason: get_in(row, TABLE, "reason")?,
        changed_at: instant(get_in(row, TABLE, "changed_at")?)?,
    })
}

/// A run request from a row of `solocron_requests`.
fn request(row: &SqliteRow) -> Result<RunRequest, StoreError> {
    const TABLE: &str = "solocron_requests";
    let at = instant(get_in(row, TABLE, "requested_at")?)?;
    Ok(RunRequest {
        tick: Tick::new(get_in::<String>(row, TABLE, "job")?, at),
        requested_by: get_in(row, TABLE, "requested_by")?,
    })
}

/// The millisecond after `t` that is not a whole second: manual ticks never fall on one,
/// so they never coincide with a scheduled tick.
fn next_manual_ms(t: i64) -> i64 {
    if (t + 1) % 1000 == 0 {
        t + 2
    } else {
        t + 1
    }
}

/// Ends an expired run as `abandoned`; whether it was (still running and expired).
async fn abandon(conn: &mut SqliteConnection, run: &RunId, reason: &str) -> Result<bool, StoreError> {
    let changed = sqlx::query(concat!(
        "UPDATE solocron_runs SET state = 'abandoned', reason = ?, finished_at = ",
        now!(),
        ", lease_until = NULL
         WHERE job = ? AND scheduled_at = ? AND attempt = ? AND state = 'running' AND lease_until < ",
        now!()
    ))
    .bind(reason)
    .bind(&run.tick.job)
    .bind(run.tick.scheduled_at.timestamp_millis())
    .bind(i64::from(run.attempt))
    .execute(conn)
    .await
    .map_err(db_err)?
    .rows_affected();
    debug_assert!(changed <= 1);
    Ok(changed == 1)
}

/// Ends an expired run as `lost` and starts its next attempt for `node`; the new lease, or
/// `None` if there was nothing to do (the caller then rolls back).
async fn retry(
    conn: &mut SqliteConnection,
    run: &RunId,
    node: &str,
    lease: Duration,
) -> Result<Option<Lease>, StoreError> {
    let attempt =
        run.attempt.checked_add(1).ok_or_else(|| StoreError::Invalid(format!("run {run} has no next attempt")))?;
    let reason = format!("lease expired; retried as attempt {attempt} by {node}");
    let changed = sqlx::query(concat!(
        "UPDATE solocron_runs SET state = 'lost', reason = ?, finished_at = ",
        now!(),
        ", lease_until = NULL
         WHERE job = ? AND scheduled_at = ? AND attempt = ? AND state = 'running' AND lease_until < ",
        now!()
    ))
    .bind(&reason)
    .bind(&run.tick.job)
    .bind(run.tick.scheduled_at.timestamp_millis())
    .bind(i64::from(run.attempt))
    .execute(&mut *conn)
    .await
    .map_err(db_err)?
    .rows_affected();
    debug_assert!(changed <= 1);
    if changed == 0 {
        return Ok(None);
    }
    let next = RunId { tick: run.tick.clone(), attempt };
    start_run(conn, &next, Trigger::Retry, node, lease).await
}

#[async_trait]
impl Store for SqliteStore {
    fn describe(&self) -> String {
        format!("sqlite://{}", self.path.display())
    }

    async fn migrate(&self) -> Result<(), StoreError> {
        // One IMMEDIATE transaction: nodes migrating at once take turns, and each later one
        // finds everything in place.
        let mut tx = self.write_tx().await?;
        for statement in SCHEMA {
            sqlx::query(statement).execute(&mut *tx).await.map_err(db_err)?;
        }
        let version: Option<i64> =
            sqlx::query_scalar("SELECT max(version) FROM solocron_schema").fetch_one(&mut *tx).await.map_err(db_err)?;
        match version {
            None => {
                sqlx::query("INSERT INTO solocron_schema (version) VALUES (?)")
                    .bind(SCHEMA_VERSION)
                    .execute(&mut *tx)
                    .await
                    .map_err(db_err)?;
            }
            Some(SCHEMA_VERSION) => {}
            // Version 1 differs only by the tables the statements above just created.
            Some(1) => {
                sqlx::query("UPDATE solocron_schema SET version = ?")
                    .bind(SCHEMA_VERSION)
                    .execute(&mut *tx)
                    .await
                    .map_err(db_err)?;
            }
            Some(v) => {
                return Err(StoreError::Invalid(format!(
                    "{} has schema version {v}; this solocron understands version {SCHEMA_VERSION}",
                    self.describe()
                )))
            }
        }
        tx.commit().await.map_err(db_err)
    }

    async fn claim(&self, requests: &[ClaimRequest]) -> Result<Vec<ClaimOutcome>, StoreError> {
        claim::claim(self, requests).await
    }

    async fn renew(&self, lease: &Lease, length: Duration) -> Result<bool, StoreError> {
        // One statement, so no explicit transaction: in autocommit SQLite takes the write
        // lock (waiting in the busy handler) for the statement alone, instead of across
        // the round trips of `BEGIN IMMEDIATE` and `COMMIT` while other nodes wait for it.
        let changed = renew_query(lease, length)?.execute(&self.pool).await.map_err(db_err)?.rows_affected();
        debug_assert!(changed <= 1);
        Ok(changed == 1)
    }

    async fn renew_all(&self, renewals: &[Renewal]) -> Result<Vec<bool>, StoreError> {
        assert!(renewals.len() <= RENEW_BATCH_MAX, "{} renewals in one batch", renewals.len());
        if renewals.is_empty() {
            return Ok(Vec::new());
        }
        // One transaction: one wait for the write lock and one commit for the batch.
        let mut tx = self.write_tx().await?;
        let mut answers = Vec::with_capacity(renewals.len());
        for r in renewals {
            let changed = renew_query(&r.lease, r.length)?.execute(&mut *tx).await.map_err(db_err)?.rows_affected();
            debug_assert!(changed <= 1);
            answers.push(changed == 1);
        }
        tx.commit().await.map_err(db_err)?;
        Ok(answers)
    }

    async fn finish(&self, lease: &Lease, end: &RunEnd) -> Result<bool, StoreError> {
        // One statement in autocommit, as in `renew`.
        let changed = finish_query(lease, end)?.execute(&self.pool).await.map_err(db_err)?.rows_affected();
        debug_assert!(changed <= 1);
        Ok(changed == 1)
    }

    async fn finish_all(&self, endings: &[Ending]) -> Result<Vec<bool>, StoreError> {
        assert!(endings.len() <= FINISH_BATCH_MAX, "{} endings in one batch", endings.len());
        // One transaction: one wait for the write lock and one commit (fsync) for the batch.
        let mut tx = self.write_tx().await?;
        let mut answers = Vec::with_capacity(endings.len());
        for e in endings {
            let changed = finish_query(&e.lease, &e.end)?.execute(&mut *tx).await.map_err(db_err)?.rows_affected();
            debug_assert!(changed <= 1);
            answers.push(changed == 1);
        }
        tx.commit().await.map_err(db_err)?;
        Ok(answers)
    }

    async fn expired(&self, limit: usize) -> Result<Vec<RunRecord>, StoreError> {
        let limit = limit.min(RECORDS_PAGE_MAX) as i64;
        let rows = sqlx::query(concat!(
            "SELECT ",
            columns!(),
            " FROM solocron_runs WHERE state = 'running' AND lease_until < ",
            now!(),
            " ORDER BY lease_until LIMIT ?"
        ))
        .bind(limit)
        .fetch_all(&self.pool)
        .await
        .map_err(db_err)?;
        // A row this version cannot read (written by a newer one, say) must not stop the
        // recovery of every other run.
        Ok(rows
            .iter()
            .filter_map(|row| {
                record(row).map_err(|e| tracing::error!(error = %e, "skipping an unreadable expired run")).ok()
            })
            .collect())
    }

    async fn recover(&self, run: &RunId, action: &RecoverAction) -> Result<RecoverOutcome, StoreError> {
        let mut tx = self.write_tx().await?;
        let outcome = match action {
            RecoverAction::Abandon { reason } => match abandon(&mut tx, run, reason).await? {
                true => RecoverOutcome::Abandoned,
                false => RecoverOutcome::NotNeeded,
            },
            RecoverAction::Retry { node, lease } => match retry(&mut tx, run, node, *lease).await? {
                Some(lease) => RecoverOutcome::Retried(lease),
                None => RecoverOutcome::NotNeeded,
            },
        };
        // NotNeeded may follow a partial step (the old run marked lost, but its next
        // attempt already existed): undo it rather than leave a tick with no running attempt.
        if outcome == RecoverOutcome::NotNeeded {
            tx.rollback().await.map_err(db_err)?;
        } else {
            tx.commit().await.map_err(db_err)?;
            tracing::debug!(%run, ?outcome, "expired run recovered");
        }
        Ok(outcome)
    }

    async fn history(&self, query: &HistoryQuery) -> Result<Vec<RunRecord>, StoreError> {
        let mut sql = QueryBuilder::<Sqlite>::new(concat!("SELECT ", columns!(), " FROM solocron_runs WHERE 1 = 1"));
        solocron_sql::push_history_filters(&mut sql, query);
        let rows = sql.build().fetch_all(&self.pool).await.map_err(db_err)?;
        rows.iter().map(record).collect()
    }

    async fn now(&self) -> Result<DateTime<Utc>, StoreError> {
        let ms: i64 = sqlx::query_scalar(concat!("SELECT ", now!())).fetch_one(&self.pool).await.map_err(db_err)?;
        instant(ms)
    }

    async fn register(&self, node: &str, jobs: &[JobDefinition]) -> Result<(), StoreError> {
        let mut tx = self.write_tx().await?;
        for job in jobs {
            sqlx::query(concat!(
                "INSERT INTO solocron_registry
                   (job, node, schedule, timezone, definition_hash, summary, first_seen, last_seen)
                 VALUES (?, ?, ?, ?, ?, ?, ",
                now!(),
                ", ",
                now!(),
                ") ON CONFLICT (job, node) DO UPDATE SET schedule = excluded.schedule,
                   timezone = excluded.timezone, definition_hash = excluded.definition_hash,
                   summary = excluded.summary, last_seen = excluded.last_seen"
            ))
            .bind(&job.job)
            .bind(node)
            .bind(&job.schedule)
            .bind(&job.timezone)
            .bind(&job.definition_hash)
            .bind(&job.summary)
            .execute(&mut *tx)
            .await
            .map_err(db_err)?;
        }
        tx.commit().await.map_err(db_err)
    }

    async fn registrations(&self) -> Result<Vec<Registration>, StoreError> {
        let rows = sqlx::query(
            "SELECT job, node, schedule, timezone, definition_hash, summary, first_seen, last_seen
             FROM solocron_registry ORDER BY job, node",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(db_err)?;
        rows.iter().map(registration).collect()
    }

    async fn set_paused(&self, job: &str, paused: bool, by: &str, reason: Option<&str>) -> Result<(), StoreError> {
        let mut tx = self.write_tx().await?;
        sqlx::query(concat!(
            "INSERT INTO solocron_jobs (job, paused, changed_by, reason, changed_at) VALUES (?, ?, ?, ?, ",
            now!(),
            ") ON CONFLICT (job) DO UPDATE SET paused = excluded.paused, changed_by = excluded.changed_by,
               reason = excluded.reason, changed_at = excluded.changed_at"
        ))
        .bind(job)
        .bind(i64::from(paused))
        .bind(by)
        .bind(reason)
        .execute(&mut *tx)
        .await
        .map_err(db_err)?;
        tx.commit().await.map_err(db_err)
    }

    async fn controls(&self) -> Result<Vec<JobControl>, StoreError> {
        let rows = sqlx::query("SELECT job, paused, changed_by, reason, changed_at FROM solocron_jobs ORDER BY job")
            .fetch_all(&self.pool)
            .await
            .map_err(db_err)?;
        rows.iter().map(control).collect()
    }

    async fn request_run(&self, job: &str, by: &str) -> Result<Tick, StoreError> {
        let mut tx = self.write_tx().await?;
        let now: i64 = sqlx::query_scalar(concat!("SELECT ", now!())).fetch_one(&mut *tx).await.map_err(db_err)?;
        // Start at the first non-whole-second millisecond at or after now.
        let mut at = if now % 1000 == 0 { now + 1 } else { now };
        for _ in 0..REQUEST_SLOTS_MAX {
            let inserted = sqlx::query(
                "INSERT INTO solocron_requests (job, requested_at, requested_by) VALUES (?, ?, ?)
                 ON CONFLICT (job, requested_at) DO NOTHING",
            )
            .bind(job)
            .bind(at)
            .bind(by)
            .execute(&mut *tx)
            .await
            .map_err(db_err)?
            .rows_affected();
            if inserted == 1 {
                tx.commit().await.map_err(db_err)?;
                return Ok(Tick::new(job, instant(at)?));
            }
            at = next_manual_ms(at);
        }
        Err(StoreError::Invalid(format!(
            "{REQUEST_SLOTS_MAX} manual runs of `{job}` already requested around this instant; try again"
        )))
    }

    fn request_watch(&self) -> Option<Box<dyn RequestWatch>> {
        Some(Box::new(watch::FileWatch::new(&self.path)))
    }

    async fn pending_requests(&self, limit: usize) -> Result<Vec<RunRequest>, StoreError> {
        let rows = sqlx::query(
            "SELECT job, requested_at, requested_by FROM solocron_requests AS r
             WHERE NOT EXISTS (SELECT 1 FROM solocron_runs
                               WHERE job = r.job AND scheduled_at = r.requested_at AND attempt = 1)
             ORDER BY requested_at, job LIMIT ?",
        )
        .bind(limit.min(RECORDS_PAGE_MAX) as i64)
        .fetch_all(&self.pool)
        .await
        .map_err(db_err)?;
        rows.iter().map(request).collect()
    }

    async fn unlock(&self, job: &str, reason: &str) -> Result<Vec<RunId>, StoreError> {
        let mut tx = self.write_tx().await?;
        let rows = sqlx::query(concat!(
            "UPDATE solocron_runs SET state = 'abandoned', reason = ?, finished_at = ",
            now!(),
            ", lease_until = NULL WHERE job = ? AND state = 'running' RETURNING job, scheduled_at, attempt"
        ))
        .bind(reason)
        .bind(job)
        .fetch_all(&mut *tx)
        .await
        .map_err(db_err)?;
        let runs = rows.iter().map(run_id).collect::<Result<Vec<_>, _>>()?;
        tx.commit().await.map_err(db_err)?;
        tracing::debug!(job, runs = runs.len(), "job unlocked");
        Ok(runs)
    }

    async fn prune(&self, older_than: Duration, batch: usize) -> Result<u64, StoreError> {
        let batch = batch.min(PRUNE_BATCH_MAX) as i64;
        let mut tx = self.write_tx().await?;
        // One cutoff for both tables: SQLite's clock may move between statements.
        let cutoff: i64 = sqlx::query_scalar(concat!("SELECT ", now!(), " - ?"))
            .bind(millis(older_than)?)
            .fetch_one(&mut *tx)
            .await
            .map_err(db_err)?;
        // By rowid: SQLite's DELETE takes no LIMIT unless compiled to.
        let deleted = sqlx::query(
            "DELETE FROM solocron_runs WHERE rowid IN (
               SELECT rowid FROM solocron_runs WHERE state <> 'running' AND scheduled_at < ?
               ORDER BY scheduled_at, attempt LIMIT ?)",
        )
        .bind(cutoff)
        .bind(batch)
        .execute(&mut *tx)
        .await
        .map_err(db_err)?
        .rows_affected();
        sqlx::query("DELETE FROM solocron_requests WHERE requested_at < ?")
            .bind(cutoff)
            .execute(&mut *tx)
            .await
            .map_err(db_err)?;
        tx.commit().await.map_err(db_err)?;
        Ok(deleted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_without_a_file_are_refused_with_a_hint() {
        for url in ["sqlite::memory:", "sqlite://", "sqlite://?mode=memory", "postgres://x/y"] {
            let err = parse_url(url).unwrap_err();
            assert!(matches!(err, StoreError::Invalid(_)), "{url}: {err}");
            assert!(err.to_string().contains(url), "{err}");
        }
        assert!(parse_url("sqlite:data/solocron.db").is_ok());
        assert!(parse_url("sqlite:///var/lib/solocron.db").is_ok());
    }

    #[test]
    fn absurd_durations_are_refused() {
        assert_eq!(millis(Duration::from_millis(1500)).unwrap(), 1500);
        assert!(millis(Duration::from_secs(u64::MAX)).is_err());
    }
}
