//! The compare-and-swap plumbing every step that writes shares: the bound on lost compares
//! and its error, a `Txn` committed with its re-reads as the `else` branch, and the keys a
//! step compares (a run's record, a job's guard) as read, with their revisions. A leaf:
//! the steps (`runs.rs`, `retry.rs`, `admin.rs`, `managed.rs`) use it, it uses none of them.

use etcd_client::{KeyValue, Txn, TxnOp};
use solocron_core::StoreError;

use crate::codec::{decode, Guard, StoredRun};
use crate::etcd::{gets, read, revision, single, txn};
use crate::EtcdStore;

/// How many times a write is decided again after losing a compare to another node.
pub(crate) const CAS_ATTEMPTS: u32 = 16;

/// The error after [`CAS_ATTEMPTS`] lost compares.
pub(crate) fn contended(what: &str) -> StoreError {
    StoreError::Unavailable(format!("{what} lost {CAS_ATTEMPTS} compare-and-swaps in a row to other nodes; try again"))
}

/// Commits `request`, with `rereads` as its `else` branch: the revision it was applied at,
/// or (a compare failed, nothing written) the keys re-read.
pub(crate) async fn commit(
    store: &EtcdStore,
    what: &str,
    request: Txn,
    rereads: Vec<TxnOp>,
) -> Result<Result<i64, Vec<Option<KeyValue>>>, StoreError> {
    let resp = txn(&store.client, what, request.or_else(rereads)).await?;
    if resp.succeeded() {
        Ok(Ok(revision(&resp)?))
    } else {
        Ok(Err(gets(&resp).into_iter().map(single).collect()))
    }
}

/// Reads single keys at one revision.
pub(crate) async fn read_keys(store: &EtcdStore, ops: Vec<TxnOp>) -> Result<Vec<Option<KeyValue>>, StoreError> {
    Ok(read(&store.client, ops).await?.into_iter().map(single).collect())
}

/// A record and its revision, if the key exists.
pub(crate) fn stored_run(kv: Option<&KeyValue>) -> Result<Option<(StoredRun, i64)>, StoreError> {
    kv.map(|kv| Ok((decode::<StoredRun>(kv.value(), "run record")?, kv.mod_revision()))).transpose()
}

/// A job's guard and its revision; a running run or a waiting retry implies one exists.
pub(crate) fn stored_guard(kv: Option<&KeyValue>, job: &str) -> Result<(Guard, i64), StoreError> {
    let kv = kv.ok_or_else(|| StoreError::Invalid(format!("job `{job}` has a run in progress but no guard key")))?;
    Ok((decode::<Guard>(kv.value(), "job guard")?, kv.mod_revision()))
}
