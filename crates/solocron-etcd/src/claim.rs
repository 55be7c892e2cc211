//! Claims: a batch of ticks, in chunks of at most [`TXN_OPS_MAX`] operations, each chunk one
//! optimistic compare-and-swap `Txn`.
//!
//! Per chunk: one read (the jobs' guards and pause switches, and whether each tick's record
//! exists) and, at the same time, a keep-alive of the node's shared etcd lease for each
//! lease length the chunk may need (or a grant, see
//! [`LEASE_SHARE_WINDOW`](crate::leases::LEASE_SHARE_WINDOW); or nothing within
//! [`REUSE_WINDOW`](crate::leases::REUSE_WINDOW) of a confirmed one); then one `Txn`
//! whose compares are "each new record is absent" and "each job's guard and switch are
//! unchanged since the read". If another node changed any of them in between, the `Txn`
//! fails as a whole, its `else` branch returns the same keys re-read, and the chunk is
//! planned again (bounded). Nothing is ever read-then-written without the compare.
//!
//! **One round trip for short chunks.** A chunk of at most [`GUESS_MAX`] ticks whose jobs
//! this instance has seen (in an earlier claim's read or commit, or its own finish) skips the
//! read: it is planned from those remembered guards and switches, at their revisions, with
//! every record assumed absent ([`Known`](crate::memory::Known)), and its keep-alives go beside the `Txn` instead
//! of beside a read. The `Txn`'s compares are the same, so a stale guess can only fail it:
//! its `else` branch is the read, and the chunk is planned again from that as above. The
//! winner of a tick then pays one round trip instead of two; a node that loses the tick
//! pays a failed `Txn` (a Raft entry) where it paid a read, which is why long chunks, where
//! racing nodes mostly find ticks taken, keep the read. Chunks whose jobs are disjoint are claimed
//! concurrently, at most [`CHUNKS_IN_FLIGHT`] at once; chunks that share a job go one after
//! the other (they would only lose compares to each other).
//!
//! **A claim asked again.** A request finding its tick's record is taken, unless the record
//! is the `running` first attempt that the same node's claim with the same nonce created
//! (its answer lost on the way): that is granted again in the same `Txn`, which compares the
//! record's `mod_revision` instead of its absence and puts it with a fresh lease. Never
//! planned from memory (a guess assumes every record absent, so its `Txn` fails and the
//! re-read, which holds those records in full, plans it).

use async_trait::async_trait;
use solocron_core::ClaimStore;
use std::collections::{HashMap, HashSet};
use std::ops::Range;
use std::time::Duration;

use etcd_client::{Compare, CompareOp, GetOptions, KeyValue, PutOptions, Txn, TxnOp, TxnResponse};
use futures_util::{stream, StreamExt as _, TryStreamExt as _};
use solocron_core::{ClaimMode, ClaimOutcome, ClaimRequest, RunId, RunState, StoreError, Tick, Trigger};

use crate::codec::{decode, encode, millis, to_lease, Guard, StoredControl, StoredRun};
use crate::etcd::{get, gets, now_ms, read, revision, single, txn, TXN_OPS_MAX};
use crate::leases::{forget_leases, fresh_leases, lease_secs, ready_leases, refresh, Granted};
use crate::memory::{Held, JobView};
use crate::EtcdStore;

/// How many times a chunk is planned again after losing a compare to another node.
const CHUNK_ATTEMPTS: u32 = 24;

/// How many chunks of one batch are in flight at once (when their jobs are disjoint).
const CHUNKS_IN_FLIGHT: usize = 4;

/// The longest chunk claimed from what this instance remembers, without a read first (see
/// the module docs): the one-tick claims of spread-out schedules, not a herd's chunks.
const GUESS_MAX: usize = 8;

/// What one request comes to.
#[derive(Debug, Clone)]
enum Step {
    Taken,
    Skip(String),
    Win(u64),
    /// The request's own claim, asked again with its nonce: the record as read and its
    /// mod revision, which the `Txn` compares.
    Again(Box<StoredRun>, i64),
}

impl Step {
    /// True if the step hands out a run (and so needs a lease).
    fn holds(&self) -> bool {
        matches!(self, Step::Win(_) | Step::Again(..))
    }
}

/// What a chunk's read tells: per job, and which of the chunk's run records exist.
#[derive(Debug, Clone, Default)]
struct View {
    jobs: HashMap<String, JobView>,
    existing: HashSet<String>,
    /// By key, the existing records that a request of the chunk may be granted again
    /// (running, created by a claim with a nonce), with their mod revisions.
    records: HashMap<String, (StoredRun, i64)>,
}

#[async_trait]
impl ClaimStore for EtcdStore {
    /// Claims `requests` (see [`solocron_core::ClaimStore::claim`]).
    async fn claim(&self, requests: &[ClaimRequest]) -> Result<Vec<ClaimOutcome>, StoreError> {
        let store = self;
        // Normalize to milliseconds, as every key and record keeps the tick.
        let requests: Vec<ClaimRequest> = requests
            .iter()
            .map(|r| ClaimRequest { tick: Tick::new(r.tick.job.clone(), r.tick.scheduled_at), ..r.clone() })
            .collect();
        let mut windows = windows(&requests);
        let in_flight = if jobs_disjoint(&requests, &windows) {
            // Nodes racing for the same batch start at different chunks, so that each first
            // wins chunks of its own instead of all losing compares on the same ones (a chunk
            // found taken costs only its read).
            let node = requests.first().map_or("", |r| r.node.as_str());
            let first = solocron_core::spread_start(node, 0, windows.len());
            windows.rotate_left(first);
            CHUNKS_IN_FLIGHT
        } else {
            1
        };
        // A failure part-way leaves the chunks already committed won (see the crate docs).
        let requests = &requests;
        let mut chunks: Vec<(usize, Vec<ClaimOutcome>)> = stream::iter(windows)
            .map(|w| async move { claim_chunk(store, &requests[w.clone()]).await.map(|o| (w.start, o)) })
            .buffer_unordered(in_flight)
            .try_collect()
            .await?;
        chunks.sort_unstable_by_key(|(start, _)| *start);
        Ok(chunks.into_iter().flat_map(|(_, o)| o).collect())
    }

    /// Those of `ticks` that are taken (see [`solocron_core::ClaimStore::taken_ticks`]): read-only
    /// `Txn`s of one `Get` of each tick's attempt 1 (no write, no raft entry), where a claim
    /// that finds its tick taken is a `Txn` with a compare per key and the job's guard.
    async fn taken_ticks(&self, ticks: &[Tick]) -> Result<Option<Vec<Tick>>, StoreError> {
        let store = self;
        let key = |t: &Tick| store.keys.run(&first(t));
        let found = read(&store.client, ticks.iter().map(|t| get(key(t))).collect()).await?;
        if found.len() != ticks.len() {
            return Err(StoreError::Invalid(format!("{} answers to {} reads", found.len(), ticks.len())));
        }
        Ok(Some(ticks.iter().zip(found).filter(|(_, kvs)| !kvs.is_empty()).map(|(t, _)| t.clone()).collect()))
    }
}

/// The batch cut into chunks that each fit one `Txn`.
fn windows(requests: &[ClaimRequest]) -> Vec<Range<usize>> {
    let mut windows = Vec::new();
    let mut start = 0;
    while start < requests.len() {
        let end = window_end(requests, start);
        windows.push(start..end);
        start = end;
    }
    windows
}

/// Whether no job has ticks in two chunks.
fn jobs_disjoint(requests: &[ClaimRequest], windows: &[Range<usize>]) -> bool {
    let mut owner: HashMap<&str, usize> = HashMap::new();
    windows
        .iter()
        .enumerate()
        .all(|(i, w)| requests[w.clone()].iter().all(|r| *owner.entry(r.tick.job.as_str()).or_insert(i) == i))
}

/// The end of the chunk starting at `start`: as many requests as fit one `Txn` in the worst
/// case (all won), with one compare and two puts per tick (record, alive key) plus two
/// compares and one put per job (guard, switch).
fn window_end(requests: &[ClaimRequest], start: usize) -> usize {
    let mut jobs = HashSet::new();
    let mut end = start;
    while end < requests.len() {
        let new_job = !jobs.contains(requests[end].tick.job.as_str());
        let (n, j) = (end - start + 1, jobs.len() + usize::from(new_job));
        if n + 2 * j > TXN_OPS_MAX || 2 * n + j > TXN_OPS_MAX {
            break;
        }
        jobs.insert(requests[end].tick.job.as_str());
        end += 1;
    }
    end
}

/// The keys a chunk's plan depends on, as `Get`s: each job's guard and switch, then each
/// tick's record: keys only (existence is all that matters), but in full for a request
/// that may ask again for its own claim ([`asks_again`]). Reading those values in the same
/// read costs a node that finds ticks taken (the usual loser of a race) bytes, not a round
/// trip, and a tick with no record yet nothing at all.
fn read_ops(store: &EtcdStore, chunk: &[ClaimRequest]) -> (Vec<String>, Vec<TxnOp>) {
    let mut jobs: Vec<String> = chunk.iter().map(|r| r.tick.job.clone()).collect();
    jobs.sort();
    jobs.dedup();
    let mut ops = Vec::with_capacity(jobs.len() * 2 + chunk.len());
    for job in &jobs {
        ops.push(TxnOp::get(store.keys.guard(job), None));
        ops.push(TxnOp::get(store.keys.control(job), None));
    }
    for r in chunk {
        let options = (!asks_again(r)).then(|| GetOptions::new().with_keys_only());
        ops.push(TxnOp::get(store.keys.run(&first(&r.tick)), options));
    }
    (jobs, ops)
}

/// True if `r` may be granted again the run its own earlier claim won: a `Run` request
/// with a nonce (see [`solocron_core::ClaimRequest::nonce`]).
fn asks_again(r: &ClaimRequest) -> bool {
    r.nonce != 0 && matches!(r.mode, ClaimMode::Run { .. })
}

/// The view from the answers to [`read_ops`].
fn parse_view(jobs: &[String], mut answers: Vec<Vec<KeyValue>>) -> Result<View, StoreError> {
    let records = answers.split_off(jobs.len() * 2);
    let mut view = View::default();
    let mut answers = answers.into_iter();
    for job in jobs {
        let (guard_kv, control_kv) = (answers.next().and_then(single), answers.next().and_then(single));
        let (guard, guard_rev) = match guard_kv {
            Some(kv) => (decode::<Guard>(kv.value(), "job guard")?, kv.mod_revision()),
            None => (Guard::new(job), 0),
        };
        let (paused, control_rev) = match control_kv {
            Some(kv) => (decode::<StoredControl>(kv.value(), "job control")?.pause_reason(), kv.mod_revision()),
            None => (None, 0),
        };
        view.jobs.insert(job.clone(), JobView { guard, guard_rev, paused, control_rev });
    }
    for kv in records.into_iter().flatten() {
        let key = String::from_utf8_lossy(kv.key()).into_owned();
        // Keys-only answers have no value; a full one is kept if it may be granted again.
        if !kv.value().is_empty() {
            match decode::<StoredRun>(kv.value(), "run record") {
                Ok(record) if record.is_running() && record.nonce.is_some() => {
                    view.records.insert(key.clone(), (record, kv.mod_revision()));
                }
                Ok(_) => {}
                // The tick is taken either way; one bad record must not fail the batch.
                Err(e) => tracing::error!(error = %e, key, "an unreadable run record: its tick stays taken"),
            }
        }
        view.existing.insert(key);
    }
    Ok(view)
}

/// Attempt 1 of a tick: the record a claim creates.
fn first(tick: &Tick) -> RunId {
    RunId { tick: tick.clone(), attempt: 1 }
}

/// Decides each request of the chunk in order, each seeing the effect of the earlier ones
/// (a duplicate tick is taken, a second won tick of a job gets the next token, an overlap
/// check sees the chunk's own running runs). Updates `view` to the state after the chunk;
/// returns the steps and the jobs whose guard or switch the decisions read.
///
/// A request for an existing record is taken, unless it asks again for its own claim's
/// run, still running ([`StoredRun::claimed_with`]): that is granted again, whatever the
/// pause and overlap (the running run is that very claim), and needs nothing but the
/// record's own compare. Later requests of its job see it running through the guard, which
/// lists every running run.
fn plan(store: &EtcdStore, chunk: &[ClaimRequest], view: &mut View) -> (Vec<Step>, HashSet<String>) {
    let mut steps = Vec::with_capacity(chunk.len());
    let mut depends = HashSet::new();
    for r in chunk {
        let id = first(&r.tick);
        let key = store.keys.run(&id);
        if !view.existing.insert(key.clone()) {
            steps.push(existing(view, r, &key));
            continue;
        }
        let skip_if_running = match &r.mode {
            ClaimMode::Skip { reason } => {
                steps.push(Step::Skip(reason.clone()));
                continue;
            }
            ClaimMode::Run { skip_if_running } => *skip_if_running,
        };
        depends.insert(r.tick.job.clone());
        let job = view.jobs.get_mut(&r.tick.job).expect("every job of the chunk was read");
        // An operator's manual run is the way to run a paused job once: it ignores the pause.
        let paused = job.paused.clone().filter(|_| r.trigger != Trigger::Manual);
        let overlap = job.guard.newest_running().ok().flatten().filter(|_| skip_if_running);
        steps.push(match (paused, overlap) {
            (Some(reason), _) => Step::Skip(reason),
            (None, Some(running)) => Step::Skip(format!("overlap: previous run {running} still running")),
            (None, None) => {
                job.guard.token += 1;
                job.guard.add(&id);
                Step::Win(job.guard.token)
            }
        });
    }
    (steps, depends)
}

/// The step of `r`, whose tick's record (at `key`) exists: granted again if it asks again
/// for its own claim's run, still running; taken otherwise.
fn existing(view: &mut View, r: &ClaimRequest, key: &str) -> Step {
    let mine = view.records.get(key).is_some_and(|(record, _)| asks_again(r) && record.claimed_with(&r.node, r.nonce));
    if !mine {
        return Step::Taken;
    }
    // Granted once: out of the view, so that a duplicate of the request in the batch is taken.
    let (record, revision) = view.records.remove(key).expect("found just above");
    Step::Again(Box::new(record), revision)
}

/// Plans and commits one chunk, again after each lost compare; its outcomes.
async fn claim_chunk(store: &EtcdStore, chunk: &[ClaimRequest]) -> Result<Vec<ClaimOutcome>, StoreError> {
    let ttls = run_ttls(chunk)?;
    let result = plan_and_commit(store, chunk, &ttls).await;
    if result.is_err() {
        forget_leases(store, &ttls);
    }
    result
}

/// The loop of [`claim_chunk`], for a chunk whose runs may need leases of `ttls`.
async fn plan_and_commit(
    store: &EtcdStore,
    chunk: &[ClaimRequest],
    ttls: &[i64],
) -> Result<Vec<ClaimOutcome>, StoreError> {
    let (jobs, ops) = read_ops(store, chunk);
    // The same reads serve as every try's `else` branch.
    let guess = (chunk.len() <= GUESS_MAX).then(|| store.known.guess(&jobs)).flatten();
    let guess = guess.map(|jobs| View { jobs, ..View::default() });
    let (mut before, mut leases, mut beside) = match guess.zip(ready_leases(store, ttls)) {
        // One round trip: plan from memory; the keep-alives go beside the `Txn`.
        Some((view, (leases, beside))) => (view, leases, Some(beside).filter(|b| !b.is_empty())),
        // Two: the leases are made ready while the chunk is read.
        None => {
            let (answers, leases) = tokio::try_join!(read(&store.client, ops.clone()), fresh_leases(store, ttls))?;
            let view = parse_view(&jobs, answers)?;
            store.known.learn(&view.jobs);
            (view, leases, None)
        }
    };
    for attempt in 0..CHUNK_ATTEMPTS {
        let mut after = before.clone();
        let (steps, depends) = plan(store, chunk, &mut after);
        if steps.iter().all(|s| matches!(s, Step::Taken)) {
            return Ok(vec![ClaimOutcome::Taken; chunk.len()]);
        }
        let granted: Vec<Granted> = held_ttls(chunk, &steps)?.iter().map(|t| leases[t]).collect();
        // The claim's instant: no later than any of its leases' refresh, so that every
        // `lease_until` (an estimate) ends before etcd's TTL can (but for a reused
        // keep-alive's few milliseconds, see `leases::REUSE_WINDOW`).
        let now = granted.iter().map(|(_, at)| *at).chain([now_ms()]).min().expect("now at least");
        let won: Vec<i64> = granted.iter().map(|(id, _)| *id).collect();
        let commit = Commit { store, chunk, steps: &steps, leases: &won, now };
        let request = commit.txn(&before, &after, &depends).or_else(ops.clone());
        let resp = send(store, request, beside.take(), ttls, &mut leases).await?;
        if resp.succeeded() {
            let revision = revision(&resp)?;
            store.known.learn_jobs(depends.iter().map(|job| {
                let mut view = after.jobs[job].clone();
                if steps.iter().zip(chunk).any(|(s, r)| matches!(s, Step::Win(_)) && r.tick.job == *job) {
                    view.guard_rev = revision;
                }
                (job.clone(), view)
            }));
            return commit.outcomes(revision);
        }
        // Lost a compare (or guessed stale): nothing was written; plan again from what the
        // `Txn` re-read.
        before = parse_view(&jobs, gets(&resp))?;
        store.known.learn(&before.jobs);
        backoff(attempt).await;
    }
    Err(StoreError::Unavailable(format!(
        "claim lost {CHUNK_ATTEMPTS} compare-and-swaps in a row to other nodes; try again"
    )))
}

/// Sends a chunk's `Txn`, with the keep-alives of the leases `beside` (see
/// [`ready_leases`]) at the same time, if any. When the `Txn` failed (nothing written),
/// `leases` are made sure of again for the next plan.
async fn send(
    store: &EtcdStore,
    request: Txn,
    beside: Option<HashMap<i64, i64>>,
    ttls: &[i64],
    leases: &mut HashMap<i64, Granted>,
) -> Result<TxnResponse, StoreError> {
    let Some(beside) = beside else { return txn(&store.client, "a claim", request).await };
    let (resp, refreshed) = tokio::join!(txn(&store.client, "a claim", request), refresh(store, &beside));
    let resp = resp?;
    // No run is reported won before etcd confirmed its lease's keep-alive (sent after the
    // instant its `lease_until` counts from). A `Txn` that wrote runs cannot be undone, so a
    // keep-alive lost in transit is sent once more rather than leaving them unrun until
    // recovered.
    let refreshed = match refreshed {
        Err(_) if resp.succeeded() => refresh(store, &beside).await,
        other => other,
    };
    match (resp.succeeded(), refreshed) {
        (_, Ok(true)) => {}
        (true, Ok(false)) => {
            return Err(StoreError::Unavailable("the node's etcd lease expired while claiming; try again".into()))
        }
        (true, Err(e)) => return Err(e),
        // Nothing was written: plan again on leases made sure of.
        (false, _) => *leases = fresh_leases(store, ttls).await?,
    }
    Ok(resp)
}

/// The distinct lease TTLs (whole seconds) of the chunk's requests that may win a run.
fn run_ttls(chunk: &[ClaimRequest]) -> Result<Vec<i64>, StoreError> {
    let mut ttls = chunk
        .iter()
        .filter(|r| matches!(r.mode, ClaimMode::Run { .. }))
        .map(|r| lease_secs(r.lease))
        .collect::<Result<Vec<_>, _>>()?;
    ttls.sort_unstable();
    ttls.dedup();
    Ok(ttls)
}

/// The lease TTL (whole seconds) of each step that hands out a run, in order.
fn held_ttls(chunk: &[ClaimRequest], steps: &[Step]) -> Result<Vec<i64>, StoreError> {
    chunk.iter().zip(steps).filter(|(_, s)| s.holds()).map(|(r, _)| lease_secs(r.lease)).collect()
}

/// A short, growing, jittered pause after a lost compare, so that nodes racing in lockstep
/// drift apart.
async fn backoff(attempt: u32) {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(attempt);
    let ms = h.finish() % (2 + u64::from(attempt.min(10)) * 2);
    tokio::time::sleep(Duration::from_millis(ms)).await;
}

/// One chunk's planned writes.
struct Commit<'a> {
    store: &'a EtcdStore,
    chunk: &'a [ClaimRequest],
    steps: &'a [Step],
    /// The lease of each step that hands out a run, in order.
    leases: &'a [i64],
    now: i64,
}

impl Commit<'_> {
    /// The `Txn`: compares on everything the plan read, puts of what it decided.
    fn txn(&self, before: &View, after: &View, depends: &HashSet<String>) -> Txn {
        let keys = &self.store.keys;
        let (mut compares, mut puts) = (Vec::new(), Vec::new());
        let mut leases = self.leases.iter();
        let mut won_jobs = HashSet::new();
        for (r, step) in self.chunk.iter().zip(self.steps) {
            let id = first(&r.tick);
            let key = keys.run(&id);
            let absent = Compare::create_revision(key.clone(), CompareOp::Equal, 0);
            let (compare, record) = match step {
                Step::Taken => continue,
                Step::Skip(reason) => (absent, self.skipped(r, reason)),
                Step::Win(_) => {
                    won_jobs.insert(r.tick.job.clone());
                    (absent, self.held(r, step, &mut leases).expect("a won step holds a run"))
                }
                // Untouched since read: no finish, renewal or recovery came in between.
                Step::Again(_, revision) => (
                    Compare::mod_revision(key.clone(), CompareOp::Equal, *revision),
                    self.held(r, step, &mut leases).expect("a step asked again holds a run"),
                ),
            };
            compares.push(compare);
            puts.push(TxnOp::put(key, encode(&record), None));
            // A held run's alive key goes on its (fresh) etcd lease.
            if let Some(lease) = record.lease_id {
                puts.push(TxnOp::put(keys.alive(&id), r.node.as_bytes(), Some(PutOptions::new().with_lease(lease))));
            }
        }
        for job in depends {
            let view = &before.jobs[job];
            compares.push(Compare::mod_revision(keys.guard(job), CompareOp::Equal, view.guard_rev));
            compares.push(Compare::mod_revision(keys.control(job), CompareOp::Equal, view.control_rev));
        }
        for job in won_jobs {
            puts.push(TxnOp::put(keys.guard(&job), encode(&after.jobs[&job].guard), None));
        }
        Txn::new().when(compares).and_then(puts)
    }

    /// The running record `step` writes, if it hands out a run, on the next of `leases`.
    fn held(&self, r: &ClaimRequest, step: &Step, leases: &mut std::slice::Iter<'_, i64>) -> Option<StoredRun> {
        let mut lease = || *leases.next().expect("one lease per held run");
        match step {
            Step::Win(token) => Some(self.running(r, *token, lease())),
            Step::Again(found, _) => Some(self.again(r, found, lease())),
            Step::Taken | Step::Skip(_) => None,
        }
    }

    /// The record of a tick recorded skipped.
    fn skipped(&self, r: &ClaimRequest, reason: &str) -> StoredRun {
        StoredRun {
            state: RunState::Skipped.as_str().into(),
            reason: Some(reason.to_owned()),
            finished_at: Some(self.now),
            ..self.base(r)
        }
    }

    /// The record of a won tick.
    fn running(&self, r: &ClaimRequest, token: u64, lease: i64) -> StoredRun {
        StoredRun {
            token: Some(token),
            lease_until: Some(self.now.saturating_add(millis(r.lease))),
            lease_id: Some(lease),
            ttl: lease_secs(r.lease).ok(),
            ..self.base(r)
        }
    }

    /// The record of a claim asked again with its nonce: as found, with a fresh lease
    /// counted like a won tick's (the same token, the original `claimed_at`).
    fn again(&self, r: &ClaimRequest, found: &StoredRun, lease: i64) -> StoredRun {
        StoredRun {
            lease_until: Some(self.now.saturating_add(millis(r.lease))),
            lease_id: Some(lease),
            ttl: lease_secs(r.lease).ok(),
            ..found.clone()
        }
    }

    fn base(&self, r: &ClaimRequest) -> StoredRun {
        StoredRun {
            job: r.tick.job.clone(),
            scheduled_at: r.tick.scheduled_at.timestamp_millis(),
            attempt: 1,
            trigger: r.trigger.as_str().into(),
            node: r.node.clone(),
            token: None,
            state: RunState::Running.as_str().into(),
            reason: None,
            claimed_at: self.now,
            started_at: None,
            finished_at: None,
            lease_until: None,
            exit_code: None,
            output: String::new(),
            lease_id: None,
            ttl: None,
            nonce: (r.nonce != 0).then_some(r.nonce),
        }
    }

    /// The outcomes of the committed chunk (applied at `revision`); remembers the won runs'
    /// leases so that their renewals skip a read.
    fn outcomes(&self, revision: i64) -> Result<Vec<ClaimOutcome>, StoreError> {
        let mut leases = self.leases.iter();
        let mut outcomes = Vec::with_capacity(self.chunk.len());
        for (r, step) in self.chunk.iter().zip(self.steps) {
            outcomes.push(match (step, self.held(r, step, &mut leases)) {
                (_, Some(record)) => {
                    let lease = to_lease(&record)?;
                    self.store.remember(Held { record, revision });
                    let (token, again) = (lease.fencing_token, matches!(step, Step::Again(..)));
                    tracing::debug!(run = %lease.run, node = %lease.owner, token, again, "run claimed");
                    ClaimOutcome::Won(lease)
                }
                (Step::Skip(reason), None) => ClaimOutcome::Skipped { reason: reason.clone() },
                (_, None) => ClaimOutcome::Taken,
            });
        }
        Ok(outcomes)
    }
}
