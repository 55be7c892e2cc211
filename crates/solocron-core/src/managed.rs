//! Managed jobs: jobs defined in the store (through the HTTP API or `solocron jobs apply`)
//! rather than in a node's configuration, each change kept as a revision.
//!
//! The store keeps a job's definition as text it does not read (`spec`: a JSON object with
//! the keys of a configuration's `[[jobs]]` entry); the writer checked it, and every node
//! checks it again before it runs it. Revisions are numbered store-wide, in the order their
//! writes committed, so a node that saw [`crate::ManagedStore::managed_version`] `n` has seen every
//! change up to `n`.

use chrono::{DateTime, Utc};

/// Most managed jobs one store (prefix) holds; a write past it is refused.
pub const MANAGED_JOBS_MAX: usize = 10_000;
/// Longest definition (`spec`), in bytes.
pub const JOB_SPEC_BYTES_MAX: usize = 16 * 1024;
/// Most revisions one [`crate::ManagedStore::job_revisions`] call returns.
pub const REVISIONS_PAGE_MAX: usize = 1_000;

/// A managed job as its newest revision defines it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManagedJob {
    /// The job's name.
    pub job: String,
    /// Its definition: a JSON object (the keys of a `[[jobs]]` entry, without `name`).
    pub spec: String,
    /// The revision that wrote it.
    pub revision: u64,
    /// Who wrote it (a token's name, `user@host`).
    pub changed_by: String,
    /// When (store clock).
    pub changed_at: DateTime<Utc>,
}

/// One change of a managed job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobRevision {
    /// The job's name.
    pub job: String,
    /// Store-wide, increasing in the order changes committed.
    pub revision: u64,
    /// The definition it wrote; `None`: it deleted the job.
    pub spec: Option<String>,
    /// Who made it.
    pub changed_by: String,
    /// When (store clock).
    pub changed_at: DateTime<Utc>,
}

/// What a write of a managed job did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobWrite {
    /// Written as this revision.
    Written(u64),
    /// The job already had this definition (or, for a delete, did not exist): nothing was
    /// written; the job's revision, if it has one.
    Unchanged(Option<u64>),
    /// The job's revision was not the one expected: nothing was written; its revision now
    /// (`None`: it does not exist).
    Conflict(Option<u64>),
    /// The store already holds [`MANAGED_JOBS_MAX`] jobs: nothing was written.
    Full,
}

/// What a write answers without writing, given the job's revision and spec now (`None`:
/// no such job) and the write's `spec` (`None`: a delete): a revision other than the
/// expected one, an equal spec, or the delete of a missing job. `None`: write. Every store
/// decides by this, in this order, inside its atomic step.
pub fn judge_write(current: Option<(u64, &str)>, spec: Option<&str>, expect: Option<u64>) -> Option<JobWrite> {
    let revision = current.map(|(r, _)| r);
    if expect.is_some_and(|e| e != revision.unwrap_or(0)) {
        return Some(JobWrite::Conflict(revision));
    }
    match (current, spec) {
        (Some((_, now)), Some(spec)) if now == spec => Some(JobWrite::Unchanged(revision)),
        (None, None) => Some(JobWrite::Unchanged(None)),
        _ => None,
    }
}

/// Refuses a definition the store must not take: empty, too long, or not a JSON object
/// (the store does not parse it further; nodes check it).
pub fn check_spec_text(spec: &str) -> Result<(), String> {
    let t = spec.trim_start();
    if spec.len() > JOB_SPEC_BYTES_MAX {
        return Err(format!("a job definition is at most {JOB_SPEC_BYTES_MAX} bytes, not {}", spec.len()));
    }
    if !t.starts_with('{') || !spec.trim_end().ends_with('}') {
        return Err("a job definition is a JSON object".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_is_judged_by_the_expected_revision_first_then_by_its_effect() {
        let judge = judge_write;
        assert_eq!(judge(Some((3, "{}")), Some("{}"), Some(2)), Some(JobWrite::Conflict(Some(3))));
        assert_eq!(judge(Some((3, "{}")), Some("{}"), Some(0)), Some(JobWrite::Conflict(Some(3))));
        assert_eq!(judge(None, Some("{}"), Some(3)), Some(JobWrite::Conflict(None)));
        assert_eq!(judge(Some((3, "{}")), Some("{}"), None), Some(JobWrite::Unchanged(Some(3))));
        assert_eq!(judge(Some((3, "{}")), Some("{ }"), Some(3)), None, "another spec is written");
        assert_eq!(judge(None, Some("{}"), Some(0)), None, "a new job is written");
        assert_eq!(judge(None, None, None), Some(JobWrite::Unchanged(None)), "nothing to delete");
        assert_eq!(judge(None, None, Some(0)), Some(JobWrite::Unchanged(None)));
        assert_eq!(judge(Some((3, "{}")), None, Some(3)), None, "a delete is written");
    }

    #[test]
    fn a_spec_is_a_bounded_json_object() {
        assert!(check_spec_text(r#"{"schedule": "* * * * *"}"#).is_ok());
        assert!(check_spec_text("[1]").is_err());
        assert!(check_spec_text("").is_err());
        let long = format!("{{\"body\": \"{}\"}}", "x".repeat(JOB_SPEC_BYTES_MAX));
        assert!(check_spec_text(&long).unwrap_err().contains("at most"));
    }
}
