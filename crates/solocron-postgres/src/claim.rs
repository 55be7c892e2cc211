//! Claims: one call of the server-side `{p}claim_set` function per batch (a batch of one
//! calls `{p}claim_one`, see `claim_one.rs`). `{p}claim_set` decides a batch of distinct
//! jobs in a few set-based statements and leaves the rest to `{p}claim`, one request at a
//! time (see the schema's version 12). Each function first refuses, by the server's clock,
//! the scheduled requests made too early (`too-early`, see the schema's version 11).

use async_trait::async_trait;
use solocron_core::{ClaimOutcome, ClaimRequest, StoreError};
use solocron_core::{ClaimStore, Tick};
use sqlx::postgres::PgRow;
use sqlx::PgPool;

use crate::claim_one::claim_one;
use crate::error::{retrying, Res};
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

    async fn taken_ticks(&self, ticks: &[Tick]) -> Result<Option<Vec<Tick>>, StoreError> {
        crate::admin::taken_ticks(self, ticks).await.map(Some)
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
