//! A `Store` that counts the calls made through it (round trips), for the benchmark.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use solocron_core::*;

/// Wraps a store and counts every call, the claim calls among them (with the asks of which
/// backups are taken), and the ticks those claim calls asked for.
pub struct Counting {
    inner: Arc<dyn Store>,
    pub calls: AtomicU64,
    pub claims: AtomicU64,
    pub requests: AtomicU64,
}

impl Counting {
    pub fn new(inner: Arc<dyn Store>) -> Counting {
        Counting { inner, calls: AtomicU64::new(0), claims: AtomicU64::new(0), requests: AtomicU64::new(0) }
    }

    fn hit(&self) {
        self.calls.fetch_add(1, Ordering::Relaxed);
    }
}

#[async_trait]
impl StoreBase for Counting {
    fn describe(&self) -> String {
        self.inner.describe()
    }

    async fn now(&self) -> Result<DateTime<Utc>, StoreError> {
        self.hit();
        self.inner.now().await
    }
}

#[async_trait]
impl SchemaStore for Counting {
    async fn migrate(&self) -> Result<(), StoreError> {
        self.hit();
        self.inner.migrate().await
    }

    async fn schema(&self) -> Result<solocron_core::SchemaState, StoreError> {
        self.hit();
        self.inner.schema().await
    }
}

#[async_trait]
impl ClaimStore for Counting {
    async fn claim(&self, r: &[ClaimRequest]) -> Result<Vec<ClaimOutcome>, StoreError> {
        self.hit();
        self.claims.fetch_add(1, Ordering::Relaxed);
        self.requests.fetch_add(r.len() as u64, Ordering::Relaxed);
        self.inner.claim(r).await
    }

    /// Asked before claiming backups: counted as a claim call (it is part of claiming), its
    /// ticks not as requests (none is claimed by it).
    async fn taken_ticks(&self, t: &[Tick]) -> Result<Option<Vec<Tick>>, StoreError> {
        self.hit();
        self.claims.fetch_add(1, Ordering::Relaxed);
        self.inner.taken_ticks(t).await
    }

    async fn memory_since(&self) -> Result<Option<DateTime<Utc>>, StoreError> {
        self.hit();
        self.inner.memory_since().await
    }
}

#[async_trait]
impl RunStore for Counting {
    async fn renew(&self, l: &Lease, d: Duration) -> Result<bool, StoreError> {
        self.hit();
        self.inner.renew(l, d).await
    }

    async fn renew_all(&self, r: &[Renewal]) -> Result<Vec<bool>, StoreError> {
        self.hit();
        self.inner.renew_all(r).await
    }

    async fn finish(&self, l: &Lease, e: &RunEnd) -> Result<bool, StoreError> {
        self.hit();
        self.inner.finish(l, e).await
    }

    async fn finish_all(&self, e: &[Ending]) -> Result<Vec<bool>, StoreError> {
        self.hit();
        self.inner.finish_all(e).await
    }

    async fn finish_for_retry(&self, l: &Lease, e: &RunEnd, after: Duration) -> Result<bool, StoreError> {
        self.hit();
        self.inner.finish_for_retry(l, e, after).await
    }

    async fn expired(&self, n: usize, ns: &solocron_core::Namespaces) -> Result<Vec<RunRecord>, StoreError> {
        self.hit();
        self.inner.expired(n, ns).await
    }

    async fn recover(&self, r: &RunId, a: &RecoverAction) -> Result<RecoverOutcome, StoreError> {
        self.hit();
        self.inner.recover(r, a).await
    }

    fn expiry_lag(&self) -> Duration {
        self.inner.expiry_lag()
    }
}

#[async_trait]
impl HistoryStore for Counting {
    async fn history(&self, q: &HistoryQuery) -> Result<Vec<RunRecord>, StoreError> {
        self.hit();
        self.inner.history(q).await
    }

    async fn prune(&self, o: Duration, b: usize, ns: &solocron_core::Namespaces) -> Result<u64, StoreError> {
        self.hit();
        self.inner.prune(o, b, ns).await
    }
}

#[async_trait]
impl RegistryStore for Counting {
    async fn register(&self, n: &str, j: &[JobDefinition]) -> Result<(), StoreError> {
        self.hit();
        self.inner.register(n, j).await
    }

    async fn registrations(&self) -> Result<Vec<Registration>, StoreError> {
        self.hit();
        self.inner.registrations().await
    }

    async fn registrations_page(
        &self,
        after: Option<&RegistryCursor>,
        limit: usize,
    ) -> Result<RegistryPage, StoreError> {
        self.hit();
        self.inner.registrations_page(after, limit).await
    }

    async fn registrations_of(&self, jobs: &[String]) -> Result<Vec<Registration>, StoreError> {
        self.hit();
        self.inner.registrations_of(jobs).await
    }

    async fn registered_jobs(&self) -> Result<Vec<String>, StoreError> {
        self.hit();
        self.inner.registered_jobs().await
    }

    async fn controls(&self) -> Result<Vec<JobControl>, StoreError> {
        self.hit();
        self.inner.controls().await
    }
}

#[async_trait]
impl ControlStore for Counting {
    async fn set_paused(&self, j: &str, p: bool, b: &str, r: Option<&str>) -> Result<(), StoreError> {
        self.hit();
        self.inner.set_paused(j, p, b, r).await
    }

    async fn unlock(&self, j: &str, b: &str, r: &str) -> Result<Vec<RunId>, StoreError> {
        self.hit();
        self.inner.unlock(j, b, r).await
    }
}

#[async_trait]
impl RequestStore for Counting {
    async fn request_run(&self, j: &str, b: &str, r: Option<&str>) -> Result<Tick, StoreError> {
        self.hit();
        self.inner.request_run(j, b, r).await
    }

    async fn pending_requests(&self, n: usize, ns: &solocron_core::Namespaces) -> Result<Vec<RunRequest>, StoreError> {
        self.hit();
        self.inner.pending_requests(n, ns).await
    }

    fn request_watch(&self) -> Option<Box<dyn RequestWatch>> {
        self.inner.request_watch()
    }
}

#[async_trait]
impl FleetStore for Counting {
    async fn heartbeat(&self, b: &NodeBeat) -> Result<(), StoreError> {
        self.hit();
        self.inner.heartbeat(b).await
    }

    async fn goodbye(&self, n: &str) -> Result<(), StoreError> {
        self.hit();
        self.inner.goodbye(n).await
    }

    async fn nodes(&self) -> Result<Vec<NodeRecord>, StoreError> {
        self.hit();
        self.inner.nodes().await
    }
}

#[async_trait]
impl AuditStore for Counting {
    async fn actions(&self, q: &ActionQuery) -> Result<Vec<ActionRecord>, StoreError> {
        self.hit();
        self.inner.actions(q).await
    }
}

#[async_trait]
impl ManagedStore for Counting {
    async fn managed_jobs(&self) -> Result<Vec<solocron_core::ManagedJob>, StoreError> {
        self.hit();
        self.inner.managed_jobs().await
    }

    async fn managed_version(&self) -> Result<u64, StoreError> {
        self.hit();
        self.inner.managed_version().await
    }
}
