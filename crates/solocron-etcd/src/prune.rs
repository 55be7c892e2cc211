//! What a prune deletes besides the fleet's own keys (`fleet.rs`): the oldest ended run
//! records of the namespaces asked for, in bounded pages that pass over the runs still in
//! progress, and old run requests. [`HistoryStore::prune`](solocron_core::HistoryStore::prune)
//! (`admin.rs`) reads what is in progress and deletes what these find.

use std::collections::HashSet;

use etcd_client::{DeleteOptions, GetOptions, KeyValue, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse};
use solocron_core::{Namespaces, StoreError, PRUNE_BATCH_MAX};

use crate::etcd::{range, range_all, txn, TXN_OPS_MAX};
use crate::keys::{key_served, prefix_end};
use crate::EtcdStore;

/// Run keys per page of prune's scan for ended records.
const PRUNE_PAGE: i64 = 1000;

/// Most old record keys one prune call examines (50 pages): other namespaces' old records,
/// which their own nodes prune by their own retention (or nobody, if those are all gone),
/// and running runs are passed over, and past this bound the call stops with what it found.
/// Far above what a call prunes ([`PRUNE_BATCH_MAX`]), so that pruning every namespace, or
/// a store that only this namespace's nodes prune, never reaches it.
pub const PRUNE_SCAN_MAX: usize = 50_000;

/// The keys of at most `batch` records of jobs in `namespaces` scheduled before `cutoff`,
/// oldest first, but for those in `running` (running runs and waiting retries), read at
/// etcd revision `at`: a run started since (a retry of an old tick) is not among the keys
/// read either. In pages (every key of an old range at once can pass the client's message
/// limit), until `batch` are found, or the old records run out, or [`PRUNE_SCAN_MAX`] were
/// examined (then a warning is logged).
pub(crate) async fn old_records(
    store: &EtcdStore,
    cutoff: i64,
    batch: usize,
    at: i64,
    running: &HashSet<Vec<u8>>,
    namespaces: &Namespaces,
) -> Result<Vec<Vec<u8>>, StoreError> {
    let (start, mut end) = (store.keys.runs_before(cutoff), prefix_end(&store.keys.family("run")));
    let mut doomed: Vec<Vec<u8>> = Vec::new();
    let mut scanned = 0;
    while doomed.len() < batch {
        if scanned >= PRUNE_SCAN_MAX {
            tracing::warn!(
                scanned,
                found = doomed.len(),
                %namespaces,
                "prune stopped after examining its most old records, mostly of other namespaces or still \
                 running; older ones of these namespaces beyond them stay until those are gone"
            );
            break;
        }
        let oldest = GetOptions::new()
            .with_range(end.clone())
            .with_sort(SortTarget::Key, SortOrder::Descend)
            .with_keys_only()
            .with_limit(PRUNE_PAGE)
            .with_revision(at);
        let page = range(&store.client, "a prune read", &start, oldest).await?;
        let keys: Vec<Vec<u8>> = page.kvs().iter().map(|kv| kv.key().to_vec()).collect();
        scanned += keys.len();
        let Some(last) = keys.last() else { break };
        end = String::from_utf8_lossy(last).into_owned();
        let wanted = |k: &&Vec<u8>| !running.contains(*k) && key_served(namespaces, k);
        doomed.extend(keys.iter().filter(wanted).take(batch - doomed.len()).cloned());
        if !page.more() {
            break;
        }
    }
    Ok(doomed)
}

/// Deletes the run requests made before `cutoff` of jobs in `namespaces`: for every
/// namespace, one range delete; for some, one read of the old requests' keys, and deletes of
/// theirs (at most [`PRUNE_BATCH_MAX`] per call) in `Txn`s of [`TXN_OPS_MAX`] keys. A
/// request is written once and never changed, so deleting it needs no compare.
pub(crate) async fn prune_requests(store: &EtcdStore, cutoff: i64, namespaces: &Namespaces) -> Result<(), StoreError> {
    let (start, end) = (store.keys.family("request"), store.keys.requests_from(cutoff));
    if namespaces.names().is_none() {
        let range = Some(DeleteOptions::new().with_range(end));
        return txn(&store.client, "a request prune", Txn::new().and_then(vec![TxnOp::delete(start, range)]))
            .await
            .map(drop);
    }
    let (old, _) = range_all(&store.client, "a request prune read", (&start, &end), true, 0).await?;
    let doomed: Vec<&[u8]> =
        old.iter().map(KeyValue::key).filter(|k| key_served(namespaces, k)).take(PRUNE_BATCH_MAX).collect();
    for chunk in doomed.chunks(TXN_OPS_MAX) {
        let ops: Vec<TxnOp> = chunk.iter().map(|k| TxnOp::delete(k.to_vec(), None)).collect();
        txn(&store.client, "a request prune", Txn::new().and_then(ops)).await?;
    }
    Ok(())
}

/// How many keys a `Txn` of deletes deleted.
pub(crate) fn deleted_count(resp: &etcd_client::TxnResponse) -> u64 {
    resp.op_responses()
        .into_iter()
        .map(|op| match op {
            TxnOpResponse::Delete(d) => d.deleted().max(0) as u64,
            _ => 0,
        })
        .sum()
}
