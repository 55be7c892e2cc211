//! The layout's life: `migrate` marks (or checks) the layout version and the epoch; there
//! are no structures to create. `uninstall` removes every key under the prefix.
//!
//! The version changes only when a build would misread the keys another build writes: a
//! build refuses a prefix marked with any other version than its own, so a change of it
//! stops every node of the other builds sharing the prefix. A new field in a hash is no
//! such change: every build reads hashes by field name and ignores fields it does not know,
//! and a field absent from older records reads as its "none" (so the claim's `nonce`, kept
//! in the run record, came with no new version). Nor is a new value of a field: the
//! `waiting` state of failure retries came with no new version (see "Failure retries" in
//! the crate docs for what older builds make of such records).
//!
//! The Functions library is not removed: its name comes from its code's hash, not from the
//! prefix (the prefix is each call's first argument), so every prefix on the server served
//! by the same build shares it, and it holds no data. `FUNCTION DELETE solocron_<hash>`
//! removes it once no fleet of that build is left.

use async_trait::async_trait;
use solocron_core::SchemaStore;
use solocron_core::{SchemaState, StoreError};

use crate::error::redis_error;
use crate::scripts::CODE;
use crate::RedisStore;

/// The layout version this build writes and understands: `SCHEMA_VERSION` in
/// `lua/prelude.lua`, which the scripts check and mark.
const SCHEMA_VERSION: u32 = 1;

/// Keys `SCAN` is asked to look at per step of [`uninstall`] (the keys found in a step are
/// deleted with one `UNLINK`).
const UNINSTALL_SCAN_COUNT: usize = 1000;

/// Most `SCAN` steps of one [`uninstall`]: a billion keys on the server at
/// [`UNINSTALL_SCAN_COUNT`] a step, far above any real one.
const UNINSTALL_SCAN_STEPS_MAX: usize = 1_000_000;

#[async_trait]
impl SchemaStore for RedisStore {
    /// Checks the layout version and marks it, and when the present memory began.
    async fn migrate(&self) -> Result<(), StoreError> {
        let store = self;
        // One script: concurrent migrations take turns, and each later one finds the version
        // and the epoch marked. There are no structures to create.
        store.run(&store.invocation(&CODE.migrate), "migrate").await.map(drop)
    }

    /// Where the layout under the prefix stands against this build, from one `GET` of the
    /// version key (see [`solocron_core::SchemaStore::schema`]): no key is [`SchemaState::Missing`].
    /// A plain read, not a script: it writes nothing and loads no code.
    async fn schema(&self) -> Result<SchemaState, StoreError> {
        let store = self;
        let context = || format!("reading the layout version on {}", store.description);
        let found: Option<String> = redis::cmd("GET")
            .arg(format!("{}schema", store.prefix))
            .query_async(&mut store.conn.clone())
            .await
            .map_err(|e| redis_error(e, &context()))?;
        let found = found
            .map(|v| v.parse::<u32>().map_err(|_| StoreError::Invalid(format!("{}: layout version {v:?}", context()))))
            .transpose()?;
        Ok(SchemaState::of(found, SCHEMA_VERSION))
    }

    /// Deletes every key under the prefix (see [`solocron_core::SchemaStore::uninstall`]): `SCAN`
    /// with the prefix as pattern, `UNLINK` of what each step finds. Not one atomic step (a
    /// script walking the keyspace would block the server): a node still running on the prefix
    /// may write keys again, so stop the fleet first. Keys of other prefixes never match: the
    /// pattern ends in the prefix's `}:`.
    async fn uninstall(&self) -> Result<(), StoreError> {
        let store = self;
        // `Prefix` allows only a-z, 0-9 and `_` inside the braces: no glob metacharacter.
        debug_assert!(!store.prefix.contains(['*', '?', '[', ']', '\\']), "{}", store.prefix);
        let pattern = format!("{}*", store.prefix);
        let context = || format!("uninstall on {}", store.description);
        let mut conn = store.conn.clone();
        let (mut cursor, mut deleted) = (0u64, 0usize);
        for _ in 0..UNINSTALL_SCAN_STEPS_MAX {
            let (next, keys): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(UNINSTALL_SCAN_COUNT)
                .query_async(&mut conn)
                .await
                .map_err(|e| redis_error(e, &context()))?;
            if !keys.is_empty() {
                let unlinked: usize = redis::cmd("UNLINK")
                    .arg(&keys)
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| redis_error(e, &context()))?;
                deleted += unlinked;
            }
            if next == 0 {
                tracing::info!(keys = deleted, prefix = %store.prefix, "uninstalled");
                return Ok(());
            }
            cursor = next;
        }
        Err(StoreError::Unavailable(format!(
            "{}: the key scan did not end within {UNINSTALL_SCAN_STEPS_MAX} steps; run it again",
            context()
        )))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_rust_layout_version_is_the_one_the_scripts_mark() {
        let prelude = include_str!("lua/prelude.lua");
        let line = format!("local SCHEMA_VERSION = '{}'\n", super::SCHEMA_VERSION);
        assert!(prelude.contains(&line), "lua/prelude.lua lacks {line:?}");
    }
}
