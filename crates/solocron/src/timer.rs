//! The timer and what is due: one heap of next fire instants for all jobs; at each wake-up
//! the ticks due up to the claim lead ahead are planned by each job's policy (on time,
//! caught up, recorded skipped) and claimed in one batch.
//!
//! Ticks come from the schedule (job, instant), never from when the node woke: a late node
//! asks for the same ticks a punctual one did, and the store's claim makes one of them win.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use solocron_core::{plan_due, ClaimMode, HistoryQuery, Overlap, Tick, Trigger, JOBS_ASKED_MAX};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::backoff::Backoff;
use crate::backups::{Again, Backups, Claims, Undo};
use crate::catchup::{self, Sequence, Sequences};
use crate::engine::{late_tolerance, Engine};
use crate::job::Job;
use crate::jobset::JobSet;
use crate::lead::{Lead, CLAIM_AHEAD_MAX};
use crate::metrics::{self, StoreOp};
use crate::store_call::counted;
use crate::store_clock::SAMPLES_AT_START;
use solocron_os::wallclock::ClockSteps;

/// Longest the timer sleeps before looking at the wall clock again, with the system clock
/// (whose steps the kernel announces, see `solocron-os`) and with a clock given by the
/// caller or when the announcement is unavailable (so a jump is noticed within a second).
/// Idle, the wake-ups were a third of a node's CPU at one per second.
const TIMER_SLEEP_MAX: Duration = Duration::from_secs(60);
const TIMER_SLEEP_MAX_UNANNOUNCED: Duration = Duration::from_secs(1);
/// Most jobs handled in one wake-up; the rest go in the next (immediate) round.
const DUE_JOBS_PER_ROUND_MAX: usize = 10_000;

/// Where the timer stands with one job.
#[derive(Debug, Clone, Copy)]
struct Cursor {
    /// The last instant already handled.
    handled: DateTime<Utc>,
    /// Did the job's last claim round succeed, as far as it asked the store (a round that
    /// asked nothing says nothing; a failed or too late backup says no)? Only then are
    /// ticks since `handled` late rather than missed (a slow round is not an outage). `None`
    /// until the job's first claim round: ticks that came due after this node started are
    /// late, not missed, even when the first rounds of a huge start (10,000 jobs per round)
    /// take a while.
    healthy: Option<bool>,
    /// For the next plan only: the job's ticks before it are missed, however late the
    /// node's estimate of the store's clock makes them (a backup found them so by the
    /// store's own clock and handed them back).
    missed_before: Option<DateTime<Utc>>,
}

/// The instants of one claim round.
#[derive(Debug, Clone, Copy)]
struct Round {
    /// When this node's timer began.
    started: DateTime<Utc>,
    now: DateTime<Utc>,
    /// Ticks up to here are claimed: `now` plus the claim lead (at most `CLAIM_AHEAD_MAX`).
    horizon: DateTime<Utc>,
}

/// What a round asks the store for.
struct Plan {
    /// Claims of this round (each with its job's index), in order.
    claims: Claims,
    /// Jobs whose ticks run one after the other instead.
    catch_ups: Vec<(usize, Sequence)>,
    /// Runs this node may still start in this round (`max_concurrent_runs` less those in
    /// flight, less the on-time ticks already planned).
    run_slots: usize,
}

/// The timer: wakes at the earliest next fire instant, claims everything due in batches,
/// until `shutdown`.
pub(crate) async fn tick_loop(e: &Arc<Engine>, shutdown: &CancellationToken) {
    metrics::describe();
    let mut timer = Timer::new(e).await;
    let mut backoff = Backoff::store();
    let mut lead = Lead::new(Instant::now());
    while !shutdown.is_cancelled() {
        while let Some(undo) = timer.backups.ended() {
            timer.undo(undo);
        }
        if timer.backups.full() {
            let undo = timer.backups.next().await;
            timer.undo(undo);
        }
        if timer.settle_undone() {
            // A backup claim failed (store unavailable): its job is due again at once; the
            // backoff paces it, as it does a failed round's.
            tokio::select! {
                _ = backoff.wait() => {}
                _ = shutdown.cancelled() => {}
            }
        }
        let now = e.now();
        // The list's `changed` (awaited in `sleep`) marks it seen: compare the lists instead.
        let current = timer.list.borrow_and_update().clone();
        if !Arc::ptr_eq(&current, &timer.set) {
            timer.adopt(current, now);
        }
        let ahead = chrono::Duration::from_std(lead.get(Instant::now())).expect("at most CLAIM_AHEAD_MAX");
        let round = Round { started: timer.started, now, horizon: now + ahead };
        let due = timer.due(round.horizon);
        if due.is_empty() {
            timer.sleep(round.horizon, shutdown).await;
            continue;
        }
        let (failed, answered, claim_took) = claim_due(e, &mut timer, &due, round, shutdown).await;
        if failed.is_empty() {
            lead.observe(Instant::now(), claim_took);
            backoff.reset();
        }
        timer.reschedule(&due, &failed, answered, now);
        if !failed.is_empty() {
            tokio::select! {
                _ = backoff.wait() => {}
                _ = shutdown.cancelled() => {}
            }
        }
    }
    timer.backups.finish().await;
}

/// The heap of next fire instants and each job's cursor, over one job list; a new list
/// is adopted between rounds ([`Timer::adopt`]).
struct Timer {
    started: DateTime<Utc>,
    /// The job list the heap and cursors index.
    set: Arc<JobSet>,
    /// Told when the list is replaced.
    list: watch::Receiver<Arc<JobSet>>,
    heap: BinaryHeap<Reverse<(DateTime<Utc>, usize)>>,
    cursors: Vec<Cursor>,
    /// The kernel's notice of wall clock steps, when the clock is the system's.
    steps: Option<ClockSteps>,
    /// Rounds whose backups are being claimed.
    backups: Backups,
    /// What their ends took back since the heap was last filled.
    undone: Undone,
    /// The catch-up sequences under way (`catchup.rs`).
    sequences: Arc<Sequences>,
}

/// What [`Timer::undo`]s did since [`Timer::settle_undone`].
#[derive(Debug, Default)]
struct Undone {
    /// A cursor moved back.
    moved: bool,
    /// A backup claim failed.
    failed: bool,
}

/// When each job of `set` came to be, as far as the store knows, for a job with a
/// catch-up window: its first registration by any node before this start, or else its newest run record
/// (history outlives a registry cleared by hand); `started` for a job the store has never
/// seen, so that a job added to the fleet is not caught up to before it existed. A job
/// without a catch-up window, or a store that does not answer, gives the epoch: nothing is
/// held back.
async fn births(e: &Engine, set: &JobSet, started: DateTime<Utc>) -> Vec<DateTime<Utc>> {
    let epoch = DateTime::<Utc>::UNIX_EPOCH;
    let looking_back: Vec<String> =
        set.jobs.iter().filter(|j| !j.policy().catchup.is_zero()).map(|j| j.name().to_owned()).collect();
    if looking_back.is_empty() {
        return vec![epoch; set.len()];
    }
    let mut registered = Vec::new();
    for names in looking_back.chunks(JOBS_ASKED_MAX) {
        match counted(StoreOp::Register, e.store.registrations_of(names)).await {
            Ok(r) => registered.extend(r),
            Err(err) => {
                tracing::warn!(error = %err, "cannot read the job registry; catching up without regard to when jobs were added");
                return vec![epoch; set.len()];
            }
        }
    }
    // A registration made as this node (or the fleet with it) started says nothing of the
    // past: its own, most likely, written a moment ago.
    let before_start = started - chrono::Duration::seconds(2);
    let mut born: HashMap<&str, DateTime<Utc>> = HashMap::new();
    for r in registered.iter().filter(|r| r.first_seen < before_start) {
        let first = born.entry(r.definition.job.as_str()).or_insert(r.first_seen);
        *first = (*first).min(r.first_seen);
    }
    let mut births = Vec::with_capacity(set.len());
    let mut reads = 0;
    for j in &set.jobs {
        let birth = match born.get(j.name()) {
            _ if j.policy().catchup.is_zero() => epoch,
            Some(first) => *first,
            None if reads < BIRTH_HISTORY_READS_MAX => {
                reads += 1;
                newest_record(e, j.name()).await.unwrap_or(started)
            }
            // Past the bound, a job nobody registered is taken as new: better a missed tick
            // not recorded than a hundred recorded that never were due.
            None => started,
        };
        births.push(birth);
    }
    births
}

/// Most history reads a node makes at start to find whether an unregistered job existed.
const BIRTH_HISTORY_READS_MAX: usize = 100;

/// The instant of `job`'s newest run record, if the store has one (and answers).
async fn newest_record(e: &Engine, job: &str) -> Option<DateTime<Utc>> {
    let q = HistoryQuery { job: Some(job.to_owned()), limit: 1, ..HistoryQuery::default() };
    match counted(StoreOp::History, e.store.history(&q)).await {
        Ok(records) => records.first().map(|r| r.id.tick.scheduled_at),
        Err(_) => Some(DateTime::<Utc>::UNIX_EPOCH),
    }
}

impl Timer {
    async fn new(e: &Engine) -> Timer {
        calibrate(e).await;
        let started = e.now();
        let mut list = e.jobs.watch();
        let set = list.borrow_and_update().clone();
        // Never look back before the store's memory began: a tick it forgot is not missed.
        let memory_since = match counted(StoreOp::MemorySince, e.store.memory_since()).await {
            Ok(since) => since,
            Err(err) => {
                tracing::warn!(error = %err, "cannot ask the store since when it remembers; not catching up at start");
                Some(started)
            }
        };
        // A job with a catch-up window starts that far back, so missed ticks go through its
        // misfire policy; but never before the job existed: a job new to the fleet missed
        // nothing.
        let births = births(e, &set, started).await;
        let cursors: Vec<Cursor> = set
            .jobs
            .iter()
            .map(|j| started - chrono::Duration::from_std(j.policy().catchup).unwrap_or(chrono::Duration::zero()))
            .map(|c| memory_since.map_or(c, |m| c.max(m.min(started))))
            .zip(&births)
            .map(|(c, born)| Cursor { handled: c.max((*born).min(started)), healthy: None, missed_before: None })
            .collect();
        let steps = if e.system_clock {
            ClockSteps::new()
                .inspect_err(
                    |err| tracing::warn!(error = %err, "cannot watch the wall clock for steps; looking at it every second"),
                )
                .ok()
        } else {
            None
        };
        metrics::jobs(set.len());
        let mut timer = Timer {
            started,
            set,
            list,
            heap: BinaryHeap::new(),
            cursors,
            steps,
            backups: Backups::default(),
            undone: Undone::default(),
            sequences: Arc::default(),
        };
        timer.fill_heap();
        timer
    }

    /// Puts every job on the heap at the first tick after its cursor.
    fn fill_heap(&mut self) {
        self.heap = BinaryHeap::with_capacity(self.set.len());
        for (i, j) in self.set.jobs.iter().enumerate() {
            if let Some(next) = j.schedule().next_after(self.cursors[i].handled) {
                self.heap.push(Reverse((next, i)));
            }
        }
    }

    /// Takes the job list now current. A job on both lists keeps its cursor, so its new
    /// schedule continues from the last instant handled under the old one (nothing run
    /// twice, nothing dropped between them); an added job is born now (its first tick is
    /// the first after `now`); a removed job leaves the heap (a run of it in progress holds
    /// its own job and finishes).
    fn adopt(&mut self, next: Arc<JobSet>, now: DateTime<Utc>) {
        let cursors = next
            .jobs
            .iter()
            .map(|j| match self.set.index(j.name()) {
                Some(i) => self.cursors[i],
                None => Cursor { handled: now, healthy: None, missed_before: None },
            })
            .collect();
        self.set = next;
        self.cursors = cursors;
        self.fill_heap();
        metrics::jobs(self.set.len());
        debug_assert_eq!(self.cursors.len(), self.set.len());
    }

    /// The jobs with a tick due up to `horizon` (at most [`DUE_JOBS_PER_ROUND_MAX`]).
    fn due(&mut self, horizon: DateTime<Utc>) -> Vec<usize> {
        let mut due = Vec::new();
        while let Some(Reverse((t, i))) = self.heap.peek().copied() {
            if t > horizon || due.len() >= DUE_JOBS_PER_ROUND_MAX {
                break;
            }
            self.heap.pop();
            due.push(i);
        }
        due
    }

    /// Sleeps until the next tick comes within the lead, the wall clock is set, the job list
    /// is replaced, or shutdown.
    async fn sleep(&mut self, horizon: DateTime<Utc>, shutdown: &CancellationToken) {
        let most = if self.steps.is_some() { TIMER_SLEEP_MAX } else { TIMER_SLEEP_MAX_UNANNOUNCED };
        let wait = self.heap.peek().map_or(most, |Reverse((t, _))| (*t - horizon).to_std().unwrap_or_default());
        tokio::select! {
            _ = tokio::time::sleep(wait.min(most)) => {}
            // An error: the list's sender is gone with the engine; nothing more will change.
            Ok(()) = self.list.changed() => {}
            stepped = async { self.steps.as_mut().expect("only polled when present").stepped().await }, if self.steps.is_some() => {
                match stepped {
                    Ok(()) => tracing::info!("the wall clock was set; looking at the schedule again"),
                    Err(err) => {
                        tracing::warn!(error = %err, "cannot watch the wall clock any more; looking at it every second");
                        self.steps = None;
                    }
                }
            }
            undo = self.backups.next() => self.undo(undo),
            _ = shutdown.cancelled() => {}
        }
    }

    /// Takes back what a round's backups left to do (see `backups.rs`): each job's cursor
    /// goes back to just before the tick to plan again ([`Timer::settle_undone`] then makes
    /// it due). When the list changed since, a job is found by name, and only if its
    /// definition is the same (a changed job goes on from its cursor, as `adopt` says).
    fn undo(&mut self, undo: Undo) {
        for (i, from, again) in undo.jobs {
            let here = if Arc::ptr_eq(&undo.set, &self.set) {
                Some(i)
            } else {
                let old = &undo.set.jobs[i];
                self.set.index(old.name()).filter(|&j| {
                    let now = &self.set.jobs[j];
                    Arc::ptr_eq(now, old) || now.definition() == old.definition()
                })
            };
            let Some(j) = here else { continue };
            let cursor = &mut self.cursors[j];
            cursor.handled = cursor.handled.min(from - chrono::Duration::milliseconds(1));
            if again != Again::TooEarly {
                cursor.healthy = Some(false);
            }
            if let Again::Stale { missed_before } = again {
                cursor.missed_before = cursor.missed_before.max(Some(missed_before));
            }
            self.undone.moved = true;
            self.undone.failed |= again == Again::Failed;
        }
    }

    /// After [`Timer::undo`]s: fills the heap again, once, if a cursor moved back (its tick
    /// is due at once); returns whether a backup claim failed.
    fn settle_undone(&mut self) -> bool {
        let undone = std::mem::take(&mut self.undone);
        if undone.moved {
            self.fill_heap();
        }
        undone.failed
    }

    /// Puts the round's jobs back on the heap: at their next tick, or, where the claim
    /// failed, at once (the backoff paces the retry) with their cursor unmoved. A job whose
    /// claim failed is unhealthy; the others are healthy if the store `answered` a claim of
    /// the round, else keep their health: a round whose ticks all went to backups or
    /// sequences never asked the store, and must not take an outage for a healthy store.
    fn reschedule(&mut self, due: &[usize], failed: &HashSet<usize>, answered: bool, now: DateTime<Utc>) {
        for &i in due {
            let ok = !failed.contains(&i);
            if !ok || answered {
                self.cursors[i].healthy = Some(ok);
            }
            let after = if ok { self.cursors[i].handled } else { now };
            if let Some(next) = self.set.jobs[i].schedule().next_after(after) {
                self.heap.push(Reverse((if ok { next } else { now }, i)));
            }
        }
    }
}

/// Reads the store's clock a few times before the first claim, so the first ticks are
/// claimed and started by it; without an answer, the node's clock is followed until the
/// heartbeats' samples come.
async fn calibrate(e: &Engine) {
    for _ in 0..SAMPLES_AT_START {
        if let Err(err) = e.sample_store_clock().await {
            tracing::warn!(error = %err, "cannot read the store's clock; following this node's until it answers");
            return;
        }
    }
}

/// Plans and claims the ticks of `due` jobs up to the round's horizon: the ticks this node
/// ranks first at once, the others as a backup past their instant, in a task of
/// `backups` (`spread.rs`, `backups.rs`). Returns the jobs whose claim failed (store
/// unavailable): their cursor stays, so nothing is lost; whether the store answered a
/// claim of this node's own ticks; and how long that claim took (what the lead adapts to).
async fn claim_due(
    e: &Arc<Engine>,
    timer: &mut Timer,
    due: &[usize],
    round: Round,
    shutdown: &CancellationToken,
) -> (HashSet<usize>, bool, Duration) {
    let (set, cursors) = (&timer.set, &mut timer.cursors);
    debug_assert!(round.now <= round.horizon);
    debug_assert!((round.horizon - round.now).to_std().is_ok_and(|d| d <= CLAIM_AHEAD_MAX));
    // After failed claims the store may have restarted and forgotten (Redis without
    // persistence): never look back before its memory began, so a tick that ran just before
    // the restart is not run again. Only asked while some due job is failing (cheap).
    let failing: Vec<usize> = due.iter().copied().filter(|&i| cursors[i].healthy == Some(false)).collect();
    if !failing.is_empty() {
        match counted(StoreOp::MemorySince, e.store.memory_since()).await {
            Ok(Some(since)) => {
                for i in failing {
                    cursors[i].handled = cursors[i].handled.max(since.min(round.now));
                }
            }
            Ok(None) => {}
            Err(_) => return (due.iter().copied().collect(), false, Duration::ZERO),
        }
    }
    let run_slots = e.max_concurrent_runs.saturating_sub(e.in_flight());
    // Nearly always one claim per due job: made at that size, not grown claim by claim.
    let mut plan = Plan { claims: Vec::with_capacity(due.len()), catch_ups: Vec::new(), run_slots };
    for &i in due {
        // Missed ticks while a sequence of the job is under way are queued behind it (see
        // `catchup::spawn`), never dropped.
        let sequence_active = timer.sequences.under_way(set.jobs[i].name());
        plan_job(e, &set.jobs[i], i, cursors[i], round, sequence_active, &mut plan);
        cursors[i].missed_before = None;
    }
    let (first, backup) = spread(e, plan.claims);
    let sent = Instant::now();
    let result = e.claim_and_start(set, first, round.horizon.timestamp_millis()).await;
    let claim_took = sent.elapsed();
    timer.backups.spawn(e, set, backup, claim_took, round.horizon.timestamp_millis(), shutdown);
    let failed = result.failed;
    for &i in due {
        if !failed.contains(&i) {
            cursors[i].handled = round.horizon;
        }
    }
    // A tick the store refused as claimed too early is due again at its instant, by the
    // clock the refusal corrected: the cursor goes back to just before it (a later tick of
    // the round already won is then found taken).
    for (&i, &at) in &result.too_early {
        if !failed.contains(&i) {
            cursors[i].handled = cursors[i].handled.min(at - chrono::Duration::milliseconds(1));
        }
    }
    for (i, ticks) in plan.catch_ups {
        if !failed.contains(&i) {
            catchup::spawn(e, &timer.sequences, set.jobs[i].clone(), ticks);
        }
    }
    (failed, result.answered, claim_took)
}

/// The claims this node makes first and those it makes as a backup: each job's by its
/// earliest tick in the round, so a job's ticks stay together, claimed oldest first.
fn spread(e: &Engine, claims: Claims) -> (Claims, Claims) {
    let ranking = e.spread.ranking();
    // A job's claims are next to one another (`plan_job` adds them in one go): its first
    // one decides for all.
    let mut job: Option<(usize, bool)> = None;
    let mine: Vec<bool> = claims
        .iter()
        .map(|(i, r)| {
            let mine = match job {
                Some((j, mine)) if j == *i => mine,
                _ => ranking.is_first(&r.tick),
            };
            job = Some((*i, mine));
            mine
        })
        .collect();
    let firsts = mine.iter().filter(|m| **m).count();
    let (mut first, mut backup) = (Vec::with_capacity(firsts), Vec::with_capacity(claims.len() - firsts));
    for (claim, mine) in claims.into_iter().zip(mine) {
        if mine { &mut first } else { &mut backup }.push(claim);
    }
    (first, backup)
}

/// Why an on-time tick of a job catching up on this node is recorded skipped.
const CATCHING_UP: &str = "overlap: a catch-up of this job is under way";

/// Adds what `job` (index `i` of the list) asks for in this round to `plan`: its on-time
/// ticks to claim (while the plan has run slots; to record skipped while the job catches
/// up here: `sequence_active`), its missed ticks to record skipped, or a catch-up sequence.
fn plan_job(e: &Engine, job: &Job, i: usize, cursor: Cursor, round: Round, sequence_active: bool, plan: &mut Plan) {
    let tolerance_start = round.now - late_tolerance();
    let late_from = match cursor.healthy {
        Some(true) => cursor.handled.min(tolerance_start),
        Some(false) => tolerance_start,
        None => tolerance_start.min(round.started),
    }
    .max(cursor.missed_before.unwrap_or(DateTime::<Utc>::MIN_UTC));
    let mut due = plan_due(job.schedule(), job.policy(), cursor.handled, round.horizon, late_from);
    if due.not_examined > 0 {
        tracing::warn!(job = %job.name(), ticks = due.not_examined, "missed ticks beyond max_catchup were not examined");
    }
    if due.older_not_examined {
        tracing::info!(job = %job.name(), catchup = ?job.policy().catchup,
            "ticks older than the catch-up window came due while this node was not claiming; not examined");
    }
    for (t, reason) in due.record_skipped {
        plan.claims.push((i, e.request(job, Tick::new(job.name(), t), Trigger::Catchup, ClaimMode::Skip { reason })));
    }
    // With overlap = skip, a job whose catch-up sequence is under way on this node is busy
    // (running a tick of it, or about to): its on-time ticks are recorded skipped, as ticks
    // that come while it runs. Claimed to run beside the sequence, one could run before
    // older ticks still queued, or be the run an older one is recorded as overlapping. A
    // tick whose earlier claim went unanswered is asked for as it was (to run: the store
    // grants it again only so).
    if sequence_active && job.policy().overlap == Overlap::Skip {
        for t in std::mem::take(&mut due.on_time) {
            let tick = Tick::new(job.name(), t);
            let request = if e.unanswered.contains(&tick) {
                e.run_request(job, tick, Trigger::Schedule)
            } else {
                e.request(job, tick, Trigger::Schedule, ClaimMode::Skip { reason: CATCHING_UP.to_owned() })
            };
            plan.claims.push((i, request));
        }
    }
    // Several late ticks of one job (after an outage or a stall) did not overlap one another
    // when they came due: with overlap = skip they run one after the other, like a
    // catch-up, instead of all but the first being recorded as overlapping.
    let queued_late = due.on_time.len() > 1 && job.policy().overlap == Overlap::Skip && !sequence_active;
    if !due.catch_up.is_empty() || queued_late {
        // Missed runs go first, oldest first; this pass's on-time ticks queue behind them,
        // so the overlap policy sees them in schedule order.
        let mut seq: Sequence = due.catch_up.into_iter().map(|t| (t, Trigger::Catchup)).collect();
        seq.extend(due.on_time.into_iter().map(|t| (t, Trigger::Schedule)));
        plan.catch_ups.push((i, seq));
        return;
    }
    for t in due.on_time {
        if plan.run_slots == 0 {
            tracing::warn!(job = %job.name(), scheduled_at = %t, "node at max_concurrent_runs; leaving the tick to other nodes");
            continue;
        }
        plan.run_slots -= 1;
        plan.claims.push((i, e.run_request(job, Tick::new(job.name(), t), Trigger::Schedule)));
    }
}
