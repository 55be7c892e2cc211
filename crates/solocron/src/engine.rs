//! Claiming ticks and starting claimed runs: the node's shared state ([`Engine`]), the one
//! constructor of a claim request ([`Engine::request`]), the claim round trip, and the one
//! door through which every claimed run starts ([`Engine::start`]): on time, catch-up,
//! manual, retry and `run_here` alike.
//!
//! The engine never decides who may run a tick: the store's claim does. It decides what to
//! ask for and what to do with the answer.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use solocron_core::{
    ClaimMode, ClaimOutcome, ClaimRequest, Clock, Lease, NodeStore, Overlap, RunId, RunState, StoreError, Tick,
    Trigger, CLAIM_BATCH_MAX, LATE_TOLERANCE,
};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::batches::Batches;
use crate::ends::Ends;
use crate::job::Job;
use crate::jobset::{JobSet, Jobs};
use crate::lead::CLAIM_AHEAD_MAX;
use crate::metrics::{self, StoreOp};
use crate::retry::RetryWakes;
use crate::runner::{execute, Claimed, Env};
use crate::spread::Spread;
use crate::store_call::{counted, STORE_CALL_TIMEOUT};
use crate::store_clock::StoreClock;
use crate::unanswered::UnansweredClaims;

/// A node's shared state: its jobs, its store and batchers, and its running runs.
pub(crate) struct Engine {
    pub(crate) store: Arc<dyn NodeStore>,
    /// Where runs' lease renewals and ends go to be sent in batches.
    pub(crate) batches: Batches,
    pub(crate) node: String,
    pub(crate) clock: Arc<dyn Clock>,
    /// `clock` is the system clock, whose steps the kernel announces.
    pub(crate) system_clock: bool,
    /// The store's clock as this node estimates it: what [`Engine::now`] follows.
    pub(crate) store_clock: StoreClock,
    /// The job list, replaceable while the node runs.
    pub(crate) jobs: Jobs,
    pub(crate) history_retention: Option<Duration>,
    pub(crate) shutdown_grace: Duration,
    pub(crate) max_concurrent_runs: usize,
    pub(crate) recovery_interval: Duration,
    in_flight: Arc<AtomicUsize>,
    /// This node's claims that went unanswered, asked again with their nonce.
    pub(crate) unanswered: UnansweredClaims,
    /// This node's view of the fleet: which ticks it claims first, which as a backup.
    pub(crate) spread: Spread,
    /// When the failure retries this node planned come due (its recovery scan wakes then).
    pub(crate) retry_wakes: RetryWakes,
    /// Whether a claim refused as too early was warned of (once; then the metric counts).
    pub(crate) too_early_warned: AtomicBool,
    /// Where the ends this node records are announced (alerts listen: `ends.rs`).
    pub(crate) ends: Ends,
    pub(crate) tracker: TaskTracker,
    /// Fired when shutdown's grace is over: running jobs are stopped.
    pub(crate) interrupt: CancellationToken,
}

/// What an [`Engine`] is made of; see [`Engine::new`].
pub(crate) struct Parts {
    pub(crate) store: Arc<dyn NodeStore>,
    pub(crate) node: String,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) system_clock: bool,
    pub(crate) jobs: Jobs,
    pub(crate) history_retention: Option<Duration>,
    pub(crate) shutdown_grace: Duration,
    pub(crate) max_concurrent_runs: usize,
    pub(crate) recovery_interval: Duration,
}

impl Engine {
    pub(crate) fn new(p: Parts) -> Engine {
        assert!(p.max_concurrent_runs > 0);
        let spread = Spread::new(&p.node);
        Engine {
            batches: Batches::new(p.store.clone()),
            store: p.store,
            node: p.node,
            clock: p.clock,
            system_clock: p.system_clock,
            store_clock: StoreClock::default(),
            jobs: p.jobs,
            history_retention: p.history_retention,
            shutdown_grace: p.shutdown_grace,
            max_concurrent_runs: p.max_concurrent_runs,
            recovery_interval: p.recovery_interval,
            in_flight: Arc::new(AtomicUsize::new(0)),
            unanswered: UnansweredClaims::default(),
            spread,
            retry_wakes: RetryWakes::default(),
            too_early_warned: AtomicBool::new(false),
            ends: Ends::default(),
            tracker: TaskTracker::new(),
            interrupt: CancellationToken::new(),
        }
    }

    /// Now, for schedules: the earliest the store's clock can read, by this node's clock and
    /// its estimate of the offset (see `store_clock.rs`).
    pub(crate) fn now(&self) -> chrono::DateTime<chrono::Utc> {
        self.store_clock.now(self.clock.as_ref())
    }

    /// The instant before which ticks are missed, no longer late ([`LATE_TOLERANCE`] before
    /// now), to judge ticks (the oldest at `oldest`) about to be claimed well after they
    /// were planned. By [`Engine::now`]; when that says `oldest` is missed, by the store's
    /// own clock, read once: a wall clock that jumped ahead since the last sample would make
    /// on-time ticks look missed (the reading corrects the estimate, as a refusal does). By
    /// the estimate alone while the store does not answer.
    pub(crate) async fn late_from(&self, oldest: chrono::DateTime<chrono::Utc>) -> chrono::DateTime<chrono::Utc> {
        let tolerance = late_tolerance();
        let estimate = self.now() - tolerance;
        if oldest >= estimate {
            return estimate;
        }
        let (before, sent) = (self.clock.now(), Instant::now());
        match counted(StoreOp::Now, self.store.now()).await {
            Ok(store_now) => {
                self.store_clock.observe_step(before, sent.elapsed(), store_now);
                store_now - tolerance
            }
            // Now, not before the read: it may have taken the store call's bound.
            Err(_) => self.now() - tolerance,
        }
    }

    /// Whether this node's claim of `tick` went unanswered and may have committed: the
    /// tick has a record, or the store cannot tell (`Ok(None)`). Not when asking fails: the
    /// store is down, and what it left unanswered most likely never reached it.
    pub(crate) async fn may_have_committed(&self, tick: &Tick) -> bool {
        if !self.unanswered.contains(tick) {
            return false;
        }
        match counted(StoreOp::Claim, self.store.taken_ticks(std::slice::from_ref(tick))).await {
            Ok(Some(taken)) => !taken.is_empty(),
            Ok(None) => true,
            Err(_) => false,
        }
    }

    /// Reads the store's clock once, to keep [`Engine::now`] close to it; a failure is
    /// counted and leaves the estimate as it was.
    pub(crate) async fn sample_store_clock(&self) -> Result<(), StoreError> {
        let (before, sent) = (self.clock.now(), Instant::now());
        let store_now = counted(StoreOp::Now, self.store.now()).await?;
        self.store_clock.observe(before, sent.elapsed(), store_now);
        Ok(())
    }

    /// Runs in progress on this node.
    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    /// The one constructor of a claim request: a tick of `job`, asked for by this node
    /// with the job's lease, and a new nonce (the earlier one, if this tick's claim went
    /// unanswered: see `unanswered.rs`).
    pub(crate) fn request(&self, job: &Job, tick: Tick, trigger: Trigger, mode: ClaimMode) -> ClaimRequest {
        debug_assert_eq!(tick.job, job.name());
        let nonce = self.unanswered.nonce(&tick);
        ClaimRequest { tick, trigger, node: self.node.clone(), lease: job.policy().lease, mode, nonce }
    }

    /// A request to run a tick of `job` now (its overlap policy decides whether a run in
    /// progress blocks it).
    pub(crate) fn run_request(&self, job: &Job, tick: Tick, trigger: Trigger) -> ClaimRequest {
        let mode = ClaimMode::Run { skip_if_running: job.policy().overlap == Overlap::Skip };
        self.request(job, tick, trigger, mode)
    }

    /// One claim round trip, bounded in time ([`claim_timeout`]), with the store's answer
    /// checked. Every claim of the engine goes through here, so here its duration, its
    /// failure and the ticks it recorded skipped are counted, and here a claim without an
    /// answer is remembered, so that its tick is asked for again with the same nonce.
    pub(crate) async fn claim(&self, requests: &[ClaimRequest]) -> Result<Vec<ClaimOutcome>, StoreError> {
        let sent = Instant::now();
        let sent_wall = self.clock.now();
        let asked_again = requests.iter().any(|r| self.unanswered.contains(&r.tick));
        let timeout = claim_timeout(requests, asked_again);
        let answer = match tokio::time::timeout(timeout, self.store.claim(requests)).await {
            Ok(answer) => answer,
            Err(_) => Err(StoreError::Unavailable(format!("no answer to a claim within {timeout:?}"))),
        };
        metrics::claim_round(sent.elapsed());
        let outcomes = answer.and_then(|outcomes| {
            if outcomes.len() != requests.len() {
                return Err(StoreError::Invalid(format!(
                    "the store answered {} claim requests with {} outcomes",
                    requests.len(),
                    outcomes.len()
                )));
            }
            Ok(outcomes)
        });
        let outcomes = outcomes.inspect_err(|_| {
            metrics::store_error(StoreOp::Claim);
            self.unanswered.failed(requests, sent);
        })?;
        if let Some(store_now) = outcomes.iter().find_map(|o| match o {
            ClaimOutcome::TooEarly { store_now } => Some(*store_now),
            _ => None,
        }) {
            // The store's clock, read inside this claim: a sample like any other.
            self.store_clock.observe_step(sent_wall, sent.elapsed(), store_now);
            metrics::claims_too_early();
            if !self.too_early_warned.swap(true, Ordering::Relaxed) {
                tracing::warn!(%store_now, node_clock = %sent_wall,
                    "the store refused a claim as too early: this node's clock runs ahead of the store's; corrected (warned once; see solocron_claims_too_early_total)");
            }
        }
        for (req, outcome) in requests.iter().zip(&outcomes) {
            match outcome {
                ClaimOutcome::Skipped { reason } => {
                    metrics::tick(req.tick.job.clone(), metrics::skip_outcome(&req.mode, reason))
                }
                ClaimOutcome::Won(lease) if !regranted_after(lease, req.lease).is_zero() => {
                    tracing::warn!(job = %req.tick.job, scheduled_at = %req.tick.scheduled_at, token = lease.fencing_token,
                        "an earlier claim of this tick committed but its answer was lost; the store granted it again")
                }
                _ => {}
            }
        }
        // A refused request keeps its nonce: asked again in time, an earlier try that did
        // commit is still granted again.
        let refused = |o: &ClaimOutcome| matches!(o, ClaimOutcome::TooEarly { .. });
        self.unanswered.answered(requests.iter().zip(&outcomes).filter(|(_, o)| !refused(o)));
        self.unanswered.release(requests.iter().zip(&outcomes).filter(|(_, o)| refused(o)).map(|(r, _)| r));
        Ok(outcomes)
    }

    /// Claims a round's requests (each with the index of its job in `set`) in chunks of at most
    /// [`CLAIM_BATCH_MAX`], then starts what was won; returns the jobs whose chunk failed
    /// (store unavailable). `round` (ms) varies the chunk a node starts at.
    ///
    /// Every chunk is claimed before any run starts: runs that end at once would otherwise
    /// queue their `finish` calls ahead of the next chunk's claim (a 10,000-tick herd then
    /// started its last runs seconds late).
    pub(crate) async fn claim_and_start(
        self: &Arc<Self>,
        set: &JobSet,
        batch: Vec<(usize, ClaimRequest)>,
        round: i64,
    ) -> RoundResult {
        let mut result = RoundResult::default();
        let mut answered = Vec::with_capacity(batch.len());
        let (jobs, requests): (Vec<usize>, Vec<ClaimRequest>) = batch.into_iter().unzip();
        for range in chunk_order(&jobs, CLAIM_BATCH_MAX, &self.node, round) {
            let (chunk_jobs, chunk) = (&jobs[range.clone()], &requests[range]);
            let sent = Instant::now();
            match self.claim(chunk).await {
                Ok(outcomes) => {
                    result.answered = true;
                    let received = Instant::now();
                    answered.extend(
                        chunk_jobs.iter().zip(chunk).zip(outcomes).map(|((i, req), o)| (*i, req, o, sent, received)),
                    )
                }
                Err(err) => {
                    tracing::warn!(error = %err, ticks = chunk.len(), "claim failed; nothing runs until the store answers");
                    result.failed.extend(chunk_jobs.iter().copied());
                }
            }
        }
        for (i, req, outcome, sent, received) in answered {
            if let ClaimOutcome::TooEarly { .. } = outcome {
                // Its tick stays due: the timer plans it again by the corrected clock.
                let at = req.tick.scheduled_at;
                result.too_early.entry(i).and_modify(|t| *t = (*t).min(at)).or_insert(at);
            }
            self.on_claimed(&set.jobs[i], req, outcome, sent, received);
        }
        result
    }

    /// Acts on one claim's answer: a won tick starts (through [`Engine::start`]), a skipped
    /// or taken one is only logged.
    pub(crate) fn on_claimed(
        self: &Arc<Self>,
        job: &Arc<Job>,
        req: &ClaimRequest,
        outcome: ClaimOutcome,
        sent: Instant,
        received: Instant,
    ) {
        match outcome {
            ClaimOutcome::Won(lease) => {
                self.start(self.claimed(job.clone(), lease, req.trigger, sent, received), self.interrupt.clone());
            }
            ClaimOutcome::Skipped { reason } => {
                tracing::info!(job = %req.tick.job, scheduled_at = %req.tick.scheduled_at, node = %self.node, state = "skipped", reason, "tick skipped");
                if metrics::skip_outcome(&req.mode, &reason) == metrics::Outcome::Missed {
                    self.ends.announce(&RunId { tick: req.tick.clone(), attempt: 1 }, RunState::Skipped);
                }
            }
            ClaimOutcome::Taken => {
                tracing::debug!(job = %req.tick.job, scheduled_at = %req.tick.scheduled_at, "tick taken by another node")
            }
            // The caller keeps the tick due (see `claim_and_start`); `claim` corrected the clock.
            ClaimOutcome::TooEarly { store_now } => {
                tracing::debug!(job = %req.tick.job, scheduled_at = %req.tick.scheduled_at, %store_now, "claimed too early by the store's clock; claimed again in time")
            }
        }
    }

    /// The claimed run of a won lease of `job`, whose claim was sent at `sent` and answered
    /// at `received`. It starts at its instant by the store's clock: as this node estimates
    /// it, and no earlier than the lease's `claimed_at` says (the store read its clock then,
    /// before `received`); at once if that has passed. The wait is at most
    /// `CLAIM_EARLY_MAX` from `received` (stores refuse ticks further ahead), even if the
    /// wall clock was set back meanwhile; the runner confirms the lease first if its
    /// renewal came due.
    pub(crate) fn claimed(
        &self,
        job: Arc<Job>,
        lease: Lease,
        trigger: Trigger,
        sent: Instant,
        received: Instant,
    ) -> Claimed {
        assert_eq!(lease.run.tick.job, job.name(), "a lease runs its own job");
        debug_assert!(sent <= received);
        let regranted_after = regranted_after(&lease, job.policy().lease);
        let scheduled_at = lease.run.tick.scheduled_at;
        let behind = self.now() - scheduled_at;
        let now = Instant::now();
        let wait_by_estimate = (-behind).to_std().unwrap_or_default();
        // The store's own word: it read its clock (`claimed_at`, plus a re-grant's delay)
        // between `sent` and `received`. Within that round trip of the estimate, the
        // estimate stands (waiting from `received` would make every start late by the
        // store's work on the batch); further ahead, the estimate is off (this node's
        // clock stepped and no sample has corrected it yet), and the wait counts from
        // `received`, which is never early.
        let store_then = lease.claimed_at + chrono::Duration::from_std(regranted_after).unwrap_or_default();
        let ahead_by_store = (scheduled_at - store_then).to_std().unwrap_or_default();
        let estimate_off = ahead_by_store > wait_by_estimate + received.saturating_duration_since(sent);
        let start_at = if estimate_off { received + ahead_by_store } else { now + wait_by_estimate }
            .min(received + CLAIM_AHEAD_MAX.max(solocron_core::CLAIM_EARLY_MAX));
        // The instant on the monotonic clock (by the estimate), which may not reach back to
        // an old tick's: what start lateness is measured from.
        let due = behind.to_std().map_or(Some(now + wait_by_estimate), |late| now.checked_sub(late));
        Claimed { job, lease, trigger, sent, regranted_after, start_at, due, handler_over: None }
    }

    /// The one door through which every claimed run starts: counted as in flight, tracked
    /// for the drain, and run to its recorded end; `interrupt` stops it early (shutdown's
    /// grace is over, or the caller of `run_here` gave up). Await the handle to wait for
    /// the end.
    pub(crate) fn start(self: &Arc<Self>, run: Claimed, interrupt: CancellationToken) -> JoinHandle<()> {
        let guard = InFlight::new(&self.in_flight);
        let engine = self.clone();
        self.tracker.spawn(async move {
            let _guard = guard;
            let env = engine.run_env();
            // Boxed: the run's future is large (its select over the lease, the timeout and
            // shutdown), and a task's future is copied whole into its cell and again when it
            // ends; a box is copied once.
            Box::pin(execute(run, &env, interrupt)).await
        })
    }

    /// What a run uses of this node, lent for the run's life: the runner sees no more.
    fn run_env(&self) -> Env<'_> {
        Env {
            batches: &self.batches,
            store: self.store.as_ref(),
            retry_wakes: &self.retry_wakes,
            clock: self.clock.as_ref(),
            store_clock: &self.store_clock,
            ends: &self.ends,
        }
    }
}

/// What a claim round ([`Engine::claim_and_start`]) left undone.
#[derive(Debug, Default)]
pub(crate) struct RoundResult {
    /// Jobs whose chunk failed (store unavailable): their ticks stay due.
    pub(crate) failed: HashSet<usize>,
    /// Jobs with a tick the store refused as claimed too early, and the earliest such tick:
    /// due again at its instant, by the clock the refusal corrected.
    pub(crate) too_early: HashMap<usize, chrono::DateTime<chrono::Utc>>,
    /// Whether the store answered a chunk of the round.
    pub(crate) answered: bool,
}

/// The chunks of at most `max` requests that a round's batch (the job of each request, in
/// order) is claimed in, in the order this node claims them. When no job has requests in
/// two chunks, each node starts at a different chunk (a hash of its id and the round), so
/// that racing nodes first win chunks of their own instead of queueing on the same rows
/// and then finding each other's chunks already taken (cheap). A job split across chunks
/// keeps them in order, so its ticks are claimed oldest first and their tokens grow with
/// their instants.
fn chunk_order(jobs: &[usize], max: usize, node: &str, round: i64) -> Vec<std::ops::Range<usize>> {
    assert!(max > 0, "a chunk holds at least one request");
    let mut chunks: Vec<_> = (0..jobs.len()).step_by(max).map(|start| start..(start + max).min(jobs.len())).collect();
    if chunks.len() > 1 {
        let mut owner: HashMap<usize, usize> = HashMap::with_capacity(jobs.len());
        let split = jobs.iter().enumerate().any(|(k, j)| *owner.entry(*j).or_insert(k / max) != k / max);
        if !split {
            let first = solocron_core::spread_start(node, round, chunks.len());
            chunks.rotate_left(first);
        }
    }
    chunks
}

/// How long after its record was created (`claimed_at`) a lease of `length` was granted,
/// by the store's clock: zero for a first grant, the time since the first try for a claim
/// granted again with its nonce (its answer had been lost). Leases a store grants in one
/// statement may read the clock twice, a few ms apart: that is not a second grant.
pub(crate) fn regranted_after(lease: &Lease, length: Duration) -> Duration {
    const SAME_GRANT_SLACK: Duration = Duration::from_millis(20);
    let held = (lease.lease_until - lease.claimed_at).to_std().unwrap_or_default();
    let after = held.saturating_sub(length);
    if after <= SAME_GRANT_SLACK {
        Duration::ZERO
    } else {
        after
    }
}

/// How long a claim of `requests` may take before its answer counts as lost. A first try
/// waits at most a third of the shortest lease asked for, so that a claim that committed
/// while its answer was lost is asked for again, and granted again, before its lease
/// lapses and anyone's recovery may end it. A try that asks again for a tick whose claim
/// went unanswered (`asked_again`) waits the whole store bound, [`STORE_CALL_TIMEOUT`]:
/// a store merely slower than a third of the lease still answers it (and the run then
/// confirms its lease before it starts, as for any late answer).
pub(crate) fn claim_timeout(requests: &[ClaimRequest], asked_again: bool) -> Duration {
    let shortest = requests.iter().map(|r| r.lease).min().unwrap_or(STORE_CALL_TIMEOUT * 3);
    if asked_again {
        STORE_CALL_TIMEOUT
    } else {
        (shortest / 3).min(STORE_CALL_TIMEOUT)
    }
}

/// [`LATE_TOLERANCE`] as a span of wall-clock time.
pub(crate) fn late_tolerance() -> chrono::Duration {
    chrono::Duration::from_std(LATE_TOLERANCE).expect("small")
}

/// Counts a run as in flight (and in the runs-in-progress gauge) for as long as it lives.
struct InFlight(Arc<AtomicUsize>);

impl InFlight {
    fn new(counter: &Arc<AtomicUsize>) -> InFlight {
        counter.fetch_add(1, Ordering::SeqCst);
        metrics::runs_in_progress(1);
        InFlight(counter.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let before = self.0.fetch_sub(1, Ordering::SeqCst);
        metrics::runs_in_progress(-1);
        debug_assert!(before > 0, "a run leaves flight once");
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use chrono::DateTime;
    use solocron_core::{ClaimMode, ClaimRequest, Lease, RunId, Tick, Trigger};

    use super::{chunk_order, claim_timeout, regranted_after};
    use crate::store_call::STORE_CALL_TIMEOUT;

    fn lease(claimed_ms: i64, until_ms: i64) -> Lease {
        let at = |ms| DateTime::from_timestamp_millis(ms).expect("in range");
        Lease {
            run: RunId { tick: Tick::new("j", at(0)), attempt: 1 },
            owner: "n".into(),
            fencing_token: 1,
            claimed_at: at(claimed_ms),
            lease_until: at(until_ms),
        }
    }

    #[test]
    fn a_lease_granted_again_says_how_long_after_its_claim() {
        let length = Duration::from_secs(3);
        assert_eq!(regranted_after(&lease(1_000, 4_000), length), Duration::ZERO, "a first grant");
        assert_eq!(regranted_after(&lease(1_000, 4_015), length), Duration::ZERO, "two reads of one clock");
        assert_eq!(regranted_after(&lease(1_000, 5_200), length), Duration::from_millis(1_200), "granted again");
        assert_eq!(regranted_after(&lease(1_000, 3_000), length), Duration::ZERO, "never negative");
    }

    #[test]
    fn a_first_claim_waits_at_most_a_third_of_its_shortest_lease() {
        let request = |secs| ClaimRequest {
            tick: Tick::new("j", DateTime::from_timestamp(0, 0).expect("in range")),
            trigger: Trigger::Schedule,
            node: "n".into(),
            lease: Duration::from_secs(secs),
            mode: ClaimMode::Run { skip_if_running: false },
            nonce: 1,
        };
        assert_eq!(claim_timeout(&[request(60), request(3), request(30)], false), Duration::from_secs(1));
        assert_eq!(claim_timeout(&[request(60), request(3)], true), STORE_CALL_TIMEOUT, "asked again: the whole bound");
        assert_eq!(claim_timeout(&[request(3600)], false), STORE_CALL_TIMEOUT);
        assert_eq!(claim_timeout(&[], false), STORE_CALL_TIMEOUT);
    }

    #[test]
    fn nodes_start_at_different_chunks_but_never_reorder_a_jobs_ticks() {
        let distinct: Vec<usize> = (0..10_000).collect();
        let starts: std::collections::HashSet<usize> =
            (0..8).map(|n| chunk_order(&distinct, 1000, &format!("node-{n}"), 0)[0].start).collect();
        assert!(starts.len() > 3, "8 nodes start at {starts:?}");
        for node in ["a", "b"] {
            let order = chunk_order(&distinct, 1000, node, 7);
            let mut covered: Vec<usize> = order.iter().flat_map(|r| r.clone()).collect();
            covered.sort_unstable();
            assert_eq!(covered, distinct, "every request once");
            assert!(order.iter().all(|r| r.len() == 1000));
            assert_eq!(order, chunk_order(&distinct, 1000, node, 7), "stable for a node and round");
        }
        // Job 5 has ticks at the end of chunk 0 and the start of chunk 1: no rotation.
        let split = [1, 2, 3, 5, 5, 6, 7, 8];
        assert_eq!(chunk_order(&split, 4, "a", 0), vec![0..4, 4..8]);
        assert_eq!(chunk_order(&split[..3], 4, "a", 0), vec![0..3], "one chunk");
        assert!(chunk_order(&[], 4, "a", 0).is_empty());
    }
}
