//! What the store keeps about the fleet besides runs: each node's heartbeat and the
//! operators' actions (the audit log). A heartbeat is one call of the store's Lua code; an
//! action is appended by the call that does it (`lua/set_paused.lua`, `request_run.lua`,
//! `unlock.lua`, through the head's `record_action`), so no action is done unrecorded.

use async_trait::async_trait;
use redis::Value;
use solocron_core::{ActionQuery, ActionRecord, NodeBeat, NodeRecord, StoreError, NODES_MAX};
use solocron_core::{AuditStore, FleetStore};

use crate::call::optional;
use crate::decode;
use crate::scripts::CODE;
use crate::RedisStore;

/// Most actions the audit log keeps per prefix: appending one more drops the oldest. Redis
/// keeps everything in memory, so the log is bounded whether or not anyone prunes; a
/// filtered [`solocron_core::AuditStore::actions`] examines at most this many.
pub const ACTIONS_KEPT_MAX: usize = 10_000;

#[async_trait]
impl FleetStore for RedisStore {
    /// Records a node's heartbeat (see [`solocron_core::FleetStore::heartbeat`]).
    async fn heartbeat(&self, beat: &NodeBeat) -> Result<(), StoreError> {
        let store = self;
        let mut call = store.invocation(&CODE.heartbeat);
        call.arg(&beat.node).arg(&beat.version).arg(beat.jobs).arg(beat.running);
        store.run(&call, "heartbeat").await.map(drop)
    }

    /// Marks a node gone (see [`solocron_core::FleetStore::goodbye`]).
    async fn goodbye(&self, node: &str) -> Result<(), StoreError> {
        let store = self;
        let mut call = store.invocation(&CODE.goodbye);
        call.arg(node);
        store.run(&call, "goodbye").await.map(drop)
    }

    /// Every node, by id (see [`solocron_core::FleetStore::nodes`]).
    async fn nodes(&self) -> Result<Vec<NodeRecord>, StoreError> {
        let store = self;
        let mut call = store.invocation(&CODE.nodes);
        call.arg(NODES_MAX);
        let reply = store.run(&call, "nodes").await?;
        decode::each(reply, "nodes", decode::node)?.into_iter().collect()
    }
}

#[async_trait]
impl AuditStore for RedisStore {
    /// Operators' actions, newest first (see [`solocron_core::AuditStore::actions`]).
    async fn actions(&self, query: &ActionQuery) -> Result<Vec<ActionRecord>, StoreError> {
        let store = self;
        let mut call = store.invocation(&CODE.actions);
        call.arg(optional(query.job.as_deref())).arg(query.effective_limit()).arg(ACTIONS_KEPT_MAX);
        let reply: Value = store.run(&call, "actions").await?;
        decode::each(reply, "actions", decode::action)?.into_iter().collect()
    }
}
