//! What operators and housekeeping read and change: history, the job registry, pause
//! switches and unlocks, manual run requests, and pruning (which keys it deletes:
//! `prune.rs`). An operator's action is appended to the audit log in the `Txn` of the step
//! (`fleet.rs`).

use async_trait::async_trait;
use solocron_core::{ControlStore, HistoryStore, RegistryStore, RequestStore, RequestWatch};
use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use etcd_client::{Compare, CompareOp, GetOptions, KeyValue, Txn, TxnOp};
use solocron_core::{
    ActionKind, ActionRecord, HistoryQuery, JobControl, JobDefinition, Namespaces, Registration, RegistryCursor,
    RegistryPage, RunId, RunRecord, RunRequest, RunState, StoreError, Tick, PRUNE_BATCH_MAX, RECORDS_PAGE_MAX,
    REGISTRY_PAGE_MAX,
};

use crate::cas::{commit, contended, read_keys, stored_guard, stored_run, CAS_ATTEMPTS};
use crate::codec::{
    decode, encode, instant, millis, Guard, StoredControl, StoredRegistration, StoredRequest, StoredRun,
};
use crate::etcd::{get, now_ms, range, range_all, read, single, txn, TXN_OPS_MAX};
use crate::fleet::{action_key, put_action, trim, Action};
use crate::keys::{key_in_history, key_served, prefix_end};
use crate::prune::{deleted_count, old_records, prune_requests};
use crate::runs::running_records;
use crate::EtcdStore;

/// Records read per page of a history scan: ~2 MB at most (4 KB of output each), under
/// the client's 4 MB message limit.
const HISTORY_PAGE: i64 = 500;

/// Most records one history call reads before giving up on finding `limit` matches: the
/// filters (job, state, node) are applied here, not by etcd, so a rare match in a long
/// history costs a long scan; this bounds it.
pub const HISTORY_SCAN_MAX: usize = 100_000;

/// Runs an unlock ends per `Txn`: two puts and one compare each, plus the guard's compare
/// and put and the action's put.
const UNLOCK_CHUNK: usize = (TXN_OPS_MAX - 2) / 2;

/// How many successive milliseconds [`request_run`] tries.
const REQUEST_SLOTS_MAX: usize = 100;

#[async_trait]
impl HistoryStore for EtcdStore {
    /// Run records, newest first (see [`solocron_core::HistoryStore::history`]). Records of another
    /// namespace than the one asked for are passed over by their keys, undecoded, but read and
    /// counted against [`HISTORY_SCAN_MAX`] like other jobs' records.
    async fn history(&self, query: &HistoryQuery) -> Result<Vec<RunRecord>, StoreError> {
        let store = self;
        if query.job.as_deref().is_some_and(|job| !query.in_namespace(job)) {
            // No record of the job is of the namespace asked for: nothing to read.
            return Ok(Vec::new());
        }
        let limit = match query.limit {
            0 => RECORDS_PAGE_MAX,
            n => n.min(RECORDS_PAGE_MAX),
        };
        if query.state == Some(RunState::Running) {
            return running_history(store, query, limit).await;
        }
        let family = store.keys.family("run");
        let mut start = query.until.map(|t| store.keys.runs_before(t.timestamp_millis())).unwrap_or(family.clone());
        let end = query.since.map(|t| store.keys.runs_since_end(t.timestamp_millis())).unwrap_or(prefix_end(&family));
        let (mut out, mut scanned, mut at_revision) = (Vec::new(), 0, 0);
        while start < end && out.len() < limit {
            // Every page at the first page's revision: one consistent snapshot.
            let options = GetOptions::new().with_range(end.clone()).with_limit(HISTORY_PAGE).with_revision(at_revision);
            let mut resp = range(&store.client, "a history read", &start, options).await?;
            at_revision = resp.header().map_or(0, |h| h.revision());
            let kvs = resp.take_kvs();
            for kv in kvs.iter().filter(|kv| key_in_history(query, kv.key())) {
                let record = decode::<StoredRun>(kv.value(), "run record")?.to_record()?;
                if matches(&record, query) && out.len() < limit {
                    out.push(record);
                }
            }
            scanned += kvs.len();
            match kvs.last() {
                Some(last) if resp.more() => start = format!("{}\0", String::from_utf8_lossy(last.key())),
                _ => break,
            }
            if scanned >= HISTORY_SCAN_MAX {
                let namespace = query.namespace.as_deref();
                tracing::warn!(
                    scanned,
                    found = out.len(),
                    namespace,
                    "history scan stopped at its bound; narrow the time window"
                );
                break;
            }
        }
        Ok(out)
    }

    /// Deletes old ended records of jobs in `namespaces`, oldest first, their old requests, and,
    /// whatever the namespaces, old actions, and forgets silent nodes (see
    /// [`solocron_core::HistoryStore::prune`]). One read at one revision (every job guard and every
    /// waiting retry's index key, to know the runs in progress, which it keeps, and the oldest
    /// record keys before the cutoff, other namespaces' passed over by their keys), then delete
    /// `Txn`s of [`TXN_OPS_MAX`] keys. Records ended at that revision never change again, so
    /// deleting them needs no compare. etcd sorts that range server-side after reading all of
    /// it (records older than the cutoff, of every namespace): prune regularly and it stays
    /// short.
    async fn prune(&self, older_than: Duration, batch: usize, namespaces: &Namespaces) -> Result<u64, StoreError> {
        let store = self;
        let batch = batch.min(PRUNE_BATCH_MAX);
        let now = now_ms();
        let cutoff = now.saturating_sub(millis(older_than));
        let guards = store.keys.family("job");
        let (guards, at) = range_all(&store.client, "a prune read", (&guards, &prefix_end(&guards)), false, 0).await?;
        let mut running = HashSet::new();
        for kv in &guards {
            for id in decode::<Guard>(kv.value(), "job guard")?.running_ids()? {
                running.insert(store.keys.run(&id).into_bytes());
            }
        }
        // Waiting retries are kept like running runs: their index keys' values are their keys.
        let waits = store.keys.family("wait");
        let (waits, _) = range_all(&store.client, "a prune read", (&waits, &prefix_end(&waits)), false, at).await?;
        running.extend(waits.iter().map(|kv| kv.value().to_vec()));
        let doomed = old_records(store, cutoff, batch, at, &running, namespaces).await?;
        let mut deleted = 0;
        for chunk in doomed.chunks(TXN_OPS_MAX) {
            let ops: Vec<TxnOp> = chunk.iter().map(|k| TxnOp::delete(k.clone(), None)).collect();
            let resp = txn(&store.client, "a prune", Txn::new().and_then(ops)).await?;
            deleted += deleted_count(&resp);
        }
        prune_requests(store, cutoff, namespaces).await?;
        crate::fleet::prune(store, now, older_than).await?;
        Ok(deleted)
    }
}

#[async_trait]
impl RegistryStore for EtcdStore {
    /// Records that `node` runs exactly these jobs (see [`solocron_core::RegistryStore::register`]):
    /// one read of the node's registrations, then a put of each listed job's and a delete of
    /// each other one found, in `Txn`s of [`TXN_OPS_MAX`] operations, each comparing every key
    /// it writes with the revision read (so `first_seen` survives a concurrent registration;
    /// a lost compare re-reads that `Txn`'s keys and tries again, bounded). Up to
    /// [`TXN_OPS_MAX`] operations this is one `Txn`; beyond, puts come before deletes (see
    /// "Registrations" in the crate docs).
    async fn register(&self, node: &str, jobs: &[JobDefinition]) -> Result<(), StoreError> {
        let store = self;
        // The last definition of a job listed twice wins (one Txn cannot put a key twice).
        let listed: BTreeMap<&str, &JobDefinition> = jobs.iter().map(|j| (j.job.as_str(), j)).collect();
        let start = store.keys.node_registrations(node);
        let range = (start.as_str(), &*prefix_end(&start));
        let (found, _) = range_all(&store.client, "a registration read", range, false, 0).await?;
        let mut found: BTreeMap<Vec<u8>, KeyValue> = found.into_iter().map(|kv| (kv.key().to_vec(), kv)).collect();
        let mut writes = Vec::with_capacity(listed.len() + found.len());
        for job in listed.into_values() {
            let key = store.keys.registration(node, &job.job).into_bytes();
            let mut write = RegistryWrite { key, job: Some(job), seen: None };
            write.saw(found.remove(&write.key).as_ref())?;
            writes.push(write);
        }
        for (key, kv) in found {
            let mut write = RegistryWrite { key, job: None, seen: None };
            write.saw(Some(&kv))?;
            writes.push(write);
        }
        for chunk in writes.chunks_mut(TXN_OPS_MAX) {
            write_registrations(store, node, chunk).await?;
        }
        Ok(())
    }

    /// Every registration, by job then node.
    async fn registrations(&self) -> Result<Vec<Registration>, StoreError> {
        let store = self;
        let mut out = Vec::new();
        for kv in read_family(store, "registry").await? {
            out.push(decode::<StoredRegistration>(kv.value(), "registration")?.to_registration()?);
        }
        out.sort_by(|a, b| (&a.definition.job, &a.node).cmp(&(&b.definition.job, &b.node)));
        Ok(out)
    }

    /// A page of the registry in key order, by node then job (see
    /// [`solocron_core::RegistryStore::registrations_page`]): each page a range read from the key the
    /// cursor names, at the latest revision.
    async fn registrations_page(
        &self,
        after: Option<&RegistryCursor>,
        limit: usize,
    ) -> Result<RegistryPage, StoreError> {
        let store = self;
        let family = store.keys.family("registry");
        let start = match after {
            None => family.clone(),
            // Only a key of this prefix's registry: a cursor cannot read out of it.
            Some(cursor) if cursor.as_str().starts_with(&family) => cursor.as_str().to_owned(),
            Some(cursor) => {
                return Err(StoreError::Invalid(format!("not a registry cursor of this store: {cursor:?}")))
            }
        };
        let limit = limit.clamp(1, REGISTRY_PAGE_MAX);
        let options = GetOptions::new().with_range(prefix_end(&family)).with_limit(limit as i64);
        let mut resp = range(&store.client, "a registry read", &start, options).await?;
        let more = resp.more();
        let kvs = resp.take_kvs();
        let registrations = kvs
            .iter()
            .map(|kv| decode::<StoredRegistration>(kv.value(), "registration")?.to_registration())
            .collect::<Result<Vec<_>, _>>()?;
        let next = match kvs.last() {
            Some(last) if more => Some(RegistryCursor::new(format!("{}\0", String::from_utf8_lossy(last.key())))),
            _ => None,
        };
        Ok(RegistryPage { registrations, next })
    }

    /// Every job's switches, by job.
    async fn controls(&self) -> Result<Vec<JobControl>, StoreError> {
        let store = self;
        let mut out = Vec::new();
        for kv in read_family(store, "control").await? {
            out.push(decode::<StoredControl>(kv.value(), "job control")?.to_control()?);
        }
        out.sort_by(|a, b| a.job.cmp(&b.job));
        Ok(out)
    }
}

#[async_trait]
impl ControlStore for EtcdStore {
    /// Sets a job's pause switch (left as it is by a pause of a paused job without a reason)
    /// and records the action: a read of the switch, then one `Txn` comparing its revision, so
    /// that the action's detail is true of the switch it changed (a lost compare decides
    /// again, bounded). Claims compare the switch's revision too, so none decides on a switch
    /// changed under it.
    async fn set_paused(&self, job: &str, paused: bool, by: &str, reason: Option<&str>) -> Result<(), StoreError> {
        let store = self;
        let key = store.keys.control(job);
        for _ in 0..CAS_ATTEMPTS {
            let found = read(&store.client, vec![get(key.clone())]).await?.into_iter().next().and_then(single);
            let (was_paused, revision) = match &found {
                Some(kv) => (decode::<StoredControl>(kv.value(), "job control")?.paused, kv.mod_revision()),
                None => (false, 0),
            };
            let (action, at) = action_key(store);
            let mut puts = Vec::new();
            if !(paused && was_paused && reason.is_none()) {
                let control = StoredControl {
                    job: job.to_owned(),
                    paused,
                    changed_by: by.to_owned(),
                    reason: reason.map(str::to_owned),
                    changed_at: at,
                };
                puts.push(TxnOp::put(key.clone(), encode(&control), None));
            }
            let kind = if paused { ActionKind::Pause } else { ActionKind::Resume };
            let detail = ActionRecord::pause_detail(paused, was_paused);
            puts.push(put_action(&action, at, Action { job, kind, by, reason, detail }));
            let unchanged = vec![Compare::mod_revision(key.clone(), CompareOp::Equal, revision)];
            if txn(&store.client, "a pause", Txn::new().when(unchanged).and_then(puts)).await?.succeeded() {
                trim(store).await;
                return Ok(());
            }
        }
        Err(contended("a pause"))
    }

    /// Ends every running run of `job` as abandoned, and records the action (see
    /// [`solocron_core::ControlStore::unlock`]): one `Txn` per `UNLOCK_CHUNK` runs, each comparing
    /// the guard's and the records' revisions. Each `Txn` also writes the action, naming every
    /// run ended so far (the same key each time), so the log never misses a run an unlock
    /// ended, even when a later `Txn` of it fails; an unlock that finds nothing running
    /// records so in a `Txn` comparing the guard's revision.
    async fn unlock(&self, job: &str, by: &str, reason: &str) -> Result<Vec<RunId>, StoreError> {
        let store = self;
        let guard_key = store.keys.guard(job);
        let why = ActionRecord::unlock_reason(by, reason);
        let (action_key, at) = action_key(store);
        let action = |ended: &[RunId]| {
            let detail = ActionRecord::unlock_detail(ended);
            let reason = (!reason.is_empty()).then_some(reason);
            put_action(&action_key, at, Action { job, kind: ActionKind::Unlock, by, reason, detail: &detail })
        };
        let mut unlocked = Vec::new();
        let mut lost = 0;
        while lost < CAS_ATTEMPTS {
            let found = read_keys(store, vec![get(guard_key.clone())]).await?.pop().flatten();
            let ids = match &found {
                Some(kv) => stored_guard(Some(kv), job)?.0.running_ids()?.into_iter().take(UNLOCK_CHUNK).collect(),
                None => Vec::new(),
            };
            if ids.is_empty() {
                if !unlocked.is_empty() {
                    break; // the last chunk's `Txn` recorded the action
                }
                let revision = found.as_ref().map_or(0, KeyValue::mod_revision);
                let idle = vec![Compare::mod_revision(guard_key.clone(), CompareOp::Equal, revision)];
                match commit(store, "an unlock", Txn::new().when(idle).and_then(vec![action(&[])]), Vec::new()).await? {
                    Ok(_) => break,
                    Err(_) => {
                        lost += 1;
                        continue;
                    }
                }
            }
            let (mut guard, guard_rev) = stored_guard(found.as_ref(), job)?;
            let answers = read_keys(store, ids.iter().map(|id| get(store.keys.run(id))).collect()).await?;
            let mut compares = vec![Compare::mod_revision(guard_key.clone(), CompareOp::Equal, guard_rev)];
            let (mut puts, mut ended) = (Vec::new(), Vec::new());
            let now = now_ms();
            for (id, kv) in ids.iter().zip(&answers) {
                guard.remove(id);
                let Some((mut record, rev)) = stored_run(kv.as_ref())? else { continue };
                compares.push(Compare::mod_revision(store.keys.run(id), CompareOp::Equal, rev));
                if record.is_running() {
                    record.end(RunState::Abandoned, Some(why.clone()), now);
                    puts.push(TxnOp::put(store.keys.run(id), encode(&record), None));
                    puts.push(TxnOp::delete(store.keys.alive(id), None));
                    ended.push(id.clone());
                }
            }
            puts.push(TxnOp::put(guard_key.clone(), encode(&guard), None));
            let mut so_far: Vec<RunId> = unlocked.iter().chain(&ended).cloned().collect();
            so_far.sort();
            puts.push(action(&so_far));
            match commit(store, "an unlock", Txn::new().when(compares).and_then(puts), Vec::new()).await? {
                Ok(_) => {
                    ended.iter().for_each(|id| store.forget(id));
                    unlocked.extend(ended);
                }
                Err(_) => lost += 1,
            }
        }
        if lost == CAS_ATTEMPTS {
            return Err(contended("unlock"));
        }
        trim(store).await;
        unlocked.sort();
        tracing::debug!(job, runs = unlocked.len(), "job unlocked");
        Ok(unlocked)
    }
}

#[async_trait]
impl RequestStore for EtcdStore {
    /// Requests a manual run: one `Txn` creating the request key if absent, at the first free
    /// off-second millisecond from the client's now, with the action.
    async fn request_run(&self, job: &str, by: &str, reason: Option<&str>) -> Result<Tick, StoreError> {
        let store = self;
        let (action, now) = action_key(store);
        let mut at = if now.rem_euclid(1000) == 0 { now + 1 } else { now };
        for _ in 0..REQUEST_SLOTS_MAX {
            let key = store.keys.request(job, at);
            let request = StoredRequest { job: job.to_owned(), requested_at: at, requested_by: by.to_owned() };
            let tick = Tick::new(job, instant(at)?);
            let detail = RunId { tick: tick.clone(), attempt: 1 }.to_string();
            let create =
                Txn::new().when(vec![Compare::create_revision(key.clone(), CompareOp::Equal, 0)]).and_then(vec![
                    TxnOp::put(key, encode(&request), None),
                    put_action(&action, now, Action { job, kind: ActionKind::Trigger, by, reason, detail: &detail }),
                ]);
            if txn(&store.client, "a run request", create).await?.succeeded() {
                trim(store).await;
                return Ok(tick);
            }
            at = next_manual_ms(at);
        }
        Err(StoreError::Invalid(format!(
            "{REQUEST_SLOTS_MAX} manual runs of `{job}` already requested around this instant; try again"
        )))
    }

    /// Requests of jobs in `namespaces` whose tick has no record, oldest first: pages of
    /// requests, other namespaces' passed over, the others checked with one read of the
    /// matching record keys.
    async fn pending_requests(&self, limit: usize, namespaces: &Namespaces) -> Result<Vec<RunRequest>, StoreError> {
        let store = self;
        let limit = limit.min(RECORDS_PAGE_MAX);
        let family = store.keys.family("request");
        let (mut start, end) = (family.clone(), prefix_end(&family));
        let mut out = Vec::new();
        while out.len() < limit {
            let options = GetOptions::new().with_range(end.clone()).with_limit(TXN_OPS_MAX as i64);
            let mut resp = range(&store.client, "a request read", &start, options).await?;
            let kvs = resp.take_kvs();
            let requests = kvs
                .iter()
                .filter(|kv| key_served(namespaces, kv.key()))
                .map(|kv| decode::<StoredRequest>(kv.value(), "run request"))
                .collect::<Result<Vec<_>, _>>()?;
            let ticks = requests
                .iter()
                .map(|r| Ok(Tick::new(r.job.clone(), instant(r.requested_at)?)))
                .collect::<Result<Vec<_>, StoreError>>()?;
            let keys_only = || Some(GetOptions::new().with_keys_only());
            let runs =
                ticks.iter().map(|t| TxnOp::get(store.keys.run(&RunId { tick: t.clone(), attempt: 1 }), keys_only()));
            let runs = runs.collect();
            let claimed = read(&store.client, runs).await?;
            for ((request, tick), record) in requests.into_iter().zip(ticks).zip(claimed) {
                if record.is_empty() && out.len() < limit {
                    out.push(RunRequest { tick, requested_by: request.requested_by });
                }
            }
            match kvs.last() {
                Some(last) if resp.more() => start = format!("{}\0", String::from_utf8_lossy(last.key())),
                _ => break,
            }
        }
        Ok(out)
    }

    fn request_watch(&self) -> Option<Box<dyn RequestWatch>> {
        Some(crate::watch::watch(self))
    }
}

/// Whether a record passes the query's filters.
fn matches(r: &RunRecord, q: &HistoryQuery) -> bool {
    q.job.as_ref().is_none_or(|j| *j == r.id.tick.job)
        && q.in_namespace(&r.id.tick.job)
        && q.state.is_none_or(|s| s == r.state)
        && q.node.as_ref().is_none_or(|n| *n == r.node)
        && q.since.is_none_or(|t| r.id.tick.scheduled_at >= t)
        && q.until.is_none_or(|t| r.id.tick.scheduled_at < t)
}

/// History of running runs only, from the job guards (which list them) rather than a scan.
async fn running_history(store: &EtcdStore, query: &HistoryQuery, limit: usize) -> Result<Vec<RunRecord>, StoreError> {
    let guards = match &query.job {
        Some(job) => read(&store.client, vec![get(store.keys.guard(job))]).await?.into_iter().flatten().collect(),
        None => {
            let family = store.keys.family("job");
            range_all(&store.client, "a history read", (&family, &prefix_end(&family)), false, 0).await?.0
        }
    };
    let mut ids = Vec::new();
    // Other namespaces' guards are passed over by their keys, undecoded.
    for kv in guards.into_iter().filter(|kv| key_in_history(query, kv.key())) {
        ids.extend(decode::<Guard>(kv.value(), "job guard")?.running_ids()?);
    }
    let mut records: Vec<RunRecord> =
        running_records(store, &ids).await?.into_iter().filter(|r| matches(r, query)).collect();
    // Newest first, in key order (ties of instant and attempt by job).
    records.sort_by_cached_key(|r| store.keys.run(&r.id));
    records.truncate(limit);
    Ok(records)
}

/// A registration key as last read: its revision and, if it is to be put, its `first_seen`.
struct Seen {
    revision: i64,
    first_seen: i64,
}

/// One key of [`register`]'s writes: the put of a listed job's registration (`job`), or
/// the delete of an unlisted one (`None`); `seen`: the key as last read (`None`: absent).
struct RegistryWrite<'a> {
    key: Vec<u8>,
    job: Option<&'a JobDefinition>,
    seen: Option<Seen>,
}

impl RegistryWrite<'_> {
    /// Notes the key as read (`None`: absent). Only a registration to keep is decoded: one
    /// to delete is deleted whatever it holds.
    fn saw(&mut self, kv: Option<&KeyValue>) -> Result<(), StoreError> {
        self.seen = match kv {
            Some(kv) if self.job.is_some() => {
                let first_seen = decode::<StoredRegistration>(kv.value(), "registration")?.first_seen;
                Some(Seen { revision: kv.mod_revision(), first_seen })
            }
            Some(kv) => Some(Seen { revision: kv.mod_revision(), first_seen: 0 }),
            None => None,
        };
        Ok(())
    }

    /// The compare that the key is still as read, and the write.
    fn txn_parts(&self, node: &str, now: i64) -> (Compare, TxnOp) {
        let revision = self.seen.as_ref().map_or(0, |s| s.revision);
        let unchanged = Compare::mod_revision(self.key.clone(), CompareOp::Equal, revision);
        let Some(job) = self.job else { return (unchanged, TxnOp::delete(self.key.clone(), None)) };
        let stored = StoredRegistration {
            job: job.job.clone(),
            node: node.to_owned(),
            schedule: job.schedule.clone(),
            timezone: job.timezone.clone(),
            definition_hash: job.definition_hash.clone(),
            summary: job.summary.clone(),
            first_seen: self.seen.as_ref().map_or(now, |s| s.first_seen),
            last_seen: now,
        };
        (unchanged, TxnOp::put(self.key.clone(), encode(&stored), None))
    }
}

/// One `Txn` of at most [`TXN_OPS_MAX`] of [`register`]'s writes; on a lost compare, their
/// keys are read again and the `Txn` decided again (a key to delete found gone is still
/// compared, as absent, and its delete deletes nothing).
async fn write_registrations(
    store: &EtcdStore,
    node: &str,
    writes: &mut [RegistryWrite<'_>],
) -> Result<(), StoreError> {
    for _ in 0..CAS_ATTEMPTS {
        let now = now_ms();
        let (compares, ops): (Vec<Compare>, Vec<TxnOp>) = writes.iter().map(|w| w.txn_parts(node, now)).unzip();
        if txn(&store.client, "a registration", Txn::new().when(compares).and_then(ops)).await?.succeeded() {
            return Ok(());
        }
        let found = read(&store.client, writes.iter().map(|w| get(w.key.clone())).collect()).await?;
        for (write, kv) in writes.iter_mut().zip(found.into_iter().map(single)) {
            write.saw(kv.as_ref())?;
        }
    }
    Err(StoreError::Unavailable(format!("registrations of {node} kept changing under this registration; try again")))
}

/// Every key-value of a family (registry, controls), in pages at one revision.
async fn read_family(store: &EtcdStore, family: &str) -> Result<Vec<etcd_client::KeyValue>, StoreError> {
    let start = store.keys.family(family);
    Ok(range_all(&store.client, "a read", (&start, &prefix_end(&start)), false, 0).await?.0)
}

/// The millisecond after `t` that is not a whole second: manual ticks never fall on one,
/// so they never coincide with a scheduled tick.
fn next_manual_ms(t: i64) -> i64 {
    if (t + 1).rem_euclid(1000) == 0 {
        t + 2
    } else {
        t + 1
    }
}
