//! Claims: a batch of ticks, in chunks of at most [`TXN_OPS_MAX`] operations, each chunk one
//! optimistic compare-and-swap `Txn`.
//!
//! Per chunk: one read (the jobs' guards and pause switches, and whether each tick's record
//! exists), one round of lease grants (concurrent, one lease per won run), one `Txn` whose
//! compares are "each new record is absent" and "each job's guard and switch are unchanged
//! since the read". If another node changed any of them in between, the `Txn` fails as a
//! whole, its `else` branch returns the same keys re-read, and the chunk is planned again
//! (bounded). Nothing is ever read-then-written without the compare.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use etcd_client::{Compare, CompareOp, GetOptions, KeyValue, PutOptions, Txn, TxnOp};
use solocron_core::{ClaimMode, ClaimOutcome, ClaimRequest, Lease, RunId, RunState, StoreError, Tick, Trigger};

use crate::codec::{decode, encode, Guard, StoredControl, StoredRun};
use crate::etcd::{gets, now_ms, revision, revoke_quietly, single, txn, TXN_OPS_MAX};
use crate::{lease_secs, EtcdStore, Held};

/// How many times a chunk is planned again after losing a compare to another node.
const CHUNK_ATTEMPTS: u32 = 24;

/// What one request comes to.
#[derive(Debug, Clone)]
enum Step {
    Taken,
    Skip(String),
    Win(u64),
}

/// What a chunk's read tells about one job.
#[derive(Debug, Clone)]
struct JobView {
    guard: Guard,
    /// Mod revision of the guard key; 0 if absent (a compare of an absent key's
    /// mod_revision sees 0, so "still absent" is the same compare).
    guard_rev: i64,
    paused: Option<String>,
    control_rev: i64,
}

/// What a chunk's read tells: per job, and which of the chunk's run records exist.
#[derive(Debug, Clone, Default)]
struct View {
    jobs: HashMap<String, JobView>,
    existing: HashSet<String>,
}

/// A lease granted for this batch: its id, and the client's clock just before the grant
/// was sent (etcd starts its TTL later, so `at + length` never outlasts the lease).
type Granted = (i64, i64);

/// Leases granted for this batch and not (yet) attached to a run, by TTL in seconds.
#[derive(Debug, Default)]
struct Spare(HashMap<i64, Vec<Granted>>);

impl Spare {
    /// Takes `count` leases of `ttl` seconds, granting what is missing.
    async fn take(&mut self, store: &EtcdStore, ttl: i64, count: usize) -> Result<Vec<Granted>, StoreError> {
        let pool = self.0.entry(ttl).or_default();
        let missing = count.saturating_sub(pool.len());
        if missing > 0 {
            let at = now_ms();
            let ids = crate::etcd::grant_many(&store.client, ttl, missing).await?;
            pool.extend(ids.into_iter().map(|id| (id, at)));
        }
        Ok(pool.split_off(pool.len() - count))
    }

    fn give_back(&mut self, ttl: i64, lease: Granted) {
        self.0.entry(ttl).or_default().push(lease);
    }

    async fn revoke(self, store: &EtcdStore) {
        revoke_quietly(&store.client, self.0.into_values().flatten().map(|(id, _)| id).collect()).await;
    }
}

/// Claims `requests` (see [`solocron_core::Store::claim`]).
pub(crate) async fn claim(store: &EtcdStore, requests: &[ClaimRequest]) -> Result<Vec<ClaimOutcome>, StoreError> {
    // Normalize to milliseconds, as every key and record keeps the tick.
    let requests: Vec<ClaimRequest> = requests
        .iter()
        .map(|r| ClaimRequest { tick: Tick::new(r.tick.job.clone(), r.tick.scheduled_at), ..r.clone() })
        .collect();
    let mut spare = Spare::default();
    let mut outcomes = Vec::with_capacity(requests.len());
    let mut start = 0;
    while start < requests.len() {
        let end = window_end(&requests, start);
        match claim_chunk(store, &requests[start..end], &mut spare).await {
            Ok(chunk) => outcomes.extend(chunk),
            Err(e) => {
                spare.revoke(store).await;
                return Err(e);
            }
        }
        start = end;
    }
    spare.revoke(store).await;
    Ok(outcomes)
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
/// tick's record (keys only: existence is all that matters).
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
        ops.push(TxnOp::get(store.keys.run(&first(&r.tick)), Some(GetOptions::new().with_keys_only())));
    }
    (jobs, ops)
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
        view.existing.insert(String::from_utf8_lossy(kv.key()).into_owned());
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
fn plan(store: &EtcdStore, chunk: &[ClaimRequest], view: &mut View) -> (Vec<Step>, HashSet<String>) {
    let mut steps = Vec::with_capacity(chunk.len());
    let mut depends = HashSet::new();
    for r in chunk {
        let id = first(&r.tick);
        if !view.existing.insert(store.keys.run(&id)) {
            steps.push(Step::Taken);
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

/// Plans and commits one chunk, again after each lost compare; its outcomes.
async fn claim_chunk(
    store: &EtcdStore,
    chunk: &[ClaimRequest],
    spare: &mut Spare,
) -> Result<Vec<ClaimOutcome>, StoreError> {
    let (jobs, ops) = read_ops(store, chunk);
    let mut answers = crate::etcd::read(&store.client, ops).await?;
    for attempt in 0..CHUNK_ATTEMPTS {
        let before = parse_view(&jobs, answers)?;
        let mut after = before.clone();
        let (steps, depends) = plan(store, chunk, &mut after);
        if steps.iter().all(|s| matches!(s, Step::Taken)) {
            return Ok(vec![ClaimOutcome::Taken; chunk.len()]);
        }
        let ttls = win_ttls(chunk, &steps)?;
        let granted = take_leases(store, spare, &ttls).await?;
        // The claim's instant: no later than any of its leases' grant, so that every
        // `lease_until` (an estimate) ends before etcd's TTL can.
        let now = granted.iter().map(|(_, at)| *at).chain([now_ms()]).min().expect("now at least");
        let leases: Vec<i64> = granted.iter().map(|(id, _)| *id).collect();
        let commit = Commit { store, chunk, steps: &steps, leases: &leases, now };
        let request = commit.txn(&before, &after, &depends).or_else(read_ops(store, chunk).1);
        let resp = txn(&store.client, "a claim", request).await?;
        if resp.succeeded() {
            return commit.outcomes(revision(&resp)?);
        }
        // Lost a compare: nothing was written, so the leases are still free.
        for (ttl, lease) in ttls.into_iter().zip(granted) {
            spare.give_back(ttl, lease);
        }
        answers = gets(&resp);
        backoff(attempt).await;
    }
    Err(StoreError::Unavailable(format!(
        "claim lost {CHUNK_ATTEMPTS} compare-and-swaps in a row to other nodes; try again"
    )))
}

/// The lease TTL (whole seconds) of each won step, in order.
fn win_ttls(chunk: &[ClaimRequest], steps: &[Step]) -> Result<Vec<i64>, StoreError> {
    chunk.iter().zip(steps).filter(|(_, s)| matches!(s, Step::Win(_))).map(|(r, _)| lease_secs(r.lease)).collect()
}

/// One lease per TTL in `ttls`, in the same order.
async fn take_leases(store: &EtcdStore, spare: &mut Spare, ttls: &[i64]) -> Result<Vec<Granted>, StoreError> {
    let mut wanted: HashMap<i64, usize> = HashMap::new();
    for ttl in ttls {
        *wanted.entry(*ttl).or_default() += 1;
    }
    let mut by_ttl = HashMap::new();
    for (ttl, count) in wanted {
        by_ttl.insert(ttl, spare.take(store, ttl, count).await?);
    }
    Ok(ttls.iter().map(|ttl| by_ttl.get_mut(ttl).and_then(Vec::pop).expect("taken above")).collect())
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
    /// The lease of each won step, in order.
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
            match step {
                Step::Taken => continue,
                Step::Skip(reason) => puts.push(TxnOp::put(key.clone(), encode(&self.skipped(r, reason)), None)),
                Step::Win(token) => {
                    let lease = *leases.next().expect("one lease per win");
                    puts.push(TxnOp::put(key.clone(), encode(&self.running(r, *token, lease)), None));
                    let alive = PutOptions::new().with_lease(lease);
                    puts.push(TxnOp::put(keys.alive(&id), r.node.as_bytes(), Some(alive)));
                    won_jobs.insert(r.tick.job.clone());
                }
            }
            compares.push(Compare::create_revision(key, CompareOp::Equal, 0));
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
        }
    }

    /// The outcomes of the committed chunk (applied at `revision`); remembers the won runs'
    /// leases so that their renewals skip a read.
    fn outcomes(&self, revision: i64) -> Result<Vec<ClaimOutcome>, StoreError> {
        let mut leases = self.leases.iter();
        let mut outcomes = Vec::with_capacity(self.chunk.len());
        for (r, step) in self.chunk.iter().zip(self.steps) {
            outcomes.push(match step {
                Step::Taken => ClaimOutcome::Taken,
                Step::Skip(reason) => ClaimOutcome::Skipped { reason: reason.clone() },
                Step::Win(token) => {
                    let record = self.running(r, *token, *leases.next().expect("one lease per win"));
                    let lease = to_lease(&record)?;
                    self.store.remember(Held { record, revision });
                    tracing::debug!(run = %lease.run, node = %lease.owner, token, "run claimed");
                    ClaimOutcome::Won(lease)
                }
            });
        }
        Ok(outcomes)
    }
}

/// A duration in milliseconds, saturated.
pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// The lease a running record stands for.
pub(crate) fn to_lease(record: &StoredRun) -> Result<Lease, StoreError> {
    let r = record.to_record()?;
    Ok(Lease {
        run: r.id,
        owner: r.node,
        fencing_token: r.fencing_token.ok_or_else(|| StoreError::Invalid("a running record has no token".into()))?,
        claimed_at: r.claimed_at,
        lease_until: r.lease_until.ok_or_else(|| StoreError::Invalid("a running record has no lease".into()))?,
    })
}
