//! Managed jobs, as operators write them: a definition read and checked by `solocron-spec`
//! (the one checker of job definitions, so a definition is refused exactly as a
//! configuration's job would be, at its key), refused where a configuration declares the
//! job, and written at the revision the writer expects.

use chrono::{DateTime, Utc};
use serde::Serialize;
use solocron_core::{JobRevision, JobWrite, OperatorStore, MANAGED_JOBS_MAX};
use solocron_spec::{JobSpec, Work};
use utoipa::ToSchema;

use crate::{Actor, Declared, FleetError};

/// What a write did.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct JobWritten {
    /// The job.
    pub job: String,
    /// `created`, `changed`, `unchanged` or `deleted`.
    pub outcome: String,
    /// The job's revision after the write (for a delete: the deleting revision).
    pub revision: u64,
}

/// One change of a managed job.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct RevisionView {
    /// The job.
    pub job: String,
    /// Store-wide, increasing.
    pub revision: u64,
    /// Who made the change.
    pub changed_by: String,
    /// When (store clock).
    pub changed_at: DateTime<Utc>,
    /// The change deleted the job.
    pub deleted: bool,
    /// The definition it wrote (absent for a delete).
    #[schema(value_type = Option<Object>)]
    pub spec: Option<serde_json::Value>,
}

impl From<&JobRevision> for RevisionView {
    fn from(r: &JobRevision) -> RevisionView {
        RevisionView {
            job: r.job.clone(),
            revision: r.revision,
            changed_by: r.changed_by.clone(),
            changed_at: r.changed_at,
            deleted: r.spec.is_none(),
            spec: r.spec.as_deref().and_then(|s| serde_json::from_str(s).ok()),
        }
    }
}

/// Refuses to manage `job` where a configuration declares it: the reader's own
/// (`declared`), or a node's (registered, and never managed).
pub async fn check_writable(store: &dyn OperatorStore, declared: &[Declared], job: &str) -> Result<(), FleetError> {
    solocron_core::validate_job_name(job).map_err(|e| FleetError::bad("job", e.to_string()))?;
    if let Some(d) = declared.iter().find(|d| d.name == job) {
        return Err(FleetError::Conflict(format!(
            "job `{job}` is declared in {}: change it there, or pick another name",
            d.source
        )));
    }
    let registered = store.registrations_of(&[job.to_owned()]).await?;
    if !registered.is_empty() && store.job_revisions(Some(job), 1).await?.is_empty() {
        let nodes: Vec<_> = registered.iter().map(|r| r.node.as_str()).collect();
        return Err(FleetError::Conflict(format!(
            "job `{job}` is declared in the configuration of node(s) {}: change it there, or pick another name",
            nodes.join(", ")
        )));
    }
    Ok(())
}

/// Creates or replaces the managed job `job` with `definition` (a JSON object: the keys of
/// a `[[jobs]]` entry, read as a [`JobSpec`] and checked as every node will check it before
/// running it), at revision `expect` (`Some(0)`: only a new job; `None`: whatever it is).
/// `allow_commands`: whether it may run a command (off, a command written here is code run
/// on the fleet's hosts). The store keeps the spec's JSON form ([`JobSpec::to_json`]).
///
/// The checks go in this order, so a writer is told the first that fails: the actor, the
/// job's name and whether a configuration declares it, then the definition (at its key:
/// `http.url`, `lease`), then the revision.
pub async fn put_job(
    store: &dyn OperatorStore,
    declared: &[Declared],
    allow_commands: bool,
    job: &str,
    definition: &serde_json::Value,
    actor: &Actor,
    expect: Option<u64>,
) -> Result<JobWritten, FleetError> {
    actor.check()?;
    check_writable(store, declared, job).await?;
    let bad = |e: solocron_spec::SpecError| FleetError::bad(e.key, e.message);
    let spec = JobSpec::from_json(job, definition).map_err(bad)?;
    let text = spec.to_json();
    solocron_core::check_spec_text(&text).map_err(|e| FleetError::bad("(body)", e))?;
    let checked = spec.check_as(job).map_err(bad)?;
    if matches!(checked.work, Work::Command(_)) && !allow_commands {
        let why =
            "command jobs are refused through the API ([http] allow_command_jobs = false): use http = { url = ... }";
        return Err(FleetError::bad("command", why));
    }
    let existed = store.managed_jobs().await?.iter().any(|m| m.job == job);
    let outcome = |revision, what: &str| JobWritten { job: job.to_owned(), outcome: what.to_owned(), revision };
    match store.put_job(job, &text, &actor.by, expect).await? {
        JobWrite::Written(r) => Ok(outcome(r, if existed { "changed" } else { "created" })),
        JobWrite::Unchanged(r) => Ok(outcome(r.unwrap_or(0), "unchanged")),
        JobWrite::Conflict(now) => Err(conflict(job, expect, now)),
        JobWrite::Full => Err(FleetError::Conflict(format!("the store holds {MANAGED_JOBS_MAX} managed jobs already"))),
    }
}

/// Deletes the managed job `job` at revision `expect` (`None`: whatever it is); a run in
/// progress finishes.
pub async fn delete_job(
    store: &dyn OperatorStore,
    job: &str,
    actor: &Actor,
    expect: Option<u64>,
) -> Result<JobWritten, FleetError> {
    actor.check()?;
    match store.delete_job(job, &actor.by, expect).await? {
        JobWrite::Written(r) => Ok(JobWritten { job: job.to_owned(), outcome: "deleted".into(), revision: r }),
        JobWrite::Unchanged(_) => Err(FleetError::NotFound(format!("no managed job `{job}`"))),
        JobWrite::Conflict(now) => Err(conflict(job, expect, now)),
        JobWrite::Full => unreachable!("a delete never fills the store"),
    }
}

/// The revisions of `job` (or of every managed job), newest first.
pub async fn revisions(
    store: &dyn OperatorStore,
    job: Option<&str>,
    limit: usize,
) -> Result<Vec<RevisionView>, FleetError> {
    Ok(store.job_revisions(job, limit).await?.iter().map(RevisionView::from).collect())
}

fn conflict(job: &str, expect: Option<u64>, now: Option<u64>) -> FleetError {
    let message = match (expect, now) {
        (Some(0), Some(r)) => format!("job `{job}` exists already (revision {r}): edit it, or pick another name"),
        (_, None) => format!("job `{job}` does not exist (any more): read the jobs again"),
        (e, Some(r)) => {
            let expected = e.map_or(String::new(), |e| format!("revision {e} was expected; "));
            format!("job `{job}` changed meanwhile: {expected}it is at revision {r}; read it again and retry")
        }
    };
    FleetError::Conflict(message)
}
