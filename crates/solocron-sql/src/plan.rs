//! Deciding a batch of claims in memory, from one locked read of the batch's state: the
//! part of a claim that SQLite and MySQL share (PostgreSQL decides inside one statement).
//!
//! A store locks what the batch's decisions depend on (SQLite: the database's write lock;
//! MySQL: the jobs' fence rows), reads what [`Wanted`] lists into a [`Found`], calls
//! [`plan`], and writes the rows of the [`Decision`]s (new records, and the fresh leases
//! of [`Decision::Regranted`] runs) and the jobs' new counters before it commits. Nothing
//! it read can change before the commit, so deciding in memory is as safe as deciding
//! statement by statement, and costs a few statements per batch instead of a few per tick.
//!
//! ```
//! use std::time::Duration;
//! use solocron_core::{ClaimMode, ClaimRequest, Tick, Trigger};
//! use solocron_sql::plan::{plan, Decision, Found};
//!
//! let request = |at: &str| ClaimRequest {
//!     tick: Tick::new("backup", at.parse().unwrap()),
//!     trigger: Trigger::Schedule,
//!     node: "n1".into(),
//!     lease: Duration::from_secs(30),
//!     mode: ClaimMode::Run { skip_if_running: true },
//!     nonce: 0,
//! };
//! let batch = [request("2026-01-01T00:00:00Z"), request("2026-01-01T00:01:00Z")];
//! let mut found = Found::default();
//! found.tokens.insert("backup".into(), 41);
//! let (decisions, counters) = plan(&batch, found);
//! assert!(matches!(&decisions[0], Decision::Won { token: 42, .. }));
//! // The second tick sees the first one running.
//! assert!(matches!(&decisions[1], Decision::Skipped(reason) if reason.starts_with("overlap")));
//! assert_eq!(counters["backup"], 42);
//! ```

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use solocron_core::{ClaimMode, ClaimOutcome, ClaimRequest, Lease, RunId, StoreError, Tick, Trigger};

/// Longest lease, in ms, that [`outcome`] adds as it is (~292 years): `TimeDelta` holds
/// at most `i64::MAX` ms, and the stores refuse leases over 100 years anyway.
const MS_MAX: i64 = i64::MAX / 1_000_000;

/// What a batch's locked read must cover, each list sorted and without repeats.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Wanted<'a> {
    /// Every job of the batch: its fencing counter, and its ticks' records.
    pub jobs: Vec<&'a str>,
    /// Every instant (ms) of the batch: records are looked up as `job IN jobs AND
    /// scheduled_at IN instants` (a superset the plan filters).
    pub instants: Vec<i64>,
    /// Jobs asked not to overlap: their `running` runs.
    pub overlapping: Vec<&'a str>,
    /// Jobs claimed by a non-manual run: whether they are paused, by whom and why.
    pub pausable: Vec<&'a str>,
}

impl<'a> Wanted<'a> {
    /// What `requests` depend on.
    pub fn of(requests: &'a [ClaimRequest]) -> Wanted<'a> {
        let jobs_where = |wanted: fn(&ClaimRequest) -> bool| {
            let mut jobs: Vec<&str> = requests.iter().filter(|r| wanted(r)).map(|r| r.tick.job.as_str()).collect();
            jobs.sort_unstable();
            jobs.dedup();
            jobs
        };
        let mut instants: Vec<i64> = requests.iter().map(|r| r.tick.scheduled_at.timestamp_millis()).collect();
        instants.sort_unstable();
        instants.dedup();
        Wanted {
            jobs: jobs_where(|_| true),
            instants,
            overlapping: jobs_where(|r| matches!(r.mode, ClaimMode::Run { skip_if_running: true })),
            pausable: jobs_where(|r| matches!(r.mode, ClaimMode::Run { .. }) && r.trigger != Trigger::Manual),
        }
    }
}

/// What the locked read found about the batch's jobs.
#[derive(Debug, Default, Clone)]
pub struct Found {
    /// Each job's fencing counter (the last token handed out; absent: none yet, 0).
    pub tokens: HashMap<String, u64>,
    /// Ticks (job, ms) that have a record (attempt 1); may hold ticks not in the batch.
    pub existing: HashSet<(String, i64)>,
    /// Of those, the ticks whose attempt 1 is still `running` as a claim made with a
    /// nonce: what a request asking again with that nonce is granted again.
    pub claims: HashMap<(String, i64), Claimed>,
    /// The newest running run of each job asked not to overlap (read), and of each job
    /// the batch won or granted again a run of (noted by [`plan`]).
    pub running: HashMap<String, RunId>,
    /// Why each paused job is paused: `paused by <who>[: <why>]`.
    pub paused: HashMap<String, String>,
    /// The store's clock (ms) at the read: the instant the batch's records carry.
    pub now: Option<i64>,
}

/// An existing tick's attempt 1, `running` as the claim of a request that carried a nonce.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claimed {
    /// The node that claimed it (and holds it).
    pub node: String,
    /// The claim's nonce (never 0).
    pub nonce: u64,
    /// The claim's fencing token.
    pub token: u64,
    /// When it was claimed (store clock).
    pub claimed_at: DateTime<Utc>,
}

/// One row of a store's `UNION ALL` state read, its columns decoded as they come.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct StateRow {
    /// `f` a job's counter (`n`), `t` an existing tick (`n` its instant; `state`, `node`,
    /// `nonce`, `token`, `claimed_at` its record's), `r` a running run (`n` its instant,
    /// `attempt`), `p` a paused job (`who`, `why`), `n` the clock (`n`).
    pub kind: String,
    /// The job (empty for the clock).
    pub job: String,
    /// A counter, an instant (ms) or the clock, by `kind`.
    pub n: i64,
    /// A running run's attempt (0 for other kinds).
    pub attempt: i64,
    /// Who paused the job.
    pub who: Option<String>,
    /// Why, if they said.
    pub why: Option<String>,
    /// An existing tick's state (`None` for other kinds).
    pub state: Option<String>,
    /// An existing tick's node.
    pub node: Option<String>,
    /// An existing tick's nonce, as stored: the `u64` bit-cast to `i64` (`None` or 0: none).
    pub nonce: Option<i64>,
    /// An existing tick's fencing token.
    pub token: Option<i64>,
    /// An existing tick's claim instant (ms).
    pub claimed_at: Option<i64>,
}

/// A nonce as the signed 64-bit integer the SQL stores keep it in (bit-cast: every `u64`
/// fits), `None` for 0 (no nonce).
///
/// ```
/// assert_eq!(solocron_sql::plan::nonce_param(0), None);
/// assert_eq!(solocron_sql::plan::nonce_param(u64::MAX), Some(-1));
/// ```
pub fn nonce_param(nonce: u64) -> Option<i64> {
    (nonce != 0).then_some(nonce as i64)
}

impl Found {
    /// Keeps `run` as its job's running run if it is the newest (the one an overlap names).
    pub fn note_running(&mut self, run: RunId) {
        let newer = |old: &RunId| (&run.tick.scheduled_at, run.attempt) > (&old.tick.scheduled_at, old.attempt);
        if self.running.get(&run.tick.job).is_none_or(newer) {
            self.running.insert(run.tick.job.clone(), run);
        }
    }

    /// Notes that `job` is paused by `who`, for `why` if given.
    pub fn note_paused(&mut self, job: String, who: &str, why: Option<&str>) {
        let reason = match why {
            Some(why) => format!("paused by {who}: {why}"),
            None => format!("paused by {who}"),
        };
        self.paused.insert(job, reason);
    }

    /// Notes what one row of the state read says.
    pub fn note_row(&mut self, row: StateRow) -> Result<(), StoreError> {
        if row.kind == "t" {
            let claimed = claimed(&row)?;
            let tick = (row.job, row.n);
            if let Some(claimed) = claimed {
                self.claims.insert(tick.clone(), claimed);
            }
            self.existing.insert(tick);
            return Ok(());
        }
        let StateRow { kind, job, n, attempt, who, why, .. } = row;
        match kind.as_str() {
            "f" => {
                let token = u64::try_from(n).map_err(|_| invalid(format!("fencing token {n} is negative")))?;
                self.tokens.insert(job, token);
            }
            "r" => {
                let at = instant(n)?;
                let attempt = u32::try_from(attempt)
                    .ok()
                    .filter(|a| *a >= 1)
                    .ok_or_else(|| invalid(format!("attempt {attempt} is not a positive attempt")))?;
                self.note_running(RunId { tick: Tick::new(job, at), attempt });
            }
            "p" => {
                let who = who.ok_or_else(|| invalid(format!("paused job `{job}` has no `changed_by`")))?;
                self.note_paused(job, &who, why.as_deref());
            }
            "n" => self.now = Some(n),
            other => return Err(invalid(format!("unexpected row kind `{other}`"))),
        }
        Ok(())
    }
}

/// An error in the claim's read.
fn invalid(what: String) -> StoreError {
    StoreError::Invalid(format!("the claim's read: {what}"))
}

/// The instant of `ms` milliseconds since the epoch.
fn instant(ms: i64) -> Result<DateTime<Utc>, StoreError> {
    DateTime::from_timestamp_millis(ms).ok_or_else(|| invalid(format!("instant {ms} ms is out of range")))
}

/// What a `t` row says of its record's claim, if it is `running` under a nonce (only such
/// a record can be granted again).
fn claimed(row: &StateRow) -> Result<Option<Claimed>, StoreError> {
    let nonce = row.nonce.unwrap_or(0);
    if nonce == 0 || row.state.as_deref() != Some("running") {
        return Ok(None);
    }
    let tick = || format!("{}@{} ms", row.job, row.n);
    let node = row.node.clone().ok_or_else(|| invalid(format!("running record {} has no node", tick())))?;
    let token = row
        .token
        .and_then(|t| u64::try_from(t).ok())
        .filter(|t| *t >= 1)
        .ok_or_else(|| invalid(format!("running record {} has no positive fencing token", tick())))?;
    let claimed_at =
        instant(row.claimed_at.ok_or_else(|| invalid(format!("record {} has no claim instant", tick())))?)?;
    // The nonce was stored bit-cast from a u64.
    Ok(Some(Claimed { node, nonce: nonce as u64, token, claimed_at }))
}

/// What becomes of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// A record of the tick exists: nothing is written.
    Taken,
    /// The tick's attempt 1 is still `running` as this very request's claim (the same
    /// node and nonce, asked again after a lost answer): won again, with its token and
    /// claim instant; its record only gets a fresh lease (`lease` from the batch's instant).
    Regranted {
        /// The run (attempt 1 of the tick).
        run: RunId,
        /// Its fencing token, unchanged.
        token: u64,
        /// When it was first claimed.
        claimed_at: DateTime<Utc>,
        /// How long its fresh lease lasts from the batch's instant.
        lease: Duration,
    },
    /// Recorded `skipped` with this reason.
    Skipped(String),
    /// Recorded `running` for the request's node, with this token and lease length.
    Won {
        /// The run (attempt 1 of the tick).
        run: RunId,
        /// Its fencing token.
        token: u64,
        /// How long its lease lasts from the claim's instant.
        lease: Duration,
    },
}

/// Decides every request in order, as if each were claimed after the previous ones (a
/// repeated tick is taken, a second won tick of a job gets the next token, an overlap sees
/// the batch's own wins and re-grants). A request that finds its tick's record still
/// running as its own claim ([`Claimed`], the same node and nonce) is
/// [`Decision::Regranted`], once per batch: a repeat of it in the batch is taken. Also
/// returns each winning job's new counter (its last token); a re-grant changes none.
pub fn plan(requests: &[ClaimRequest], mut found: Found) -> (Vec<Decision>, HashMap<String, u64>) {
    let mut decisions = Vec::with_capacity(requests.len());
    let mut counters = HashMap::new();
    for request in requests {
        let tick = Tick::new(request.tick.job.clone(), request.tick.scheduled_at);
        if !found.existing.insert((tick.job.clone(), tick.scheduled_at.timestamp_millis())) {
            decisions.push(regrant(request, tick, &mut found).unwrap_or(Decision::Taken));
            continue;
        }
        let decision = decide(request, tick, &mut found);
        if let Decision::Won { run, token, .. } = &decision {
            counters.insert(run.tick.job.clone(), *token);
        }
        decisions.push(decision);
    }
    (decisions, counters)
}

/// The re-grant of a request whose tick has a record, if that record is its own claim: a
/// `Run` request with a nonce, by the node that holds it under that nonce. Pause and
/// overlap do not apply (the running run is that claim), but later requests see it run.
fn regrant(request: &ClaimRequest, tick: Tick, found: &mut Found) -> Option<Decision> {
    if request.nonce == 0 || !matches!(request.mode, ClaimMode::Run { .. }) {
        return None;
    }
    let key = (tick.job, tick.scheduled_at.timestamp_millis());
    let claimed = found.claims.get(&key)?;
    if claimed.nonce != request.nonce || claimed.node != request.node {
        return None;
    }
    // Removed: a repeat of this request in the batch finds the tick taken.
    let Claimed { token, claimed_at, .. } = found.claims.remove(&key)?;
    let run = RunId { tick: Tick::new(key.0, request.tick.scheduled_at), attempt: 1 };
    found.note_running(run.clone());
    Some(Decision::Regranted { run, token, claimed_at, lease: request.lease })
}

/// The decision for a request whose tick has no record yet.
fn decide(request: &ClaimRequest, tick: Tick, found: &mut Found) -> Decision {
    let skip_if_running = match &request.mode {
        ClaimMode::Skip { reason } => return Decision::Skipped(reason.clone()),
        ClaimMode::Run { skip_if_running } => *skip_if_running,
    };
    // An operator's manual run is the way to run a paused job once: it ignores the pause.
    if request.trigger != Trigger::Manual {
        if let Some(reason) = found.paused.get(&tick.job) {
            return Decision::Skipped(reason.clone());
        }
    }
    if skip_if_running {
        if let Some(running) = found.running.get(&tick.job) {
            return Decision::Skipped(format!("overlap: previous run {running} still running"));
        }
    }
    let counter = found.tokens.entry(tick.job.clone()).or_insert(0);
    *counter += 1;
    let token = *counter;
    let run = RunId { tick, attempt: 1 };
    found.note_running(run.clone());
    Decision::Won { run, token, lease: request.lease }
}

/// The outcome of `decision`, decided at `now` (the instant the batch's rows carry: a new
/// run's claim instant, and where every lease of the batch starts).
pub fn outcome(request: &ClaimRequest, decision: Decision, now: DateTime<Utc>) -> ClaimOutcome {
    let won = |run, token, claimed_at, lease| {
        let lease_until = lease_until(now, lease);
        ClaimOutcome::Won(Lease { run, owner: request.node.clone(), fencing_token: token, claimed_at, lease_until })
    };
    match decision {
        Decision::Taken => ClaimOutcome::Taken,
        Decision::Skipped(reason) => ClaimOutcome::Skipped { reason },
        Decision::Won { run, token, lease } => won(run, token, now, lease),
        Decision::Regranted { run, token, claimed_at, lease } => won(run, token, claimed_at, lease),
    }
}

/// `now` plus `lease`, in whole milliseconds as the stores keep instants.
fn lease_until(now: DateTime<Utc>, lease: Duration) -> DateTime<Utc> {
    let ms = TimeDelta::milliseconds(i64::try_from(lease.as_millis()).unwrap_or(i64::MAX).min(MS_MAX));
    now.checked_add_signed(ms).unwrap_or(DateTime::<Utc>::MAX_UTC)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(job: &str, secs: i64, mode: ClaimMode, trigger: Trigger) -> ClaimRequest {
        ClaimRequest {
            tick: Tick::new(job, DateTime::from_timestamp(secs, 0).unwrap()),
            trigger,
            node: "n1".into(),
            lease: Duration::from_secs(10),
            mode,
            nonce: 0,
        }
    }

    const RUN: ClaimMode = ClaimMode::Run { skip_if_running: false };

    #[test]
    fn existing_and_repeated_ticks_are_taken_and_tokens_count_on_from_the_stored_counter() {
        let batch = [
            request("a", 60, RUN, Trigger::Schedule),
            request("a", 60, RUN, Trigger::Schedule),
            request("a", 120, RUN, Trigger::Schedule),
            request("b", 60, RUN, Trigger::Schedule),
        ];
        let mut found = Found::default();
        found.tokens.insert("a".into(), 7);
        found.existing.insert(("b".into(), 60_000));
        let (decisions, counters) = plan(&batch, found);
        let tokens: Vec<Option<u64>> =
            decisions.iter().map(|d| if let Decision::Won { token, .. } = d { Some(*token) } else { None }).collect();
        assert_eq!(tokens, [Some(8), None, Some(9), None]);
        assert_eq!((&decisions[1], &decisions[3]), (&Decision::Taken, &Decision::Taken));
        assert_eq!(counters, HashMap::from([("a".to_owned(), 9)]));
    }

    #[test]
    fn a_pause_skips_all_but_manual_runs_and_an_overlap_names_the_newest_running_run() {
        let exclusive = ClaimMode::Run { skip_if_running: true };
        let batch = [
            request("p", 60, RUN, Trigger::Schedule),
            request("p", 61, RUN, Trigger::Manual),
            request("x", 60, exclusive.clone(), Trigger::Schedule),
        ];
        let mut found = Found::default();
        found.note_paused("p".into(), "ops", Some("maintenance"));
        let old = |secs, attempt| RunId { tick: Tick::new("x", DateTime::from_timestamp(secs, 0).unwrap()), attempt };
        found.note_running(old(10, 3));
        found.note_running(old(30, 1));
        found.note_running(old(20, 1));
        let (decisions, _) = plan(&batch, found);
        assert_eq!(decisions[0], Decision::Skipped("paused by ops: maintenance".into()));
        assert!(matches!(decisions[1], Decision::Won { token: 1, .. }));
        assert_eq!(decisions[2], Decision::Skipped(format!("overlap: previous run {} still running", old(30, 1))));
    }

    #[test]
    fn rows_of_the_read_are_noted_by_kind_and_bad_ones_refused() {
        let row = |kind: &str, job: &str, n, attempt, who: Option<&str>| StateRow {
            kind: kind.into(),
            job: job.into(),
            n,
            attempt,
            who: who.map(Into::into),
            ..StateRow::default()
        };
        let mut found = Found::default();
        for r in [
            row("f", "a", 4, 0, None),
            row("t", "a", 60_000, 1, None),
            row("r", "a", 60_000, 2, None),
            row("p", "b", 0, 0, Some("ops")),
            row("n", "", 99, 0, None),
        ] {
            found.note_row(r).unwrap();
        }
        assert_eq!((found.tokens["a"], found.now), (4, Some(99)));
        assert!(found.existing.contains(&("a".to_owned(), 60_000)));
        assert_eq!(found.running["a"].attempt, 2);
        assert_eq!(found.paused["b"], "paused by ops");
        assert!(found.note_row(row("f", "a", -1, 0, None)).is_err(), "a negative counter");
        assert!(found.note_row(row("r", "a", 0, 0, None)).is_err(), "attempt 0");
        assert!(found.note_row(row("x", "a", 0, 0, None)).is_err(), "an unknown kind");
    }

    #[test]
    fn the_read_covers_each_job_and_instant_once() {
        let batch = [
            request("b", 60, ClaimMode::Run { skip_if_running: true }, Trigger::Schedule),
            request("a", 60, RUN, Trigger::Manual),
            request("b", 120, ClaimMode::Skip { reason: "late".into() }, Trigger::Schedule),
        ];
        let wanted = Wanted::of(&batch);
        assert_eq!(
            wanted,
            Wanted {
                jobs: vec!["a", "b"],
                instants: vec![60_000, 120_000],
                overlapping: vec!["b"],
                pausable: vec!["b"]
            }
        );
    }

    /// The record of tick `secs` of `job`, running as node `n1`'s claim under `nonce`, as
    /// the read's `t` row brings it.
    fn record_row(job: &str, secs: i64, state: &str, node: &str, nonce: i64) -> StateRow {
        StateRow {
            kind: "t".into(),
            job: job.into(),
            n: secs * 1000,
            attempt: 1,
            state: Some(state.into()),
            node: Some(node.into()),
            nonce: Some(nonce),
            token: Some(5),
            claimed_at: Some(secs * 1000 + 7),
            ..StateRow::default()
        }
    }

    fn with_nonce(mut request: ClaimRequest, nonce: u64) -> ClaimRequest {
        request.nonce = nonce;
        request
    }

    #[test]
    fn a_request_asked_again_with_its_nonce_is_regranted_its_token_and_claim_instant() {
        let batch = [with_nonce(request("a", 60, RUN, Trigger::Schedule), 9)];
        let mut found = Found::default();
        found.tokens.insert("a".into(), 5);
        found.note_row(record_row("a", 60, "running", "n1", 9)).unwrap();
        let (decisions, counters) = plan(&batch, found);
        let run = RunId { tick: Tick::new("a", DateTime::from_timestamp(60, 0).unwrap()), attempt: 1 };
        let claimed_at = DateTime::from_timestamp_millis(60_007).unwrap();
        let lease = Duration::from_secs(10);
        assert_eq!(decisions, [Decision::Regranted { run: run.clone(), token: 5, claimed_at, lease }]);
        assert!(counters.is_empty(), "a re-grant hands out no token");
        let now = DateTime::from_timestamp(100, 0).unwrap();
        let ClaimOutcome::Won(granted) = outcome(&batch[0], decisions[0].clone(), now) else { panic!("won") };
        let until = DateTime::from_timestamp(110, 0).unwrap();
        assert_eq!(granted, Lease { run, owner: "n1".into(), fencing_token: 5, claimed_at, lease_until: until });
    }

    #[test]
    fn any_other_request_for_a_running_claim_is_taken() {
        let skip = ClaimMode::Skip { reason: "missed".into() };
        let other_node = ClaimRequest { node: "n2".into(), ..with_nonce(request("a", 60, RUN, Trigger::Schedule), 9) };
        let batch = [
            with_nonce(request("a", 60, RUN, Trigger::Schedule), 8),
            request("a", 60, RUN, Trigger::Schedule),
            other_node,
            with_nonce(request("a", 60, skip, Trigger::Schedule), 9),
            with_nonce(request("e", 60, RUN, Trigger::Schedule), 9),
            with_nonce(request("u", 60, RUN, Trigger::Schedule), 9),
        ];
        let mut found = Found::default();
        for row in [
            record_row("a", 60, "running", "n1", 9),
            record_row("e", 60, "succeeded", "n1", 9),
            record_row("u", 60, "running", "n1", 0),
        ] {
            found.note_row(row).unwrap();
        }
        assert_eq!(found.claims.len(), 1, "only a running record claimed under a nonce");
        let (decisions, counters) = plan(&batch, found);
        assert_eq!(decisions, vec![Decision::Taken; batch.len()]);
        assert!(counters.is_empty());
    }

    #[test]
    fn a_regrant_ignores_the_pause_counts_as_running_for_later_requests_and_is_granted_once() {
        let exclusive = ClaimMode::Run { skip_if_running: true };
        let again = with_nonce(request("a", 60, exclusive.clone(), Trigger::Schedule), 9);
        let batch = [again.clone(), request("a", 120, exclusive, Trigger::Manual), again];
        let mut found = Found::default();
        found.note_paused("a".into(), "ops", None);
        found.note_row(record_row("a", 60, "running", "n1", 9)).unwrap();
        let (decisions, _) = plan(&batch, found);
        assert!(matches!(decisions[0], Decision::Regranted { token: 5, .. }), "{decisions:?}");
        let regranted = "a@1970-01-01T00:01:00.000Z#1";
        assert_eq!(decisions[1], Decision::Skipped(format!("overlap: previous run {regranted} still running")));
        assert_eq!(decisions[2], Decision::Taken, "a repeat in the batch is not granted twice");
    }

    #[test]
    fn a_running_claim_with_a_nonce_and_no_token_is_refused() {
        let mut found = Found::default();
        let row = StateRow { token: None, ..record_row("a", 60, "running", "n1", 9) };
        assert!(found.note_row(row).is_err());
        assert!(found.note_row(record_row("a", 60, "running", "n1", -1)).is_ok(), "a nonce over i64::MAX");
        assert_eq!(found.claims[&("a".to_owned(), 60_000)].nonce, u64::MAX);
    }
}
