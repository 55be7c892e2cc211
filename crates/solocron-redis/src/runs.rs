//! A held run's life after its claim: renew, finish (one or a pipelined batch), finish
//! for a retry, the expiry scan, and recovery (of expired runs and of due waiting
//! retries); an operator's unlock is in `admin.rs`. Each is one call of the store's Lua code, which compares the
//! owner and fencing token (or the state and lease expiry) in the same atomic step that
//! writes.

use async_trait::async_trait;
use solocron_core::RunStore;
use std::time::Duration;

use redis::Value;
use solocron_core::{
    output_tail, Ending, Lease, Namespaces, RecoverAction, RecoverOutcome, Renewal, RunEnd, RunId, RunRecord,
    StoreError, FINISH_BATCH_MAX, RECORDS_PAGE_MAX, RENEW_BATCH_MAX,
};

use crate::call::{millis, Call, OptionalInt};
use crate::decode::{self, convert, invalid};
use crate::scripts::{Method, CODE};
use crate::{RedisStore, SCAN_EXAMINED_MAX};

#[async_trait]
impl RunStore for RedisStore {
    /// Extends a lease (see [`solocron_core::RunStore::renew`]).
    async fn renew(&self, lease: &Lease, length: Duration) -> Result<bool, StoreError> {
        let store = self;
        let renewed: i64 = convert(store.run(&renew_call(store, lease, length)?, "renew").await?, "renew reply")?;
        Ok(renewed == 1)
    }

    /// Extends several leases in one pipeline (see [`solocron_core::RunStore::renew_all`]).
    async fn renew_all(&self, renewals: &[Renewal]) -> Result<Vec<bool>, StoreError> {
        let store = self;
        assert!(renewals.len() <= RENEW_BATCH_MAX, "{} renewals in one batch", renewals.len());
        let calls = renewals.iter().map(|r| renew_call(store, &r.lease, r.length)).collect::<Result<Vec<_>, _>>()?;
        store.run_flags(&calls, "renew").await
    }

    /// Records a run's end (see [`solocron_core::RunStore::finish`]).
    async fn finish(&self, lease: &Lease, end: &RunEnd) -> Result<bool, StoreError> {
        let store = self;
        let call = finish_call(store, lease, end)?;
        let finished: i64 = convert(store.run(&call, "finish").await?, "finish reply")?;
        Ok(finished == 1)
    }

    /// Records several runs' ends in one call of `lua/finish_all.lua`, which answers one flag
    /// per end in one string (see [`solocron_core::RunStore::finish_all`]). One call instead of a
    /// pipeline of one per end: the server runs the prelude once and the client reads one
    /// reply, which most of a run's cost was. If the call fails midway (a script error), the
    /// ends before it are recorded and the engine's item by item retry finds them no longer
    /// running: reported as not recorded, though they are.
    async fn finish_all(&self, endings: &[Ending]) -> Result<Vec<bool>, StoreError> {
        let store = self;
        assert!(endings.len() <= FINISH_BATCH_MAX, "{} endings in one batch", endings.len());
        if endings.is_empty() {
            return Ok(Vec::new());
        }
        let mut call = store.invocation(&CODE.finish_all);
        call.arg(endings.len());
        for e in endings {
            end_args(&mut call, &e.lease, &e.end)?;
        }
        let flags: Vec<u8> = convert(store.run(&call, "finish").await?, "finish flags")?;
        decode::flags(&flags, endings.len())
    }

    /// Records a failed run's end and plans its next attempt as a waiting retry, in one call
    /// (see [`solocron_core::RunStore::finish_for_retry`]).
    async fn finish_for_retry(&self, lease: &Lease, end: &RunEnd, after: Duration) -> Result<bool, StoreError> {
        let store = self;
        // The retry is never the last possible attempt, which `recover` could not start.
        if lease.run.attempt >= u32::MAX - 1 {
            return Err(StoreError::Invalid(format!("run {} has no next attempt to retry as", lease.run)));
        }
        let mut call = end_call(store, &CODE.finish_retry, lease, end)?;
        call.arg(millis(after)?);
        let finished: i64 = convert(store.run(&call, "finish_for_retry").await?, "finish_for_retry reply")?;
        if finished == 1 {
            tracing::debug!(run = %lease.run, ?after, "run finished; its retry waits");
        }
        Ok(finished == 1)
    }

    /// Running runs whose lease passed, and waiting retries whose not-before passed, by Redis's
    /// clock, of jobs in `namespaces` (see [`solocron_core::RunStore::expired`]). The Lua scans the
    /// due entries oldest first, passing over other namespaces', and examines at most
    /// [`SCAN_EXAMINED_MAX`] of them.
    async fn expired(&self, limit: usize, namespaces: &Namespaces) -> Result<Vec<RunRecord>, StoreError> {
        let store = self;
        let limit = limit.min(RECORDS_PAGE_MAX);
        if limit == 0 {
            return Ok(Vec::new());
        }
        let mut call = store.invocation(&CODE.expired);
        call.arg(limit).arg(SCAN_EXAMINED_MAX).namespaces(namespaces);
        let (bounded, records): (i64, Value) = convert(store.run(&call, "expired").await?, "expired reply")?;
        let records = decode::each(records, "expired runs", decode::record)?;
        if bounded == 1 {
            tracing::warn!(
                examined = SCAN_EXAMINED_MAX,
                found = records.len(),
                %namespaces,
                "the expired runs scan stopped after examining its most entries, mostly of other namespaces; \
                 later expired runs of these namespaces are not listed until those are recovered"
            );
        }
        // A record this version cannot read (written by a newer one, say) must not stop the
        // recovery of every other run.
        Ok(records
            .into_iter()
            .filter_map(|r| r.map_err(|e| tracing::error!(error = %e, "skipping an unreadable expired run")).ok())
            .collect())
    }

    /// Abandons or retries an expired run, or drops or starts a due waiting retry (see
    /// [`solocron_core::RunStore::recover`]).
    async fn recover(&self, run: &RunId, action: &RecoverAction) -> Result<RecoverOutcome, StoreError> {
        let store = self;
        // Checked before the call: the script may end the run before it starts the next one.
        // (A waiting retry is never the last attempt: `finish_for_retry` makes none.)
        if matches!(action, RecoverAction::Retry { .. }) && run.attempt == u32::MAX {
            return Err(StoreError::Invalid(format!("run {run} has no next attempt")));
        }
        let next = RunId { tick: run.tick.clone(), attempt: run.attempt.saturating_add(1) };
        let mut call = store.invocation(&CODE.recover);
        call.arg(&run.tick.job).arg(run.tick.scheduled_at.timestamp_millis()).arg(run.attempt);
        match action {
            RecoverAction::Abandon { reason } => call.arg("abandon").arg(reason).arg(0),
            RecoverAction::Retry { node, lease } => call.arg("retry").arg(node).arg(millis(*lease)?),
        };
        let reply: Vec<String> = convert(store.run(&call, "recover").await?, "recover reply")?;
        let outcome = match (reply.first().map(String::as_str), action) {
            (Some("not_needed"), _) => RecoverOutcome::NotNeeded,
            (Some("abandoned"), RecoverAction::Abandon { .. }) => RecoverOutcome::Abandoned,
            (Some("won"), RecoverAction::Retry { node, .. }) => {
                RecoverOutcome::Retried(decode::won(&reply, next, node)?)
            }
            // A waiting retry started: the same attempt.
            (Some("started"), RecoverAction::Retry { node, .. }) => {
                RecoverOutcome::Retried(decode::won(&reply, run.clone(), node)?)
            }
            _ => return Err(invalid("recover reply", format!("{reply:?}"))),
        };
        if outcome != RecoverOutcome::NotNeeded {
            tracing::debug!(%run, ?outcome, "expired run recovered");
        }
        Ok(outcome)
    }
}

/// The `renew` script's call for one lease.
fn renew_call(store: &RedisStore, lease: &Lease, length: Duration) -> Result<Call, StoreError> {
    let mut call = store.invocation(&CODE.renew);
    lease_args(&mut call, lease);
    call.arg(millis(length)?);
    Ok(call)
}

/// The `finish` script's call for one end.
fn finish_call(store: &RedisStore, lease: &Lease, end: &RunEnd) -> Result<Call, StoreError> {
    end_call(store, &CODE.finish, lease, end)
}

/// A call of `method` (`finish`, or `finish_retry` before its backoff argument) with the
/// arguments of one end.
fn end_call(store: &RedisStore, method: &'static Method, lease: &Lease, end: &RunEnd) -> Result<Call, StoreError> {
    let mut call = store.invocation(method);
    end_args(&mut call, lease, end)?;
    Ok(call)
}

/// The ten arguments of one end, as `finish` and `finish_all` take them.
fn end_args(call: &mut Call, lease: &Lease, end: &RunEnd) -> Result<(), StoreError> {
    assert!(end.state.is_terminal(), "a run cannot finish as `{}`", end.state);
    let started_after = end.started_after.map(millis).transpose()?;
    lease_args(call, lease);
    call.arg(end.state.as_str())
        .arg(crate::call::optional(end.reason.as_deref()))
        .arg(OptionalInt(end.exit_code.map(i64::from)))
        .arg(output_tail(&end.output))
        .arg(OptionalInt(started_after));
    Ok(())
}

/// The identity of a run and its holder's proof, as renew and finish send them.
fn lease_args(call: &mut Call, lease: &Lease) {
    call.arg(&lease.run.tick.job)
        .arg(lease.run.tick.scheduled_at.timestamp_millis())
        .arg(lease.run.attempt)
        .arg(&lease.owner)
        .arg(lease.fencing_token);
}
