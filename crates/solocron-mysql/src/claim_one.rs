//! A one-tick claim in **one** round trip: `CALL {p}claim_one_v7(...)`, a stored procedure
//! (schema version 7, its text in [`crate::schema`]) that decides on the server, instead
//! of Rust deciding in memory between the two round trips of [`crate::claim`].
//!
//! A scheduled tick more than [`CLAIM_EARLY_MAX`](solocron_core::CLAIM_EARLY_MAX) ahead of
//! the server's clock is refused first, by the procedure's first statement: it answers
//! [`ClaimOutcome::TooEarly`](solocron_core::ClaimOutcome::TooEarly) with that clock, having written nothing (not even the job's
//! counter). Otherwise the procedure runs, in one transaction: an upsert that creates the job's fence row or
//! advances its counter (taking the row's exclusive lock, as every claim and retry of the
//! job does before it reads) and leaves the new token in `LAST_INSERT_ID()` (so no read of
//! the row is needed); the read of whether the tick has a record and, if not, why it would
//! be skipped (its skip reason, the job's pause, or the newest running run of a job asked
//! not to overlap); the insert of its `running` or `skipped` record, or, for a run request
//! that finds the record still running as its own claim (the same node and nonce, asked
//! again after a lost answer), a fresh lease for it; `COMMIT`; and a `SELECT` of what it
//! decided. The reads are safe for the reason given in
//! [`crate::claim`]: the fence lock is held from before them until the commit.
//!
//! Why a procedure: the same steps sent as one multi-statement text query (as schema
//! version 1 did) cost the server a parse and a plan per statement, ~50 µs each here,
//! where a procedure's statements, parsed once per connection, cost ~10 µs each
//! (benchmarks/2026-11-25-fair-raw-insert-claim-functions-46f38a3.md). And the `CALL` is a prepared statement, its arguments
//! bound rather than written into the text.
//!
//! The counter is advanced before the claim knows whether it wins, so a tick found taken
//! or skipped leaves a gap in the job's tokens: they still only ever grow, which is all a
//! fencing token promises. Batches of several ticks keep the two round trips of
//! [`crate::claim`], whose statements do not grow with the batch.

use solocron_core::{ClaimMode, ClaimOutcome, ClaimRequest, RunId, Tick, Trigger};
use solocron_sql::plan::{self, Decision};
use sqlx::mysql::MySqlRow;

use crate::error::{invalid, is_duplicate, Failure};
use crate::records::{early_max_ms, get, instant, millis, opt_text, token};
use crate::text::OpenTransaction;
use crate::MySqlStore;

/// The one-tick claim's statement, to be filled with the tables' prefix; every connection
/// prepares it when it opens (see `setup_session`).
pub(crate) const CALL: &str = "CALL {p}claim_one_v7(?, ?, ?, ?, ?, ?, ?, ?, ?, ?)";

/// One try at claiming one tick (checked by the caller), in one round trip.
pub(crate) async fn claim_one(store: &MySqlStore, request: &ClaimRequest) -> Result<ClaimOutcome, Failure> {
    let (pausable, overlap, skip) = match &request.mode {
        ClaimMode::Skip { reason } => (false, false, Some(reason.as_str())),
        ClaimMode::Run { skip_if_running } => (request.trigger != Trigger::Manual, *skip_if_running, None),
    };
    let sql = store.sql(CALL);
    let call = sqlx::query(&sql)
        .bind(request.tick.job.as_str())
        .bind(request.tick.scheduled_at.timestamp_millis())
        .bind(request.trigger.as_str())
        .bind(request.node.as_str())
        .bind(millis(request.lease)?)
        .bind(pausable)
        .bind(overlap)
        .bind(skip)
        .bind(plan::nonce_param(request.nonce))
        .bind(early_max_ms(request));
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

/// The outcome the procedure's row says. Its columns are read by position (taken, why,
/// token, now, the claim instant of a run granted again, and whether the tick was too
/// early): sqlx names a row's columns from the prepared statement, and a prepared `CALL`
/// declares none.
fn outcome(request: &ClaimRequest, row: &MySqlRow) -> Result<ClaimOutcome, Failure> {
    let early: i64 = get(row, 5)?;
    if early != 0 {
        return Ok(ClaimOutcome::TooEarly { store_now: instant(get(row, 3)?)? });
    }
    let taken: i64 = get(row, 0)?;
    let claimed: Option<i64> = get(row, 4)?;
    let run = || RunId { tick: Tick::new(request.tick.job.clone(), request.tick.scheduled_at), attempt: 1 };
    let decision = if let Some(claimed) = claimed {
        Decision::Regranted {
            run: run(),
            token: token(get(row, 2)?)?,
            claimed_at: instant(claimed)?,
            lease: request.lease,
        }
    } else if taken != 0 {
        Decision::Taken
    } else if let Some(why) = opt_text(row, 1)? {
        Decision::Skipped(why)
    } else {
        Decision::Won { run: run(), token: token(get(row, 2)?)?, lease: request.lease }
    };
    let outcome = plan::outcome(request, decision, instant(get(row, 3)?)?);
    if let ClaimOutcome::Won(lease) = &outcome {
        tracing::debug!(run = %lease.run, node = %request.node, token = lease.fencing_token, "run claimed");
    }
    Ok(outcome)
}
