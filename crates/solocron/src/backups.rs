//! A round's backups (the ticks this node ranks behind another node, `spread.rs`), claimed
//! off the timer loop: a task per round waits past their instant ([`backup_wait`]), asks
//! the store which are still free and claims those, while the timer goes on planning and
//! claiming the next rounds on time. After a herd the wait lasts up to seconds; held in the
//! timer loop, it made every other job's next ticks of this node late by as much.
//!
//! What a task could not claim (the store unavailable) or was refused as too early comes
//! back to the timer as an [`Undo`]: the job's cursor goes back to just before the tick,
//! so it is planned again, as an own claim that failed would be; a later tick of the job
//! already claimed since is then found taken. So does a tick that, once the task is about
//! to claim it, is past the late tolerance (the store was slow, not down: the timer does
//! not back off for it): it goes through its job's misfire policy instead of running that
//! late. Nothing is lost, nothing runs twice (the store's claim decides).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use solocron_core::{ClaimMode, ClaimRequest, Tick};
use tokio::task::{JoinError, JoinSet};
use tokio_util::sync::CancellationToken;

use crate::engine::{late_tolerance, Engine};
use crate::jobset::JobSet;
use crate::metrics::StoreOp;
use crate::spread::{backup_wait, BACKUP_AFTER};
use crate::store_call::counted;

/// Claims of one round, each with its job's index in the round's list.
pub(crate) type Claims = Vec<(usize, ClaimRequest)>;

/// Most rounds whose backups are waited for or claimed at once; past it, the timer waits
/// for one of them to end before its next round. Rounds come at most every few hundred
/// milliseconds, so a few cover a herd's wait ([`backup_wait`], at most seconds).
const BACKUP_ROUNDS_MAX: usize = 8;

/// What one round's backups left to do again: for each job (by its index in `set`), the
/// earliest tick to plan again, and why.
#[derive(Debug)]
pub(crate) struct Undo {
    /// The job list the round was planned on.
    pub(crate) set: Arc<JobSet>,
    pub(crate) jobs: Vec<(usize, DateTime<Utc>, Again)>,
}

/// Why a job's backup tick is planned again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Again {
    /// Its claim failed (the store unavailable): the job is unhealthy (its next round is
    /// not on time) and the timer backs off before claiming again.
    Failed,
    /// Not sent: older than `missed_before` (the late tolerance, by the store's clock) when
    /// it was about to be (the store was slow). The job is unhealthy and its ticks before
    /// that instant are missed, whatever the node's estimate of the store's clock says, so
    /// misfire decides and the tick never comes back as a backup; the store answers, so
    /// no backoff.
    Stale {
        /// Before it, the job's ticks are missed.
        missed_before: DateTime<Utc>,
    },
    /// Refused as claimed too early: due again at its instant.
    TooEarly,
}

/// The rounds whose backups are under way.
#[derive(Default)]
pub(crate) struct Backups {
    tasks: JoinSet<Undo>,
}

impl Backups {
    /// Starts claiming a round's `backup` claims on list `set`: waiting past the earliest
    /// tick's instant (and after a long `own_claim`, half as long again), then claiming
    /// those still free, up to the round's `horizon` (ms). Ends at once on `shutdown`
    /// while waiting or asking which are free (the ticks are the other nodes'); a claim
    /// already sent is answered and its runs started, as the timer's own. At most
    /// [`BACKUP_ROUNDS_MAX`] are under way: see [`Backups::full`].
    pub(crate) fn spawn(
        &mut self,
        e: &Arc<Engine>,
        set: &Arc<JobSet>,
        backup: Claims,
        own_claim: Duration,
        horizon: i64,
        shutdown: &CancellationToken,
    ) {
        assert!(!self.full(), "the timer waits for a round's backups before starting more");
        let Some(earliest) = backup.iter().map(|(_, r)| r.tick.scheduled_at).min() else { return };
        let at = earliest + chrono::Duration::from_std(BACKUP_AFTER).expect("small");
        let wait = backup_wait((at - e.now()).to_std().unwrap_or_default(), own_claim);
        let (e, set, shutdown) = (e.clone(), set.clone(), shutdown.clone());
        self.tasks.spawn(async move {
            let jobs = claim_backups(&e, &set, backup, wait, horizon, &shutdown).await;
            Undo { set, jobs }
        });
    }

    /// Whether [`BACKUP_ROUNDS_MAX`] rounds are under way: the timer waits for one
    /// ([`Backups::next`]) before its next round.
    pub(crate) fn full(&self) -> bool {
        self.tasks.len() >= BACKUP_ROUNDS_MAX
    }

    /// A round that ended, if one has.
    pub(crate) fn ended(&mut self) -> Option<Undo> {
        self.tasks.try_join_next().map(joined)
    }

    /// The next round to end; pending forever while none is under way (for a `select!`).
    pub(crate) async fn next(&mut self) -> Undo {
        match self.tasks.join_next().await {
            Some(done) => joined(done),
            None => std::future::pending().await,
        }
    }

    /// Waits for every round under way to end (each ends at once while waiting, once
    /// `shutdown` is cancelled): no claim is made after the timer stops.
    pub(crate) async fn finish(&mut self) {
        while let Some(done) = self.tasks.join_next().await {
            joined(done);
        }
    }
}

/// A round's backup claims, made after `wait` on list `set`: what the timer must plan
/// again (see [`Undo`]); nothing once `shutdown` began.
async fn claim_backups(
    e: &Arc<Engine>,
    set: &Arc<JobSet>,
    backup: Claims,
    wait: Duration,
    horizon: i64,
    shutdown: &CancellationToken,
) -> Vec<(usize, DateTime<Utc>, Again)> {
    // Requests not sent give back the nonces of unanswered claims they were lent.
    let not_sent = |claims: &Claims| e.unanswered.release(claims.iter().map(|(_, r)| r));
    tokio::select! {
        biased;
        _ = shutdown.cancelled() => {
            not_sent(&backup);
            return Vec::new();
        }
        _ = tokio::time::sleep(wait) => {}
    }
    let earliest = earliest_by_job(&backup);
    // Asking which are free only reads: cut short by shutdown like the wait. The claim is
    // not (its answer must not be dropped), but not made once it began.
    let unanswered: Claims = backup.iter().filter(|(_, r)| e.unanswered.contains(&r.tick)).cloned().collect();
    let (backup, maybe_ours) = tokio::select! {
        biased;
        _ = shutdown.cancelled() => {
            not_sent(&unanswered);
            return Vec::new();
        }
        free = still_free(e, backup) => free,
    };
    let oldest =
        backup.iter().filter(|(_, r)| matches!(r.mode, ClaimMode::Run { .. })).map(|(_, r)| r.tick.scheduled_at).min();
    let late_from = match oldest {
        Some(oldest) => e.late_from(oldest).await,
        None => DateTime::<Utc>::MIN_UTC,
    };
    if shutdown.is_cancelled() {
        not_sent(&backup);
        return Vec::new();
    }
    // A tick with less than the late tolerance left of its job's catch-up window (none, by
    // default) may be out of it when the timer plans it again: claimed, not handed back.
    let now = e.now();
    let window_closing = |i: usize, r: &ClaimRequest| {
        let catchup = chrono::Duration::from_std(set.jobs[i].policy().catchup).unwrap_or(chrono::Duration::MAX);
        r.tick.scheduled_at.checked_add_signed(catchup).is_none_or(|end| end < now + late_tolerance())
    };
    let exempt = |i: usize, r: &ClaimRequest| maybe_ours.contains(&r.tick) || window_closing(i, r);
    let (backup, stale) = past_tolerance(backup, late_from, exempt);
    not_sent(&stale);
    let result = e.claim_and_start(set, backup, horizon).await;
    let stale: HashSet<usize> = stale.iter().map(|(i, _)| *i).collect();
    undo(&earliest, &result.failed, (&stale, late_from), &result.too_early)
}

/// Splits off the backups to run whose tick is older than `late_from` (the late tolerance)
/// now that they are about to be claimed: waiting past their instant, then asking which
/// are free, against a slow or unavailable store, may have taken seconds. Claimed, they
/// would run as late ticks past the tolerance; given back to the timer instead (as
/// [`Again::Stale`]: the store was slow), they go through their job's misfire policy, like any tick
/// found that late. Not those `exempt` says may not be: one whose unanswered claim may
/// have committed in time (asked again, it is granted again), and one its job's catch-up
/// window is about to leave behind (none by default: the timer would not examine it
/// again; it runs late, not lost unrecorded). Returns the backups to claim and the others.
fn past_tolerance(
    backup: Claims,
    late_from: DateTime<Utc>,
    exempt: impl Fn(usize, &ClaimRequest) -> bool,
) -> (Claims, Claims) {
    backup.into_iter().partition(|(i, r)| {
        !matches!(r.mode, ClaimMode::Run { .. }) || r.tick.scheduled_at >= late_from || exempt(*i, r)
    })
}

/// A task's end: a panic goes on (a bug, as in the timer itself).
fn joined(done: Result<Undo, JoinError>) -> Undo {
    match done {
        Ok(undo) => undo,
        Err(err) => std::panic::resume_unwind(err.into_panic()),
    }
}

/// Each job's earliest tick among `claims`.
fn earliest_by_job(claims: &Claims) -> HashMap<usize, DateTime<Utc>> {
    let mut earliest: HashMap<usize, DateTime<Utc>> = HashMap::new();
    for (i, r) in claims {
        let at = r.tick.scheduled_at;
        earliest.entry(*i).and_modify(|t| *t = (*t).min(at)).or_insert(at);
    }
    earliest
}

/// The ticks to plan again: a failed or stale job's from its earliest backup tick
/// (`earliest`; failed says why if both; stale ones were older than `missed_before`), a
/// job's refused as too early from that tick, whichever is earlier; sorted by job.
fn undo(
    earliest: &HashMap<usize, DateTime<Utc>>,
    failed: &HashSet<usize>,
    (stale, missed_before): (&HashSet<usize>, DateTime<Utc>),
    too_early: &HashMap<usize, DateTime<Utc>>,
) -> Vec<(usize, DateTime<Utc>, Again)> {
    let from = |i: &usize| earliest.get(i).copied().expect("a job handed back had a backup claim");
    let mut jobs: Vec<(usize, DateTime<Utc>, Again)> = failed.iter().map(|i| (*i, from(i), Again::Failed)).collect();
    jobs.extend(stale.difference(failed).map(|i| (*i, from(i), Again::Stale { missed_before })));
    for (&i, &at) in too_early {
        match jobs.iter_mut().find(|(j, _, _)| *j == i) {
            Some((_, from, _)) => *from = (*from).min(at),
            None => jobs.push((i, at, Again::TooEarly)),
        }
    }
    jobs.sort_unstable_by_key(|(i, _, _)| *i);
    jobs
}

/// The backups whose ticks are still free: the store is asked which are taken (their
/// first-ranked node won them, as it does unless it is slow or gone), in chunks, and only
/// the others are claimed. Asking costs the store a lookup per tick where a claim that
/// finds its tick taken costs it more, and it is the common case. A tick this node's own
/// claim of went unanswered is kept (its claim, asked again, is granted again); a chunk
/// the store cannot answer is kept whole (claimed, as before). Also returns the kept ticks
/// whose unanswered claim may have committed: taken, or every unanswered one if the store
/// cannot tell at all (`Ok(None)`). Not when asking failed: the store is down, and the
/// claims it left unanswered most likely never reached it (a pool that found no
/// connection).
async fn still_free(e: &Engine, backup: Claims) -> (Claims, HashSet<Tick>) {
    let mut keep = Vec::with_capacity(backup.len());
    let mut maybe_ours = HashSet::new();
    for chunk in backup.chunks(solocron_core::CLAIM_BATCH_MAX) {
        let ticks: Vec<Tick> = chunk.iter().map(|(_, r)| r.tick.clone()).collect();
        let taken: Option<HashSet<Tick>> = match counted(StoreOp::Claim, e.store.taken_ticks(&ticks)).await {
            Ok(Some(taken)) => Some(taken.into_iter().collect()),
            Ok(None) => break,
            Err(err) => {
                tracing::debug!(error = %err, "cannot ask which backups are taken; claiming them");
                None
            }
        };
        for (_, r) in chunk {
            let unanswered = e.unanswered.contains(&r.tick);
            let is_taken = taken.as_ref().is_some_and(|t| t.contains(&r.tick));
            if unanswered && is_taken {
                maybe_ours.insert(r.tick.clone());
            }
            keep.push(unanswered || !is_taken);
        }
    }
    if keep.len() < backup.len() {
        // The store cannot tell (`Ok(None)` is the same for every chunk): all are claimed.
        let ours = backup.iter().filter(|(_, r)| e.unanswered.contains(&r.tick)).map(|(_, r)| r.tick.clone());
        let ours = ours.collect();
        return (backup, ours);
    }
    (backup.into_iter().zip(keep).filter_map(|(claim, kept)| kept.then_some(claim)).collect(), maybe_ours)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(s, 0).unwrap()
    }

    #[test]
    fn a_failed_or_stale_backup_is_planned_again_from_its_earliest_tick_and_a_too_early_one_from_its_own() {
        let earliest = HashMap::from([(1, t(10)), (2, t(20)), (3, t(30)), (4, t(40))]);
        let failed = HashSet::from([1, 3]);
        let stale = HashSet::from([3, 4]);
        let too_early = HashMap::from([(2, t(25)), (3, t(5))]);
        assert_eq!(
            undo(&earliest, &failed, (&stale, t(45)), &too_early),
            vec![
                (1, t(10), Again::Failed),
                (2, t(25), Again::TooEarly),
                (3, t(5), Again::Failed),
                (4, t(40), Again::Stale { missed_before: t(45) })
            ]
        );
        assert!(undo(&earliest, &HashSet::new(), (&HashSet::new(), t(0)), &HashMap::new()).is_empty());
    }

    fn claim(job: usize, at: i64, mode: ClaimMode) -> (usize, ClaimRequest) {
        let tick = Tick::new(format!("j{job}"), t(at));
        let trigger = solocron_core::Trigger::Schedule;
        (job, ClaimRequest { tick, trigger, node: "n".into(), lease: Duration::from_secs(30), mode, nonce: 7 })
    }

    #[test]
    fn a_backup_to_run_past_the_late_tolerance_goes_back_to_the_timer_unless_exempt_and_a_skip_is_recorded() {
        let run = ClaimMode::Run { skip_if_running: true };
        let skip = ClaimMode::Skip { reason: "missed".into() };
        let backup = vec![
            claim(1, 5, run.clone()),
            claim(1, 15, run.clone()),
            claim(2, 5, skip),
            claim(3, 6, run.clone()),
            claim(4, 9, run.clone()),
            claim(5, 10, run),
        ];
        let exempt = |i: usize, _: &ClaimRequest| i == 3;
        let (kept, stale) = past_tolerance(backup, t(10), exempt);
        let at = |claims: &Claims| -> Vec<(usize, i64)> {
            claims.iter().map(|(i, r)| (*i, r.tick.scheduled_at.timestamp())).collect()
        };
        assert_eq!(at(&kept), vec![(1, 15), (2, 5), (3, 6), (5, 10)], "a skip is recorded however late");
        assert_eq!(at(&stale), vec![(1, 5), (4, 9)]);
    }
}
