//! The node's job list, checked once and shared by the engine's rooms, and replaced whole
//! while the node runs ([`Jobs::replace`]: a configuration reloaded, managed jobs changed).
//!
//! A list is never edited in place: the timer, recovery and housekeeping each take the
//! current list when they act, and a run holds its own job (an `Arc`) to its end, so a job
//! removed or changed while it runs finishes as it started.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use solocron_core::Namespaces;
use tokio::sync::watch;

use crate::job::Job;

/// A job list that cannot be scheduled, or a node that cannot be built around it: what
/// [`SchedulerBuilder::build`](crate::SchedulerBuilder::build) and [`Jobs::replace`] refuse.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// Two jobs share a name.
    #[error("job `{0}` is defined twice; job names must be unique")]
    DuplicateJob(String),
    /// A job's name breaks the rule every part of solocron shares (see
    /// [`solocron_core::validate_job_name`]): a name like `a@b` could not be told apart in
    /// a run id (`job@instant#attempt`), and an empty one names nothing.
    #[error("the job added at index {index}: {error}")]
    JobName {
        /// Where the job is in the order [`SchedulerBuilder::job`](crate::SchedulerBuilder::job) added it, from 0: the
        /// name alone may not identify it (it may be empty).
        index: usize,
        /// The name as given.
        job: String,
        /// What is wrong, and what a name may be.
        error: solocron_core::JobNameError,
    },
    /// A job's policy is out of bounds.
    #[error("job `{job}`: {error}")]
    Policy {
        /// The job.
        job: String,
        /// What is wrong.
        error: solocron_core::PolicyError,
    },
    /// An alert rule is incomplete.
    #[error("alert rule {index}: {error}")]
    Alert {
        /// Where the rule is in the order [`SchedulerBuilder::alert`](crate::SchedulerBuilder::alert) added it, from 0.
        index: usize,
        /// What is wrong.
        error: String,
    },
    /// A job is in a namespace this node does not serve.
    #[error("job `{job}` is in namespace `{namespace}`, which this node does not serve (it serves {served}); add `{namespace}` to the node's namespaces")]
    Namespace {
        /// The job's full name.
        job: String,
        /// Its namespace.
        namespace: String,
        /// The namespaces the node serves, in words.
        served: String,
    },
    /// The node's namespaces are not a valid list.
    #[error("the node's namespaces: {0}")]
    Namespaces(solocron_core::NamespacesError),
    /// The node id is empty.
    #[error("the node id must not be empty")]
    EmptyNodeId,
    /// The history retention is too short to be safe.
    #[error("history retention {} is too short: a pruned tick could be claimed again by a node whose clock lags, or by a catch-up looking back; it must be at least {} (a day, and twice the longest catchup)", solocron_core::format_duration(*.retention), solocron_core::format_duration(*.floor))]
    Retention {
        /// What was asked.
        retention: Duration,
        /// The shortest safe retention.
        floor: Duration,
    },
}

/// A checked job list: unique, valid names and policies.
///
/// Names are found through `by_name`, the jobs' places sorted by name (4 bytes a job), not
/// a map holding a second copy of every name: a node of 10,000 jobs keeps this list for
/// its life, and each byte per job is 10 kB of it.
#[derive(Debug, Default)]
pub(crate) struct JobSet {
    /// The jobs, in the order they were given.
    pub(crate) jobs: Vec<Arc<Job>>,
    /// Places in `jobs`, in the order of their names.
    by_name: Vec<u32>,
}

impl JobSet {
    /// Checks `jobs` (names, namespaces served, policies, no name twice) and, with a
    /// `retention`, that it is safe for their catch-up windows.
    pub(crate) fn new(
        jobs: Vec<Arc<Job>>,
        namespaces: &Namespaces,
        retention: Option<Duration>,
    ) -> Result<JobSet, BuildError> {
        // Hundreds of bytes a job: memory runs out long before 2^32 of them.
        let places = u32::try_from(jobs.len()).expect("fewer than 2^32 jobs");
        for (i, job) in jobs.iter().enumerate() {
            solocron_core::validate_job_name(job.name()).map_err(|error| BuildError::JobName {
                index: i,
                job: job.name().to_owned(),
                error,
            })?;
            if !namespaces.serves(job.name()) {
                return Err(BuildError::Namespace {
                    job: job.name().to_owned(),
                    namespace: solocron_core::namespace_of(job.name()).to_owned(),
                    served: namespaces.to_string(),
                });
            }
            job.policy().validate().map_err(|error| BuildError::Policy { job: job.name().to_owned(), error })?;
        }
        let mut by_name: Vec<u32> = (0..places).collect();
        by_name.sort_unstable_by(|&a, &b| jobs[a as usize].name().cmp(jobs[b as usize].name()));
        if let Some(twice) = by_name.windows(2).find(|w| jobs[w[0] as usize].name() == jobs[w[1] as usize].name()) {
            return Err(BuildError::DuplicateJob(jobs[twice[0] as usize].name().to_owned()));
        }
        if let Some(r) = retention {
            let floor = solocron_core::retention_floor(jobs.iter().map(|j| j.policy()));
            if r < floor {
                return Err(BuildError::Retention { retention: r, floor });
            }
        }
        Ok(JobSet { jobs, by_name })
    }

    /// The job named `name`, if this list has it.
    pub(crate) fn get(&self, name: &str) -> Option<&Arc<Job>> {
        self.index(name).map(|i| &self.jobs[i])
    }

    /// Where `name` is in this list.
    pub(crate) fn index(&self, name: &str) -> Option<usize> {
        let found = self.by_name.binary_search_by(|&i| self.jobs[i as usize].name().cmp(name)).ok()?;
        Some(self.by_name[found] as usize)
    }

    /// How many jobs.
    pub(crate) fn len(&self) -> usize {
        self.jobs.len()
    }

    /// What going from `self` to `next` adds, changes (another definition) and removes.
    fn changes_to(&self, next: &JobSet) -> JobChanges {
        let mut c = JobChanges::default();
        for job in &next.jobs {
            match self.get(job.name()) {
                None => c.added.insert(job.name().to_owned()),
                Some(old) if old.definition() != job.definition() => c.changed.insert(job.name().to_owned()),
                Some(_) => false,
            };
        }
        c.removed = self.jobs.iter().filter(|j| next.get(j.name()).is_none()).map(|j| j.name().to_owned()).collect();
        c
    }
}

/// What a [`Jobs::replace`] changed, by job name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobChanges {
    /// Jobs the node did not have: their first tick is the first after the change (a job is
    /// born when it is added: no tick before it is missed or caught up).
    pub added: BTreeSet<String>,
    /// Jobs defined differently (schedule, zone or policy): the new definition takes over
    /// from the first tick after the last one handled under the old.
    pub changed: BTreeSet<String>,
    /// Jobs no longer on the list: no new tick is claimed; a run in progress finishes.
    pub removed: BTreeSet<String>,
}

impl JobChanges {
    /// True when the lists define the same jobs the same way.
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.changed.is_empty() && self.removed.is_empty()
    }
}

/// The job list of a scheduler, which can be replaced while it runs; get it with
/// [`crate::Scheduler::jobs`]. Cheap to clone: every clone changes the same scheduler.
///
/// A replacement takes effect from the next tick, with the rules every change follows:
/// no tick runs twice (a tick's identity is its job and instant, and the store's claim
/// decides), none is dropped between the old schedule and the new (the new one continues
/// from the last instant the old one handled), an added job starts with its first tick
/// after the change, and a removed or changed job's run in progress finishes as it began.
#[derive(Clone)]
pub struct Jobs {
    current: Arc<watch::Sender<Arc<JobSet>>>,
    /// The namespaces this node serves; every job of every list is in one of them.
    namespaces: Arc<Namespaces>,
    retention: Option<Duration>,
}

impl Jobs {
    pub(crate) fn new(set: JobSet, namespaces: Namespaces, retention: Option<Duration>) -> Jobs {
        Jobs { current: Arc::new(watch::channel(Arc::new(set)).0), namespaces: Arc::new(namespaces), retention }
    }

    /// Replaces the job list whole, checked like [`crate::SchedulerBuilder::build`] checks
    /// it (a job of a namespace the node does not serve included); a list with an error is
    /// refused whole and the running list stays. Jobs given in their `Arc`s are kept as
    /// they are (a caller that keeps its own list shares each job with the scheduler's).
    pub fn replace<J: Into<Arc<Job>>>(&self, jobs: Vec<J>) -> Result<JobChanges, BuildError> {
        let mut jobs: Vec<Arc<Job>> = jobs.into_iter().map(Into::into).collect();
        // Collected in place from a `Vec<Job>`, the list would keep a job's size per slot.
        jobs.shrink_to_fit();
        let next = JobSet::new(jobs, &self.namespaces, self.retention)?;
        let mut changes = JobChanges::default();
        self.current.send_modify(|set| {
            changes = set.changes_to(&next);
            *set = Arc::new(next);
        });
        if !changes.is_empty() {
            tracing::info!(added = ?changes.added, changed = ?changes.changed, removed = ?changes.removed, "job list changed");
        }
        Ok(changes)
    }

    /// The namespaces this node serves: it claims, recovers and prunes only their jobs.
    pub fn namespaces(&self) -> &Namespaces {
        &self.namespaces
    }

    /// The names of the jobs now on the list, in order.
    pub fn names(&self) -> Vec<String> {
        self.current.borrow().jobs.iter().map(|j| j.name().to_owned()).collect()
    }

    /// The list now.
    pub(crate) fn get(&self) -> Arc<JobSet> {
        self.current.borrow().clone()
    }

    /// A receiver told of every replacement.
    pub(crate) fn watch(&self) -> watch::Receiver<Arc<JobSet>> {
        self.current.subscribe()
    }
}
