//! Claims: one call of the server-side `{p}claim_set` function per batch (a batch of one
//! calls `{p}claim_one`, see `claim_one.rs`). `{p}claim_set` decides a batch of distinct
//! jobs in a few set-based statements and leaves the rest to `{p}claim`, one request at a
//! time (see the schema's version 12). Each function first refuses, by the server's clock,
//! the scheduled requests made too early (`too-early`, see the schema's version 11).
//! Which ticks are taken is answered here too, in one read-only statement.

use async_trait::async_trait;
use solocron_core::{ClaimOutcome, ClaimRequest, StoreError};
use solocron_core::{ClaimStore, Tick};
use sqlx::postgres::PgRow;
use sqlx::PgPool;

use crate::claim_one::claim_one;
use crate::error::{retrying, step, Res};
use crate::records::{outcomes, Batch};
use crate::PgStore;

#[async_trait]
impl ClaimStore for PgStore {
    /// Claims `requests` in one call (one round trip, one transaction), retried when it loses
    /// a conflict.
    async fn claim(&self, requests: &[ClaimRequest]) -> Result<Vec<ClaimOutcome>, StoreError> {
        let store = self;
        if requests.is_empty() {
            return Ok(Vec::new());
        }
        let batch = Batch::new(requests)?;
        retrying("claim", || claim_once(store, &batch, requests)).await
    }

    /// Those of `ticks` that are taken (see [`solocron_core::ClaimStore::taken_ticks`]): one
    /// statement, a primary key lookup per tick (the ticks as arrays, as the claim sends them),
    /// answered as one string of flags in the ticks' order (one row to decode, not a row per
    /// taken tick). Not the shared `job IN (…)` over a span of instants: over a herd's fresh
    /// rows, not yet in the statistics, the planner read the whole table for each chunk.
    async fn taken_ticks(&self, ticks: &[Tick]) -> Result<Option<Vec<Tick>>, StoreError> {
        let store = self;
        if ticks.is_empty() {
            return Ok(Some(Vec::new()));
        }
        let jobs: Vec<&str> = ticks.iter().map(|t| t.job.as_str()).collect();
        let instants: Vec<i64> = ticks.iter().map(|t| t.scheduled_at.timestamp_millis()).collect();
        let flags: String = sqlx::query_scalar(&store.sql(
            "SELECT string_agg(CASE WHEN EXISTS (SELECT 1 FROM {p}runs r \
             WHERE r.job = t.job AND r.scheduled_at = t.at AND r.attempt = 1) THEN '1' ELSE '0' END, '' ORDER BY t.i) \
             FROM unnest($1::text[], $2::bigint[]) WITH ORDINALITY AS t(job, at, i)",
        ))
        .bind(&jobs)
        .bind(&instants)
        .fetch_one(&store.pool)
        .await
        .map_err(step("taken_ticks"))?;
        if flags.len() != ticks.len() || !flags.bytes().all(|f| f == b'0' || f == b'1') {
            return Err(StoreError::Invalid(format!("{} taken flags for {} ticks", flags.len(), ticks.len())));
        }
        Ok(Some(ticks.iter().zip(flags.bytes()).filter(|(_, f)| *f == b'1').map(|(t, _)| t.clone()).collect()))
    }
}

async fn claim_once(store: &PgStore, batch: &Batch<'_>, requests: &[ClaimRequest]) -> Res<Vec<ClaimOutcome>> {
    if let [_] = requests {
        return claim_one(store, batch, requests).await;
    }
    let sql = store.sql(crate::records::claim_query!("claim_set"));
    let row = batch.send(&store.pool, &sql).await?;
    Ok(outcomes(requests, &row)?)
}

impl Batch<'_> {
    /// Calls the function once: one round trip, one transaction; the answer's one row.
    pub(crate) async fn send(&self, pool: &PgPool, sql: &str) -> Res<PgRow> {
        Ok(sqlx::query(sql)
            .bind(&self.jobs)
            .bind(&self.ticks)
            .bind(&self.triggers)
            .bind(&self.nodes)
            .bind(&self.leases)
            .bind(&self.modes)
            .bind(&self.reasons)
            .bind(&self.nonces)
            .fetch_one(pool)
            .await?)
    }
}
