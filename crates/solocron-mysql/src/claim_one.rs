//! A one-tick claim in **one** round trip: `CALL {p}claim_one(...)`, a stored procedure
//! (schema version 2) that decides on the server, instead of Rust deciding in memory
//! between the two round trips of [`crate::claim`].
//!
//! The procedure runs, in one transaction: an upsert that creates the job's fence row or
//! advances its counter (taking the row's exclusive lock, as every claim and retry of the
//! job does before it reads) and leaves the new token in `LAST_INSERT_ID()` (so no read of
//! the row is needed); the read of whether the tick has a record and, if not, why it would
//! be skipped (its skip reason, the job's pause, or the newest running run of a job asked
//! not to overlap); the insert of its `running` or `skipped` record; `COMMIT`; and a
//! `SELECT` of what it decided. The reads are safe for the reason given in
//! [`crate::claim`]: the fence lock is held from before them until the commit.
//!
//! Why a procedure: the same steps sent as one multi-statement text query (as schema
//! version 1 did) cost the server a parse and a plan per statement, ~50 µs each here,
//! where a procedure's statements, parsed once per connection, cost ~10 µs each
//! (BENCHMARKS.md, 2026-11-25). And the `CALL` is a prepared statement, its arguments
//! bound rather than written into the text.
//!
//! The counter is advanced before the claim knows whether it wins, so a tick found taken
//! or skipped leaves a gap in the job's tokens: they still only ever grow, which is all a
//! fencing token promises. Batches of several ticks keep the two round trips of
//! [`crate::claim`], whose statements do not grow with the batch.

use solocron_core::{ClaimMode, ClaimOutcome, ClaimRequest, RunId, Tick, Trigger};
use solocron_sql::plan::{self, Decision};
use sqlx::mysql::MySqlRow;

use crate::claim::{is_duplicate, OpenTransaction};
use crate::error::{invalid, Failure};
use crate::records::{get, instant, millis, opt_text, token, TEXT_BYTES_MAX};
use crate::MySqlStore;

/// The longest pause reason written as it is, in characters: 4 bytes each at most, so it
/// always fits a `TEXT` column ([`TEXT_BYTES_MAX`] bytes); longer ones are cut to it.
const REASON_CHARS_FIT: usize = TEXT_BYTES_MAX / 4;

/// One try at claiming one tick (checked by the caller), in one round trip.
pub(crate) async fn claim_one(store: &MySqlStore, request: &ClaimRequest) -> Result<ClaimOutcome, Failure> {
    let (pausable, overlap, skip) = match &request.mode {
        ClaimMode::Skip { reason } => (false, false, Some(reason.as_str())),
        ClaimMode::Run { skip_if_running } => (request.trigger != Trigger::Manual, *skip_if_running, None),
    };
    let sql = store.sql("CALL {p}claim_one(?, ?, ?, ?, ?, ?, ?, ?)");
    let call = sqlx::query(&sql)
        .bind(request.tick.job.as_str())
        .bind(request.tick.scheduled_at.timestamp_millis())
        .bind(request.trigger.as_str())
        .bind(request.node.as_str())
        .bind(millis(request.lease)?)
        .bind(pausable)
        .bind(overlap)
        .bind(skip);
    // The procedure begins a transaction and commits it last: until the call has answered,
    // the connection may hold it open (a statement inside failed), and must roll it back.
    let mut tx = OpenTransaction { conn: store.pool.acquire().await?, open: true };
    let rows = match call.fetch_all(&mut *tx.conn).await {
        Ok(rows) => rows,
        Err(e) if is_duplicate(&e) => {
            return Err(tx.roll_back(Failure::Conflict(format!("a record appeared despite the lock: {e}"))).await)
        }
        Err(e) => return Err(tx.roll_back(e.into()).await),
    };
    // The procedure ran to its end, `COMMIT` included.
    tx.open = false;
    let [row] = rows.as_slice() else {
        return Err(invalid(format!("a one-tick claim answered {} rows", rows.len())));
    };
    outcome(request, row)
}

/// The procedure of schema version 2 (a template: prefix and clock not yet filled in).
/// Its arguments: job, tick (ms), trigger, node, lease (ms), whether a pause applies,
/// whether a running run of the job skips the tick, and the skip reason of a request to
/// record a skip (`NULL` otherwise). A pause comes before an overlap, as in
/// [`solocron_sql::plan`]. Texts are `utf8mb4` and compare as `utf8mb4_bin`, like the
/// columns, whatever the database's defaults. It runs with the caller's rights (`SQL
/// SECURITY INVOKER`), not those of whoever migrated: an operator's account that created it
/// may lack the nodes' rights, or be dropped later (every call would then fail with 1449).
pub(crate) fn procedure_sql() -> String {
    const TEXT: &str = "CHARACTER SET utf8mb4 COLLATE utf8mb4_bin";
    format!(
        "CREATE PROCEDURE {{p}}claim_one(
             IN p_job VARCHAR(191) {TEXT}, IN p_at BIGINT, IN p_trigger VARCHAR(16) {TEXT},
             IN p_node VARCHAR(191) {TEXT}, IN p_lease BIGINT, IN p_pausable BOOLEAN,
             IN p_overlap BOOLEAN, IN p_skip TEXT {TEXT})
         MODIFIES SQL DATA
         SQL SECURITY INVOKER
         BEGIN
             DECLARE v_token BIGINT;
             DECLARE v_taken BOOLEAN;
             DECLARE v_why TEXT {TEXT};
             DECLARE v_now BIGINT;
             START TRANSACTION;
             INSERT INTO {{p}}fences (job, token) VALUES (p_job, LAST_INSERT_ID(1))
                 ON DUPLICATE KEY UPDATE token = LAST_INSERT_ID(token + 1);
             SET v_token = LAST_INSERT_ID(), v_now = NOW_MS;
             SET v_taken = EXISTS(SELECT 1 FROM {{p}}runs WHERE job = p_job AND scheduled_at = p_at AND attempt = 1);
             IF NOT v_taken THEN
                 SET v_why = p_skip;
                 IF v_why IS NULL AND p_pausable THEN
                     SET v_why = (SELECT LEFT(CONCAT('paused by ', changed_by, COALESCE(CONCAT(': ', reason), '')),
                                              {REASON_CHARS_FIT})
                                  FROM {{p}}jobs WHERE job = p_job AND paused <> 0);
                 END IF;
                 IF v_why IS NULL AND p_overlap THEN
                     -- Spelled like RunId's Display: job@2026-01-01T00:00:00.000Z#1 (sessions are in UTC).
                     SET v_why = (SELECT CONCAT('overlap: previous run ', job, '@',
                                      LEFT(DATE_FORMAT(TIMESTAMP'1970-01-01 00:00:00' + INTERVAL scheduled_at * 1000 MICROSECOND,
                                                       '%Y-%m-%dT%H:%i:%s.%f'), 23),
                                      'Z#', attempt, ' still running')
                                  FROM {{p}}runs WHERE job = p_job AND state = 'running'
                                  ORDER BY scheduled_at DESC, attempt DESC LIMIT 1);
                 END IF;
                 IF v_why IS NULL THEN
                     INSERT INTO {{p}}runs (job, scheduled_at, attempt, `trigger`, node, token, state, reason,
                         claimed_at, finished_at, lease_until, output)
                     VALUES (p_job, p_at, 1, p_trigger, p_node, v_token, 'running', NULL, v_now, NULL,
                         v_now + p_lease, '');
                 ELSE
                     INSERT INTO {{p}}runs (job, scheduled_at, attempt, `trigger`, node, token, state, reason,
                         claimed_at, finished_at, lease_until, output)
                     VALUES (p_job, p_at, 1, p_trigger, p_node, NULL, 'skipped', v_why, v_now, v_now, NULL, '');
                 END IF;
             END IF;
             COMMIT;
             SELECT CAST(v_taken AS SIGNED) AS taken, CAST(v_why AS BINARY) AS why,
                 CAST(v_token AS SIGNED) AS token, CAST(v_now AS SIGNED) AS now;
         END"
    )
}

/// The outcome the procedure's row says. Its columns are read by position (taken, why,
/// token, now): sqlx names a row's columns from the prepared statement, and a prepared
/// `CALL` declares none.
fn outcome(request: &ClaimRequest, row: &MySqlRow) -> Result<ClaimOutcome, Failure> {
    let taken: i64 = get(row, 0)?;
    let decision = if taken != 0 {
        Decision::Taken
    } else if let Some(why) = opt_text(row, 1)? {
        Decision::Skipped(why)
    } else {
        let run = RunId { tick: Tick::new(request.tick.job.clone(), request.tick.scheduled_at), attempt: 1 };
        Decision::Won { run, token: token(get(row, 2)?)?, lease: request.lease }
    };
    let outcome = plan::outcome(request, decision, instant(get(row, 3)?)?);
    if let ClaimOutcome::Won(lease) = &outcome {
        tracing::debug!(run = %lease.run, node = %request.node, token = lease.fencing_token, "run claimed");
    }
    Ok(outcome)
}
