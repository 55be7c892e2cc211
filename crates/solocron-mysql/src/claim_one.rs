//! A one-tick claim in **one** round trip: the server decides, in SQL with session
//! variables, instead of Rust deciding in memory between two round trips.
//!
//! One multi-statement text query: `START TRANSACTION`; an upsert that creates the job's
//! fence row or advances its counter (taking the row's exclusive lock, as every claim and
//! retry of the job does before it reads) and leaves the new token in the session's
//! `LAST_INSERT_ID()` (`LAST_INSERT_ID(expr)` sets it, so no read of the row is needed); a
//! `SET` that reads the token, whether the tick has a record, why it would be skipped (its
//! skip reason, the job's pause, or the newest running run of a job asked not to overlap)
//! and the server's clock; one
//! `INSERT ... SELECT ... WHERE NOT taken` of its `running` or `skipped` record; `COMMIT`;
//! and a `SELECT` of the variables. The reads are safe for the reason given in
//! [`crate::claim`]: the fence lock is held from before them until the commit.
//!
//! The counter is advanced before the claim knows whether it wins, so a tick found taken
//! or skipped leaves a gap in the job's tokens: they still only ever grow, which is all a
//! fencing token promises, and writing the counter once instead of locking it and then
//! writing it measured ~15% of the claim's time (BENCHMARKS.md, 2026-11-24).
//! Batches of several ticks keep the two round trips of [`crate::claim`], whose
//! statements do not grow with the batch.

use solocron_core::{ClaimMode, ClaimOutcome, ClaimRequest, RunId, Tick, Trigger};
use solocron_sql::plan::{self, Decision};
use sqlx::mysql::MySqlRow;

use crate::claim::{inline, is_duplicate, read_rows, Literal, OpenTransaction};
use crate::error::{invalid, Failure};
use crate::records::{get, instant, millis, opt_text, token, TEXT_BYTES_MAX};
use crate::MySqlStore;

/// The longest pause reason written as it is, in characters: 4 bytes each at most, so it
/// always fits a `TEXT` column ([`TEXT_BYTES_MAX`] bytes); longer ones are cut to it.
const REASON_CHARS_FIT: usize = TEXT_BYTES_MAX / 4;

/// One try at claiming one tick (checked by the caller), in one round trip.
pub(crate) async fn claim_one(store: &MySqlStore, request: &ClaimRequest) -> Result<ClaimOutcome, Failure> {
    let sql = store.sql(&one_sql(request)?);
    let mut tx = OpenTransaction { conn: store.pool.acquire().await?, open: true };
    let rows = match read_rows(&mut tx.conn, &sql).await {
        Ok(rows) => rows,
        Err(e) if is_duplicate(&e) => {
            return Err(tx.roll_back(Failure::Conflict(format!("a record appeared despite the lock: {e}"))).await)
        }
        Err(e) => return Err(tx.roll_back(e.into()).await),
    };
    // Every statement ran (the server stops at the first that fails), `COMMIT` included.
    tx.open = false;
    let [row] = rows.as_slice() else {
        return Err(invalid(format!("a one-tick claim answered {} rows", rows.len())));
    };
    outcome(request, row)
}

/// The whole claim's SQL (prefix and clock not yet filled in).
fn one_sql(request: &ClaimRequest) -> Result<String, Failure> {
    let job = Literal::Text(&request.tick.job);
    let at = Literal::Int(request.tick.scheduled_at.timestamp_millis());
    let why = why_sql(request);
    let won = "@solocron_why IS NULL";
    let sql = format!(
        "START TRANSACTION;
         INSERT INTO {{p}}fences (job, token) VALUES (?, LAST_INSERT_ID(1))
             ON DUPLICATE KEY UPDATE token = LAST_INSERT_ID(token + 1);
         SET @solocron_token = LAST_INSERT_ID(),
             @solocron_taken = EXISTS(SELECT 1 FROM {{p}}runs WHERE job = ? AND scheduled_at = ? AND attempt = 1),
             @solocron_why = {why},
             @solocron_now = NOW_MS;
         INSERT INTO {{p}}runs (job, scheduled_at, attempt, `trigger`, node, token, state, reason,
             claimed_at, finished_at, lease_until, output)
         SELECT ?, ?, 1, ?, ?, IF({won}, @solocron_token, NULL), IF({won}, 'running', 'skipped'),
             @solocron_why, @solocron_now, IF({won}, NULL, @solocron_now),
             IF({won}, @solocron_now + ?, NULL), ''
         FROM DUAL WHERE NOT @solocron_taken;
         COMMIT;
         SELECT CAST(@solocron_taken AS SIGNED) AS taken, CAST(@solocron_why AS BINARY) AS why,
             CAST(@solocron_token AS SIGNED) AS token, CAST(@solocron_now AS SIGNED) AS now"
    );
    let mut values = vec![job.clone(), job.clone(), at.clone()];
    values.extend(why_values(request));
    values.extend([
        job,
        at,
        Literal::Text(request.trigger.as_str()),
        Literal::Text(&request.node),
        Literal::Int(millis(request.lease)?),
    ]);
    Ok(inline(&sql, &values))
}

/// Why request's tick would be recorded `skipped` rather than run, as SQL (`NULL`: run it),
/// with a `?` for each of [`why_values`]. A pause comes before an overlap, as in
/// [`solocron_sql::plan`]; manual runs ignore the pause.
fn why_sql(request: &ClaimRequest) -> String {
    let skip_if_running = match &request.mode {
        ClaimMode::Skip { .. } => return "?".into(),
        ClaimMode::Run { skip_if_running } => *skip_if_running,
    };
    let mut reasons = Vec::new();
    if request.trigger != Trigger::Manual {
        reasons.push(format!(
            "(SELECT LEFT(CONCAT('paused by ', changed_by, COALESCE(CONCAT(': ', reason), '')), {REASON_CHARS_FIT})
              FROM {{p}}jobs WHERE job = ? AND paused <> 0)"
        ));
    }
    if skip_if_running {
        // Spelled like RunId's Display: job@2026-01-01T00:00:00.000Z#1 (sessions are in UTC).
        reasons.push(
            "(SELECT CONCAT('overlap: previous run ', job, '@',
                  LEFT(DATE_FORMAT(TIMESTAMP'1970-01-01 00:00:00' + INTERVAL scheduled_at * 1000 MICROSECOND,
                                   '%Y-%m-%dT%H:%i:%s.%f'), 23),
                  'Z#', attempt, ' still running')
              FROM {p}runs WHERE job = ? AND state = 'running' ORDER BY scheduled_at DESC, attempt DESC LIMIT 1)"
                .into(),
        );
    }
    match reasons.len() {
        0 => "NULL".into(),
        1 => reasons.pop().expect("one"),
        _ => format!("COALESCE({})", reasons.join(", ")),
    }
}

/// The values of [`why_sql`]'s placeholders.
fn why_values(request: &ClaimRequest) -> Vec<Literal<'_>> {
    match &request.mode {
        ClaimMode::Skip { reason } => vec![Literal::Text(reason)],
        ClaimMode::Run { skip_if_running } => {
            let pausable = request.trigger != Trigger::Manual;
            let n = usize::from(pausable) + usize::from(*skip_if_running);
            vec![Literal::Text(&request.tick.job); n]
        }
    }
}

/// The outcome the variables read back say.
fn outcome(request: &ClaimRequest, row: &MySqlRow) -> Result<ClaimOutcome, Failure> {
    let taken: i64 = get(row, "taken")?;
    let decision = if taken != 0 {
        Decision::Taken
    } else if let Some(why) = opt_text(row, "why")? {
        Decision::Skipped(why)
    } else {
        let run = RunId { tick: Tick::new(request.tick.job.clone(), request.tick.scheduled_at), attempt: 1 };
        Decision::Won { run, token: token(get(row, "token")?)?, lease: request.lease }
    };
    let outcome = plan::outcome(request, decision, instant(get(row, "now")?)?);
    if let ClaimOutcome::Won(lease) = &outcome {
        tracing::debug!(run = %lease.run, node = %request.node, token = lease.fencing_token, "run claimed");
    }
    Ok(outcome)
}
