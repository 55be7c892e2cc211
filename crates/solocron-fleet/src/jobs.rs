//! The fleet's jobs: which names exist, their schedules, and their views.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use futures_util::{stream, StreamExt as _, TryStreamExt as _};
use solocron_core::{
    ActionQuery, HistoryQuery, JobControl, Liveness, ManagedJob, NodeRecord, OperatorStore, Registration, RunRecord,
    RunState, Schedule, JOBS_ASKED_MAX, RECORDS_PAGE_MAX,
};

use crate::views::{
    ActionView, FireTime, JobDetail, JobPage, JobSummary, ManagedView, NodeView, PauseView, RecentRun,
    RegistrationView, RunView, RECENT_RUNS_MAX,
};
use crate::{Declared, FleetError, KNOWN_NAMES_SHOWN_MAX};

/// Most jobs on one page.
pub const JOBS_PAGE_MAX: usize = 200;
/// Jobs on a page when the caller does not say.
const JOBS_PAGE_DEFAULT: usize = 50;
/// Store reads in flight at once while building one page of views.
const READS_IN_FLIGHT_MAX: usize = 8;
/// Fire times shown in a job's detail.
const NEXT_FIRES_SHOWN: usize = 5;
/// Actions shown in a job's detail.
const ACTIONS_SHOWN: usize = 20;

/// A state a job can be filtered by (in the API: `state=paused`, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum JobStateFilter {
    /// Paused fleet-wide.
    Paused,
    /// Not paused.
    Active,
    /// With a run in progress.
    Running,
    /// Registered, but by no live node.
    Stale,
    /// Defined differently by two live nodes.
    Drift,
}

/// Which jobs to list.
#[derive(Debug, Clone, Default)]
pub struct JobFilter {
    /// Only names containing this (case-insensitive).
    pub search: Option<String>,
    /// Only jobs in this state.
    pub state: Option<JobStateFilter>,
    /// Only jobs of this namespace (see [`solocron_core::namespace_of`]).
    pub namespace: Option<String>,
    /// Only names after this one (the previous page's `next_cursor`).
    pub cursor: Option<String>,
    /// At most this many (1..=[`JOBS_PAGE_MAX`]; 0 means the default, 50).
    pub limit: usize,
}

/// What the store and the reader's configuration know about the fleet, read once: the
/// registry, the operators' switches, the nodes and the runs in progress. Views are built
/// from it; only per-job history is read per view.
pub struct Fleet {
    declared: Vec<Declared>,
    registry: Registry,
    controls: Vec<JobControl>,
    /// The managed jobs, by name.
    managed: Vec<ManagedJob>,
    nodes: Vec<NodeRecord>,
    /// The nodes alive at `now`, by id.
    alive: std::collections::HashSet<String>,
    running: Vec<RunRecord>,
    now: DateTime<Utc>,
}

/// The registry as the fleet was read: whole, or only the registered names (then a page of
/// views reads its own jobs' registrations, and a server's page costs the same at 10 or
/// 10,000 jobs).
enum Registry {
    Whole(Registrations),
    Names(Vec<String>),
}

/// A managed job's schedule, read from its definition's `schedule` and `timezone`.
fn managed_schedule(m: &ManagedJob) -> Option<Schedule> {
    let spec: serde_json::Value = serde_json::from_str(&m.spec).ok()?;
    let zone = spec.get("timezone").and_then(serde_json::Value::as_str).unwrap_or("UTC");
    Schedule::parse(spec.get("schedule")?.as_str()?, zone).ok()
}

/// Registrations sorted by job, then node: a job's are found by binary search, so a page
/// of views costs no scan of the whole registry per job.
struct Registrations(Vec<Registration>);

impl Registrations {
    fn sorted(mut all: Vec<Registration>) -> Registrations {
        all.sort_by(|a, b| a.definition.job.cmp(&b.definition.job).then_with(|| a.node.cmp(&b.node)));
        Registrations(all)
    }

    fn of(&self, job: &str) -> &[Registration] {
        let start = self.0.partition_point(|r| r.definition.job.as_str() < job);
        let len = self.0[start..].iter().take_while(|r| r.definition.job == job).count();
        &self.0[start..start + len]
    }
}

impl Fleet {
    /// Reads the fleet with its whole registry: a handful of store calls, whatever the
    /// number of jobs. For a tool that shows every job (the CLI's `status`).
    pub async fn read(store: &dyn OperatorStore, declared: Vec<Declared>) -> Result<Fleet, FleetError> {
        let registry = Registry::Whole(Registrations::sorted(store.registrations().await?));
        Fleet::read_with(store, declared, registry).await
    }

    /// Reads the fleet with only the names of registered jobs: views read their own jobs'
    /// registrations ([`RegistryStore::registrations_of`]). For a server answering one page.
    /// [`Fleet::schedule`], [`Fleet::zone`] and [`Fleet::registrations`] of such a fleet know
    /// the declared jobs only; [`Fleet::jobs`] and [`Fleet::job`] are whole either way.
    pub async fn read_names(store: &dyn OperatorStore, declared: Vec<Declared>) -> Result<Fleet, FleetError> {
        let registry = Registry::Names(store.registered_jobs().await?);
        Fleet::read_with(store, declared, registry).await
    }

    async fn read_with(
        store: &dyn OperatorStore,
        declared: Vec<Declared>,
        registry: Registry,
    ) -> Result<Fleet, FleetError> {
        let controls = store.controls().await?;
        let managed = store.managed_jobs().await?;
        let nodes = store.nodes().await?;
        let q = HistoryQuery { state: Some(RunState::Running), limit: RECORDS_PAGE_MAX, ..HistoryQuery::default() };
        let running = store.history(&q).await?;
        let now = store.now().await?;
        let alive = nodes.iter().filter(|n| n.liveness(now) == Liveness::Alive).map(|n| n.beat.node.clone()).collect();
        Ok(Fleet { declared, registry, controls, managed, nodes, alive, running, now })
    }

    /// The registrations of `jobs`: from the whole registry if it was read, else from the
    /// store (in chunks of at most [`JOBS_ASKED_MAX`]).
    async fn registrations_for(&self, store: &dyn OperatorStore, jobs: &[String]) -> Result<Registrations, FleetError> {
        let mut found = Vec::new();
        match &self.registry {
            Registry::Whole(all) => jobs.iter().for_each(|j| found.extend_from_slice(all.of(j))),
            Registry::Names(_) => {
                for chunk in jobs.chunks(JOBS_ASKED_MAX) {
                    found.extend(store.registrations_of(chunk).await?);
                }
            }
        }
        Ok(Registrations::sorted(found))
    }

    /// The store's clock when the fleet was read.
    pub fn now(&self) -> DateTime<Utc> {
        self.now
    }

    /// Every job name known: declared, registered, or touched by an operator.
    pub fn names(&self) -> BTreeSet<String> {
        let mut n: BTreeSet<String> = match &self.registry {
            Registry::Whole(all) => all.0.iter().map(|r| r.definition.job.clone()).collect(),
            Registry::Names(names) => names.iter().cloned().collect(),
        };
        n.extend(self.controls.iter().map(|c| c.job.clone()));
        n.extend(self.managed.iter().map(|m| m.job.clone()));
        n.extend(self.declared.iter().map(|d| d.name.clone()));
        n
    }

    /// Refuses a job name nobody knows, naming some known ones.
    pub fn require(&self, job: &str) -> Result<(), FleetError> {
        let names = self.names();
        if names.contains(job) {
            return Ok(());
        }
        let shown: Vec<_> = names.iter().take(KNOWN_NAMES_SHOWN_MAX).cloned().collect();
        let known = match (shown.is_empty(), names.len() > shown.len()) {
            (true, _) => "none".to_owned(),
            (false, false) => shown.join(", "),
            (false, true) => format!("{}, … {} in all", shown.join(", "), names.len()),
        };
        Err(FleetError::UnknownJob { job: job.to_owned(), known })
    }

    /// Like [`Fleet::require`], but a job nobody knows any more that still has run records
    /// (removed from every node, its history kept) is accepted: for reading its history.
    pub async fn require_known_or_recorded(&self, store: &dyn OperatorStore, job: &str) -> Result<(), FleetError> {
        let unknown = match self.require(job) {
            Ok(()) => return Ok(()),
            Err(unknown) => unknown,
        };
        let q = HistoryQuery { job: Some(job.to_owned()), limit: 1, ..HistoryQuery::default() };
        if store.history(&q).await?.is_empty() {
            return Err(unknown);
        }
        Ok(())
    }

    /// The job's schedule: the reader's configuration's, else its managed definition's, else
    /// the newest registration's
    /// (see [`Fleet::read_names`]).
    pub fn schedule(&self, job: &str) -> Option<Schedule> {
        self.schedule_in(self.whole().map_or(&[], |all| all.of(job)), job)
    }

    fn schedule_in(&self, registrations: &[Registration], job: &str) -> Option<Schedule> {
        if let Some(d) = self.declared.iter().find(|d| d.name == job) {
            return Some(d.schedule.clone());
        }
        if let Some(s) = self.managed_job(job).and_then(managed_schedule) {
            return Some(s);
        }
        let r = registrations.iter().max_by_key(|r| r.last_seen)?;
        Schedule::parse(&r.definition.schedule, &r.definition.timezone).ok()
    }

    fn whole(&self) -> Option<&Registrations> {
        match &self.registry {
            Registry::Whole(all) => Some(all),
            Registry::Names(_) => None,
        }
    }

    /// The zone the job's times are shown in (UTC when its schedule is unknown).
    pub fn zone(&self, job: &str) -> Tz {
        self.schedule(job).map_or(chrono_tz::UTC, |s| s.zone())
    }

    /// The nodes, by id, each with the runs it holds.
    pub fn nodes(&self) -> Vec<NodeView> {
        self.nodes
            .iter()
            .map(|n| {
                let held = self.running.iter().filter(|r| r.node == n.beat.node).map(|r| r.id.to_string()).collect();
                NodeView::new(n, self.now, held)
            })
            .collect()
    }

    fn alive(&self, node: &str) -> bool {
        self.alive.contains(node)
    }

    /// How each node registered `job` (drift shows as two definitions; see
    /// [`Fleet::read_names`]).
    pub fn registrations(&self, job: &str) -> Vec<RegistrationView> {
        self.whole().map_or(&[][..], |all| all.of(job)).iter().map(RegistrationView::from).collect()
    }

    /// Drift: two live nodes define the job differently. Stale: nodes registered it, none
    /// of them is alive.
    fn drift_and_stale(&self, registrations: &[Registration]) -> (bool, bool) {
        let live: Vec<&Registration> = registrations.iter().filter(|r| self.alive(&r.node)).collect();
        let hashes: BTreeSet<&str> = live.iter().map(|r| r.definition.definition_hash.as_str()).collect();
        (hashes.len() > 1, !registrations.is_empty() && live.is_empty())
    }

    /// The managed job `job`, if it is one.
    fn managed_job(&self, job: &str) -> Option<&ManagedJob> {
        self.managed.iter().find(|m| m.job == job)
    }

    /// Who paused `job`, when and why, while it is paused (as read with the fleet).
    pub fn paused(&self, job: &str) -> Option<PauseView> {
        let c = self.controls.iter().find(|c| c.job == job && c.paused)?;
        Some(PauseView { by: c.changed_by.clone(), reason: c.reason.clone(), at: c.changed_at })
    }

    /// Whether `job` is in `state`; `all` is the whole registry (needed by stale and drift).
    fn matches(&self, all: Option<&Registrations>, job: &str, state: Option<JobStateFilter>) -> bool {
        let Some(state) = state else { return true };
        let drift_and_stale = || self.drift_and_stale(all.map_or(&[][..], |a| a.of(job)));
        match state {
            JobStateFilter::Paused => self.paused(job).is_some(),
            JobStateFilter::Active => self.paused(job).is_none(),
            JobStateFilter::Running => self.running.iter().any(|r| r.id.tick.job == job),
            JobStateFilter::Stale => drift_and_stale().1,
            JobStateFilter::Drift => drift_and_stale().0,
        }
    }

    /// One page of jobs by name: the filter runs over names and what was read with the
    /// fleet; only the page's jobs have their history read.
    pub async fn jobs(&self, store: &dyn OperatorStore, filter: &JobFilter) -> Result<JobPage, FleetError> {
        let limit = match filter.limit {
            0 => JOBS_PAGE_DEFAULT,
            n if n > JOBS_PAGE_MAX => return Err(FleetError::bad("limit", format!("at most {JOBS_PAGE_MAX}"))),
            n => n,
        };
        if let Some(ns) = &filter.namespace {
            solocron_core::validate_namespace(ns).map_err(|e| FleetError::bad("namespace", e.to_string()))?;
        }
        let needle = filter.search.as_deref().map(str::to_lowercase);
        // Stale and drift are judged from every registration: read whole if it was not.
        let read_whole;
        let all = match (self.whole(), filter.state) {
            (Some(all), _) => Some(all),
            (None, Some(JobStateFilter::Stale | JobStateFilter::Drift)) => {
                read_whole = Registrations::sorted(store.registrations().await?);
                Some(&read_whole)
            }
            (None, _) => None,
        };
        let names = self.names();
        let namespaces: Vec<String> = {
            let distinct: BTreeSet<&str> = names.iter().map(|n| solocron_core::namespace_of(n)).collect();
            distinct.into_iter().map(str::to_owned).collect()
        };
        let matching: Vec<String> = names
            .into_iter()
            .filter(|n| filter.namespace.as_deref().is_none_or(|ns| solocron_core::namespace_of(n) == ns))
            .filter(|n| needle.as_deref().is_none_or(|s| n.to_lowercase().contains(s)))
            .filter(|n| self.matches(all, n, filter.state))
            .collect();
        let after = filter.cursor.as_deref().unwrap_or("");
        let page: Vec<&String> = matching.iter().filter(|n| n.as_str() > after).take(limit + 1).collect();
        let next_cursor = (page.len() > limit).then(|| page[limit - 1].clone());
        let names: Vec<String> = page.into_iter().take(limit).cloned().collect();
        let registrations = &self.registrations_for(store, &names).await?;
        let jobs = stream::iter(names)
            .map(|name| async move { self.summary(store, registrations, &name).await })
            .buffered(READS_IN_FLIGHT_MAX)
            .try_collect()
            .await?;
        Ok(JobPage { jobs, total: matching.len(), next_cursor, namespaces })
    }

    async fn summary(
        &self,
        store: &dyn OperatorStore,
        registrations: &Registrations,
        job: &str,
    ) -> Result<JobSummary, FleetError> {
        let q = HistoryQuery { job: Some(job.to_owned()), limit: RECENT_RUNS_MAX, ..HistoryQuery::default() };
        let recent = store.history(&q).await?;
        Ok(self.summary_from(registrations.of(job), job, &recent))
    }

    fn summary_from(&self, registrations: &[Registration], job: &str, recent: &[RunRecord]) -> JobSummary {
        let schedule = self.schedule_in(registrations, job);
        let (drift, stale) = self.drift_and_stale(registrations);
        let last = recent.iter().find(|r| r.state.is_terminal() && r.state != RunState::Skipped);
        JobSummary {
            name: job.to_owned(),
            namespace: solocron_core::namespace_of(job).to_owned(),
            schedule_words: schedule.as_ref().map(Schedule::describe),
            next_fire: schedule.as_ref().and_then(|s| s.next_after(self.now)),
            timezone: schedule.as_ref().map(|s| s.zone().name().to_owned()),
            schedule: schedule.as_ref().map(|s| s.expr().to_owned()),
            paused: self.paused(job),
            last_run: last.map(RunView::from),
            running: self.running.iter().filter(|r| r.id.tick.job == job).map(RunView::from).collect(),
            recent: recent
                .iter()
                .take(RECENT_RUNS_MAX)
                .map(|r| RecentRun {
                    id: r.id.to_string(),
                    state: r.state.to_string(),
                    scheduled_at: r.id.tick.scheduled_at,
                })
                .collect(),
            drift,
            stale,
            nodes: registrations.iter().map(|r| r.node.clone()).collect(),
            declared_in: self.declared.iter().find(|d| d.name == job).map(|d| d.source.to_string()),
            managed: self.managed_job(job).map(|m| ManagedView {
                revision: m.revision,
                changed_by: m.changed_by.clone(),
                changed_at: m.changed_at,
            }),
        }
    }

    /// One job in detail: its list entry, registrations, next fire times, the last day's
    /// counts by state, its newest runs and actions.
    pub async fn job(&self, store: &dyn OperatorStore, job: &str) -> Result<JobDetail, FleetError> {
        self.require(job)?;
        let day_ago = self.now - chrono::Duration::hours(24);
        let counted = store.count_runs(job, day_ago).await?;
        let q = HistoryQuery { job: Some(job.to_owned()), limit: RECENT_RUNS_MAX, ..HistoryQuery::default() };
        let recent = store.history(&q).await?;
        let actions = store.actions(&ActionQuery { job: Some(job.to_owned()), limit: ACTIONS_SHOWN }).await?;
        let registrations = self.registrations_for(store, &[job.to_owned()]).await?;
        let registrations = registrations.of(job);
        let counts: BTreeMap<String, u64> = counted.by_state.iter().map(|(s, n)| (s.to_string(), *n)).collect();
        Ok(JobDetail {
            summary: self.summary_from(registrations, job, &recent),
            registrations: registrations.iter().map(RegistrationView::from).collect(),
            next_fires: self.next_fires(self.schedule_in(registrations, job)),
            counts_truncated: counted.truncated,
            counts_24h: counts,
            recent_runs: recent.iter().map(RunView::from).collect(),
            actions: actions.iter().map(ActionView::from).collect(),
            definition: self.managed_job(job).and_then(|m| serde_json::from_str(&m.spec).ok()),
        })
    }

    fn next_fires(&self, schedule: Option<Schedule>) -> Vec<FireTime> {
        let Some(s) = schedule else { return Vec::new() };
        let mut out = Vec::with_capacity(NEXT_FIRES_SHOWN);
        let mut after = self.now;
        while let Some(t) = s.next_after(after).filter(|_| out.len() < NEXT_FIRES_SHOWN) {
            out.push(FireTime { utc: t, local: t.with_timezone(&s.zone()).to_rfc3339() });
            after = t;
        }
        out
    }
}
