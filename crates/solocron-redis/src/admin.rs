//! What operators and housekeeping read and change: history, the job registry, pause
//! switches and unlocks, manual run requests, and pruning. Each is one call of the store's
//! Lua code.

use async_trait::async_trait;
use solocron_core::{ControlStore, HistoryStore, RegistryStore, RequestStore, RequestWatch, RunId};
use std::time::Duration;

use redis::Value;
use solocron_core::{
    HistoryQuery, JobControl, JobDefinition, Namespaces, Registration, RegistryCursor, RegistryPage, RunRecord,
    RunRequest, StoreError, Tick, NODE_FORGET_AFTER, PRUNE_BATCH_MAX, RECORDS_PAGE_MAX, REGISTRY_PAGE_MAX,
    UNLOCK_DETAIL_RUNS_MAX,
};

use crate::call::{millis, optional, Call};
use crate::decode::{self, convert, instant, invalid};
use crate::fleet::ACTIONS_KEPT_MAX;
use crate::scripts::CODE;
use crate::{RedisStore, SCAN_EXAMINED_MAX};

/// Most records one filtered [`HistoryStore::history`](solocron_core::HistoryStore::history) call
/// examines (see "Cost" in the crate docs).
const HISTORY_EXAMINED_MAX: usize = 50_000;

/// How many successive milliseconds [`request_run`] tries before giving up.
const REQUEST_SLOTS_MAX: usize = 100;

#[async_trait]
impl HistoryStore for RedisStore {
    /// Run records, newest first (see [`solocron_core::HistoryStore::history`]). A namespace asked
    /// for goes last, as the one name `namespaces_from` in `lua/prelude.lua` reads (not as a
    /// [`Namespaces`]: a name no namespace may have is asked for as it is, and matches nothing).
    async fn history(&self, query: &HistoryQuery) -> Result<Vec<RunRecord>, StoreError> {
        let store = self;
        if query.job.as_deref().is_some_and(|job| !query.in_namespace(job)) {
            // The job's history holds no record of another namespace: nothing to examine.
            return Ok(Vec::new());
        }
        let limit = match query.limit {
            0 => RECORDS_PAGE_MAX,
            n => n.min(RECORDS_PAGE_MAX),
        };
        let mut call = store.invocation(&CODE.history);
        call.arg(optional(query.job.as_deref()))
            .arg(optional(query.state.map(|s| s.as_str())))
            .arg(optional(query.node.as_deref()))
            .arg(optional(query.since.map(|t| t.timestamp_millis())))
            .arg(optional(query.until.map(|t| t.timestamp_millis())))
            .arg(limit)
            .arg(HISTORY_EXAMINED_MAX);
        if let Some(namespace) = &query.namespace {
            call.arg(namespace.as_str());
        }
        let (bounded, records): (i64, Value) = convert(store.run(&call, "history").await?, "history reply")?;
        let records = decode::each(records, "history", decode::record)?.into_iter().collect::<Result<Vec<_>, _>>()?;
        if bounded == 1 {
            tracing::warn!(
                examined = HISTORY_EXAMINED_MAX,
                found = records.len(),
                namespace = query.namespace.as_deref(),
                "history query stopped after examining its most records; older matches are not listed"
            );
        }
        Ok(records)
    }

    /// Deletes old ended records and requests of jobs in `namespaces`, and, whatever the
    /// namespaces, old registrations and actions and silent nodes (see
    /// [`solocron_core::HistoryStore::prune`]). The Lua scans the old records and requests oldest
    /// first, passing over other namespaces' (and running or waiting records), and examines at
    /// most [`SCAN_EXAMINED_MAX`] of each.
    async fn prune(&self, older_than: Duration, batch: usize, namespaces: &Namespaces) -> Result<u64, StoreError> {
        let store = self;
        let mut call = store.invocation(&CODE.prune);
        call.arg(millis(older_than)?)
            .arg(batch.min(PRUNE_BATCH_MAX))
            .arg(PRUNE_BATCH_MAX)
            .arg(millis(older_than.min(NODE_FORGET_AFTER))?)
            .arg(SCAN_EXAMINED_MAX)
            .arg(SCAN_EXAMINED_MAX)
            .namespaces(namespaces);
        let (deleted, bounded): (i64, i64) = convert(store.run(&call, "prune").await?, "prune reply")?;
        if bounded == 1 {
            tracing::warn!(
                examined = SCAN_EXAMINED_MAX,
                deleted,
                %namespaces,
                "prune stopped after examining its most old records or requests, mostly of other namespaces \
                 or still running; older ones of these namespaces beyond them stay until those are gone"
            );
        }
        u64::try_from(deleted).map_err(|e| invalid("pruned count", e))
    }
}

#[async_trait]
impl RegistryStore for RedisStore {
    /// Records that `node` runs exactly these jobs (see
    /// [`solocron_core::RegistryStore::register`]): one call upserts the listed ones and
    /// deletes the node's others, even when none is listed. A list longer than
    /// `REGISTER_CALL_JOBS` is staged first, in calls of that many, under an id of this
    /// registration's own; nothing is registered before the last call.
    async fn register(&self, node: &str, jobs: &[JobDefinition]) -> Result<(), StoreError> {
        let store = self;
        let (inline, stage) = match jobs.len() {
            n if n <= REGISTER_CALL_JOBS => (jobs, String::new()),
            _ => (&[][..], stage_id()),
        };
        if !stage.is_empty() {
            for part in jobs.chunks(REGISTER_CALL_JOBS) {
                let mut call = store.invocation(&CODE.register_stage);
                call.arg(node).arg(&stage);
                definitions(&mut call, part);
                store.run(&call, "register").await?;
            }
        }
        let mut call = store.invocation(&CODE.register);
        call.arg(node).arg(jobs.len()).arg(&stage);
        definitions(&mut call, inline);
        store.run(&call, "register").await.map(drop)
    }

    /// Every registration, by job then node.
    async fn registrations(&self) -> Result<Vec<Registration>, StoreError> {
        let store = self;
        let reply = store.run(&store.invocation(&CODE.registrations), "registrations").await?;
        let mut all =
            decode::each(reply, "registrations", decode::registration)?.into_iter().collect::<Result<Vec<_>, _>>()?;
        all.sort_by(|a, b| (&a.definition.job, &a.node).cmp(&(&b.definition.job, &b.node)));
        Ok(all)
    }

    /// A page of the registry: one `ZSCAN` step over its ids (see
    /// [`solocron_core::RegistryStore::registrations_page`]), so in no order, and about `limit` of them
    /// (a step returns whole hash buckets; a registry of up to Redis's
    /// `zset-max-listpack-entries`, 128 by default, comes whole).
    async fn registrations_page(
        &self,
        after: Option<&RegistryCursor>,
        limit: usize,
    ) -> Result<RegistryPage, StoreError> {
        let store = self;
        let cursor = after.map_or("0", RegistryCursor::as_str);
        if cursor.is_empty() || !cursor.bytes().all(|b| b.is_ascii_digit()) {
            return Err(StoreError::Invalid(format!("not a registry cursor of this store: {cursor:?}")));
        }
        let mut call = store.invocation(&CODE.registrations_page);
        call.arg(cursor).arg(limit.clamp(1, REGISTRY_PAGE_MAX));
        let reply = store.run(&call, "registrations").await?;
        let (next, hashes): (String, Value) = convert(reply, "registry page")?;
        let registrations =
            decode::each(hashes, "registrations", decode::registration)?.into_iter().collect::<Result<Vec<_>, _>>()?;
        let next = (next != "0").then(|| RegistryCursor::new(next));
        Ok(RegistryPage { registrations, next })
    }

    /// Every job's switches, by job.
    async fn controls(&self) -> Result<Vec<JobControl>, StoreError> {
        let store = self;
        let reply = store.run(&store.invocation(&CODE.controls), "controls").await?;
        let mut all =
            decode::each(reply, "job controls", decode::control)?.into_iter().collect::<Result<Vec<_>, _>>()?;
        all.sort_by(|a, b| a.job.cmp(&b.job));
        Ok(all)
    }
}

#[async_trait]
impl ControlStore for RedisStore {
    /// Sets a job's pause switch, and records the action (see
    /// [`solocron_core::ControlStore::set_paused`]).
    async fn set_paused(&self, job: &str, paused: bool, by: &str, reason: Option<&str>) -> Result<(), StoreError> {
        let store = self;
        let mut call = store.invocation(&CODE.set_paused);
        call.arg(job).arg(if paused { "1" } else { "0" }).arg(by).arg(optional(reason)).arg(ACTIONS_KEPT_MAX);
        store.run(&call, "set_paused").await.map(drop)
    }

    /// Ends every running run of a job for an operator, and records the action (see
    /// [`solocron_core::ControlStore::unlock`]).
    async fn unlock(&self, job: &str, by: &str, reason: &str) -> Result<Vec<RunId>, StoreError> {
        let mut call = self.invocation(&CODE.unlock);
        call.arg(job).arg(by).arg(reason).arg(ACTIONS_KEPT_MAX).arg(UNLOCK_DETAIL_RUNS_MAX);
        let ids: Vec<String> = convert(self.run(&call, "unlock").await?, "unlocked runs")?;
        let mut runs = ids.iter().map(|id| decode::run_id(id)).collect::<Result<Vec<_>, _>>()?;
        runs.sort();
        tracing::debug!(job, runs = runs.len(), "job unlocked");
        Ok(runs)
    }
}

#[async_trait]
impl RequestStore for RedisStore {
    /// Requests a manual run, and records the action (see
    /// [`solocron_core::RequestStore::request_run`]).
    async fn request_run(&self, job: &str, by: &str, reason: Option<&str>) -> Result<Tick, StoreError> {
        let store = self;
        let mut call = store.invocation(&CODE.request_run);
        call.arg(job).arg(by).arg(REQUEST_SLOTS_MAX).arg(optional(reason)).arg(ACTIONS_KEPT_MAX);
        let at: i64 = convert(store.run(&call, "request_run").await?, "requested instant")?;
        Ok(Tick::new(job, instant(at)?))
    }

    /// Requests whose tick has no record yet, oldest first, of jobs in `namespaces`. The Lua
    /// scans the pending requests oldest first, passing over other namespaces', and examines at
    /// most [`SCAN_EXAMINED_MAX`] of them.
    async fn pending_requests(&self, limit: usize, namespaces: &Namespaces) -> Result<Vec<RunRequest>, StoreError> {
        let store = self;
        let limit = limit.min(RECORDS_PAGE_MAX);
        if limit == 0 {
            return Ok(Vec::new());
        }
        let mut call = store.invocation(&CODE.pending);
        call.arg(limit).arg(SCAN_EXAMINED_MAX).namespaces(namespaces);
        let (bounded, flat): (i64, Vec<String>) =
            convert(store.run(&call, "pending_requests").await?, "pending requests")?;
        if bounded == 1 {
            tracing::warn!(
                examined = SCAN_EXAMINED_MAX,
                found = flat.len() / 2,
                %namespaces,
                "the pending requests scan stopped after examining its most requests, mostly of other namespaces; \
                 later requests of these namespaces are not listed until those are claimed or pruned"
            );
        }
        flat.chunks(2)
            .map(|pair| {
                let (member, by) = match pair {
                    [member, by] => (member, by),
                    _ => return Err(invalid("pending requests", format!("{flat:?}"))),
                };
                let (at, job) = member.split_once(':').ok_or_else(|| invalid("run request", member))?;
                let at = at.parse::<i64>().map_err(|e| invalid("run request", format!("{member}: {e}")))?;
                Ok(RunRequest { tick: Tick::new(job, instant(at)?), requested_by: by.clone() })
            })
            .collect()
    }

    fn request_watch(&self) -> Option<Box<dyn RequestWatch>> {
        Some(crate::watch::watch(self))
    }
}

/// Jobs per call of a registration: a longer list is staged in calls of this many, then
/// applied by one call (see `lua/register_stage.lua`). One call of 10,000 jobs held 8 MB of
/// buffers in this process (the command, its packed copy, the connection's copy).
const REGISTER_CALL_JOBS: usize = 500;

/// Adds each definition's five arguments to `call`.
fn definitions(call: &mut Call, jobs: &[JobDefinition]) {
    for job in jobs {
        call.arg(&job.job).arg(&job.schedule).arg(&job.timezone).arg(&job.definition_hash).arg(&job.summary);
    }
}

/// An id for one registration's stage, unique among this node's registrations: this
/// process's id and the wall clock's nanoseconds (a node registers from one process, one
/// registration at a time).
fn stage_id() -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    format!("{}.{nanos}", std::process::id())
}
