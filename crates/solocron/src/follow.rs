//! A node's job list made of two sources, followed as either changes: the jobs the program
//! declares (its configuration, replaced whole by a reload) and the store's managed jobs
//! (written anywhere through the API or `solocron jobs apply`, picked up through the store's
//! change hint within a second). What `solocron run` does, for any program that embeds the
//! library.
//!
//! ```no_run
//! # async fn demo(store: std::sync::Arc<dyn solocron::Store>, scheduler: solocron::Scheduler) {
//! use std::sync::Arc;
//! use solocron::follow::{follow, read_if_changed, Sources};
//! use solocron::CancellationToken;
//!
//! let shutdown = CancellationToken::new();
//! let (seen, managed) = read_if_changed(store.as_ref(), 0).await.ok().flatten().unwrap_or_default();
//! let sources = Arc::new(Sources::new(scheduler.jobs(), Vec::new(), false, solocron::spec::read_secret));
//! sources.set_managed(&managed);
//! tokio::spawn(follow(store, sources, seen, managed, shutdown.clone()));
//! scheduler.run(shutdown).await;
//! # }
//! ```

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use solocron_core::{ManagedJob, ManagedStore, RequestStore, StoreError};
use solocron_spec::{SecretSource, Work};
use tokio_util::sync::CancellationToken;

use crate::job::Job;
use crate::jobset::{BuildError, JobChanges, Jobs};

/// Reads a secret (an HTTP job's header) from where its source says: what the program
/// allows (`crate::spec::read_secret` reads environment variables and files).
pub type SecretReader = fn(&SecretSource) -> Result<String, String>;

/// How often the managed jobs' version is read when the store gives no hint (MySQL): a
/// change is picked up within this.
const POLL: Duration = Duration::from_millis(500);
/// How often it is read anyway with a hint (in case one was lost).
const BACKSTOP: Duration = Duration::from_secs(10);

/// The two sources of the node's jobs, and the scheduler's list they make.
pub struct Sources {
    jobs: Jobs,
    allow_commands: bool,
    secret: SecretReader,
    inner: Mutex<Lists>,
}

/// Each job in the `Arc` the scheduler's list shares.
#[derive(Default)]
struct Lists {
    declared: Vec<Arc<Job>>,
    managed: Vec<Arc<Job>>,
    /// What was said about each managed job that is not run here (once per revision).
    refused: HashMap<String, u64>,
}

impl Sources {
    /// The sources of a scheduler's list (`jobs`, [`crate::Scheduler::jobs`]), holding
    /// `declared` and no managed job yet. A managed job that runs a command is run only if
    /// `allow_commands` (it is code on the fleet's hosts); an HTTP job's secret headers are
    /// read with `secret`.
    pub fn new(jobs: Jobs, declared: Vec<Job>, allow_commands: bool, secret: SecretReader) -> Sources {
        let declared = shared(declared);
        Sources { jobs, allow_commands, secret, inner: Mutex::new(Lists { declared, ..Lists::default() }) }
    }

    /// Replaces the declared jobs (a reload) and the scheduler's list with them; a list the
    /// scheduler refuses changes nothing.
    pub fn set_declared(&self, declared: Vec<Job>) -> Result<JobChanges, BuildError> {
        let mut lists = self.lists();
        let previous = std::mem::replace(&mut lists.declared, shared(declared));
        match self.jobs.replace(merged(&lists)) {
            Ok(changes) => Ok(changes),
            Err(e) => {
                lists.declared = previous;
                Err(e)
            }
        }
    }

    /// Replaces the managed jobs with those of `list` this node runs, and the scheduler's
    /// list with them.
    pub fn set_managed(&self, list: &[ManagedJob]) {
        let mut lists = self.lists();
        let declared: HashSet<String> = lists.declared.iter().map(|j| j.name().to_owned()).collect();
        let mut managed = Vec::with_capacity(list.len());
        // Another namespace's managed jobs are another application's: not this node's.
        for m in list.iter().filter(|m| self.jobs.namespaces().serves(&m.job)) {
            match runnable(m, &declared, self.allow_commands, self.secret) {
                Ok(job) => managed.push(Arc::new(job)),
                Err(why) => {
                    if lists.refused.insert(m.job.clone(), m.revision) != Some(m.revision) {
                        tracing::error!(job = %m.job, revision = m.revision, why, "managed job not run on this node");
                    }
                }
            }
        }
        lists.managed = managed;
        if let Err(e) = self.jobs.replace(merged(&lists)) {
            tracing::error!(error = %e, "managed jobs not taken: the list they make is refused");
        }
    }

    fn lists(&self) -> std::sync::MutexGuard<'_, Lists> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The scheduler's list: the declared jobs, then the managed ones.
fn merged(lists: &Lists) -> Vec<Arc<Job>> {
    lists.declared.iter().chain(&lists.managed).cloned().collect()
}

/// `jobs`, each in its `Arc`, in a list of their exact length.
fn shared(jobs: Vec<Job>) -> Vec<Arc<Job>> {
    let mut out = Vec::with_capacity(jobs.len());
    out.extend(jobs.into_iter().map(Arc::new));
    out
}

/// A managed job as this node runs it, or why it does not.
fn runnable(
    m: &ManagedJob,
    declared: &HashSet<String>,
    allow_commands: bool,
    secret: SecretReader,
) -> Result<Job, String> {
    if declared.contains(&m.job) {
        return Err("this node's configuration declares a job of that name; the declared one runs".into());
    }
    let job = solocron_spec::check_definition(&m.job, &m.spec).map_err(|e| e.to_string())?;
    if matches!(job.work, Work::Command(_)) && !allow_commands {
        return Err("it runs a command, and this node's [http] allow_command_jobs is off".into());
    }
    let label = format!("managed job `{}` (revision {})", m.job, m.revision);
    crate::spec::job(&job, &secret).map_err(|e| format!("{label}: jobs[0] ({}).{}: {}", m.job, e.key, e.message))
}

/// Reads the managed jobs whenever the store hints at a change (or every [`POLL`] without
/// hints), and hands a changed set to `sources`, until shutdown. `seen`: the version read
/// at start, `known` the managed jobs read then.
///
/// **A store that forgot.** Versions only grow (a deletion is a revision too), so a version
/// below the one seen means the store lost its managed jobs (Redis without persistence,
/// restarted). The jobs this node last read are then written back where absent, as
/// [`RESTORED_BY`] (every node that knew them tries; one write per job wins), and the node
/// keeps running them meanwhile: a store that blinks never silently stops the fleet's
/// managed jobs. Their revision history is lost with the rest.
pub async fn follow<S: RequestStore + ManagedStore + ?Sized>(
    store: Arc<S>,
    sources: Arc<Sources>,
    mut seen: u64,
    mut known: Vec<ManagedJob>,
    shutdown: CancellationToken,
) {
    let mut watch = store.request_watch();
    let every = if watch.is_some() { BACKSTOP } else { POLL };
    loop {
        let hinted = async {
            match watch.as_mut() {
                Some(w) => w.changed().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = hinted => {}
            _ = shutdown.cancelled() => return,
        }
        match read_if_changed(store.as_ref(), seen).await {
            Ok(Some((version, _))) if version < seen => {
                tracing::warn!(version, seen, jobs = known.len(),
                    "the store forgot its managed jobs (restarted without persistence?); writing back the ones this node knows");
                if let Err(e) = restore(store.as_ref(), &known).await {
                    tracing::warn!(error = %e, "cannot write back the managed jobs; running them as known, retrying");
                    continue;
                }
                seen = 0; // read the restored list at the next hint (the writes send one)
            }
            Ok(Some((version, list))) => {
                sources.set_managed(&list);
                (seen, known) = (version, list);
            }
            Ok(None) => {}
            Err(e) => tracing::warn!(error = %e, "cannot read the managed jobs; retrying"),
        }
    }
}

/// Who a managed job written back after the store forgot it was written by.
pub const RESTORED_BY: &str = "solocron (written back: the store had forgotten it)";

/// Writes `known` back where the store has no such job (`expect` 0: only if absent).
async fn restore<S: ManagedStore + ?Sized>(store: &S, known: &[ManagedJob]) -> Result<(), StoreError> {
    for m in known {
        match store.put_job(&m.job, &m.spec, RESTORED_BY, Some(0)).await? {
            solocron_core::JobWrite::Written(revision) => {
                tracing::info!(job = %m.job, revision, "managed job written back")
            }
            other => tracing::debug!(job = %m.job, ?other, "managed job already back"),
        }
    }
    Ok(())
}

/// The managed jobs and their version, if the version is not `seen`.
pub async fn read_if_changed<S: ManagedStore + ?Sized>(
    store: &S,
    seen: u64,
) -> Result<Option<(u64, Vec<ManagedJob>)>, StoreError> {
    let version = store.managed_version().await?;
    if version == seen {
        return Ok(None);
    }
    Ok(Some((version, store.managed_jobs().await?)))
}
