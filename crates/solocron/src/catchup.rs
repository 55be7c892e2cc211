//! Catch-up: missed ticks of one job (and late ticks queued behind them) run one after the
//! other, oldest first, each claimed just before it runs, at most one sequence per job on
//! this node. While one is under way, the timer records the job's on-time ticks skipped
//! (overlap = skip: the job is busy), never claims them to run beside it. Other nodes know
//! nothing of it: one that ranks first for an on-time tick claims it to run, and may win
//! it between two runs of the sequence, before older ticks still queued here.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use solocron_core::{ClaimOutcome, ClaimRequest, HistoryQuery, Overlap, RunRecord, RunState, Tick, Trigger};
use tokio::time::Instant;

use crate::backoff::Backoff;
use crate::engine::{counted, Engine};
use crate::job::Job;
use crate::metrics::StoreOp;

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

/// Most ticks one job's sequence holds; beyond it, newly missed ticks are not run (a
/// warning says how many) and not recorded.
const QUEUED_MAX: usize = 10_000;

/// Starts a catch-up sequence of `job`, or, if one is already under way on this node,
/// queues `ticks` in it, in order (ticks that came due, and were missed, while it ran:
/// after a long outage the timer hands them over here instead of dropping them).
pub(crate) fn spawn(e: &Arc<Engine>, job: Arc<Job>, ticks: Sequence) {
    {
        let mut sequences = e.catching_up.lock().expect("not poisoned");
        if let Some(queue) = sequences.get_mut(job.name()) {
            let room = QUEUED_MAX.saturating_sub(queue.len());
            if ticks.len() > room {
                tracing::warn!(job = %job.name(), ticks = ticks.len() - room, "catch-up queue full; the newest missed ticks are not run");
            }
            queue_in_order(queue, ticks, room);
            return;
        }
        sequences.insert(job.name().to_owned(), ticks.into_iter().take(QUEUED_MAX).collect());
    }
    let engine = e.clone();
    e.tracker.spawn(async move {
        let _guard = CatchingUp(engine.clone(), job.name().to_owned());
        run_sequence(&engine, &job).await
    });
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

/// The next tick of `job`'s sequence; when none is left, the sequence is over (under the
/// same lock, so a tick queued by [`spawn`] is never left behind).
fn next_tick(e: &Engine, job: &str) -> Option<(DateTime<Utc>, Trigger)> {
    let mut sequences = e.catching_up.lock().expect("not poisoned");
    let next = sequences.get_mut(job)?.pop_front();
    if next.is_none() {
        sequences.remove(job);
    }
    next
}

async fn run_sequence(e: &Arc<Engine>, job: &Arc<Job>) {
    while let Some((t, trigger)) = next_tick(e, job.name()) {
        if e.interrupt.is_cancelled() || e.tracker.is_closed() {
            break;
        }
        // The job was removed or redefined meanwhile: its new definition (if any) takes
        // over from the timer's cursor, which went past these ticks.
        if !e
            .jobs
            .get()
            .get(job.name())
            .is_some_and(|now| Arc::ptr_eq(now, job) || now.definition() == job.definition())
        {
            tracing::info!(job = %job.name(), "job removed or changed during its catch-up; the rest is not run");
            break;
        }
        // Several nodes may catch up the same job at once (after a fleet-wide outage). With
        // overlap = skip, a tick claimed while another node's catch-up run is in progress
        // would be recorded skipped; waiting for the job to be idle first makes the fleet's
        // catch-up sequences run one tick at a time instead.
        if job.policy().overlap == Overlap::Skip && !wait_until_idle(e, job.name()).await {
            break;
        }
        let req = e.run_request(job, Tick::new(job.name(), t), trigger);
        let Some((outcome, sent, received)) = claim_in_time(e, &req).await else { break };
        match outcome {
            // The sequence may end with this round's on-time ticks, claimed ahead: the run
            // waits for its instant like any other.
            ClaimOutcome::Won(lease) => {
                let run = e.claimed(job.clone(), lease, trigger, sent, received);
                let _ = e.start(run, e.interrupt.clone()).await;
            }
            other => e.on_claimed(job, &req, other, sent, received),
        }
    }
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

/// [`claim_one`], asked again at the tick's instant (by the clock the refusal corrected)
/// for as long as the store refuses it as too early: a late tick of the sequence is a
/// scheduled one, and this node's clock may have run ahead of the store's. `None` on
/// shutdown.
async fn claim_in_time(e: &Engine, req: &ClaimRequest) -> Option<(ClaimOutcome, Instant, Instant)> {
    loop {
        let (outcome, sent) = claim_one(e, req).await?;
        let received = Instant::now();
        if !matches!(outcome, ClaimOutcome::TooEarly { .. }) {
            return Some((outcome, sent, received));
        }
        // At least a little: the corrected estimate may still say the instant has passed.
        let wait = (req.tick.scheduled_at - e.now()).to_std().unwrap_or_default().max(TOO_EARLY_PAUSE);
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = e.interrupt.cancelled() => return None,
        }
        if e.tracker.is_closed() {
            return None;
        }
    }
}

/// The least wait before a tick refused as too early is asked for again.
const TOO_EARLY_PAUSE: Duration = Duration::from_millis(20);

/// One claim, retried while the store is unavailable; `None` on shutdown.
async fn claim_one(e: &Engine, req: &ClaimRequest) -> Option<(ClaimOutcome, Instant)> {
    let mut backoff = Backoff::store();
    while !e.tracker.is_closed() {
        let sent = Instant::now();
        match e.claim(std::slice::from_ref(req)).await {
            Ok(mut o) => return o.pop().map(|o| (o, sent)),
            Err(err) => tracing::warn!(error = %err, "catch-up claim failed; retrying"),
        }
        backoff.wait().await;
    }
    None
}

/// Marks a job's catch-up sequence as over when dropped (even by a panic).
struct CatchingUp(Arc<Engine>, String);

impl Drop for CatchingUp {
    fn drop(&mut self) {
        if let Ok(mut sequences) = self.0.catching_up.lock() {
            sequences.remove(&self.1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(s, 0).unwrap()
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
}
