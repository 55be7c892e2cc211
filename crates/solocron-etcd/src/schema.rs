//! The layout's life: `migrate` writes (or checks) the layout version, the one key the
//! other steps do not read; `uninstall` deletes every key under the prefix.

use etcd_client::{Compare, CompareOp, DeleteOptions, Txn, TxnOp};
use solocron_core::StoreError;

use crate::etcd::{bounded, get, single, txn};
use crate::EtcdStore;

/// The key layout this crate writes and understands (see [`crate::keys`]).
const LAYOUT_VERSION: &str = "1";

/// Writes the layout version once; checks it afterwards. One `Txn`, so any number of nodes
/// may migrate at once.
pub(crate) async fn migrate(store: &EtcdStore) -> Result<(), StoreError> {
    let key = store.keys.schema();
    let request = Txn::new()
        .when(vec![Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
        .and_then(vec![TxnOp::put(key.clone(), LAYOUT_VERSION, None)])
        .or_else(vec![get(key)]);
    let resp = txn(&store.client, "a migration", request).await?;
    if resp.succeeded() {
        return Ok(());
    }
    let found = crate::etcd::gets(&resp).into_iter().next().and_then(single);
    match found.as_ref().map(|kv| kv.value()) {
        Some(v) if v == LAYOUT_VERSION.as_bytes() => Ok(()),
        other => Err(StoreError::Invalid(format!(
            "{} has key layout version {:?}; this solocron understands version {LAYOUT_VERSION}",
            store.description,
            other.map(String::from_utf8_lossy)
        ))),
    }
}

/// Deletes every key under the prefix (see [`solocron_core::Store::uninstall`]): one range
/// delete, which etcd applies atomically. The prefix ends in `/` and names are one key
/// segment, so no other prefix's key falls in the range. No lease is revoked: a node's
/// leases are its own instance's, attached to keys of its prefix only, and once those keys
/// are gone each lease expires by its TTL; revoking one still in use by a running node
/// would only hasten what its next renewal finds anyway. A node still running on the
/// prefix writes keys again at its next claim: stop the fleet first.
pub(crate) async fn uninstall(store: &EtcdStore) -> Result<(), StoreError> {
    let prefix = store.keys.prefix().to_owned();
    let deleted = bounded(&store.client, "an uninstall", |mut c| {
        let prefix = prefix.clone();
        async move { c.delete(prefix, Some(DeleteOptions::new().with_prefix())).await }
    })
    .await?
    .deleted();
    // What this instance remembers of the prefix's runs and jobs is gone with them.
    store.forget_all();
    tracing::info!(keys = deleted, prefix = %prefix, "uninstalled");
    Ok(())
}
