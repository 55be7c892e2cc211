//! The life of one claimed run: start the handler, renew the lease every lease/3, stop the
//! job when the lease is lost, the timeout passes or the node shuts down, and record the end.
//!
//! This is the one function that owns a run's control flow; everything it calls computes.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use solocron_core::{
    output_tail, Clock, Ending, JobPolicy, Lease, NodeStore, Renewal, RunEnd, RunId, RunState, StoreError, Trigger,
};
use tokio::sync::oneshot;
use tokio::time::{sleep_until, timeout_at, Instant};
use tokio_util::sync::CancellationToken;

use crate::backoff::Backoff;
use crate::batches::{Batcher, Batches, Renewals};
use crate::ends::Ends;
use crate::job::{Job, Outcome, RunContext};
use crate::metrics::{self, Renewal as RenewalResult, StoreOp};
use crate::retry::{self, RetryPlan, RetryWakes};
use crate::store_call::counted;
use crate::store_clock::StoreClock;

/// A claimed run, ready to start: the one value every path hands to [`execute`].
#[derive(Debug)]
pub(crate) struct Claimed {
    /// The job it runs (as it was defined when claimed, whatever the list is now).
    pub(crate) job: Arc<Job>,
    /// The lease the claim won (its run id, owner and fencing token).
    pub(crate) lease: Lease,
    /// Why the tick was claimed.
    pub(crate) trigger: Trigger,
    /// When the claim was sent: the lease's local deadlines count from it.
    pub(crate) sent: Instant,
    /// How long after the record's `claimed_at` the store granted this lease (not zero
    /// only for a claim granted again after its answer was lost): the run's start is
    /// recorded as `claimed_at` plus this plus the time from `sent` to the start.
    pub(crate) regranted_after: Duration,
    /// When the job starts: the tick's instant for a tick claimed ahead, else at once.
    pub(crate) start_at: Instant,
    /// The tick's instant on the monotonic clock (by this node's wall clock at the claim),
    /// if that clock reaches back to it: how late a scheduled start was is measured from it.
    pub(crate) due: Option<Instant>,
    /// Told how long the handler ran, once it is over and before the end is recorded
    /// (dropped unsent if it never starts): a catch-up sequence excuses its runs' handlers
    /// by it, not the store's time to confirm their leases or record their ends.
    pub(crate) handler_over: Option<oneshot::Sender<Duration>>,
}

/// Extra time, beyond the job's kill grace, that a stopped handler gets before it is dropped
/// (a command also drains its output pipes after the kill: up to 2 × 1 s).
const STOP_SLACK: Duration = Duration::from_secs(3);
/// Longest wait for recording the end of a run whose lease is already lost.
const LOST_FINISH_WAIT: Duration = Duration::from_secs(2);

/// Why the engine stopped a job before it ended by itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// The lease is gone or could not be renewed before the local deadline.
    Lost(&'static str),
    /// The job's timeout passed.
    TimedOut,
    /// The node is shutting down and the grace passed.
    Interrupted,
}

/// The owner's view of its lease: when to renew next, and until when it may trust it.
struct Heartbeat {
    lease: Lease,
    policy: JobPolicy,
    next_renew: Instant,
    /// Local, conservative end of the lease (monotonic clock).
    deadline: Instant,
    /// When to start stopping the job if no renewal succeeds: `kill_grace` before `deadline`.
    stop_at: Instant,
}

enum Beat {
    Renewed,
    Retry,
    Gone,
}

impl Heartbeat {
    fn new(lease: Lease, policy: JobPolicy, claim_sent: Instant) -> Heartbeat {
        Heartbeat {
            next_renew: claim_sent + policy.renew_interval(),
            deadline: claim_sent + policy.local_lease_deadline(),
            stop_at: claim_sent + policy.local_stop_deadline(),
            lease,
            policy,
        }
    }

    /// Sends one renewal (through the engine's batches of renewals), bounded by the local
    /// deadline and by one renew interval, so a hung connection gets another try before the
    /// deadline. The returned future owns what it needs: the run's supervision goes on
    /// while it is pending, so a renewal that hangs (a partition: nothing refused, nothing
    /// answered) never delays the stop, the timeout or shutdown.
    fn send(&self, renewals: &Batcher<Renewals>) -> PendingRenewal {
        let sent = Instant::now();
        let bound = self.deadline.min(sent + self.policy.renew_interval());
        let renewal = Renewal { lease: self.lease.clone(), length: self.policy.lease };
        let renewals = renewals.clone();
        Box::pin(async move { (sent, timeout_at(bound, renewals.send(renewal, bound)).await.ok()) })
    }

    /// Takes the answer to the renewal sent at `sent` (`None`: no answer within its bound).
    fn answered(&mut self, sent: Instant, answer: Option<Result<bool, StoreError>>) -> Beat {
        metrics::lease_renewal(match answer {
            Some(Ok(true)) => RenewalResult::Ok,
            Some(Ok(false)) => RenewalResult::Refused,
            Some(Err(_)) | None => RenewalResult::Error,
        });
        match answer {
            Some(Ok(true)) => {
                self.deadline = sent + self.policy.local_lease_deadline();
                self.stop_at = sent + self.policy.local_stop_deadline();
                self.next_renew = sent + self.policy.renew_interval();
                Beat::Renewed
            }
            Some(Ok(false)) => Beat::Gone,
            Some(Err(e)) => {
                tracing::warn!(run = %self.lease.run, error = %e, "lease renewal failed; retrying until the lease deadline");
                self.next_renew = Instant::now() + (self.policy.renew_interval() / 4).max(Duration::from_millis(50));
                Beat::Retry
            }
            None => {
                tracing::warn!(run = %self.lease.run, "lease renewal timed out");
                self.next_renew = Instant::now();
                Beat::Retry
            }
        }
    }

    /// One renewal, awaited: only before the job starts, when nothing else needs watching.
    async fn beat(&mut self, renewals: &Batcher<Renewals>) -> Beat {
        let (sent, answer) = self.send(renewals).await;
        self.answered(sent, answer)
    }
}

/// A renewal on its way: when it was sent, and the store's answer if one came in time.
type PendingRenewal = Pin<Box<dyn Future<Output = (Instant, Option<Result<bool, StoreError>>)> + Send>>;

/// What a run uses of its node: where its renewals and ends go, the store (for an end that
/// plans a retry), the retry wake-ups, the store's clock as this node estimates it, and where
/// its end is announced. The engine lends it for the run's life (`Engine::start`): the
/// runner never claims, and never sees the engine.
pub(crate) struct Env<'a> {
    pub(crate) batches: &'a Batches,
    pub(crate) store: &'a dyn NodeStore,
    pub(crate) retry_wakes: &'a RetryWakes,
    pub(crate) clock: &'a dyn Clock,
    pub(crate) store_clock: &'a StoreClock,
    pub(crate) ends: &'a Ends,
}

impl Env<'_> {
    /// Now, by the store's clock as this node estimates it (see `store_clock.rs`).
    fn now(&self) -> DateTime<Utc> {
        self.store_clock.now(self.clock)
    }
}

/// Runs a claimed run to its recorded end: the handler starts at `run.start_at` (the instant
/// of a tick claimed ahead, at most `CLAIM_AHEAD_MAX` away), its lease is renewed and its end
/// recorded through the node's batches (or, when another attempt follows, with that attempt
/// in one store step), and `interrupt` fires when it must stop early (shutdown's grace is
/// over).
pub(crate) async fn execute(run: Claimed, env: &Env<'_>, interrupt: CancellationToken) {
    let Claimed { job, lease, trigger, sent: claim_sent, regranted_after, start_at, due, handler_over } = run;
    let policy = job.policy().clone();
    let cancel = CancellationToken::new();
    let ctx = context(&job, &lease, trigger, &cancel);
    let mut hb = Heartbeat::new(lease, policy.clone(), claim_sent);
    // A wait for the instant ends inside the first renew interval (lease/3 ≥ 166 ms against
    // CLAIM_AHEAD_MAX = 150 ms after the claim was sent), unless the node's estimate of the
    // store's clock was off and the store granted the tick further ahead (at most
    // CLAIM_EARLY_MAX); a start at once may come later, when the claim's answer was late.
    // Either way the lease is confirmed before the start when the renewal came due (below).
    debug_assert!(
        start_at <= claim_sent + solocron_core::CLAIM_EARLY_MAX.max(hb.policy.renew_interval())
            || start_at <= Instant::now()
    );
    sleep_until(start_at).await;
    let started = Instant::now();
    tracing::info!(
        job = %ctx.job, scheduled_at = %ctx.scheduled_at, node = %ctx.node_id, token = ctx.fencing_token,
        attempt = ctx.attempt, trigger = %trigger, run = %ctx.run_id, "run started"
    );
    let renewals = &env.batches.renewals;
    if Instant::now() >= hb.next_renew && !matches!(hb.beat(renewals).await, Beat::Renewed) {
        // The claim's answer came so late that the lease may be gone: never start unsure.
        drop(handler_over);
        return lost_before_start(env, &job, &hb).await;
    }
    if let (Trigger::Schedule, Some(due)) = (trigger, due) {
        metrics::start_lateness(Instant::now().saturating_duration_since(due));
    }
    let handler = job.handler();
    let spawned = Instant::now();
    let task = tokio::spawn(async move { handler.run(ctx).await });
    let (outcome, stop) = supervise(task, &mut hb, renewals, &policy, started, &cancel, &interrupt).await;
    if let Some(over) = handler_over {
        let _ = over.send(spawned.elapsed());
    }
    let end = end_of(outcome, stop, regranted_after + (started - claim_sent));
    let (end, wait) = next_attempt(env, &job, &hb.lease.run, end);
    let lost = matches!(stop, Some(Stop::Lost(_)));
    if record(env, &hb, &end, lost, wait).await {
        ended(env, &job, &hb.lease.run, end.state, wait.is_some());
    }
    // An absent exit code or reason is left out of the line, not shown as `None` or "".
    tracing::info!(
        job = %job.name(), scheduled_at = %hb.lease.run.tick.scheduled_at, node = %hb.lease.owner,
        token = hb.lease.fencing_token, attempt = hb.lease.run.attempt, state = %end.state,
        duration = %solocron_core::format_duration(started.elapsed()), exit_code = end.exit_code,
        reason = end.reason.as_deref(), "run ended"
    );
}

/// What the handler of `job`'s run under `lease` is told about its run.
fn context(job: &Job, lease: &Lease, trigger: Trigger, cancel: &CancellationToken) -> RunContext {
    RunContext {
        job: job.name().to_owned(),
        scheduled_at: lease.run.tick.scheduled_at,
        fencing_token: lease.fencing_token,
        node_id: lease.owner.clone(),
        run_id: lease.run.text(),
        attempt: lease.run.attempt,
        trigger,
        cancel: cancel.clone(),
        kill_grace: job.policy().kill_grace,
    }
}

/// Records lost, never started, a run of `job` whose lease could not be confirmed before
/// its start.
async fn lost_before_start(env: &Env<'_>, job: &Job, hb: &Heartbeat) {
    let end = RunEnd {
        state: RunState::Lost,
        reason: Some("the claim's answer came too late to trust the lease; job not started".into()),
        exit_code: None,
        output: String::new(),
        started_after: None,
    };
    metrics::lease_lost(job.name());
    if record_end(hb, &end, true, |ending, give_up| env.batches.ends.send(ending, give_up)).await {
        ended(env, job, &hb.lease.run, end.state, false);
    }
    tracing::warn!(run = %hb.lease.run, "lease not confirmed before start; run recorded lost without starting");
}

/// The end of `job`'s `run` to record and, when another attempt of its tick follows, the
/// wait before it: a failure the job's policy retries, or a run of an on-demand job that
/// shutdown cut short, handed to another node ([`Job::interrupted_handoff`]).
fn next_attempt(env: &Env<'_>, job: &Job, run: &RunId, end: RunEnd) -> (RunEnd, Option<Duration>) {
    let policy = job.policy();
    let next_tick = || job.next_tick_after(run.tick.scheduled_at);
    let plan = retry::plan(policy, next_tick, run, &end, env.now(), fastrand::f64());
    let interrupted = end.state == RunState::Interrupted && run.attempt < policy.max_attempts;
    match plan {
        RetryPlan::None => (end, job.interrupted_handoff().filter(|_| interrupted)),
        RetryPlan::After(wait) => (end, Some(wait)),
        RetryPlan::Dropped(why) => (retry::with_note(end, &why), None),
    }
}

/// Records the end: through the node's batches of ends, or, when another attempt follows
/// after `wait`, together with that attempt in one store step (the recovery scan is then
/// woken for it). True if this end is the run's record.
async fn record(env: &Env<'_>, hb: &Heartbeat, end: &RunEnd, lost: bool, wait: Option<Duration>) -> bool {
    let Some(wait) = wait else {
        return record_end(hb, end, lost, |ending, give_up| env.batches.ends.send(ending, give_up)).await;
    };
    let store = env.store;
    let recorded = record_end(hb, end, lost, |ending, _| async move {
        counted(StoreOp::Finish, store.finish_for_retry(&ending.lease, &ending.end, wait)).await
    })
    .await;
    if recorded {
        env.retry_wakes.push(Instant::now() + wait + retry::WAKE_SLACK);
        tracing::info!(run = %hb.lease.run, next_attempt = hb.lease.run.attempt + 1,
            wait = %solocron_core::format_duration(wait), "run failed; retry planned");
    }
    recorded
}

/// Counts the recorded end of `job`'s `run`, and announces it (`ends.rs`) unless another
/// attempt of its tick follows (`retried`): only a tick's last end is an event.
fn ended(env: &Env<'_>, job: &Job, run: &RunId, state: RunState, retried: bool) {
    metrics::tick_ended(job.shared_name(), state);
    if !retried {
        env.ends.announce(run, state);
    }
}

/// Waits for the handler while keeping the lease; stops it when it must stop.
async fn supervise(
    mut task: tokio::task::JoinHandle<Outcome>,
    hb: &mut Heartbeat,
    renewals: &Batcher<Renewals>,
    policy: &JobPolicy,
    started: Instant,
    cancel: &CancellationToken,
    interrupt: &CancellationToken,
) -> (Option<Outcome>, Option<Stop>) {
    let far = started + Duration::from_secs(30 * 365 * 86_400);
    let timeout_at = policy.timeout.map_or(far, |t| started + t);
    let mut stop: Option<Stop> = None;
    let mut hard_stop = far;
    let mut renewing = true;
    // At most one renewal in flight; it is polled beside every other reason to stop.
    let mut pending: Option<PendingRenewal> = None;
    loop {
        let mut stop_now = None;
        // The next deadline, of every one armed, is the run's one timer entry.
        let next = Deadlines {
            stop_at: renewing.then_some(hb.stop_at),
            renew_at: (renewing && pending.is_none()).then_some(hb.next_renew),
            timeout_at: (stop.is_none() && timeout_at != far).then_some(timeout_at),
            hard_stop: (hard_stop != far).then_some(hard_stop),
        }
        .next();
        tokio::select! {
            biased;
            res = &mut task => {
                return (res.ok().or_else(|| Some(Outcome { output: "handler panicked".into(), ..Outcome::default() })), stop);
            }
            deadline = async { let (at, which) = next.expect("polled only when armed"); sleep_until(at).await; which }, if next.is_some() => match deadline {
                Deadline::Stop => stop_now = Some(Stop::Lost("could not renew the lease in time")),
                Deadline::Renew => pending = Some(hb.send(renewals)),
                Deadline::Timeout => stop_now = Some(Stop::TimedOut),
                Deadline::HardStop => {
                    task.abort();
                    tracing::warn!(run = %hb.lease.run, "handler ignored cancellation past its kill grace; dropped");
                    return (None, stop);
                }
            },
            (sent, answer) = async { pending.as_mut().expect("polled only when present").await }, if renewing && pending.is_some() => {
                pending = None;
                if let Beat::Gone = hb.answered(sent, answer) {
                    stop_now = Some(Stop::Lost("the lease was taken away (expired, recovered or unlocked)"));
                }
            }
            _ = interrupt.cancelled(), if stop.is_none() => stop_now = Some(Stop::Interrupted),
        }
        if let Some(s) = stop_now {
            if let Stop::Lost(why) = s {
                renewing = false;
                pending = None;
                metrics::lease_lost(&hb.lease.run.tick.job);
                tracing::warn!(run = %hb.lease.run, why, "lease lost; stopping the job");
            }
            if stop.is_none() || matches!(s, Stop::Lost(_)) {
                stop = Some(s);
            }
            if !cancel.is_cancelled() {
                cancel.cancel();
                hard_stop = Instant::now() + policy.kill_grace + STOP_SLACK;
            }
            // Past the local deadline the lease may be another node's: whatever ignores the
            // stop is dropped then (a command's group is killed by the drop), not later.
            if let Stop::Lost(_) = s {
                hard_stop = hard_stop.min(hb.deadline.max(Instant::now()));
            }
        }
    }
}

/// What a run's supervision waits for besides the handler, the renewal's answer and the
/// node's shutdown: each deadline that is armed (`None`: not now).
struct Deadlines {
    /// Start stopping the job: no renewal succeeded in time.
    stop_at: Option<Instant>,
    /// Send the next renewal (none is in flight).
    renew_at: Option<Instant>,
    /// The job's timeout.
    timeout_at: Option<Instant>,
    /// Drop a handler that ignored its stop.
    hard_stop: Option<Instant>,
}

/// Which deadline a run's one timer entry is set for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Deadline {
    Stop,
    Renew,
    Timeout,
    HardStop,
}

impl Deadlines {
    /// The earliest armed deadline; of equal ones, the first in the order above (a lost
    /// lease before a renewal, a renewal before the timeout).
    fn next(&self) -> Option<(Instant, Deadline)> {
        let all = [
            (self.stop_at, Deadline::Stop),
            (self.renew_at, Deadline::Renew),
            (self.timeout_at, Deadline::Timeout),
            (self.hard_stop, Deadline::HardStop),
        ];
        all.into_iter().filter_map(|(at, which)| at.map(|at| (at, which))).fold(
            None,
            |best: Option<(Instant, Deadline)>, (at, which)| match best {
                Some((b, _)) if b <= at => best,
                _ => Some((at, which)),
            },
        )
    }
}

/// The recorded end, from what the handler said and why the engine stopped it.
fn end_of(outcome: Option<Outcome>, stop: Option<Stop>, started_after: Duration) -> RunEnd {
    let outcome = outcome.unwrap_or_default();
    let (state, reason) = match stop {
        None if outcome.success => (RunState::Succeeded, None),
        None => (RunState::Failed, outcome.reason.clone().or(outcome.exit_code.map(|c| format!("exit code {c}")))),
        Some(Stop::Lost(why)) => (RunState::Lost, Some(why.to_owned())),
        Some(Stop::TimedOut) => (RunState::TimedOut, Some("timeout passed; job stopped".to_owned())),
        Some(Stop::Interrupted) => {
            (RunState::Interrupted, Some("node shut down; job stopped after the grace".to_owned()))
        }
    };
    debug_assert!(state.is_terminal());
    RunEnd {
        state,
        reason,
        exit_code: outcome.exit_code,
        output: output_tail(&outcome.output).to_owned(),
        started_after: Some(started_after),
    }
}

/// Records the end with `send` (the node's batches of ends, or the store's step that also
/// plans a retry), retrying while the lease may still be ours; true if this end is the
/// run's record.
async fn record_end<F, Fut>(hb: &Heartbeat, end: &RunEnd, lost: bool, send: F) -> bool
where
    F: Fn(Ending, Instant) -> Fut,
    Fut: Future<Output = Result<bool, StoreError>>,
{
    let give_up =
        if lost { Instant::now() + LOST_FINISH_WAIT } else { hb.deadline.max(Instant::now() + LOST_FINISH_WAIT) };
    let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(2));
    loop {
        let ending = Ending { lease: hb.lease.clone(), end: end.clone() };
        match timeout_at(give_up, send(ending, give_up)).await {
            Ok(Ok(true)) => return true,
            Ok(Ok(false)) => {
                tracing::warn!(run = %hb.lease.run, state = %end.state,
                    "run already ended (by another node, or by an earlier try whose answer was lost); its record stands");
                return false;
            }
            Ok(Err(e)) => tracing::warn!(run = %hb.lease.run, error = %e, "could not record the run's end; retrying"),
            Err(_) => {}
        }
        if Instant::now() + backoff.peek() >= give_up {
            tracing::error!(run = %hb.lease.run, state = %end.state,
                "could not record the run's end before its lease ran out; another node will recover it by its on_crash policy");
            return false;
        }
        backoff.wait().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_one_timer_is_set_for_the_earliest_armed_deadline_and_a_lost_lease_wins_ties() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let all = Deadlines {
            stop_at: Some(t0 + s(9)),
            renew_at: Some(t0 + s(3)),
            timeout_at: Some(t0 + s(5)),
            hard_stop: None,
        };
        assert_eq!(all.next(), Some((t0 + s(3), Deadline::Renew)));
        let renewing = Deadlines { renew_at: None, ..all };
        assert_eq!(renewing.next(), Some((t0 + s(5), Deadline::Timeout)), "no renewal armed while one is in flight");
        let tie = Deadlines {
            stop_at: Some(t0 + s(3)),
            renew_at: Some(t0 + s(3)),
            timeout_at: Some(t0 + s(3)),
            hard_stop: Some(t0 + s(3)),
        };
        assert_eq!(tie.next(), Some((t0 + s(3), Deadline::Stop)));
        let stopping = Deadlines { stop_at: None, renew_at: None, timeout_at: None, hard_stop: Some(t0 + s(1)) };
        assert_eq!(stopping.next(), Some((t0 + s(1), Deadline::HardStop)));
        assert_eq!(Deadlines { hard_stop: None, ..stopping }.next(), None, "nothing armed: no timer at all");
    }
}
