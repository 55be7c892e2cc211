//! What operators and housekeeping read and change: history, the store's clock, the job
//! registry, pause switches, manual run requests, where the present memory begins, and
//! pruning. Each is one call of the store's Lua code (or `TIME`).

use std::time::Duration;

use chrono::{DateTime, Utc};
use redis::Value;
use solocron_core::{
    HistoryQuery, JobControl, JobDefinition, Namespaces, Registration, RunRecord, RunRequest, StoreError, Tick,
    NODE_FORGET_AFTER, PRUNE_BATCH_MAX, RECORDS_PAGE_MAX,
};

use crate::call::{millis, optional};
use crate::decode::{self, convert, instant, invalid};
use crate::error::redis_error;
use crate::fleet::ACTIONS_KEPT_MAX;
use crate::scripts::CODE;
use crate::{RedisStore, SCAN_EXAMINED_MAX};

/// Most records one filtered [`Store::history`](solocron_core::Store::history) call
/// examines (see "Cost" in the crate docs).
const HISTORY_EXAMINED_MAX: usize = 50_000;

/// How many successive milliseconds [`request_run`] tries before giving up.
const REQUEST_SLOTS_MAX: usize = 100;

/// Run records, newest first (see [`solocron_core::Store::history`]). A namespace asked
/// for goes last, as the one name `namespaces_from` in `lua/prelude.lua` reads (not as a
/// [`Namespaces`]: a name no namespace may have is asked for as it is, and matches nothing).
pub(crate) async fn history(store: &RedisStore, query: &HistoryQuery) -> Result<Vec<RunRecord>, StoreError> {
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

/// Redis's clock (`TIME`).
pub(crate) async fn now(store: &RedisStore) -> Result<DateTime<Utc>, StoreError> {
    let mut conn = store.conn.clone();
    let (secs, micros): (i64, i64) = redis::cmd("TIME")
        .query_async(&mut conn)
        .await
        .map_err(|e| redis_error(e, &format!("now on {}", store.description)))?;
    instant(secs * 1000 + micros / 1000)
}

/// Records that `node` runs exactly these jobs (see [`solocron_core::Store::register`]):
/// one call upserts the listed ones and deletes the node's others, even when none is listed.
pub(crate) async fn register(store: &RedisStore, node: &str, jobs: &[JobDefinition]) -> Result<(), StoreError> {
    let mut call = store.invocation(&CODE.register);
    call.arg(node).arg(jobs.len());
    for job in jobs {
        call.arg(&job.job).arg(&job.schedule).arg(&job.timezone).arg(&job.definition_hash).arg(&job.summary);
    }
    store.run(&call, "register").await.map(drop)
}

/// Every registration, by job then node.
pub(crate) async fn registrations(store: &RedisStore) -> Result<Vec<Registration>, StoreError> {
    let reply = store.run(&store.invocation(&CODE.registrations), "registrations").await?;
    let mut all =
        decode::each(reply, "registrations", decode::registration)?.into_iter().collect::<Result<Vec<_>, _>>()?;
    all.sort_by(|a, b| (&a.definition.job, &a.node).cmp(&(&b.definition.job, &b.node)));
    Ok(all)
}

/// Sets a job's pause switch, and records the action (see
/// [`solocron_core::Store::set_paused`]).
pub(crate) async fn set_paused(
    store: &RedisStore,
    job: &str,
    paused: bool,
    by: &str,
    reason: Option<&str>,
) -> Result<(), StoreError> {
    let mut call = store.invocation(&CODE.set_paused);
    call.arg(job).arg(if paused { "1" } else { "0" }).arg(by).arg(optional(reason)).arg(ACTIONS_KEPT_MAX);
    store.run(&call, "set_paused").await.map(drop)
}

/// Every job's switches, by job.
pub(crate) async fn controls(store: &RedisStore) -> Result<Vec<JobControl>, StoreError> {
    let reply = store.run(&store.invocation(&CODE.controls), "controls").await?;
    let mut all = decode::each(reply, "job controls", decode::control)?.into_iter().collect::<Result<Vec<_>, _>>()?;
    all.sort_by(|a, b| a.job.cmp(&b.job));
    Ok(all)
}

/// Requests a manual run, and records the action (see
/// [`solocron_core::Store::request_run`]).
pub(crate) async fn request_run(
    store: &RedisStore,
    job: &str,
    by: &str,
    reason: Option<&str>,
) -> Result<Tick, StoreError> {
    let mut call = store.invocation(&CODE.request_run);
    call.arg(job).arg(by).arg(REQUEST_SLOTS_MAX).arg(optional(reason)).arg(ACTIONS_KEPT_MAX);
    let at: i64 = convert(store.run(&call, "request_run").await?, "requested instant")?;
    Ok(Tick::new(job, instant(at)?))
}

/// Requests whose tick has no record yet, oldest first, of jobs in `namespaces`. The Lua
/// scans the pending requests oldest first, passing over other namespaces', and examines at
/// most [`SCAN_EXAMINED_MAX`] of them.
pub(crate) async fn pending_requests(
    store: &RedisStore,
    limit: usize,
    namespaces: &Namespaces,
) -> Result<Vec<RunRequest>, StoreError> {
    let limit = limit.min(RECORDS_PAGE_MAX);
    if limit == 0 {
        return Ok(Vec::new());
    }
    let mut call = store.invocation(&CODE.pending);
    call.arg(limit).arg(SCAN_EXAMINED_MAX).namespaces(namespaces);
    let (bounded, flat): (i64, Vec<String>) = convert(store.run(&call, "pending_requests").await?, "pending requests")?;
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

/// When the present memory began (see "Amnesia" in the crate docs), marked now if unmarked.
pub(crate) async fn memory_since(store: &RedisStore) -> Result<Option<DateTime<Utc>>, StoreError> {
    let reply = store.run(&store.invocation(&CODE.memory_since), "memory_since").await?;
    let ms: i64 = convert(reply, "epoch")?;
    Ok(Some(instant(ms)?))
}

/// Deletes old ended records and requests of jobs in `namespaces`, and, whatever the
/// namespaces, old registrations and actions and silent nodes (see
/// [`solocron_core::Store::prune`]). The Lua scans the old records and requests oldest
/// first, passing over other namespaces' (and running or waiting records), and examines at
/// most [`SCAN_EXAMINED_MAX`] of each.
pub(crate) async fn prune(
    store: &RedisStore,
    older_than: Duration,
    batch: usize,
    namespaces: &Namespaces,
) -> Result<u64, StoreError> {
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
