//! A one-tick claim in **one** writing statement, one call to the connection's worker:
//! SQLite decides, in SQL, instead of Rust deciding in memory between the five worker round
//! trips of [`crate::claim`] (`BEGIN IMMEDIATE`, read, insert, counter write, `COMMIT`).
//!
//! One `INSERT ... SELECT ... RETURNING` in autocommit. A writing statement takes the
//! database's write lock when it begins, before it reads (waiting in the busy handler like
//! every other writer), so its reads (whether the tick has a record, why it would be
//! skipped, the job's counter) cannot change before its write. The job's fencing counter
//! is advanced by the `{p}runs_fence` trigger that every insert of a run with a token
//! fires (see [`crate::schema`]), inside the same statement. No row back (from it or from
//! the refusal's `SELECT` below): the tick was taken.
//!
//! Where the tick has a record, a request to record a skip inserts nothing (`WHERE NOT
//! EXISTS`); a request to run it meets the primary key instead (`ON CONFLICT DO UPDATE`),
//! which gives the record a fresh lease, and returns it, only if it is still `running` as
//! this very request's claim (the same node and nonce, asked again after a lost answer):
//! the row returned then carries the claim's token and `claimed_at`. An upsert's update
//! fires no insert trigger, so the counter stays.
//!
//! The decisions are those of [`solocron_sql::plan`], spelled in SQL: a pause comes before
//! an overlap, a manual run ignores the pause, and the overlap names the job's newest
//! running run the way `RunId` displays it.
//!
//! Too early first: the insert's `WHERE` selects no row for a [`Trigger::Schedule`](solocron_core::Trigger::Schedule) request
//! whose tick is more than [`solocron_core::CLAIM_EARLY_MAX`] ahead of the statement's
//! clock, so it writes nothing (no record, no counter). A `SELECT` follows it in the same
//! call to the connection's worker (no round trip of its own), and answers only if the
//! insert wrote nothing (`changes() = 0`; sqlx stops at the insert's row otherwise): it
//! returns its clock as the refusal's `store_now` if the request is scheduled for a tick
//! still ahead, and either that tick is still too early or it has no record (then only the
//! clock can have refused it: the two clocks are microseconds apart, and this keeps a
//! refusal at the bound from reading as taken). No row from either: taken.

use sqlx::sqlite::SqliteRow;
use sqlx::Sqlite;

use solocron_core::{ClaimMode, ClaimOutcome, ClaimRequest, Lease, RunId, StoreError, Tick, Trigger};
use solocron_sql::plan;

use crate::error::db_err;
use crate::records::{get, instant, millis, EARLY_MAX_MS};
use crate::{fill, SqliteStore};

/// Claims the tick of `request` (see [`solocron_core::ClaimStore::claim`]) in one writing
/// statement, followed in the same call by the read of a too-early refusal's clock.
pub(crate) async fn claim_one(store: &SqliteStore, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
    let (variant, skip_reason) = variant(request);
    let mut query = sqlx::query::<Sqlite>(store.sql.claim_one.text(variant))
        .bind(request.tick.job.as_str())
        .bind(request.tick.scheduled_at.timestamp_millis())
        .bind(request.trigger.as_str())
        .bind(request.node.as_str())
        .bind(millis(request.lease)?)
        .bind(plan::nonce_param(request.nonce));
    if let Some(reason) = skip_reason {
        query = query.bind(reason);
    }
    let row = query.fetch_optional(&store.pool).await.map_err(db_err)?;
    outcome(request, row.as_ref())
}

/// Which of the claim's texts a request needs: whether it asks for a skipped record, and
/// otherwise whether the pause applies (not to manual runs) and whether an overlap skips
/// it; and the reason to bind as `?7` when it asks for a skipped record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Variant {
    Skip,
    Run { pausable: bool, skip_if_running: bool },
}

fn variant(request: &ClaimRequest) -> (Variant, Option<&str>) {
    match &request.mode {
        ClaimMode::Skip { reason } => (Variant::Skip, Some(reason)),
        ClaimMode::Run { skip_if_running } => {
            (Variant::Run { pausable: request.trigger != Trigger::Manual, skip_if_running: *skip_if_running }, None)
        }
    }
}

/// The one-tick claim's texts for one table prefix, one per [`Variant`], built when the
/// store connects (a claim is the hot path, and sqlx keeps each text's prepared statement
/// per connection).
pub(crate) struct Sql {
    texts: [String; 5],
}

impl Sql {
    /// The texts with the tables named `{tables}runs`, ...
    pub(crate) fn new(tables: &str) -> Sql {
        let run = |pausable, skip_if_running| build_sql(Variant::Run { pausable, skip_if_running }, tables);
        Sql {
            texts: [
                build_sql(Variant::Skip, tables),
                run(false, false),
                run(false, true),
                run(true, false),
                run(true, true),
            ],
        }
    }

    /// The claim's text for `variant`.
    fn text(&self, variant: Variant) -> &str {
        let index = match variant {
            Variant::Skip => 0,
            Variant::Run { pausable, skip_if_running } => 1 + 2 * usize::from(pausable) + usize::from(skip_if_running),
        };
        &self.texts[index]
    }
}

/// The claim's text for `variant`: job, tick (ms), trigger, node, lease (ms) and nonce
/// (`NULL`: none) are `?1` to `?6`. Two statements: the claim, then the refusal's clock
/// (see the module's docs); each returns `token, reason, claimed_at, lease_until,
/// store_now`.
fn build_sql(variant: Variant, tables: &str) -> String {
    let existing = match variant {
        Variant::Skip => "AND NOT EXISTS (SELECT 1 FROM {p}runs WHERE job = ?1 AND scheduled_at = ?2 AND attempt = 1)",
        // An upsert's `SELECT` needs its `WHERE` (the one above), or its `ON` would be read
        // as a join's. `NULL = NULL` is not true: a request without a nonce is never re-granted.
        Variant::Run { .. } => {
            "ON CONFLICT (job, scheduled_at, attempt) DO UPDATE SET lease_until = excluded.claimed_at + ?5
               WHERE state = 'running' AND node = excluded.node AND nonce = excluded.nonce"
        }
    };
    format!(
        concat!(
            r#"INSERT INTO {p}runs (job, scheduled_at, attempt, "trigger", node, token, state, reason,
                   claimed_at, finished_at, lease_until, nonce)
               SELECT ?1, ?2, 1, ?3, ?4,
                   CASE WHEN why IS NULL THEN COALESCE((SELECT token FROM {p}fences WHERE job = ?1), 0) + 1 END,
                   CASE WHEN why IS NULL THEN 'running' ELSE 'skipped' END,
                   why, now, CASE WHEN why IS NULL THEN NULL ELSE now END, CASE WHEN why IS NULL THEN now + ?5 END, ?6
               FROM (SELECT {why} AS why, "#,
            now!(),
            r#" AS now)
               WHERE (?3 <> '{schedule}' OR ?2 - now <= {early_max})
               {existing}
               RETURNING token, reason, claimed_at, lease_until, NULL AS store_now;
             SELECT NULL AS token, NULL AS reason, NULL AS claimed_at, NULL AS lease_until, now AS store_now
               FROM (SELECT "#,
            now!(),
            r#" AS now)
               WHERE changes() = 0 AND ?3 = '{schedule}' AND ?2 > now
                 AND (?2 - now > {early_max}
                      OR NOT EXISTS (SELECT 1 FROM {p}runs WHERE job = ?1 AND scheduled_at = ?2 AND attempt = 1))"#
        ),
        p = tables,
        why = why_sql(variant, tables),
        existing = fill(existing, tables),
        schedule = Trigger::Schedule.as_str(),
        early_max = EARLY_MAX_MS,
    )
}

/// Why a request of `variant` would be recorded `skipped` rather than run, as SQL (`NULL`:
/// run it); a skip request's reason is bound as `?7`.
fn why_sql(variant: Variant, tables: &str) -> String {
    let (pausable, skip_if_running) = match variant {
        Variant::Skip => return "?7".into(),
        Variant::Run { pausable, skip_if_running } => (pausable, skip_if_running),
    };
    let mut reasons = Vec::new();
    if pausable {
        reasons.push(
            "(SELECT 'paused by ' || changed_by || COALESCE(': ' || reason, '')
              FROM {p}jobs WHERE job = ?1 AND paused <> 0)",
        );
    }
    if skip_if_running {
        // Spelled like RunId's Display: job@2026-01-01T00:00:00.000Z#1.
        reasons.push(
            "(SELECT 'overlap: previous run ' || job || '@'
                  || strftime('%Y-%m-%dT%H:%M:%fZ', scheduled_at / 1000.0, 'unixepoch')
                  || '#' || attempt || ' still running'
              FROM {p}runs WHERE job = ?1 AND state = 'running'
              ORDER BY scheduled_at DESC, attempt DESC LIMIT 1)",
        );
    }
    let reasons: Vec<String> = reasons.iter().map(|r| fill(r, tables)).collect();
    match reasons.as_slice() {
        [] => "NULL".to_owned(),
        [one] => one.clone(),
        many => format!("COALESCE({})", many.join(", ")),
    }
}

/// The outcome the returned row (if any) says: a refusal (its `store_now`), a new record,
/// or a run granted again (its first `claimed_at`, its fresh `lease_until`).
fn outcome(request: &ClaimRequest, row: Option<&SqliteRow>) -> Result<ClaimOutcome, StoreError> {
    const WHAT: &str = "the one-tick claim";
    let Some(row) = row else { return Ok(ClaimOutcome::Taken) };
    let store_now: Option<i64> = get(row, "store_now")?;
    if let Some(store_now) = store_now {
        let store_now = instant(store_now)?;
        let (job, at) = (&request.tick.job, request.tick.scheduled_at);
        tracing::debug!(%job, %at, node = %request.node, %store_now, "claim refused: too early");
        return Ok(ClaimOutcome::TooEarly { store_now });
    }
    let token: Option<i64> = get(row, "token")?;
    let Some(token) = token else {
        let reason: Option<String> = get(row, "reason")?;
        let reason = reason.ok_or_else(|| StoreError::Invalid(format!("{WHAT}: a skipped record without a reason")))?;
        return Ok(ClaimOutcome::Skipped { reason });
    };
    let fencing_token = u64::try_from(token)
        .ok()
        .filter(|t| *t >= 1)
        .ok_or_else(|| StoreError::Invalid(format!("{WHAT}: fencing token {token} is not positive")))?;
    let lease_until: Option<i64> = get(row, "lease_until")?;
    let lease_until =
        lease_until.ok_or_else(|| StoreError::Invalid(format!("{WHAT}: a running record without a lease")))?;
    let lease = Lease {
        run: RunId { tick: Tick::new(request.tick.job.clone(), request.tick.scheduled_at), attempt: 1 },
        owner: request.node.clone(),
        fencing_token,
        claimed_at: instant(get(row, "claimed_at")?)?,
        lease_until: instant(lease_until)?,
    };
    tracing::debug!(run = %lease.run, node = %lease.owner, token = lease.fencing_token, "run claimed");
    Ok(ClaimOutcome::Won(lease))
}
