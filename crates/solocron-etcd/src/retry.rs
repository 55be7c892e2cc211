//! Failure retries: a failed run's next attempt waits in the store as a `waiting` record
//! until its not-before, then one node starts it (or drops it) through `recover`.
//!
//! [`finish_for_retry`] is one `Txn`, the finish's (the run's record compared at the
//! revision read, its alive key deleted, the guard compared and put without the run) plus
//! the next attempt's record, created `waiting` (its absence compared), and its index key
//! `{p}wait/{not_before}/...` whose value is the record's key. The index is written and
//! deleted in the same `Txn`s as the record's state, so it lists exactly the waiting
//! retries, ordered by their not-before: [`due_waiting`] reads only the due ones, and
//! `prune` keeps their records. Waiting retries are never in a guard's running runs, so
//! overlap checks and the runs in progress do not see them.
//!
//! etcd has no clock: the not-before is this process's clock at the finish plus the
//! backoff, and a retry is due once a node's clock passes it. A node's clock skew moves
//! when it may start a retry, never who does: starting one is a `Txn` comparing the
//! record's revision, which exactly one recoverer wins.

use std::time::Duration;

use etcd_client::{Compare, CompareOp, GetOptions, KeyValue, PutOptions, Txn, TxnOp};
use solocron_core::{
    Lease, Namespaces, RecoverAction, RecoverOutcome, RunEnd, RunId, RunRecord, RunState, StoreError, Trigger,
};

use crate::cas::{commit, contended, read_keys, stored_guard, stored_run, CAS_ATTEMPTS};
use crate::codec::{decode, encode, end_record, instant, millis, to_lease, Guard, StoredRun};
use crate::etcd::{get, now_ms, range};
use crate::keys::key_served;
use crate::leases::{grant_once, lease_secs};
use crate::EtcdStore;

/// Due retries' index keys one read of [`due_waiting`] takes when it passes over other
/// namespaces' (their values are run keys: some 100 bytes each).
const WAITS_PAGE: usize = 500;

/// A planned recovery: its `Txn`, its outcome and (when it starts a run) the new running
/// record.
pub(crate) type Planned = (Txn, RecoverOutcome, Option<StoredRun>);

/// The attempt after `run`'s, of the same tick.
pub(crate) fn next_of(run: &RunId) -> Result<RunId, StoreError> {
    let attempt =
        run.attempt.checked_add(1).ok_or_else(|| StoreError::Invalid(format!("run {run} has no next attempt")))?;
    Ok(RunId { tick: run.tick.clone(), attempt })
}

/// Records a failed run's end and creates its next attempt, `waiting` until the client's
/// clock passes now + `after` (see [`solocron_core::RunStore::finish_for_retry`]): a read of
/// the record, the guard and the next attempt's record, then one `Txn` (again per lost
/// compare, bounded). `false`, with nothing written, unless the lease still holds the run.
///
/// # Panics
///
/// If `end.state` is not terminal: a bug in the caller.
pub(crate) async fn finish_for_retry(
    store: &EtcdStore,
    lease: &Lease,
    end: &RunEnd,
    after: Duration,
) -> Result<bool, StoreError> {
    assert!(end.state.is_terminal(), "a run cannot finish as `{}`", end.state);
    let (run, next) = (&lease.run, next_of(&lease.run)?);
    let keys = &store.keys;
    let reads = || vec![get(keys.run(run)), get(keys.guard(&run.tick.job)), get(keys.run(&next))];
    let mut answers = read_keys(store, reads()).await?;
    for _ in 0..CAS_ATTEMPTS {
        let Some((request, guard)) = plan_finish(store, lease, end, after, &next, &answers)? else {
            store.forget(run);
            return Ok(false);
        };
        match commit(store, "a finish for a retry", request, reads()).await? {
            Ok(revision) => {
                store.known.learn_guard(&guard, revision);
                store.forget(run);
                tracing::debug!(%run, retry = %next, ?after, "run finished for a retry");
                return Ok(true);
            }
            Err(fresh) => answers = fresh,
        }
    }
    Err(contended("finish_for_retry"))
}

/// The `Txn` of [`finish_for_retry`] from `answers` (the run's record, its job's guard, the
/// next attempt's record) and the guard it writes; `None` if the lease no longer holds the
/// run.
fn plan_finish(
    store: &EtcdStore,
    lease: &Lease,
    end: &RunEnd,
    after: Duration,
    next: &RunId,
    answers: &[Option<KeyValue>],
) -> Result<Option<(Txn, Guard)>, StoreError> {
    let (keys, run) = (&store.keys, &lease.run);
    let Some((mut record, record_rev)) = stored_run(answers[0].as_ref())? else { return Ok(None) };
    if !record.held_by(&lease.owner, lease.fencing_token) {
        return Ok(None);
    }
    if answers[2].is_some() {
        return Err(StoreError::Invalid(format!("run {run} still runs, but its next attempt {next} already exists")));
    }
    let (mut guard, guard_rev) = stored_guard(answers[1].as_ref(), &run.tick.job)?;
    guard.remove(run);
    let now = now_ms();
    let not_before = now.saturating_add(millis(after));
    instant(not_before).map_err(|_| StoreError::Invalid(format!("a retry backoff of {after:?} is out of range")))?;
    let waiting = waiting_record(&record, next, now, not_before);
    end_record(&mut record, end, now);
    let compares = vec![
        Compare::mod_revision(keys.run(run), CompareOp::Equal, record_rev),
        Compare::mod_revision(keys.guard(&run.tick.job), CompareOp::Equal, guard_rev),
        Compare::create_revision(keys.run(next), CompareOp::Equal, 0),
    ];
    let writes = vec![
        TxnOp::put(keys.run(run), encode(&record), None),
        TxnOp::delete(keys.alive(run), None),
        TxnOp::put(keys.guard(&run.tick.job), encode(&guard), None),
        TxnOp::put(keys.run(next), encode(&waiting), None),
        TxnOp::put(keys.wait(not_before, next), keys.run(next), None),
    ];
    Ok(Some((Txn::new().when(compares).and_then(writes), guard)))
}

/// The `waiting` record of attempt `next` after `ran` (the same tick and node): trigger
/// `retry`, no token, no lease, claimed `now`, due at `not_before`.
fn waiting_record(ran: &StoredRun, next: &RunId, now: i64, not_before: i64) -> StoredRun {
    StoredRun {
        job: ran.job.clone(),
        scheduled_at: ran.scheduled_at,
        attempt: next.attempt,
        trigger: Trigger::Retry.as_str().into(),
        node: ran.node.clone(),
        token: None,
        state: RunState::Waiting.as_str().into(),
        reason: None,
        claimed_at: now,
        started_at: None,
        finished_at: None,
        lease_until: Some(not_before),
        exit_code: None,
        output: String::new(),
        lease_id: None,
        ttl: None,
        // No claim created it: a claim asked again with a nonce never reaches it.
        nonce: None,
    }
}

/// The recovery of `run`, a `waiting` retry (its record and revision in `waiting`): `None`
/// unless its not-before has passed by this process's clock. `Retry` starts it: `running`
/// for the node, the job's next token (the guard compared and put), a fresh etcd lease for
/// its alive key, as a recovery's retry of a running run has. `Abandon` ends it
/// `abandoned` (the guard untouched: it holds no token). Either deletes its index key; the
/// record's compare makes exactly one recoverer win.
pub(crate) async fn plan_start(
    store: &EtcdStore,
    run: &RunId,
    action: &RecoverAction,
    waiting: (StoredRun, i64),
    guard_kv: Option<&KeyValue>,
    granted: &mut Option<(i64, i64)>,
) -> Result<Option<Planned>, StoreError> {
    let (keys, (mut record, record_rev)) = (&store.keys, waiting);
    let Some(not_before) = record.lease_until.filter(|at| *at <= now_ms()) else { return Ok(None) };
    let mut compares = vec![
        Compare::mod_revision(keys.run(run), CompareOp::Equal, record_rev),
        Compare::create_revision(keys.alive(run), CompareOp::Equal, 0),
    ];
    let mut writes = vec![TxnOp::delete(keys.wait(not_before, run), None)];
    let (node, length) = match action {
        RecoverAction::Abandon { reason } => {
            record.end(RunState::Abandoned, Some(reason.clone()), now_ms());
            writes.push(TxnOp::put(keys.run(run), encode(&record), None));
            return Ok(Some((Txn::new().when(compares).and_then(writes), RecoverOutcome::Abandoned, None)));
        }
        RecoverAction::Retry { node, lease } => (node, *lease),
    };
    let (mut guard, guard_rev) = stored_guard(guard_kv, &run.tick.job)?;
    let (lease_id, now) = grant_once(store, granted, length).await?;
    guard.token += 1;
    guard.add(run);
    let started = StoredRun {
        node: node.clone(),
        token: Some(guard.token),
        state: RunState::Running.as_str().into(),
        claimed_at: now,
        lease_until: Some(now.saturating_add(millis(length))),
        lease_id: Some(lease_id),
        ttl: Some(lease_secs(length)?),
        ..record
    };
    compares.push(Compare::mod_revision(keys.guard(&run.tick.job), CompareOp::Equal, guard_rev));
    writes.extend([
        TxnOp::put(keys.run(run), encode(&started), None),
        TxnOp::put(keys.alive(run), node.as_bytes(), Some(PutOptions::new().with_lease(lease_id))),
        TxnOp::put(keys.guard(&run.tick.job), encode(&guard), None),
    ]);
    let outcome = RecoverOutcome::Retried(to_lease(&started)?);
    Ok(Some((Txn::new().when(compares).and_then(writes), outcome, Some(started))))
}

/// At most `limit` `waiting` retries of jobs in `namespaces` due by this process's clock,
/// oldest not-before first: reads of the index keys before now (at etcd revision `at`, 0
/// for the newest), then one of their records. For every namespace, one read of `limit`
/// index keys; for some, pages of [`WAITS_PAGE`] keys until `limit` of theirs are found or
/// the due ones run out, other namespaces' passed over by their keys. Unreadable records are
/// logged and skipped, so that one bad record never stops the others' recovery.
pub(crate) async fn due_waiting(
    store: &EtcdStore,
    at: i64,
    limit: usize,
    namespaces: &Namespaces,
) -> Result<Vec<RunRecord>, StoreError> {
    // etcd reads a limit of 0 as no limit.
    if limit == 0 {
        return Ok(Vec::new());
    }
    let now = now_ms();
    let (mut start, runs, end) = (store.keys.family("wait"), store.keys.family("run"), store.keys.waits_due_end(now));
    let page = if namespaces.names().is_none() { limit } else { WAITS_PAGE };
    let page = i64::try_from(page).unwrap_or(i64::MAX);
    let mut reads = Vec::new();
    while reads.len() < limit {
        let options = GetOptions::new().with_range(end.clone()).with_limit(page).with_revision(at);
        let index = range(&store.client, "an expiry read", &start, options).await?;
        for kv in index.kvs() {
            let Some(key) = std::str::from_utf8(kv.value()).ok().filter(|key| key.starts_with(&runs)) else {
                tracing::error!(key = %String::from_utf8_lossy(kv.key()), "skipping a malformed retry index key");
                continue;
            };
            if key_served(namespaces, key.as_bytes()) && reads.len() < limit {
                reads.push(get(key));
            }
        }
        match index.kvs().last() {
            Some(last) if index.more() => start = format!("{}\0", String::from_utf8_lossy(last.key())),
            _ => break,
        }
    }
    let mut records = Vec::with_capacity(reads.len());
    for kv in read_keys(store, reads).await?.iter().flatten() {
        match decode::<StoredRun>(kv.value(), "run record").and_then(|r| r.to_record()) {
            Ok(r) if r.state == RunState::Waiting && r.lease_until.is_some_and(|t| t.timestamp_millis() <= now) => {
                records.push(r)
            }
            Ok(_) => {}
            Err(e) => tracing::error!(error = %e, "skipping an unreadable waiting retry"),
        }
    }
    Ok(records)
}
