//! The etcd leases a node attaches its runs to: one per node and lease length, shared by
//! the runs it claims within [`LEASE_SHARE_WINDOW`], each claim refreshing it (see
//! `claim.rs` and "One lease per node and length" in the crate docs); and lease lengths as
//! etcd's whole-second TTLs.

use std::collections::HashMap;
use std::time::Duration;

use solocron_core::StoreError;

use crate::etcd::now_ms;
use crate::EtcdStore;

/// Longest lease etcd grants: 9,000,000,000 s (its `MaxLeaseTTL`).
const LEASE_SECS_MAX: i64 = 9_000_000_000;

/// A lease length as etcd's TTL: whole seconds, rounded up (at least 1).
pub(crate) fn lease_secs(length: Duration) -> Result<i64, StoreError> {
    let secs = length.as_secs() + u64::from(length.subsec_nanos() > 0);
    i64::try_from(secs.max(1))
        .ok()
        .filter(|s| *s <= LEASE_SECS_MAX)
        .ok_or_else(|| StoreError::Invalid(format!("lease of {length:?} is longer than etcd grants")))
}

/// A lease for a chunk's won runs: its id, and the instant its runs' leases count from:
/// the client's clock just before the grant or keep-alive that made it last its full TTL
/// was sent (etcd starts the TTL later, so `at + TTL` never outlasts the lease), or, for a
/// keep-alive reused within [`REUSE_WINDOW`], the claim's own instant.
pub(crate) type Granted = (i64, i64);

/// The lease a node attaches its new runs of one TTL to, and when it was granted.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SharedLease {
    id: i64,
    granted: std::time::Instant,
    /// When the last grant or keep-alive that etcd confirmed was sent.
    confirmed: std::time::Instant,
}

impl SharedLease {
    /// Young enough to take new runs.
    fn young(&self) -> bool {
        self.granted.elapsed() < LEASE_SHARE_WINDOW
    }

    /// Confirmed so recently that a claim may attach runs to it without another keep-alive
    /// (see [`REUSE_WINDOW`]).
    fn reusable(&self) -> bool {
        self.young() && self.confirmed.elapsed() < REUSE_WINDOW
    }

    /// Confirmed within half its TTL: it surely lives until a keep-alive sent now arrives,
    /// so the keep-alive may go beside the claim's `Txn` instead of before it.
    fn alive_for_sure(&self, ttl: i64) -> bool {
        let half = Duration::from_millis(u64::try_from(ttl).unwrap_or(0).saturating_mul(500));
        self.young() && self.confirmed.elapsed() < half
    }
}

/// How long one etcd lease takes new runs. Every claim refreshes it (a keep-alive, sent
/// beside the claim's read or `Txn`, or one confirmed within [`REUSE_WINDOW`]), so its age
/// does not matter for safety; a new one from time to time bounds how long a run whose end
/// could not be recorded stays alive beside its node's newer runs.
pub(crate) const LEASE_SHARE_WINDOW: Duration = Duration::from_secs(10);

/// A claim this soon after the last confirmed keep-alive (or grant) of the node's shared
/// lease attaches its runs without sending another: a burst of claims (catch-ups, manual
/// runs, one-tick claims back to back) shares one keep-alive. The run's etcd lease then
/// counts from that keep-alive, at most this much before the claim: `lease_until` (an
/// estimate, counted from the claim) may be up to these 5 ms late when the length is whole
/// seconds, and the engine's own deadline (90% of the length from when the claim was sent)
/// keeps all but these 5 ms of its margin. A keep-alive beside every one-tick claim cost
/// ~0.2 of the claim / raw ratio (benchmarks/2026-11-24-morning-etcd-redis-postgres-ab.md).
pub(crate) const REUSE_WINDOW: Duration = Duration::from_millis(5);

/// For each TTL in `ttls` (distinct), a lease to attach won runs to, lasting its full TTL
/// from the returned instant on: the node's shared lease of that TTL, reused, refreshed by
/// a keep-alive, or a new one. At most one round trip; the requests for several TTLs go at
/// once.
pub(crate) async fn fresh_leases(store: &EtcdStore, ttls: &[i64]) -> Result<HashMap<i64, Granted>, StoreError> {
    let one = |ttl: i64| async move {
        let cached = store.shared.lock().unwrap_or_else(|e| e.into_inner()).get(&ttl).copied();
        if let Some(lease) = cached.filter(SharedLease::reusable) {
            return Ok((ttl, (lease.id, now_ms())));
        }
        if let Some(lease) = cached.filter(SharedLease::young) {
            if let Some(at) = keep_alive(store, ttl, lease.id).await? {
                return Ok((ttl, (lease.id, at)));
            }
        }
        let (at, sent) = (now_ms(), std::time::Instant::now());
        let id = crate::etcd::grant(&store.client, ttl).await?;
        let lease = SharedLease { id, granted: sent, confirmed: sent };
        store.shared.lock().unwrap_or_else(|e| e.into_inner()).insert(ttl, lease);
        Ok::<_, StoreError>((ttl, (id, at)))
    };
    futures_util::future::try_join_all(ttls.iter().map(|&ttl| one(ttl))).await.map(|v| v.into_iter().collect())
}

/// One keep-alive of the shared lease `id` of `ttl`: the client's clock just before it was
/// sent if etcd refreshed the lease to its full TTL, `None` (and the lease forgotten) if
/// the lease is gone.
async fn keep_alive(store: &EtcdStore, ttl: i64, id: i64) -> Result<Option<i64>, StoreError> {
    let (at, sent) = (now_ms(), std::time::Instant::now());
    let alive = crate::etcd::keep_alive(&store.client, id).await?;
    let mut shared = store.shared.lock().unwrap_or_else(|e| e.into_inner());
    match shared.get_mut(&ttl).filter(|l| l.id == id) {
        Some(lease) if alive => lease.confirmed = lease.confirmed.max(sent),
        Some(_) => drop(shared.remove(&ttl)),
        None => {}
    }
    Ok(alive.then_some(at))
}

/// The leases of a claim planned without a read: for each TTL in `ttls`, the node's shared
/// lease, if each is reusable as it is or alive for sure (see [`SharedLease`]); with the
/// ones of the latter kind, which need a keep-alive beside the `Txn`.
pub(crate) fn ready_leases(store: &EtcdStore, ttls: &[i64]) -> Option<(HashMap<i64, Granted>, HashMap<i64, i64>)> {
    let shared = store.shared.lock().unwrap_or_else(|e| e.into_inner());
    let (mut leases, mut beside) = (HashMap::new(), HashMap::new());
    for &ttl in ttls {
        let lease = shared.get(&ttl)?;
        if !lease.reusable() && !lease.alive_for_sure(ttl) {
            return None;
        }
        if !lease.reusable() {
            beside.insert(ttl, lease.id);
        }
        leases.insert(ttl, (lease.id, now_ms()));
    }
    Some((leases, beside))
}

/// Keep-alives of the leases `beside` (see [`ready_leases`]): whether etcd refreshed every
/// one (false: one is gone, and runs attached to it may already have expired).
pub(crate) async fn refresh(store: &EtcdStore, beside: &HashMap<i64, i64>) -> Result<bool, StoreError> {
    let one = |(&ttl, &id): (&i64, &i64)| async move { keep_alive(store, ttl, id).await.map(|at| at.is_some()) };
    let alive = futures_util::future::try_join_all(beside.iter().map(one)).await?;
    Ok(alive.into_iter().all(|a| a))
}

/// Forgets the shared leases of `ttls` (after a failed claim: one may be gone).
pub(crate) fn forget_leases(store: &EtcdStore, ttls: &[i64]) {
    let mut shared = store.shared.lock().unwrap_or_else(|e| e.into_inner());
    for ttl in ttls {
        shared.remove(ttl);
    }
}

/// The etcd lease a recovery starts a run on, granted on the first try and kept in
/// `granted` for the next ones (revoked by [`recover`](solocron_core::RunStore::recover) if the run is not started), with
/// the run's instant: the client's clock just before the grant, no later than its TTL's
/// start (see the claim's).
pub(crate) async fn grant_once(
    store: &EtcdStore,
    granted: &mut Option<(i64, i64)>,
    length: Duration,
) -> Result<(i64, i64), StoreError> {
    if let Some(lease) = *granted {
        return Ok(lease);
    }
    let ttl = lease_secs(length)?;
    let now = now_ms();
    Ok(*granted.insert((crate::etcd::grant(&store.client, ttl).await?, now)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_lengths_round_up_to_whole_seconds() {
        assert_eq!(lease_secs(Duration::from_millis(1)).unwrap(), 1);
        assert_eq!(lease_secs(Duration::from_millis(800)).unwrap(), 1);
        assert_eq!(lease_secs(Duration::from_millis(1001)).unwrap(), 2);
        assert_eq!(lease_secs(Duration::from_secs(30)).unwrap(), 30);
        assert!(lease_secs(Duration::from_secs(u64::MAX)).is_err());
    }
}
