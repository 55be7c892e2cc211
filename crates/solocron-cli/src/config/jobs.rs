//! The `[[jobs]]` entries and `[defaults]`: each a [`JobSpec`] (the job definition
//! language, `solocron-spec`, which a configuration, a jobs document and a managed job's
//! definition share), checked by its one checker, each error at its key in the file
//! (`jobs[1] (b).lease`, `defaults.schedule`).

use std::collections::HashMap;

use solocron_spec::{CheckedJob, JobSpec, SpecError};

use super::errors::KeyError;

/// A refusal of job `i`'s entry at its key in the file: `jobs[1] (b).lease` (the entry by
/// the name its error shows), or `jobs[1].name` where the name itself is at fault.
fn at_job(i: usize) -> impl Fn(SpecError) -> KeyError {
    move |e| match e.job {
        Some(job) => (format!("jobs[{i}] ({job}).{}", e.key), e.message),
        None => (format!("jobs[{i}].{}", e.key), e.message),
    }
}

/// `[defaults]` may not hold what only a job can say.
pub(super) fn check_defaults(defaults: &JobSpec) -> Result<(), KeyError> {
    defaults.check_defaults().map_err(|e| (format!("defaults.{}", e.key), e.message))
}

/// Every `[[jobs]]` entry, `[defaults]` applied, checked, names unique.
pub(super) fn resolve_jobs(defaults: &JobSpec, raw: &[JobSpec]) -> Result<Vec<CheckedJob>, KeyError> {
    let mut jobs = Vec::new();
    let mut seen: HashMap<String, usize> = HashMap::new();
    for (i, j) in raw.iter().enumerate() {
        let job = j.check(defaults).map_err(at_job(i))?;
        if let Some(first) = seen.insert(job.name.clone(), i) {
            return Err((
                format!("jobs[{i}].name"),
                format!("job name `{}` is already used by jobs[{first}]; names must be unique", job.name),
            ));
        }
        jobs.push(job);
    }
    Ok(jobs)
}

/// The key that put job `j` in its namespace, for errors: `namespace` where the job or
/// `[defaults]` sets one, else `name` (a full name carries its namespace).
pub(super) fn namespace_key(j: &JobSpec, defaults: &JobSpec) -> &'static str {
    if j.namespace.is_some() || defaults.namespace.is_some() {
        "namespace"
    } else {
        "name"
    }
}
