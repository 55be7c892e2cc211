//! A node as the scheduler runs it: a configuration's jobs and alerts turned into the
//! library's `Job`s and `AlertRule`s, their secrets (headers, CA files) read only here, and
//! the `Scheduler` built over a store. The daemon, `trigger --here` and the managed jobs a
//! node follows all build their jobs through this one door.

use solocron::{AlertRule, AlertTarget, Command, HttpJob, Job, Scheduler};

use crate::config::{AlertConfig, AlertTargetConfig, Config, HttpWork, JobConfig, SecretSource, Work};
use crate::{bad_input, Failure};

/// The scheduler for a configuration, running `jobs` (its command jobs and HTTP jobs, made
/// by [`jobs`]).
pub fn scheduler(
    cfg: &Config,
    store: std::sync::Arc<dyn solocron_core::Store>,
    node_id: Option<String>,
    jobs: Vec<Job>,
) -> Result<Scheduler, Failure> {
    // The daemon migrates before it builds this (and only with `store.migrate`), failing
    // with a clear error; the scheduler need not do it again.
    let mut builder = Scheduler::builder(store)
        .migrate(false)
        .shutdown_grace(cfg.shutdown_grace)
        .max_concurrent_runs(cfg.max_concurrent_runs)
        .history_retention(cfg.history_retention)
        .namespaces(cfg.namespaces.names().unwrap_or_default().iter().cloned());
    if let Some(id) = node_id.or(cfg.node_id.clone()) {
        builder = builder.node_id(id);
    }
    for job in jobs {
        builder = builder.job(job);
    }
    for alert in &cfg.alerts {
        builder = builder.alert(alert_rule(&cfg.file, alert)?);
    }
    builder.build().map_err(|e| bad_input(format!("{}: {e}", cfg.file)))
}

/// An `[[alerts]]` entry as the scheduler takes it, its webhook's secrets read.
fn alert_rule(file: &str, a: &AlertConfig) -> Result<AlertRule, Failure> {
    let target = match &a.target {
        AlertTargetConfig::Webhook(w) => AlertTarget::Webhook(Box::new(http_job(file, w)?)),
        AlertTargetConfig::Command(argv) => {
            AlertTarget::Command(Command::new(argv.clone()).expect("validated: non-empty"))
        }
    };
    let mut rule = AlertRule::new(target).on(a.events.iter().copied()).max_per_hour(a.max_per_hour);
    if let Some(jobs) = &a.jobs {
        rule = rule.jobs(jobs.iter().cloned());
    }
    if let Some(after) = a.stale_after {
        rule = rule.stale_after(after);
    }
    Ok(rule)
}

/// A configuration's jobs, with their secrets read.
pub fn jobs(cfg: &Config) -> Result<Vec<Job>, Failure> {
    cfg.jobs.iter().map(|j| job_of(&cfg.file, j)).collect()
}

/// A checked job as the scheduler runs it, its secrets read; `file` names where it is
/// defined in errors.
pub fn job_of(file: &str, j: &JobConfig) -> Result<Job, Failure> {
    let job = match &j.work {
        Work::Command(argv) => {
            let cmd = Command::new(argv.clone()).expect("validated: non-empty");
            Job::new(j.name.clone(), j.schedule.detached(), cmd).with_fingerprint(format!("command {argv:?}"))
        }
        Work::Http(w) => {
            let http = http_job(file, w)?;
            // Secret headers by name only: a rotated token is no drift.
            let fingerprint = http.fingerprint();
            Job::new(j.name.clone(), j.schedule.detached(), http).with_fingerprint(fingerprint)
        }
    };
    Ok(job.with_policy(j.policy.clone()))
}

/// An HTTP job with its secret headers and CA file read. Errors name the key and the
/// variable or file, never a value.
fn http_job(file: &str, w: &HttpWork) -> Result<HttpJob, Failure> {
    let mut http = w.request.clone();
    for h in &w.secret_headers {
        let (value, from) = match &h.source {
            SecretSource::Env(var) => {
                let v = std::env::var(var)
                    .map_err(|_| bad_input(format!("{file}: {}: the environment variable {var} is not set", h.key)))?;
                (v, format!("the environment variable {var}"))
            }
            SecretSource::File(path) => {
                let v = std::fs::read_to_string(path)
                    .map_err(|e| bad_input(format!("{file}: {}: cannot read {path}: {e}", h.key)))?;
                (v, path.clone())
            }
        };
        // A file's trailing newline is no part of a token.
        http = http.secret_header(&h.name, value.trim()).map_err(|_| {
            bad_input(format!(
                "{file}: {}: the value in {from} holds a line break, a control character or non-ASCII",
                h.key
            ))
        })?;
    }
    if let Some(ca) = &w.ca_file {
        http = http.ca_file(ca).map_err(|e| bad_input(format!("{file}: {}.ca_file: {}", w.key, e.why)))?;
    }
    Ok(http)
}
