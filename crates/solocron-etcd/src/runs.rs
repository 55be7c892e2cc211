//! The life of a won run after its claim: renew, finish, expiry and recovery (an
//! operator's unlock, which ends runs too, is in `admin.rs`). Each write is one `Txn`
//! comparing the revisions of what it read (the run's record, the job's guard) or the lease
//! of the run's alive key, so that exactly one of several racing nodes succeeds; a lost
//! compare re-reads (the `Txn`'s `else` branch) and decides again, bounded.

use async_trait::async_trait;
use solocron_core::RunStore;
use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use etcd_client::{Compare, CompareOp, KeyValue, PutOptions, Txn, TxnOp};
use solocron_core::{
    Ending, Lease, Namespaces, RecoverAction, RecoverOutcome, Renewal, RunEnd, RunId, RunRecord, RunState, StoreError,
    Trigger, RECORDS_PAGE_MAX, RENEW_BATCH_MAX,
};

use crate::cas::{commit, contended, read_keys, stored_guard, stored_run, CAS_ATTEMPTS};
use crate::codec::{decode, encode, end_record, millis, to_lease, Guard, StoredRun};
use crate::etcd::{get, keep_alive, now_ms, range_all, revision, revoke_quietly, txn, TXN_OPS_MAX};
use crate::keys::{key_served, prefix_end};
use crate::leases::{grant_once, lease_secs};
use crate::memory::Held;
use crate::retry::{plan_start, Planned};
use crate::EtcdStore;

#[async_trait]
impl RunStore for EtcdStore {
    /// Extends a lease (see [`solocron_core::RunStore::renew`]). With the run remembered from its
    /// claim or last renewal: a keep-alive, then one `Txn` (two round trips); otherwise a read
    /// first (three). A new length in whole seconds moves the alive key to a new etcd lease.
    async fn renew(&self, lease: &Lease, length: Duration) -> Result<bool, StoreError> {
        let store = self;
        let ttl = lease_secs(length)?;
        if let Some(held) = store.recall(&lease.run).filter(|h| h.record.held_by(&lease.owner, lease.fencing_token)) {
            match renew_held(store, held, ttl, length).await? {
                Some(renewed) => return Ok(renewed),
                // The record changed since this store last wrote it: look at it afresh.
                None => store.forget(&lease.run),
            }
        }
        let Some(held) = read_held(store, lease).await? else { return Ok(false) };
        Ok(renew_held(store, held, ttl, length).await?.unwrap_or(false))
    }

    /// Extends several leases (see [`solocron_core::RunStore::renew_all`]): each as
    /// [`renew`](solocron_core::RunStore::renew) does, `RENEWALS_IN_FLIGHT` at a time. Not one
    /// `Txn`: a renewal is a keep-alive of the run's etcd lease (shared by the runs of one
    /// claim) and a compare on its record, and a batch of them would need a keep-alive per
    /// lease before one `Txn` of every compare; not done, since etcd renewals already overlap
    /// on its one multiplexed connection.
    async fn renew_all(&self, renewals: &[Renewal]) -> Result<Vec<bool>, StoreError> {
        let store = self;
        assert!(renewals.len() <= RENEW_BATCH_MAX, "{} renewals in one batch", renewals.len());
        let mut answers = Vec::with_capacity(renewals.len());
        for chunk in renewals.chunks(RENEWALS_IN_FLIGHT) {
            let calls: Vec<_> = chunk.iter().map(|r| store.renew(&r.lease, r.length)).collect();
            for answer in futures_util::future::join_all(calls).await {
                answers.push(answer?);
            }
        }
        Ok(answers)
    }

    /// Records a run's end (see [`solocron_core::RunStore::finish`]): a read and one `Txn` (plus
    /// a retry per lost compare) that also deletes the run's alive key. The etcd lease is not
    /// revoked: other runs of the same claim may share it; it expires once nobody renews it.
    async fn finish(&self, lease: &Lease, end: &RunEnd) -> Result<bool, StoreError> {
        let store = self;
        let ending = [Ending { lease: lease.clone(), end: end.clone() }];
        let answers = finish_ends(store, &ending, CAS_ATTEMPTS).await?.ok_or_else(|| contended("finish"))?;
        Ok(answers[0])
    }

    /// Records a batch of ends (see [`solocron_core::RunStore::finish_all`]), in chunks of
    /// `FINISH_CHUNK`: per chunk one read of the records and guards, and one `Txn` comparing
    /// every revision it read. If another node changed any of them in between (a claim of the
    /// same job changes its guard), the chunk is read and tried again; after
    /// `FINISH_CHUNK_ATTEMPTS` lost tries its ends go one by one through
    /// [`finish`](solocron_core::RunStore::finish).
    async fn finish_all(&self, endings: &[Ending]) -> Result<Vec<bool>, StoreError> {
        let store = self;
        let mut answers = Vec::with_capacity(endings.len());
        for chunk in endings.chunks(FINISH_CHUNK) {
            answers.extend(finish_chunk(store, chunk).await?);
        }
        Ok(answers)
    }

    async fn finish_for_retry(&self, lease: &Lease, end: &RunEnd, after: Duration) -> Result<bool, StoreError> {
        crate::retry::finish_for_retry(self, lease, end, after).await
    }

    /// Running runs whose etcd lease is gone and due `waiting` retries (see
    /// [`solocron_core::RunStore::expired`]): one read of every job guard and every alive key at
    /// one revision, then the candidates' records; and the due retries (`retry.rs`). Only jobs
    /// in `namespaces`, chosen by their keys before the limit applies.
    async fn expired(&self, limit: usize, namespaces: &Namespaces) -> Result<Vec<RunRecord>, StoreError> {
        let store = self;
        let (guards, alive) = (store.keys.family("job"), store.keys.family("alive"));
        let what = "an expiry read";
        let (guards, at) = range_all(&store.client, what, (&guards, &prefix_end(&guards)), false, 0).await?;
        let (alive, _) = range_all(&store.client, what, (&alive, &prefix_end(&alive)), true, at).await?;
        let alive: HashSet<Vec<u8>> = alive.iter().map(|kv| kv.key().to_vec()).collect();
        let mut lapsed = Vec::new();
        // Other namespaces' guards are passed over by their keys, before the limit.
        for kv in guards.iter().filter(|kv| key_served(namespaces, kv.key())) {
            let guard = match decode::<Guard>(kv.value(), "job guard").and_then(|g| g.running_ids()) {
                Ok(ids) => ids,
                Err(e) => {
                    tracing::error!(error = %e, "skipping an unreadable job guard");
                    continue;
                }
            };
            lapsed.extend(guard.into_iter().filter(|id| !alive.contains(store.keys.alive(id).as_bytes())));
        }
        let limit = limit.min(RECORDS_PAGE_MAX);
        let mut records = running_records(store, &lapsed).await?;
        records.extend(crate::retry::due_waiting(store, at, limit, namespaces).await?);
        records.sort_by(|a, b| (a.lease_until, &a.id).cmp(&(b.lease_until, &b.id)));
        records.truncate(limit);
        Ok(records)
    }

    /// Acts on an expired run or a due `waiting` retry (see [`solocron_core::RunStore::recover`]):
    /// a read, then one `Txn` that compares the record's (and, when it hands out a token, the
    /// guard's) revision and that the alive key is still absent, so exactly one of several
    /// recoverers wins. Revokes nothing it does not own: the expired lease is etcd's to drop;
    /// only a lease granted here for a retry that lost is revoked.
    async fn recover(&self, run: &RunId, action: &RecoverAction) -> Result<RecoverOutcome, StoreError> {
        let store = self;
        let next = crate::retry::next_of(run)?;
        let keys = &store.keys;
        let reads =
            || vec![get(keys.run(run)), get(keys.alive(run)), get(keys.guard(&run.tick.job)), get(keys.run(&next))];
        let mut answers = read_keys(store, reads()).await?;
        let mut granted = None;
        let mut outcome = Err(contended("recover"));
        for _ in 0..CAS_ATTEMPTS {
            let Some(plan) = plan_recovery(store, run, &next, action, &answers, &mut granted).await? else {
                outcome = Ok(RecoverOutcome::NotNeeded);
                break;
            };
            match commit(store, "a recovery", plan.0, reads()).await? {
                Ok(revision) => {
                    outcome = Ok(plan.1.clone());
                    if let (RecoverOutcome::Retried(_), Some(record)) = (&plan.1, plan.2) {
                        granted = None;
                        store.remember(Held { record, revision });
                    }
                    tracing::debug!(%run, outcome = ?plan.1, "expired run recovered");
                    break;
                }
                Err(fresh) => answers = fresh,
            }
        }
        revoke_quietly(&store.client, granted.into_iter().map(|(id, _)| id).collect()).await;
        outcome
    }

    fn expiry_lag(&self) -> Duration {
        crate::EXPIRY_LAG
    }
}

/// Renewals of a batch in flight at once.
const RENEWALS_IN_FLIGHT: usize = 32;

/// The record of `lease`'s run if the lease holds it and its alive key still exists.
async fn read_held(store: &EtcdStore, lease: &Lease) -> Result<Option<Held>, StoreError> {
    let answers = read_keys(store, vec![get(store.keys.run(&lease.run)), get(store.keys.alive(&lease.run))]).await?;
    let Some((record, revision)) = stored_run(answers[0].as_ref())? else { return Ok(None) };
    let attached = answers[1].as_ref().map(|kv| kv.lease());
    if !record.held_by(&lease.owner, lease.fencing_token) || attached.is_none() || attached != record.lease_id {
        return Ok(None);
    }
    Ok(Some(Held { record, revision }))
}

/// Renews a held run: `Some(renewed)`, or `None` if the record changed since `held` was read.
async fn renew_held(store: &EtcdStore, held: Held, ttl: i64, length: Duration) -> Result<Option<bool>, StoreError> {
    let old = held.record.lease_id.ok_or_else(|| StoreError::Invalid("a running record has no lease".into()))?;
    let moving = held.record.ttl != Some(ttl);
    // Before the keep-alive or grant is sent: etcd's TTL restarts later than this.
    let from = now_ms();
    let new = if moving {
        crate::etcd::grant(&store.client, ttl).await?
    } else if keep_alive(&store.client, old).await? {
        old
    } else {
        // etcd judged the lease expired (or it was revoked): the run is no longer held.
        store.forget(&held.record.id()?);
        return Ok(Some(false));
    };
    let id = held.record.id()?;
    let record = StoredRun {
        lease_until: Some(from.saturating_add(millis(length))),
        lease_id: Some(new),
        ttl: Some(ttl),
        ..held.record
    };
    let (run_key, alive_key) = (store.keys.run(&id), store.keys.alive(&id));
    let mut puts = vec![TxnOp::put(run_key.clone(), encode(&record), None)];
    if moving {
        puts.push(TxnOp::put(alive_key.clone(), record.node.as_bytes(), Some(PutOptions::new().with_lease(new))));
    }
    // The alive key still on the old lease: the lease had not expired when this applied.
    let compares = vec![
        Compare::mod_revision(run_key, CompareOp::Equal, held.revision),
        Compare::lease(alive_key, CompareOp::Equal, old),
    ];
    let resp = txn(&store.client, "a renewal", Txn::new().when(compares).and_then(puts)).await?;
    // The old lease may be shared with other runs of the same claim: it is left to expire.
    let (unused, renewed) = match (resp.succeeded(), moving) {
        (false, true) => (Some(new), false),
        (succeeded, _) => (None, succeeded),
    };
    if let Some(unused) = unused {
        revoke_quietly(&store.client, vec![unused]).await;
    }
    if !renewed {
        return Ok(None);
    }
    store.remember(Held { record, revision: revision(&resp)? });
    Ok(Some(true))
}

/// Ends per `Txn` of a batch: a compare and two writes (record, alive key) each, plus a
/// compare and a write per job's guard.
const FINISH_CHUNK: usize = TXN_OPS_MAX / 3;

/// Tries of a whole chunk before its ends go one by one.
const FINISH_CHUNK_ATTEMPTS: u32 = 4;

async fn finish_chunk(store: &EtcdStore, chunk: &[Ending]) -> Result<Vec<bool>, StoreError> {
    if let Some(answers) = finish_ends(store, chunk, FINISH_CHUNK_ATTEMPTS).await? {
        return Ok(answers);
    }
    tracing::debug!(ends = chunk.len(), "a batch of finishes kept losing compares; recording them one by one");
    let mut answers = Vec::with_capacity(chunk.len());
    for e in chunk {
        answers.push(store.finish(&e.lease, &e.end).await?);
    }
    Ok(answers)
}

/// Ends the held runs among `chunk` (at most [`FINISH_CHUNK`]): one read of their records
/// and their jobs' guards, then one `Txn` comparing every revision read, whose `else`
/// branch reads them again for the next of at most `attempts` tries. `None` if every try
/// lost a compare to another node.
async fn finish_ends(store: &EtcdStore, chunk: &[Ending], attempts: u32) -> Result<Option<Vec<bool>>, StoreError> {
    debug_assert!(chunk.len() <= FINISH_CHUNK);
    for e in chunk {
        assert!(e.end.state.is_terminal(), "a run cannot finish as `{}`", e.end.state);
    }
    let mut jobs: Vec<&str> = chunk.iter().map(|e| e.lease.run.tick.job.as_str()).collect();
    jobs.sort_unstable();
    jobs.dedup();
    let run_keys: Vec<String> = chunk.iter().map(|e| store.keys.run(&e.lease.run)).collect();
    let reads = || {
        let mut reads: Vec<TxnOp> = run_keys.iter().map(|k| get(k.clone())).collect();
        reads.extend(jobs.iter().map(|j| get(store.keys.guard(j))));
        reads
    };
    let mut found = read_keys(store, reads()).await?;
    for _ in 0..attempts {
        let (records, guard_kvs) = found.split_at(chunk.len());
        let now = now_ms();
        let mut guards: BTreeMap<&str, (Guard, i64)> = BTreeMap::new();
        let (mut compares, mut writes, mut ended) = (Vec::new(), Vec::new(), vec![false; chunk.len()]);
        let mut seen = HashSet::new();
        for (i, (e, kv)) in chunk.iter().zip(records).enumerate() {
            let Some((mut record, record_rev)) = stored_run(kv.as_ref())? else { continue };
            if !record.held_by(&e.lease.owner, e.lease.fencing_token) {
                store.forget(&e.lease.run);
                continue;
            }
            // The same end twice: the second answers as a second `finish` would.
            if !seen.insert(&run_keys[i]) {
                continue;
            }
            let job = e.lease.run.tick.job.as_str();
            let (guard, _) = match guards.entry(job) {
                Entry::Occupied(o) => o.into_mut(),
                Entry::Vacant(v) => {
                    let at = jobs.binary_search(&job).expect("every job of the chunk was read");
                    v.insert(stored_guard(guard_kvs[at].as_ref(), job)?)
                }
            };
            guard.remove(&e.lease.run);
            end_record(&mut record, &e.end, now);
            compares.push(Compare::mod_revision(run_keys[i].clone(), CompareOp::Equal, record_rev));
            writes.push(TxnOp::put(run_keys[i].clone(), encode(&record), None));
            writes.push(TxnOp::delete(store.keys.alive(&e.lease.run), None));
            ended[i] = true;
        }
        if compares.is_empty() {
            return Ok(Some(ended));
        }
        for (job, (guard, guard_rev)) in &guards {
            compares.push(Compare::mod_revision(store.keys.guard(job), CompareOp::Equal, *guard_rev));
            writes.push(TxnOp::put(store.keys.guard(job), encode(guard), None));
        }
        debug_assert!(compares.len() <= TXN_OPS_MAX && writes.len() <= TXN_OPS_MAX);
        match commit(store, "a finish", Txn::new().when(compares).and_then(writes), reads()).await? {
            Ok(revision) => {
                for (guard, _) in guards.values() {
                    store.known.learn_guard(guard, revision);
                }
                for (e, _) in chunk.iter().zip(&ended).filter(|(_, ended)| **ended) {
                    store.forget(&e.lease.run);
                }
                return Ok(Some(ended));
            }
            Err(fresh) => found = fresh,
        }
    }
    Ok(None)
}

/// The records of `ids` that are still running; unreadable ones are logged and skipped, so
/// that one bad record never stops the recovery of the others.
pub(crate) async fn running_records(store: &EtcdStore, ids: &[RunId]) -> Result<Vec<RunRecord>, StoreError> {
    let answers = read_keys(store, ids.iter().map(|id| get(store.keys.run(id))).collect()).await?;
    let mut records = Vec::with_capacity(ids.len());
    for kv in answers.iter().flatten() {
        match decode::<StoredRun>(kv.value(), "run record").and_then(|r| r.to_record()) {
            Ok(record) if record.state == RunState::Running => records.push(record),
            Ok(_) => {}
            Err(e) => tracing::error!(error = %e, "skipping an unreadable running run"),
        }
    }
    Ok(records)
}

/// The recovery `Txn` of `run` from `answers` (its record, its alive key, its job's guard,
/// its next attempt's record); `None` if there is nothing to do: the run is neither
/// running nor waiting, its lease is live, its next attempt exists, or (waiting) it is not
/// due yet.
async fn plan_recovery(
    store: &EtcdStore,
    run: &RunId,
    next: &RunId,
    action: &RecoverAction,
    answers: &[Option<KeyValue>],
    granted: &mut Option<(i64, i64)>,
) -> Result<Option<Planned>, StoreError> {
    let keys = &store.keys;
    let Some((mut old, old_rev)) = stored_run(answers[0].as_ref())? else { return Ok(None) };
    if answers[1].is_some() {
        return Ok(None);
    }
    if old.is_waiting() {
        return plan_start(store, run, action, (old, old_rev), answers[2].as_ref(), granted).await;
    }
    if !old.is_running() {
        return Ok(None);
    }
    let (mut guard, guard_rev) = stored_guard(answers[2].as_ref(), &run.tick.job)?;
    let mut compares = vec![
        Compare::mod_revision(keys.run(run), CompareOp::Equal, old_rev),
        Compare::mod_revision(keys.guard(&run.tick.job), CompareOp::Equal, guard_rev),
        Compare::create_revision(keys.alive(run), CompareOp::Equal, 0),
    ];
    guard.remove(run);
    let (node, length) = match action {
        RecoverAction::Abandon { reason } => {
            old.end(RunState::Abandoned, Some(reason.clone()), now_ms());
            let puts = vec![
                TxnOp::put(keys.run(run), encode(&old), None),
                TxnOp::put(keys.guard(&run.tick.job), encode(&guard), None),
            ];
            return Ok(Some((Txn::new().when(compares).and_then(puts), RecoverOutcome::Abandoned, None)));
        }
        RecoverAction::Retry { node, lease } => (node, *lease),
    };
    if answers[3].is_some() {
        return Ok(None);
    }
    let (lease_id, now) = grant_once(store, granted, length).await?;
    old.end(RunState::Lost, Some(format!("lease expired; retried as attempt {} by {node}", next.attempt)), now);
    guard.token += 1;
    guard.add(next);
    let record = next_attempt(&old, next, node, guard.token, lease_id, length, now)?;
    compares.push(Compare::create_revision(keys.run(next), CompareOp::Equal, 0));
    let puts = vec![
        TxnOp::put(keys.run(run), encode(&old), None),
        TxnOp::put(keys.run(next), encode(&record), None),
        TxnOp::put(keys.alive(next), node.as_bytes(), Some(PutOptions::new().with_lease(lease_id))),
        TxnOp::put(keys.guard(&run.tick.job), encode(&guard), None),
    ];
    let outcome = RecoverOutcome::Retried(to_lease(&record)?);
    Ok(Some((Txn::new().when(compares).and_then(puts), outcome, Some(record))))
}

/// The record of a retry: attempt `next` of the same tick, running for `node`.
fn next_attempt(
    old: &StoredRun,
    next: &RunId,
    node: &str,
    token: u64,
    lease_id: i64,
    length: Duration,
    now: i64,
) -> Result<StoredRun, StoreError> {
    Ok(StoredRun {
        attempt: next.attempt,
        trigger: Trigger::Retry.as_str().into(),
        node: node.to_owned(),
        token: Some(token),
        state: RunState::Running.as_str().into(),
        reason: None,
        claimed_at: now,
        finished_at: None,
        lease_until: Some(now.saturating_add(millis(length))),
        lease_id: Some(lease_id),
        ttl: Some(lease_secs(length)?),
        // No claim created the retry: a nonce asked again never reaches it.
        nonce: None,
        ..old.clone()
    })
}
