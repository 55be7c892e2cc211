//! The claim of one tick (most claims: a job's own schedule): one call of `{p}claim_one`,
//! the one-tick twin of `{p}claim` (see the schema), which takes scalars instead of arrays.

use solocron_core::{ClaimOutcome, ClaimRequest};
use sqlx::postgres::PgRow;
use sqlx::PgPool;

use crate::error::Res;
use crate::records::{outcomes, Batch};
use crate::PgStore;

/// The one-tick claim's statement, to be filled with the tables' prefix; every connection
/// prepares it when it opens (see `prepare_claim`).
pub(crate) const CALL: &str = crate::records::claim_query!("claim_one");

/// One try at claiming the one request of `batch`: one round trip, one transaction.
pub(crate) async fn claim_one(store: &PgStore, batch: &Batch<'_>, requests: &[ClaimRequest]) -> Res<Vec<ClaimOutcome>> {
    let row = batch.send_one(&store.pool, &store.sql(CALL)).await?;
    Ok(outcomes(requests, &row)?)
}

impl Batch<'_> {
    /// Calls `{p}claim_one` (`sql`) with the batch's one request: one round trip, one
    /// transaction.
    async fn send_one(&self, pool: &PgPool, sql: &str) -> Res<PgRow> {
        assert_eq!(self.jobs.len(), 1, "send_one sends a batch of one");
        Ok(sqlx::query(sql)
            .bind(self.jobs[0])
            .bind(self.ticks[0])
            .bind(self.triggers[0])
            .bind(self.nodes[0])
            .bind(self.leases[0])
            .bind(self.modes[0])
            .bind(self.reasons[0])
            .bind(self.nonces[0])
            .fetch_one(pool)
            .await?)
    }
}
