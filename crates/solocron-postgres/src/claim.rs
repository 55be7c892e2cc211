//! Claims: one call of the server-side `{p}claim` function per batch (a batch of one
//! calls `{p}claim_one`, see `claim_one.rs`).

use solocron_core::{ClaimMode, ClaimOutcome, ClaimRequest, Lease, RunId, StoreError, Tick};
use sqlx::postgres::PgRow;
use sqlx::PgPool;

use crate::claim_one::claim_one;
use crate::error::{retrying, Res};
use crate::records::{get, instant, millis, token};
use crate::PgStore;

/// The smallest batch claimed by `{p}claim_taken_first` (ticks found taken answered before
/// any lock; see the schema): a herd's chunks, which other nodes may have claimed already.
/// Shorter batches skip its extra read, which costs a one-tick claim a third of its time.
const TAKEN_FIRST_MIN: usize = 256;

/// Claims `requests` in one call (one round trip, one transaction), retried when it loses
/// a conflict.
pub(crate) async fn claim(store: &PgStore, requests: &[ClaimRequest]) -> Result<Vec<ClaimOutcome>, StoreError> {
    if requests.is_empty() {
        return Ok(Vec::new());
    }
    let batch = Batch::new(requests)?;
    retrying("claim", || claim_once(store, &batch, requests)).await
}

async fn claim_once(store: &PgStore, batch: &Batch, requests: &[ClaimRequest]) -> Res<Vec<ClaimOutcome>> {
    if let [_] = requests {
        return claim_one(store, batch, requests).await;
    }
    let sql = if requests.len() >= TAKEN_FIRST_MIN {
        store.sql("SELECT * FROM {p}claim_taken_first($1, $2, $3, $4, $5, $6, $7)")
    } else {
        store.sql("SELECT * FROM {p}claim($1, $2, $3, $4, $5, $6, $7)")
    };
    let rows = batch.send(&store.pool, &sql).await?;
    Ok(outcomes(requests, &rows)?)
}

/// A batch as the function's parallel arrays (one element per request, in order).
#[derive(Default)]
pub(crate) struct Batch {
    pub(crate) jobs: Vec<String>,
    pub(crate) ticks: Vec<i64>,
    pub(crate) triggers: Vec<&'static str>,
    pub(crate) nodes: Vec<String>,
    pub(crate) leases: Vec<i64>,
    pub(crate) modes: Vec<&'static str>,
    pub(crate) reasons: Vec<String>,
}

impl Batch {
    /// The arrays of `requests`, checked before anything is sent.
    pub(crate) fn new(requests: &[ClaimRequest]) -> Result<Batch, StoreError> {
        let mut batch = Batch::default();
        for request in requests {
            let (mode, reason) = match &request.mode {
                ClaimMode::Skip { reason } => ("skip", reason.clone()),
                ClaimMode::Run { skip_if_running: true } => ("run-unless-running", String::new()),
                ClaimMode::Run { skip_if_running: false } => ("run", String::new()),
            };
            batch.jobs.push(request.tick.job.clone());
            batch.ticks.push(request.tick.scheduled_at.timestamp_millis());
            batch.triggers.push(request.trigger.as_str());
            batch.nodes.push(request.node.clone());
            batch.leases.push(millis(request.lease)?);
            batch.modes.push(mode);
            batch.reasons.push(reason);
        }
        Ok(batch)
    }

    /// Calls the function once: one round trip, one transaction.
    pub(crate) async fn send(&self, pool: &PgPool, sql: &str) -> Res<Vec<PgRow>> {
        Ok(sqlx::query(sql)
            .bind(&self.jobs)
            .bind(&self.ticks)
            .bind(&self.triggers)
            .bind(&self.nodes)
            .bind(&self.leases)
            .bind(&self.modes)
            .bind(&self.reasons)
            .fetch_all(pool)
            .await?)
    }
}

/// The outcomes of `requests` from the function's rows, which must answer each request
/// once, in order.
pub(crate) fn outcomes(requests: &[ClaimRequest], rows: &[PgRow]) -> Result<Vec<ClaimOutcome>, StoreError> {
    if rows.len() != requests.len() {
        return Err(StoreError::Invalid(format!(
            "the claim function answered {} of {} requests",
            rows.len(),
            requests.len()
        )));
    }
    let mut outcomes = Vec::with_capacity(rows.len());
    for (i, (request, row)) in requests.iter().zip(rows).enumerate() {
        let index: i32 = get(row, "o_index")?;
        if usize::try_from(index).ok() != Some(i + 1) {
            return Err(StoreError::Invalid(format!("the claim function answered request {index} in place {}", i + 1)));
        }
        outcomes.push(outcome(request, row)?);
    }
    Ok(outcomes)
}

fn outcome(request: &ClaimRequest, row: &PgRow) -> Result<ClaimOutcome, StoreError> {
    let kind: String = get(row, "o_outcome")?;
    match kind.as_str() {
        "taken" => Ok(ClaimOutcome::Taken),
        "skipped" => Ok(ClaimOutcome::Skipped { reason: get(row, "o_reason")? }),
        "won" => {
            // Normalized to the millisecond precision the store keeps, so that the lease
            // names the run exactly as history will.
            let tick = Tick::new(request.tick.job.clone(), request.tick.scheduled_at);
            let lease = Lease {
                run: RunId { tick, attempt: 1 },
                owner: request.node.clone(),
                fencing_token: token(get(row, "o_token")?)?,
                claimed_at: instant(get(row, "o_claimed_at")?)?,
                lease_until: instant(get(row, "o_lease_until")?)?,
            };
            tracing::debug!(run = %lease.run, node = %lease.owner, token = lease.fencing_token, "run claimed");
            Ok(ClaimOutcome::Won(lease))
        }
        other => Err(StoreError::Invalid(format!("the claim function answered `{other}`"))),
    }
}
