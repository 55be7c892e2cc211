//! The claim: a whole batch (up to [`CLAIM_BATCH_MAX`](solocron_core::CLAIM_BATCH_MAX)
//! requests) in one call of `lua/claim.lua`, so one round trip and one atomic step; one
//! outcome per request in request order, each request seeing the effect of the earlier
//! ones. Nothing else in this crate claims.
//!
//! A request that finds its tick's record is `Taken`, except a `Run` request asked again
//! with the nonce of the claim that created the record, while that run is still running as
//! this node's: it is won again (same token, original `claimed_at`, a fresh lease). See
//! [`ClaimRequest::nonce`].
//!
//! Before anything else, a [`Trigger::Schedule`](solocron_core::Trigger::Schedule)
//! request whose tick is more than [`CLAIM_EARLY_MAX`] ahead of Redis's clock (the call's
//! `TIME`) is `TooEarly` with that clock, and writes nothing (no record, no fencing token
//! taken); the batch's other requests are decided as usual.
//!
//! The rest of [`ClaimStore`] is here too: which ticks are taken (one `EXISTS` per tick),
//! and since when this Redis remembers claims (`memory_since`, see "Amnesia" in the crate
//! docs).

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use solocron_core::ClaimStore;
use solocron_core::{ClaimMode, ClaimOutcome, ClaimRequest, RunId, StoreError, Tick, CLAIM_EARLY_MAX};

use crate::call::millis;
use crate::decode::{self, convert, instant, invalid};
use crate::scripts::CODE;
use crate::RedisStore;

#[async_trait]
impl ClaimStore for RedisStore {
    /// Claims `requests` (see [`solocron_core::ClaimStore::claim`]).
    async fn claim(&self, requests: &[ClaimRequest]) -> Result<Vec<ClaimOutcome>, StoreError> {
        let store = self;
        if requests.is_empty() {
            return Ok(Vec::new());
        }
        let mut call = store.invocation(&CODE.claim);
        call.arg(requests.len()).arg(millis(CLAIM_EARLY_MAX)?);
        for request in requests {
            let (mode, reason) = mode(&request.mode);
            call.arg(&request.tick.job)
                .arg(request.tick.scheduled_at.timestamp_millis())
                .arg(request.trigger.as_str())
                .arg(&request.node)
                .arg(millis(request.lease)?)
                .arg(mode)
                .arg(reason)
                // Decimal, compared as text by the script: Lua's doubles cannot hold every u64.
                .arg(request.nonce);
        }
        let replies: Vec<String> = convert(store.run(&call, "claim").await?, "claim outcomes")?;
        if replies.len() != requests.len() {
            return Err(invalid(
                "claim outcomes",
                format!("{} outcomes for {} requests", replies.len(), requests.len()),
            ));
        }
        let outcomes = requests
            .iter()
            .zip(&replies)
            .map(|(request, reply)| decode::claim_outcome_text(reply, first_attempt(request), &request.node))
            .collect::<Result<Vec<_>, _>>()?;
        for outcome in &outcomes {
            if let ClaimOutcome::Won(lease) = outcome {
                tracing::debug!(run = %lease.run, node = %lease.owner, token = lease.fencing_token, "run claimed");
            }
        }
        Ok(outcomes)
    }

    /// Those of `ticks` that are taken (see [`solocron_core::ClaimStore::taken_ticks`]): one
    /// call, one `EXISTS` per tick.
    async fn taken_ticks(&self, ticks: &[Tick]) -> Result<Option<Vec<Tick>>, StoreError> {
        if ticks.is_empty() {
            return Ok(Some(Vec::new()));
        }
        let mut call = self.invocation(&CODE.taken);
        call.arg(ticks.len());
        for t in ticks {
            call.arg(t.job.as_str()).arg(t.scheduled_at.timestamp_millis());
        }
        let flags: Vec<u8> = convert(self.run(&call, "taken_ticks").await?, "taken flags")?;
        let flags = decode::flags(&flags, ticks.len())?;
        Ok(Some(ticks.iter().zip(flags).filter(|(_, taken)| *taken).map(|(t, _)| t.clone()).collect()))
    }

    /// When the present memory began (see "Amnesia" in the crate docs), marked now if
    /// unmarked.
    async fn memory_since(&self) -> Result<Option<DateTime<Utc>>, StoreError> {
        let reply = self.run(&self.invocation(&CODE.memory_since), "memory_since").await?;
        let ms: i64 = convert(reply, "epoch")?;
        Ok(Some(instant(ms)?))
    }
}

/// The store's scripts' mode names.
fn mode(mode: &ClaimMode) -> (&'static str, &str) {
    match mode {
        ClaimMode::Skip { reason } => ("skip", reason),
        ClaimMode::Run { skip_if_running: true } => ("exclusive", ""),
        ClaimMode::Run { skip_if_running: false } => ("run", ""),
    }
}

/// Attempt 1 of a request's tick, at the millisecond precision the store keeps.
fn first_attempt(request: &ClaimRequest) -> RunId {
    RunId { tick: Tick::new(request.tick.job.clone(), request.tick.scheduled_at), attempt: 1 }
}
