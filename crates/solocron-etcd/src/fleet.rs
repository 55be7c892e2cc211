//! What the store keeps about the fleet besides runs: each node's heartbeat and the
//! operators' actions (the audit log). Instants are this process's clock (etcd has none),
//! like every instant this store records.
//!
//! A node has up to three keys (see [`crate::keys`]): `beat`, rewritten by every beat;
//! `start`, written by the first beat after a goodbye (or ever); `left`, written by a
//! goodbye and deleted by the next beat. A heartbeat is then one `Txn` that needs no read:
//! it compares whether `start` is there and `left` is not, and writes the beat alone, or
//! the beat with a new start.
//!
//! An action is one more put ([`put_action`]) in the `Txn` of the step it records (admin.rs:
//! pause, resume, trigger; runs.rs: unlock), so no action is done unrecorded. The log keeps
//! at most [`ACTIONS_KEPT_MAX`] actions: each step trims it right after its `Txn`.

use async_trait::async_trait;
use solocron_core::{AuditStore, FleetStore};
use std::collections::BTreeMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

use etcd_client::{Compare, CompareOp, GetOptions, SortOrder, SortTarget, Txn, TxnOp};
use solocron_core::{
    ActionKind, ActionQuery, ActionRecord, NodeBeat, NodeRecord, StoreError, NODES_MAX, NODE_FORGET_AFTER,
    PRUNE_BATCH_MAX,
};

use crate::codec::{decode, encode, instant, millis, StoredAction, StoredBeat};
use crate::etcd::{now_ms, range, range_all, txn, TXN_OPS_MAX};
use crate::keys::prefix_end;
use crate::EtcdStore;

/// Most actions the audit log keeps per prefix: a step that makes it longer drops the
/// oldest. etcd keeps its whole keyspace in memory, so the log is bounded whether or not
/// anyone prunes; a filtered [`solocron_core::AuditStore::actions`] examines at most this many.
pub const ACTIONS_KEPT_MAX: usize = 10_000;

/// Actions read per page (at most ~200 bytes each).
const ACTIONS_PAGE: i64 = 500;

/// The parts of a node's keys.
const BEAT: &str = "beat";
const START: &str = "start";
const LEFT: &str = "left";

#[async_trait]
impl FleetStore for EtcdStore {
    /// Records a node's heartbeat: one `Txn`, no read (see the module docs).
    async fn heartbeat(&self, beat: &NodeBeat) -> Result<(), StoreError> {
        let store = self;
        let now = now_ms();
        let key = |part| store.keys.node(&beat.node, part);
        let value = encode(&StoredBeat::new(beat, now));
        let still_up = vec![
            Compare::create_revision(key(START), CompareOp::Greater, 0),
            Compare::create_revision(key(LEFT), CompareOp::Equal, 0),
        ];
        let restart = vec![
            TxnOp::put(key(START), encode(&now), None),
            TxnOp::put(key(BEAT), value.clone(), None),
            TxnOp::delete(key(LEFT), None),
        ];
        let request = Txn::new().when(still_up).and_then(vec![TxnOp::put(key(BEAT), value, None)]).or_else(restart);
        txn(&store.client, "a heartbeat", request).await.map(drop)
    }

    /// Marks a node gone: one `Txn`, writing `left` only if the node ever beat.
    async fn goodbye(&self, node: &str) -> Result<(), StoreError> {
        let store = self;
        let known = vec![Compare::create_revision(store.keys.node(node, BEAT), CompareOp::Greater, 0)];
        let left = vec![TxnOp::put(store.keys.node(node, LEFT), encode(&now_ms()), None)];
        txn(&store.client, "a goodbye", Txn::new().when(known).and_then(left)).await.map(drop)
    }

    /// Every node, by id, at most [`NODES_MAX`].
    async fn nodes(&self) -> Result<Vec<NodeRecord>, StoreError> {
        let store = self;
        let mut out = Vec::new();
        // A node's keys without a beat are the remains of one being forgotten: skipped.
        for keys in node_keys(store).await?.into_values() {
            let Some((beat, _)) = keys.beat else { continue };
            out.push(NodeRecord {
                beat: beat.to_beat(),
                started_at: instant(keys.start.unwrap_or(beat.last_seen))?,
                last_seen: instant(beat.last_seen)?,
                left_at: keys.left.map(instant).transpose()?,
            });
        }
        // Escaping (`%`, `/`) can change the order of the keys: by the ids themselves.
        out.sort_by(|a, b| a.beat.node.cmp(&b.beat.node));
        out.truncate(NODES_MAX);
        Ok(out)
    }
}

#[async_trait]
impl AuditStore for EtcdStore {
    /// Operators' actions, newest first (key order), of one job or all: pages at one revision,
    /// at most [`ACTIONS_KEPT_MAX`] examined.
    async fn actions(&self, query: &ActionQuery) -> Result<Vec<ActionRecord>, StoreError> {
        let store = self;
        let limit = query.effective_limit();
        let family = store.keys.family("action");
        let (mut start, end) = (family.clone(), prefix_end(&family));
        let (mut out, mut examined, mut at_revision) = (Vec::new(), 0, 0);
        while out.len() < limit && examined < ACTIONS_KEPT_MAX {
            let options = GetOptions::new().with_range(end.clone()).with_limit(ACTIONS_PAGE).with_revision(at_revision);
            let mut resp = range(&store.client, "an action read", &start, options).await?;
            at_revision = resp.header().map_or(0, |h| h.revision());
            let kvs = resp.take_kvs();
            for kv in &kvs {
                let action = decode::<StoredAction>(kv.value(), "action")?;
                if query.job.as_ref().is_none_or(|j| *j == action.job) && out.len() < limit {
                    out.push(action.to_record()?);
                }
            }
            examined += kvs.len();
            match kvs.last() {
                Some(last) if resp.more() => start = format!("{}\0", String::from_utf8_lossy(last.key())),
                _ => break,
            }
        }
        Ok(out)
    }
}

/// A node's keys as read, and the revision of its beat.
#[derive(Default)]
struct NodeKeys {
    beat: Option<(StoredBeat, i64)>,
    start: Option<i64>,
    left: Option<i64>,
}

/// Every node's keys, by escaped id, read at one revision.
async fn node_keys(store: &EtcdStore) -> Result<BTreeMap<String, NodeKeys>, StoreError> {
    let family = store.keys.family("node");
    let (kvs, _) = range_all(&store.client, "a node read", (&family, &prefix_end(&family)), false, 0).await?;
    let mut nodes: BTreeMap<String, NodeKeys> = BTreeMap::new();
    for kv in &kvs {
        let key = String::from_utf8_lossy(kv.key());
        let bad = || StoreError::Invalid(format!("malformed node key `{key}`"));
        let (name, part) = key.strip_prefix(&family).and_then(|k| k.rsplit_once('/')).ok_or_else(bad)?;
        let keys = nodes.entry(name.to_owned()).or_default();
        match part {
            BEAT => keys.beat = Some((decode(kv.value(), "node heartbeat")?, kv.mod_revision())),
            START => keys.start = Some(decode(kv.value(), "node start")?),
            LEFT => keys.left = Some(decode(kv.value(), "node goodbye")?),
            _ => return Err(bad()),
        }
    }
    Ok(nodes)
}

/// What an operator did, as [`put_action`] records it.
pub(crate) struct Action<'a> {
    pub job: &'a str,
    pub kind: ActionKind,
    pub by: &'a str,
    pub reason: Option<&'a str>,
    pub detail: &'a str,
}

/// Where an action made now goes, and its instant (ms): a key of its own, made once per
/// action (an unlock of several `Txn`s rewrites the same one).
pub(crate) fn action_key(store: &EtcdStore) -> (String, i64) {
    let at_us = chrono::Utc::now().timestamp_micros();
    (store.keys.action(at_us, &tag()), at_us.div_euclid(1000))
}

/// The put of `action` at `key` (from [`action_key`], made at instant `at`), for the `Txn`
/// of the step it records.
pub(crate) fn put_action(key: &str, at: i64, action: Action<'_>) -> TxnOp {
    let stored = StoredAction {
        job: action.job.to_owned(),
        kind: action.kind.as_str().to_owned(),
        by: action.by.to_owned(),
        reason: action.reason.map(str::to_owned),
        at,
        detail: action.detail.to_owned(),
    };
    TxnOp::put(key, encode(&stored), None)
}

/// 16 hex digits, unique among this process's calls and unlikely to repeat elsewhere in
/// the same microsecond: what keeps two actions' keys apart.
fn tag() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    hasher.write_u32(std::process::id());
    format!("{:016x}", hasher.finish())
}

/// Drops the oldest actions beyond [`ACTIONS_KEPT_MAX`], after a step appended one. A count
/// (one round trip); only past the bound, a read of the oldest keys and their delete. A
/// failure is logged, not returned: the step itself is done and recorded.
pub(crate) async fn trim(store: &EtcdStore) {
    if let Err(e) = trim_once(store).await {
        tracing::debug!(error = %e, "cannot trim the audit log; the next action will");
    }
}

async fn trim_once(store: &EtcdStore) -> Result<(), StoreError> {
    let family = store.keys.family("action");
    let end = prefix_end(&family);
    let count = GetOptions::new().with_range(end.clone()).with_count_only();
    let held = usize::try_from(range(&store.client, "an action count", &family, count).await?.count()).unwrap_or(0);
    let excess = held.saturating_sub(ACTIONS_KEPT_MAX);
    if excess == 0 {
        return Ok(());
    }
    // The oldest are last in key order: etcd sorts this range server-side, which is why
    // it is read only past the bound.
    let oldest = GetOptions::new()
        .with_range(end)
        .with_sort(SortTarget::Key, SortOrder::Descend)
        .with_keys_only()
        .with_limit(i64::try_from(excess).unwrap_or(i64::MAX));
    let resp = range(&store.client, "an action trim", &family, oldest).await?;
    for chunk in resp.kvs().chunks(TXN_OPS_MAX) {
        let deletes: Vec<TxnOp> = chunk.iter().map(|kv| TxnOp::delete(kv.key(), None)).collect();
        txn(&store.client, "an action trim", Txn::new().and_then(deletes)).await?;
    }
    Ok(())
}

/// For prune, at this process's instant `now` (ms): deletes the actions older than
/// `older_than` (one range delete: the log holds at most [`ACTIONS_KEPT_MAX`]), and forgets
/// at most [`PRUNE_BATCH_MAX`] nodes silent for longer than the smaller of `older_than` and
/// [`NODE_FORGET_AFTER`], each by a `Txn` that compares its beat's revision, so that a node
/// beating meanwhile stays.
pub(crate) async fn prune(store: &EtcdStore, now: i64, older_than: std::time::Duration) -> Result<(), StoreError> {
    let cutoff_us = now.saturating_sub(millis(older_than)).saturating_mul(1000);
    let family = store.keys.family("action");
    let old = etcd_client::DeleteOptions::new().with_range(prefix_end(&family));
    let old_actions = Txn::new().and_then(vec![TxnOp::delete(store.keys.actions_before(cutoff_us), Some(old))]);
    txn(&store.client, "an action prune", old_actions).await?;
    let silent_before = now.saturating_sub(millis(older_than.min(NODE_FORGET_AFTER)));
    let mut forgotten = 0;
    for keys in node_keys(store).await?.into_values() {
        let Some((beat, revision)) = keys.beat else { continue };
        if beat.last_seen >= silent_before || forgotten >= PRUNE_BATCH_MAX {
            continue;
        }
        let key = |part| store.keys.node(&beat.node, part);
        let unchanged = vec![Compare::mod_revision(key(BEAT), CompareOp::Equal, revision)];
        let deletes = [BEAT, START, LEFT].map(|part| TxnOp::delete(key(part), None)).to_vec();
        txn(&store.client, "a node prune", Txn::new().when(unchanged).and_then(deletes)).await?;
        forgotten += 1;
    }
    Ok(())
}
