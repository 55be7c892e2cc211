//! Catch-up: missed ticks of one job (and late ticks queued behind them) run one after the
//! other, oldest first, each claimed just before it runs, at most one sequence per job on
//! this node. A late tick that a sequence held by the store (down or as slow) reaches well
//! past the late tolerance is missed by then, and follows the misfire policy. While one is
//! under way, the timer records the job's on-time ticks skipped (overlap = skip: the job
//! is busy), never claims them to run beside it. Other nodes know
//! nothing of it: one that ranks first for an on-time tick claims it to run, and may win
//! it between two runs of the sequence, before older ticks still queued here.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use solocron_core::{
    ClaimMode, ClaimOutcome, ClaimRequest, HistoryQuery, Misfire, Overlap, RunRecord, RunState, Tick, Trigger,
};
use tokio::time::Instant;

use crate::backoff::Backoff;
use crate::engine::Engine;
use crate::job::Job;
use crate::metrics::StoreOp;
use crate::runner::Claimed;
use crate::store_call::counted;

/// How often a catch-up sequence looks whether the job is still running elsewhere.
const IDLE_POLL: Duration = Duration::from_millis(200);
/// Most running runs of a job read at each look: more than this node's own unanswered
/// claims of one job are, short of an outage of many seconds (a full page is
/// taken as "not idle", whatever it holds).
const RUNNING_LOOKED_AT_MAX: usize = 16;

/// Ticks of one job to claim and run in sequence, oldest first.
pub(crate) type Sequence = Vec<(DateTime<Utc>, Trigger)>;

/// The ticks a job's sequence under way has still to run, oldest first.
pub(crate) type Queue = VecDeque<(DateTime<Utc>, Trigger)>;

/// The catch-up sequences under way on this node, by job: at most one each. The timer
/// holds them (it starts sequences and records a busy job's on-time ticks skipped), and so
/// does each sequence's task until it is over.
#[derive(Default)]
pub(crate) struct Sequences {
    queues: Mutex<HashMap<String, Queued>>,
}

impl Sequences {
    /// Whether a sequence of `job` is under way.
    pub(crate) fn under_way(&self, job: &str) -> bool {
        self.queues.lock().expect("not poisoned").contains_key(job)
    }
}

/// A job's sequence under way: the definition its ticks are of, and its queue.
struct Queued {
    job: Arc<Job>,
    ticks: Queue,
}

/// Most ticks one job's sequence holds; beyond it, newly missed ticks are not run (a
/// warning says how many) and not recorded.
const QUEUED_MAX: usize = 10_000;

/// Starts a catch-up sequence of `job`, or, if one is already under way on this node,
/// queues `ticks` in it, in order (ticks that came due, and were missed, while it ran:
/// after a long outage the timer hands them over here instead of dropping them).
pub(crate) fn spawn(e: &Arc<Engine>, sequences: &Arc<Sequences>, job: Arc<Job>, ticks: Sequence) {
    if !enqueue(&mut sequences.queues.lock().expect("not poisoned"), &job, ticks) {
        return;
    }
    // Made before the task, so that a task dropped unpolled still ends the sequence.
    let mut sequence =
        CatchingUp { engine: e.clone(), sequences: sequences.clone(), job: job.name().to_owned(), over: false };
    e.tracker.spawn(async move { run_sequence(&mut sequence).await });
}

/// Queues `ticks` of `job` in its sequence under way, or makes them a new one: whether it
/// is new (a task must run it). The queue of an earlier definition of the job gives way:
/// its ticks are dropped (the new definition goes on from the timer's cursor, which went
/// past them), and the sequence under way runs the new definition's ticks instead.
fn enqueue(sequences: &mut HashMap<String, Queued>, job: &Arc<Job>, ticks: Sequence) -> bool {
    let Some(queued) = sequences.get_mut(job.name()) else {
        let ticks = ticks.into_iter().take(QUEUED_MAX).collect();
        sequences.insert(job.name().to_owned(), Queued { job: job.clone(), ticks });
        return true;
    };
    if !same_definition(&queued.job, job) {
        tracing::info!(job = %job.name(), dropped = queued.ticks.len(), "job changed during its catch-up; the earlier definition's ticks are not run");
        queued.job = job.clone();
        queued.ticks.clear();
    }
    let room = QUEUED_MAX.saturating_sub(queued.ticks.len());
    if ticks.len() > room {
        tracing::warn!(job = %job.name(), ticks = ticks.len() - room, "catch-up queue full; the newest missed ticks are not run");
    }
    queue_in_order(&mut queued.ticks, ticks, room);
    false
}

/// Whether `a` and `b` are the same job as defined (a reloaded list makes new `Arc`s).
fn same_definition(a: &Arc<Job>, b: &Arc<Job>) -> bool {
    Arc::ptr_eq(a, b) || a.definition() == b.definition()
}

/// Adds `ticks` to a sequence's `queue` (oldest first), in order, each once, at most
/// `room` of them: a tick older than the queue's newest is one handed back after a failed
/// claim (`backups.rs`), never to be dropped for being old.
fn queue_in_order(queue: &mut Queue, ticks: Sequence, room: usize) {
    let mut added = 0;
    for (t, trigger) in ticks {
        if added == room {
            break;
        }
        if let Err(at) = queue.binary_search_by_key(&t, |(q, _)| *q) {
            queue.insert(at, (t, trigger));
            added += 1;
        }
    }
    debug_assert!(queue.iter().zip(queue.iter().skip(1)).all(|(a, b)| a.0 < b.0));
}

async fn run_sequence(sequence: &mut CatchingUp) {
    let (e, sequences) = (&sequence.engine.clone(), &sequence.sequences.clone());
    // How long the sequence waited for its own runs' handlers, and for each step's store
    // calls up to [`STEP_SLACK`]: a late tick queued behind them is that much later by the
    // time it is reached, as queuing it promised ([`reached`]). A store slow or down beyond
    // that (in a claim, or recording a run's end) holds the sequence: what makes a tick
    // missed.
    let mut waited = Duration::ZERO;
    while let Some((t, trigger, job)) = sequence.next_tick() {
        let (job, step) = (&job, Instant::now());
        if e.interrupt.is_cancelled() || e.tracker.is_closed() {
            break;
        }
        // The job was removed or redefined meanwhile: its new definition (if any) takes
        // over from the timer's cursor, which went past this tick. The ticks after it may
        // be the new definition's (queued by `spawn`): the sequence goes on.
        if !e.jobs.get().get(job.name()).is_some_and(|now| same_definition(now, job)) {
            tracing::debug!(job = %job.name(), at = %t, "job removed or changed during its catch-up; its tick is not run");
            continue;
        }
        // Several nodes may catch up the same job at once (after a fleet-wide outage). With
        // overlap = skip, a tick claimed while another node's catch-up run is in progress
        // would be recorded skipped; waiting for the job to be idle first makes the fleet's
        // catch-up sequences run one tick at a time instead.
        if job.policy().overlap == Overlap::Skip && !wait_until_idle(e, job.name()).await {
            break;
        }
        let Some((req, outcome, sent, received)) = claim_reached(e, sequences, job, t, trigger, waited).await else {
            break;
        };
        let handler = match outcome {
            // The sequence may end with this round's on-time ticks, claimed ahead: the run
            // waits for its instant like any other.
            ClaimOutcome::Won(lease) => {
                let (handler_over, over) = tokio::sync::oneshot::channel();
                let run = Claimed {
                    handler_over: Some(handler_over),
                    ..e.claimed(job.clone(), lease, req.trigger, sent, received)
                };
                let ended = e.start(run, e.interrupt.clone());
                // Dropped unsent when the handler never started.
                let handler = over.await.unwrap_or_default();
                let _ = ended.await;
                handler
            }
            other => {
                e.on_claimed(job, &req, other, sent, received);
                Duration::ZERO
            }
        };
        waited += handler + step.elapsed().saturating_sub(handler).min(STEP_SLACK);
    }
}

/// How the sequence asks for a tick it reached.
#[derive(Debug, PartialEq, Eq)]
enum Reached {
    /// As it was queued.
    AsQueued,
    /// As a missed tick: run as a catch-up (`None`), or recorded skipped for this reason.
    Missed(Option<&'static str>),
}

/// A tick queued on time (`Schedule`) that a sequence reaches older than `late_from` (by
/// its lateness as [`reached`] judges it) is missed by now: it goes through the job's
/// misfire policy as the timer's missed ticks do, never runs as a scheduled tick that late.
/// (A sequence that only waited for its own runs runs its late ticks as queued: that wait
/// is what queuing them promised.) Misfire = once runs it only if the next queued tick is
/// not missed too (`next_missed`): the latest of a stretch of missed ticks.
fn past_tolerance(
    job: &Job,
    t: DateTime<Utc>,
    trigger: Trigger,
    late_from: DateTime<Utc>,
    next_missed: impl FnOnce() -> bool,
) -> Reached {
    if trigger != Trigger::Schedule || t >= late_from {
        return Reached::AsQueued;
    }
    match job.policy().misfire {
        Misfire::All => Reached::Missed(None),
        Misfire::Once if !next_missed() => Reached::Missed(None),
        Misfire::Once => Reached::Missed(Some(
            "missed: its catch-up sequence reached it past the late tolerance; only the latest missed tick runs (misfire = once)",
        )),
        Misfire::Skip => {
            Reached::Missed(Some("missed: its catch-up sequence reached it past the late tolerance (misfire = skip)"))
        }
    }
}

/// The next tick queued in `job`'s sequence.
fn next_queued(sequences: &Sequences, job: &str) -> Option<DateTime<Utc>> {
    let queues = sequences.queues.lock().expect("not poisoned");
    queues.get(job).and_then(|q| q.ticks.front()).map(|(t, _)| *t)
}

/// Waits until no run of `job` is running anywhere, but this node's own claims whose
/// answer was lost (the sequence asks for those again itself); false on shutdown.
async fn wait_until_idle(e: &Engine, job: &str) -> bool {
    let q = HistoryQuery {
        job: Some(job.to_owned()),
        state: Some(RunState::Running),
        limit: RUNNING_LOOKED_AT_MAX,
        ..Default::default()
    };
    let ours_unanswered = |r: &RunRecord| r.node == e.node && r.id.attempt == 1 && e.unanswered.contains(&r.id.tick);
    while !e.tracker.is_closed() {
        match counted(StoreOp::History, e.store.history(&q)).await {
            Ok(running) if running.len() < RUNNING_LOOKED_AT_MAX && running.iter().all(ours_unanswered) => return true,
            Ok(_) => {}
            Err(err) => tracing::debug!(error = %err, "cannot tell whether the job is running"),
        }
        tokio::time::sleep(IDLE_POLL).await;
    }
    false
}

/// Claims tick `t` of `job`, reached by the sequence (queued with `trigger`, after the
/// sequence `waited` for its own runs), asked for as [`reached`] says at each try: retried
/// while the store is unavailable, and asked again at the tick's instant (by the clock the
/// refusal corrected) while the store refuses it as too early: a late tick of the sequence
/// is a scheduled one, and this node's clock may have run ahead of the store's. The
/// request with its answer and when it was sent and answered; `None` on shutdown.
async fn claim_reached(
    e: &Engine,
    sequences: &Sequences,
    job: &Job,
    t: DateTime<Utc>,
    trigger: Trigger,
    waited: Duration,
) -> Option<(ClaimRequest, ClaimOutcome, Instant, Instant)> {
    let mut backoff = Backoff::store();
    while !e.tracker.is_closed() {
        let req = reached(e, sequences, job, t, trigger, waited).await;
        let sent = Instant::now();
        let outcome = match e.claim(std::slice::from_ref(&req)).await {
            Ok(mut outcomes) => outcomes.pop().expect("the engine checks one outcome per request"),
            Err(err) => {
                tracing::warn!(error = %err, "catch-up claim failed; retrying");
                backoff.wait().await;
                continue;
            }
        };
        let received = Instant::now();
        if !matches!(outcome, ClaimOutcome::TooEarly { .. }) {
            return Some((req, outcome, sent, received));
        }
        // At least a little: the corrected estimate may still say the instant has passed.
        let wait = (t - e.now()).to_std().unwrap_or_default().max(TOO_EARLY_PAUSE);
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = e.interrupt.cancelled() => return None,
        }
    }
    None
}

/// What a sequence's step in progress may add to a queued tick's lateness while it goes on
/// as it should (its calls take milliseconds); a store that holds it longer makes its ticks
/// missed.
const SEQUENCE_SLACK: Duration = Duration::from_secs(1);

/// What each step of a sequence (its look at whether the job is idle, its claim and, for a
/// run, its start and the recording of its end) is excused besides the run's handler: a
/// long sequence on a store as it should be never gets late by the sum of its steps' round
/// trips; a step the store holds longer makes the rest count.
const STEP_SLACK: Duration = Duration::from_millis(100);

/// The least wait before a tick refused as too early is asked for again.
const TOO_EARLY_PAUSE: Duration = Duration::from_millis(20);

/// The request for tick `t` of `job` now: as queued, or as a missed tick by the misfire
/// policy ([`past_tolerance`]) if its job has a catch-up window and no claim of it by this
/// node may have committed. A tick is judged by its lateness less what the sequence
/// `waited` for its own runs' handlers and steps (each step up to [`STEP_SLACK`]) and less
/// [`SEQUENCE_SLACK`]: a sequence going on as it should never reaches one missed; one held
/// by the store (down, or as slow) does, whether in its claims or in recording its runs'
/// ends.
async fn reached(
    e: &Engine,
    sequences: &Sequences,
    job: &Job,
    t: DateTime<Utc>,
    trigger: Trigger,
    waited: Duration,
) -> ClaimRequest {
    let tick = Tick::new(job.name(), t);
    // A job without a catch-up window: the timer would not examine a missed tick at all; it
    // runs late rather than being lost unrecorded.
    if trigger != Trigger::Schedule || job.policy().catchup.is_zero() {
        return e.run_request(job, tick, trigger);
    }
    let slack = chrono::Duration::from_std(waited + SEQUENCE_SLACK).unwrap_or(chrono::Duration::MAX);
    let judged = |t: DateTime<Utc>| t.checked_add_signed(slack).unwrap_or(DateTime::<Utc>::MAX_UTC);
    let late_from = e.late_from(judged(t)).await;
    // An unanswered claim that may have committed in time is asked for again as it was
    // (only a claim to run is granted again).
    if judged(t) < late_from && e.may_have_committed(&tick).await {
        return e.run_request(job, tick, trigger);
    }
    let next_missed = || next_queued(sequences, job.name()).is_some_and(|next| judged(next) < late_from);
    match past_tolerance(job, judged(t), trigger, late_from, next_missed) {
        Reached::AsQueued => e.run_request(job, tick, trigger),
        Reached::Missed(None) => e.run_request(job, tick, Trigger::Catchup),
        Reached::Missed(Some(reason)) => {
            e.request(job, tick, Trigger::Catchup, ClaimMode::Skip { reason: reason.to_owned() })
        }
    }
}

/// A job's catch-up sequence under way: its queue is in [`Sequences`] until the sequence is
/// over, by running out of ticks or by being dropped (cut short, or by a panic).
struct CatchingUp {
    engine: Arc<Engine>,
    sequences: Arc<Sequences>,
    job: String,
    /// The queue ran out and was removed: what is under the job's name now is a new
    /// sequence's ([`spawn`] starts one as soon as this one is over), not to be removed.
    over: bool,
}

impl CatchingUp {
    /// The next tick of the sequence, and the job as defined when it was queued; when none
    /// is left, the sequence is over (under the same lock, so a tick queued by [`spawn`] is
    /// never left behind).
    fn next_tick(&mut self) -> Option<(DateTime<Utc>, Trigger, Arc<Job>)> {
        assert!(!self.over, "an ended sequence takes no more ticks");
        let mut queues = self.sequences.queues.lock().expect("not poisoned");
        let next = queues.get_mut(&self.job).and_then(|q| {
            let (t, trigger) = q.ticks.pop_front()?;
            Some((t, trigger, q.job.clone()))
        });
        if next.is_none() {
            queues.remove(&self.job);
            self.over = true;
        }
        next
    }
}

impl Drop for CatchingUp {
    fn drop(&mut self) {
        if self.over {
            return;
        }
        if let Ok(mut queues) = self.sequences.queues.lock() {
            queues.remove(&self.job);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(s, 0).unwrap()
    }

    /// The host's clock (the scheduler's own is not imported here: nothing below the
    /// scheduler imports it).
    struct Wall;

    impl solocron_core::Clock for Wall {
        fn now(&self) -> DateTime<Utc> {
            Utc::now()
        }
    }

    /// A sequence that ran out of ticks is over at once: the timer may start the job's
    /// next sequence before the ended one's task is gone, and the ended one, dropped
    /// then, must leave the new one's queue in place (its ticks would never run).
    #[tokio::test]
    async fn a_sequence_that_ran_out_leaves_the_next_sequence_of_its_job_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}/s.db", dir.path().display());
        let store = solocron_sqlite::SqliteStore::connect(&url, &solocron_core::Prefix::default()).await.unwrap();
        let namespaces = solocron_core::Namespaces::default();
        let set = crate::jobset::JobSet::new(Vec::new(), &namespaces, None).unwrap();
        let engine = Arc::new(Engine::new(crate::engine::Parts {
            store: Arc::new(store),
            node: "n".into(),
            clock: Arc::new(Wall),
            system_clock: false,
            jobs: crate::jobset::Jobs::new(set, namespaces, None),
            history_retention: None,
            shutdown_grace: Duration::from_secs(1),
            max_concurrent_runs: 1,
            recovery_interval: Duration::from_secs(1),
        }));
        let sequences = Arc::new(Sequences::default());
        let queued = |s: &Sequences| s.queues.lock().unwrap().get("j").map(|q| q.ticks.len());
        let j = job("* * * * * *");
        assert!(enqueue(&mut sequences.queues.lock().unwrap(), &j, vec![(t(1), Trigger::Catchup)]));
        let guard = |job: &str| CatchingUp {
            engine: engine.clone(),
            sequences: sequences.clone(),
            job: job.into(),
            over: false,
        };
        let mut first = guard("j");
        let next = first.next_tick().map(|(at, trigger, of)| (at, trigger, Arc::ptr_eq(&of, &j)));
        assert_eq!(next, Some((t(1), Trigger::Catchup, true)));
        assert!(first.next_tick().is_none());
        assert_eq!(queued(&sequences), None, "the sequence is over as soon as it ran out");
        assert!(enqueue(&mut sequences.queues.lock().unwrap(), &j, vec![(t(2), Trigger::Catchup)]));
        drop(first);
        assert_eq!(queued(&sequences), Some(1), "the next sequence's queue stays");
        // A sequence cut short (shutdown, the job removed) ends with its guard.
        let cut = guard("j");
        drop(cut);
        assert_eq!(queued(&sequences), None);
    }

    fn job(expr: &str) -> Arc<Job> {
        let handler = crate::job::handler_fn(|_ctx| async { Ok(()) });
        Arc::new(Job::new("j", solocron_core::Schedule::parse(expr, "UTC").unwrap(), handler))
    }

    /// A job redefined while its sequence is under way: the new definition's missed ticks
    /// replace the earlier definition's in the queue, for the task under way to run (before,
    /// that task saw the change, stopped, and its guard removed the new ticks with the rest).
    #[test]
    fn a_redefined_jobs_ticks_replace_the_earlier_definitions_in_its_sequence() {
        let (old, new) = (job("* * * * * *"), job("*/2 * * * * *"));
        let mut sequences = HashMap::new();
        assert!(enqueue(&mut sequences, &old, vec![(t(1), Trigger::Catchup), (t(2), Trigger::Schedule)]));
        let reloaded = job("* * * * * *");
        assert!(!enqueue(&mut sequences, &reloaded, vec![(t(3), Trigger::Schedule)]), "same definition: queued behind");
        assert!(Arc::ptr_eq(&sequences["j"].job, &old));
        assert_eq!(sequences["j"].ticks.len(), 3);
        assert!(!enqueue(&mut sequences, &new, vec![(t(4), Trigger::Catchup)]), "the task under way runs it");
        assert!(Arc::ptr_eq(&sequences["j"].job, &new));
        assert_eq!(sequences["j"].ticks, [(t(4), Trigger::Catchup)]);
    }

    #[test]
    fn ticks_join_a_sequences_queue_in_order_once_and_an_older_one_is_not_dropped() {
        let mut queue: Queue = [(t(10), Trigger::Catchup), (t(20), Trigger::Catchup)].into();
        let handed = vec![(t(5), Trigger::Schedule), (t(20), Trigger::Schedule), (t(30), Trigger::Schedule)];
        queue_in_order(&mut queue, handed, 10);
        let times: Vec<_> = queue.iter().map(|(at, _)| *at).collect();
        assert_eq!(times, [t(5), t(10), t(20), t(30)]);
        assert_eq!(queue[2].1, Trigger::Catchup, "a tick already queued keeps its place and trigger");
        queue_in_order(&mut queue, vec![(t(1), Trigger::Schedule), (t(40), Trigger::Schedule)], 1);
        assert_eq!(queue.len(), 5, "at most `room` added");
        assert_eq!(queue[0].0, t(1));
    }

    #[test]
    fn a_scheduled_tick_reached_past_the_tolerance_follows_misfire_and_once_runs_only_the_latest() {
        let job = |misfire| {
            let schedule = solocron_core::Schedule::parse("* * * * * *", "UTC").unwrap();
            let policy = solocron_core::JobPolicy { misfire, ..Default::default() };
            Job::new("j", schedule, crate::handler_fn(|_| async { Ok(()) })).with_policy(policy)
        };
        let (all, once, skip) = (job(Misfire::All), job(Misfire::Once), job(Misfire::Skip));
        let late_from = t(100);
        let never = || -> bool { panic!("only misfire = once looks at the next tick") };
        assert_eq!(past_tolerance(&skip, t(100), Trigger::Schedule, late_from, never), Reached::AsQueued);
        assert_eq!(past_tolerance(&skip, t(50), Trigger::Catchup, late_from, never), Reached::AsQueued);
        assert_eq!(past_tolerance(&all, t(99), Trigger::Schedule, late_from, never), Reached::Missed(None));
        assert!(matches!(past_tolerance(&skip, t(99), Trigger::Schedule, late_from, never), Reached::Missed(Some(_))));
        assert_eq!(past_tolerance(&once, t(98), Trigger::Schedule, late_from, || false), Reached::Missed(None));
        assert!(matches!(
            past_tolerance(&once, t(98), Trigger::Schedule, late_from, || true),
            Reached::Missed(Some(_))
        ));
    }
}
