//! The layout's life: `migrate` writes (or checks) the layout version, the one key the
//! other steps do not read; `schema` reads it; `uninstall` deletes every key under the
//! prefix.

use async_trait::async_trait;
use etcd_client::{Compare, CompareOp, DeleteOptions, GetOptions, Txn, TxnOp};
use solocron_core::SchemaStore;
use solocron_core::{SchemaState, StoreError};

use crate::etcd::{bounded, get, range, single, txn};
use crate::EtcdStore;

/// The key layout this crate writes and understands (see [`crate::keys`]).
const LAYOUT_VERSION: u32 = 1;

#[async_trait]
impl SchemaStore for EtcdStore {
    /// Writes the layout version once; checks it afterwards. One `Txn`, so any number of nodes
    /// may migrate at once.
    async fn migrate(&self) -> Result<(), StoreError> {
        let store = self;
        let (key, version) = (store.keys.schema(), LAYOUT_VERSION.to_string());
        let request = Txn::new()
            .when(vec![Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then(vec![TxnOp::put(key.clone(), version.as_str(), None)])
            .or_else(vec![get(key)]);
        let resp = txn(&store.client, "a migration", request).await?;
        if resp.succeeded() {
            return Ok(());
        }
        let found = crate::etcd::gets(&resp).into_iter().next().and_then(single);
        match found.as_ref().map(|kv| kv.value()) {
            Some(v) if v == version.as_bytes() => Ok(()),
            other => Err(StoreError::Invalid(format!(
                "{} has key layout version {:?}; this solocron understands version {LAYOUT_VERSION}",
                store.description,
                other.map(String::from_utf8_lossy)
            ))),
        }
    }

    /// Where the layout under the prefix stands against this build, from one linearizable read
    /// of the version key (see [`solocron_core::SchemaStore::schema`]): no key is
    /// [`SchemaState::Missing`].
    async fn schema(&self) -> Result<SchemaState, StoreError> {
        let store = self;
        let resp = range(&store.client, "a schema read", &store.keys.schema(), GetOptions::new()).await?;
        let found = resp.kvs().first().map(|kv| {
            let value = String::from_utf8_lossy(kv.value());
            value
                .parse::<u32>()
                .map_err(|_| StoreError::Invalid(format!("{} has key layout version {value:?}", store.description)))
        });
        let found = found.transpose()?;
        Ok(SchemaState::of(found, LAYOUT_VERSION))
    }

    /// Deletes every key under the prefix (see [`solocron_core::SchemaStore::uninstall`]): one range
    /// delete, which etcd applies atomically. The prefix ends in `/` and names are one key
    /// segment, so no other prefix's key falls in the range. No lease is revoked: a node's
    /// leases are its own instance's, attached to keys of its prefix only, and once those keys
    /// are gone each lease expires by its TTL; revoking one still in use by a running node
    /// would only hasten what its next renewal finds anyway. A node still running on the
    /// prefix writes keys again at its next claim: stop the fleet first.
    async fn uninstall(&self) -> Result<(), StoreError> {
        let store = self;
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
}
