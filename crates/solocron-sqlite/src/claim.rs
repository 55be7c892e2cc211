//! The claim of a batch of ticks: one `BEGIN IMMEDIATE` transaction of a few statements,
//! whatever the batch's size. One read of everything the decisions depend on, the
//! decisions made in memory ([`solocron_sql::plan`]), then one insert per 90 new records
//! (each run inserted with a token advances its job's counter by trigger), and, only if
//! some request asked again for its own running claim, one update of those runs' leases.
//! A batch of one tick is claimed in one statement instead ([`crate::claim_one`]).
//!
//! A [`Trigger::Schedule`] request for a tick more than
//! [`CLAIM_EARLY_MAX`](solocron_core::CLAIM_EARLY_MAX) ahead of the read's clock (SQLite's,
//! under the lock) is answered [`ClaimOutcome::TooEarly`] and left out of the plan before
//! anything is decided: it writes nothing, and its job's counter stays. The rest of the
//! batch is decided as if it had not been asked.
//!
//! Deciding in memory is safe because the transaction holds the database's write lock
//! from its first statement to its commit: nothing it read can change in between. The
//! primary key stays the final arbiter: an insert that finds a record fails the whole
//! transaction, which rolls back.
//!
//! Why batch-wide statements: every statement is a round trip to the connection's worker
//! thread, made while every other process waits for the lock. Statement by statement a
//! won tick cost 4 of them (and a taken one 2); a batch of 1,000 held the lock for
//! thousands of round trips.

use async_trait::async_trait;
use solocron_core::{ClaimStore, Tick};
use std::borrow::Cow;

use chrono::{DateTime, Utc};
use sqlx::{QueryBuilder, Sqlite, SqliteConnection};

use solocron_core::{ClaimOutcome, ClaimRequest, StoreError, Trigger, CLAIM_BATCH_MAX};
use solocron_sql::plan::{self, Decision, Found, StateRow, Wanted};

use crate::error::db_err;
use crate::records::{get_in, instant, millis, EARLY_MAX_MS};
use crate::{fill, SqliteStore};

/// Batches of at most this many requests keep their statements prepared (sqlx's
/// per-connection statement cache): a small batch's statements have one of a few texts,
/// and preparing them again each time was a quarter of a one-tick claim's time when those
/// went through here (benchmarks/2026-11-24-evening-redis-functions-mariadb-claim-7391480.md). Larger batches' texts vary with
/// their size and are not kept.
const PREPARED_BATCH_MAX: usize = 8;

/// Records per `INSERT`: 11 bound values each stay below SQLite's limit on a statement's
/// parameters (32,766 in the bundled SQLite; the read binds at most ~5 per request, the
/// leases' update 3 per re-grant).
const ROWS_PER_INSERT: usize = 90;

/// Whether `request` asks for its tick too early to be granted at `now` (the store's clock,
/// ms): a [`Trigger::Schedule`] request for a tick more than
/// [`CLAIM_EARLY_MAX`](solocron_core::CLAIM_EARLY_MAX) ahead. Other triggers are never early
/// (a manual tick's instant is the store's; catch-ups and retries are of past ticks).
fn too_early(request: &ClaimRequest, now: i64) -> bool {
    request.trigger == Trigger::Schedule
        && request.tick.scheduled_at.timestamp_millis().saturating_sub(now) > EARLY_MAX_MS
}

/// The batch claim's statement parts for one table prefix, built when the store connects:
/// a batch's texts vary with its size, but their parts need no formatting per claim.
pub(crate) struct Sql {
    read_fences: String,
    read_firsts: String,
    read_running: String,
    read_paused: String,
    insert: String,
    regrant: String,
    /// The runs table, for `taken_ticks`' query (built by the shared builder).
    runs: String,
}

impl Sql {
    /// The parts with the tables named `{tables}runs`, ...
    pub(crate) fn new(tables: &str) -> Sql {
        Sql {
            read_fences: fill(
                concat!(
                    "SELECT 'f' AS kind, job, token AS n, 0 AS attempt, NULL AS who, NULL AS why, NULL AS state,",
                    " NULL AS node, NULL AS nonce, NULL AS token, NULL AS claimed_at FROM {p}fences WHERE job IN "
                ),
                tables,
            ),
            // What a request asking again for its own claim is re-granted from.
            read_firsts: fill(
                concat!(
                    " UNION ALL SELECT 't', job, scheduled_at, attempt, NULL, NULL, state, node, nonce, token,",
                    " claimed_at FROM {p}runs WHERE attempt = 1 AND job IN "
                ),
                tables,
            ),
            read_running: fill(
                concat!(
                    " UNION ALL SELECT 'r', job, scheduled_at, attempt, NULL, NULL, NULL, NULL, NULL, NULL, NULL",
                    " FROM {p}runs WHERE state = 'running' AND job IN "
                ),
                tables,
            ),
            read_paused: fill(
                concat!(
                    " UNION ALL SELECT 'p', job, 0, 0, changed_by, reason, NULL, NULL, NULL, NULL, NULL",
                    " FROM {p}jobs WHERE paused <> 0 AND job IN "
                ),
                tables,
            ),
            insert: fill(
                r#"INSERT INTO {p}runs (job, scheduled_at, attempt, "trigger", node, token, state, reason, claimed_at, finished_at, lease_until, nonce) "#,
                tables,
            ),
            // `running`: checked under the write lock already, restated so that the count
            // proves it.
            regrant: fill(
                concat!(
                    "UPDATE {p}runs SET lease_until = g.column3 FROM (VALUES {values}) AS g",
                    " WHERE {p}runs.job = g.column1 AND {p}runs.scheduled_at = g.column2 AND {p}runs.attempt = 1",
                    " AND {p}runs.state = 'running'"
                ),
                tables,
            ),
            runs: fill("{p}runs", tables),
        }
    }
}

#[async_trait]
impl ClaimStore for SqliteStore {
    /// Claims `requests` (see [`solocron_core::ClaimStore::claim`]).
    async fn claim(&self, requests: &[ClaimRequest]) -> Result<Vec<ClaimOutcome>, StoreError> {
        let store = self;
        if requests.is_empty() {
            return Ok(Vec::new());
        }
        if requests.len() > CLAIM_BATCH_MAX {
            // The read's and the counters' statements bind a few values per request.
            return Err(StoreError::Invalid(format!(
                "{} requests in one claim; at most {CLAIM_BATCH_MAX}",
                requests.len()
            )));
        }
        if let [one] = requests {
            return Ok(vec![crate::claim_one::claim_one(store, one).await?]);
        }
        // The whole batch in one transaction: one lock round per poll, and all-or-nothing if
        // any statement fails (the transaction rolls back when dropped).
        let keep = requests.len() <= PREPARED_BATCH_MAX;
        let mut tx = store.write_tx().await?;
        let sql = &store.sql.claim;
        let (found, now) = read_state(sql, &mut tx, &Wanted::of(requests), keep).await?;
        let (early, kept) = leave_out_early(requests, now);
        let (decisions, counters) = plan::plan(&kept, found);
        let rows: Vec<(&ClaimRequest, &Decision)> = kept
            .iter()
            .zip(&decisions)
            .filter(|(_, d)| matches!(d, Decision::Won { .. } | Decision::Skipped(_)))
            .collect();
        // Each inserted run with a token advances its job's counter (the `{p}runs_fence`
        // trigger), so the counters `plan` computed need no statement of their own.
        for chunk in rows.chunks(ROWS_PER_INSERT) {
            insert(sql, &mut tx, chunk, now, keep).await?;
        }
        regrant(sql, &mut tx, &kept, &decisions, now, keep).await?;
        debug_assert!(counters.values().all(|t| *t >= 1));
        // Checked before the commit: once committed, the won runs must be run.
        let now = instant(now)?;
        tx.commit().await.map_err(db_err)?;
        let outcomes = outcomes(requests, &early, &kept, decisions, now);
        for (request, outcome) in requests.iter().zip(&outcomes) {
            match outcome {
                ClaimOutcome::Won(lease) => {
                    tracing::debug!(run = %lease.run, node = %lease.owner, token = lease.fencing_token, "run claimed");
                }
                ClaimOutcome::TooEarly { store_now } => {
                    let (job, at) = (&request.tick.job, request.tick.scheduled_at);
                    tracing::debug!(%job, %at, node = %request.node, %store_now, "claim refused: too early");
                }
                _ => {}
            }
        }
        Ok(outcomes)
    }

    /// Those of `ticks` that are taken (see [`solocron_core::ClaimStore::taken_ticks`]): their
    /// jobs' attempt 1 rows over the ticks' span of instants, in one statement.
    async fn taken_ticks(&self, ticks: &[Tick]) -> Result<Option<Vec<Tick>>, StoreError> {
        let Some(mut sql) = solocron_sql::taken_ticks_query::<Sqlite>(&self.sql.claim.runs, ticks) else {
            return Ok(Some(Vec::new()));
        };
        let rows: Vec<(String, i64)> = sql.build_query_as().fetch_all(&self.pool).await.map_err(db_err)?;
        Ok(Some(solocron_sql::taken_of(ticks, rows)))
    }
}

/// Which of `requests` are [`too_early`] at `now` (the store's clock, ms), and the others,
/// in order: `requests` itself unless some are early (the usual batch has none, and is
/// not copied).
fn leave_out_early(requests: &[ClaimRequest], now: i64) -> (Vec<bool>, Cow<'_, [ClaimRequest]>) {
    let early: Vec<bool> = requests.iter().map(|r| too_early(r, now)).collect();
    if !early.contains(&true) {
        return (early, Cow::Borrowed(requests));
    }
    let kept = requests.iter().zip(&early).filter(|(_, e)| !**e).map(|(r, _)| r.clone()).collect();
    (early, Cow::Owned(kept))
}

/// Every request's outcome, in request order: [`ClaimOutcome::TooEarly`](solocron_core::ClaimOutcome::TooEarly) at `now` where
/// `early` says so, and otherwise the next of the `kept` requests' `decisions`.
fn outcomes(
    requests: &[ClaimRequest],
    early: &[bool],
    kept: &[ClaimRequest],
    decisions: Vec<Decision>,
    now: DateTime<Utc>,
) -> Vec<ClaimOutcome> {
    assert_eq!(early.len(), requests.len(), "one verdict per request");
    assert_eq!(kept.len() + early.iter().filter(|e| **e).count(), requests.len(), "each request early or kept");
    assert_eq!(decisions.len(), kept.len(), "one decision per kept request");
    let mut decided = kept.iter().zip(decisions).map(|(r, d)| plan::outcome(r, d, now));
    early
        .iter()
        .map(|e| {
            if *e {
                ClaimOutcome::TooEarly { store_now: now }
            } else {
                decided.next().expect("one decision per kept request")
            }
        })
        .collect()
}

/// One read of what the batch depends on (`Wanted`), and SQLite's clock (ms): the
/// instant every record of the batch carries.
async fn read_state(
    texts: &Sql,
    conn: &mut SqliteConnection,
    wanted: &Wanted<'_>,
    keep: bool,
) -> Result<(Found, i64), StoreError> {
    let mut sql = QueryBuilder::<Sqlite>::new(&texts.read_fences);
    list(&mut sql, &wanted.jobs);
    sql.push(&texts.read_firsts);
    list(&mut sql, &wanted.jobs);
    sql.push(" AND scheduled_at IN (");
    let mut instants = sql.separated(", ");
    for at in &wanted.instants {
        instants.push_bind(*at);
    }
    sql.push(")");
    if !wanted.overlapping.is_empty() {
        sql.push(&texts.read_running);
        list(&mut sql, &wanted.overlapping);
    }
    if !wanted.pausable.is_empty() {
        sql.push(&texts.read_paused);
        list(&mut sql, &wanted.pausable);
    }
    sql.push(concat!(" UNION ALL SELECT 'n', '', ", now!(), ", 0, NULL, NULL, NULL, NULL, NULL, NULL, NULL"));
    let rows = sql.build().persistent(keep).fetch_all(conn).await.map_err(db_err)?;
    let mut found = Found::default();
    const READ: &str = "the claim's read";
    for row in &rows {
        found.note_row(StateRow {
            kind: get_in(row, READ, "kind")?,
            job: get_in(row, READ, "job")?,
            n: get_in(row, READ, "n")?,
            attempt: get_in(row, READ, "attempt")?,
            who: get_in(row, READ, "who")?,
            why: get_in(row, READ, "why")?,
            state: get_in(row, READ, "state")?,
            node: get_in(row, READ, "node")?,
            nonce: get_in(row, READ, "nonce")?,
            token: get_in(row, READ, "token")?,
            claimed_at: get_in(row, READ, "claimed_at")?,
        })?;
    }
    let now = found.now.ok_or_else(|| StoreError::Invalid(format!("{READ} returned no clock")))?;
    Ok((found, now))
}

/// `(?, ?, ...)` of `items`.
fn list<'a>(sql: &mut QueryBuilder<'a, Sqlite>, items: &[&'a str]) {
    sql.push("(");
    let mut separated = sql.separated(", ");
    for item in items {
        separated.push_bind(*item);
    }
    sql.push(")");
}

/// Inserts the records of `rows` (none taken), claimed at `now`. A plain `INSERT`: a record
/// that exists despite the lock fails the transaction.
async fn insert(
    texts: &Sql,
    conn: &mut SqliteConnection,
    rows: &[(&ClaimRequest, &Decision)],
    now: i64,
    keep: bool,
) -> Result<(), StoreError> {
    let mut values = Vec::with_capacity(rows.len());
    for (request, decision) in rows {
        let (token, state, reason, finished, lease_until) = match decision {
            Decision::Won { token, lease, .. } => {
                let token = solocron_sql::token_param(*token)?;
                (Some(token), "running", None, None, Some(now.saturating_add(millis(*lease)?)))
            }
            Decision::Skipped(reason) => (None, "skipped", Some(reason.as_str()), Some(now), None),
            Decision::Taken | Decision::Regranted { .. } => unreachable!("only new records are inserted"),
        };
        values.push((request, token, state, reason, finished, lease_until));
    }
    let mut sql = QueryBuilder::<Sqlite>::new(&texts.insert);
    sql.push_values(values, |mut row, (request, token, state, reason, finished, lease_until)| {
        row.push_bind(request.tick.job.as_str())
            .push_bind(request.tick.scheduled_at.timestamp_millis())
            .push("1")
            .push_bind(request.trigger.as_str())
            .push_bind(request.node.as_str())
            .push_bind(token)
            .push_bind(state)
            .push_bind(reason)
            .push_bind(now)
            .push_bind(finished)
            .push_bind(lease_until)
            .push_bind(plan::nonce_param(request.nonce));
    });
    let inserted = sql.build().persistent(keep).execute(conn).await.map_err(db_err)?.rows_affected();
    assert_eq!(inserted, rows.len() as u64, "every new record inserted");
    Ok(())
}

/// Gives each [`Decision::Regranted`] run a fresh lease from `now`, in one statement, and
/// none when there is none (the usual batch).
async fn regrant(
    texts: &Sql,
    conn: &mut SqliteConnection,
    requests: &[ClaimRequest],
    decisions: &[Decision],
    now: i64,
    keep: bool,
) -> Result<(), StoreError> {
    let mut leases = Vec::new();
    for (request, decision) in requests.iter().zip(decisions) {
        if let Decision::Regranted { lease, .. } = decision {
            leases.push((request, now.saturating_add(millis(*lease)?)));
        }
    }
    if leases.is_empty() {
        return Ok(());
    }
    let text = texts.regrant.replace("{values}", &vec!["(?, ?, ?)"; leases.len()].join(", "));
    let mut query = sqlx::query::<Sqlite>(&text);
    for (request, until) in &leases {
        query = query.bind(request.tick.job.as_str()).bind(request.tick.scheduled_at.timestamp_millis()).bind(*until);
    }
    let updated = query.persistent(keep).execute(conn).await.map_err(db_err)?.rows_affected();
    assert_eq!(updated, leases.len() as u64, "every run granted again holds a fresh lease");
    Ok(())
}
