//! A node as the scheduler runs it: a configuration's jobs and alerts turned into the
//! library's `Job`s and `AlertRule`s, their secrets (headers, CA files) read only here, and
//! the `Scheduler` built over a store. The daemon, `trigger --here` and the managed jobs a
//! node follows all build their jobs through this one door.

use solocron::spec::read_secret;
use solocron::{AlertRule, AlertTarget, Command, HttpJob, Job, Scheduler};

use crate::config::{AlertConfig, AlertTargetConfig, CheckedJob, Config, Webhook};
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
    for (i, alert) in cfg.alerts.iter().enumerate() {
        builder = builder.alert(alert_rule(&cfg.file, i, alert)?);
    }
    builder.build().map_err(|e| bad_input(format!("{}: {e}", cfg.file)))
}

/// `[[alerts]]` entry `i` as the scheduler takes it, its webhook's secrets read.
fn alert_rule(file: &str, i: usize, a: &AlertConfig) -> Result<AlertRule, Failure> {
    let target = match &a.target {
        AlertTargetConfig::Webhook(w) => AlertTarget::Webhook(Box::new(webhook(file, i, w)?)),
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
    cfg.jobs.iter().enumerate().map(|(i, j)| job_of(&cfg.file, &format!("jobs[{i}] ({})", j.name), j)).collect()
}

/// A checked job as the scheduler runs it (the library's `solocron::spec::job`), its
/// secrets read from their environment variables and files; errors name `file`, the job's
/// `table` in it (`jobs[0] (sync)`) and the key, never a value.
pub fn job_of(file: &str, table: &str, j: &CheckedJob) -> Result<Job, Failure> {
    solocron::spec::job(j, &read_secret).map_err(|e| bad_input(format!("{file}: {table}.{}: {}", e.key, e.message)))
}

/// Alert `i`'s webhook with its secret headers and CA file read. Errors name the alert's
/// key and the variable or file, never a value.
fn webhook(file: &str, i: usize, w: &Webhook) -> Result<HttpJob, Failure> {
    let http = solocron::spec::http_job(&w.work, &read_secret).map_err(|e| {
        let key = match e.key.strip_prefix("http.") {
            Some("url") => "webhook",
            Some(rest) => rest,
            None => &e.key,
        };
        bad_input(format!("{file}: alerts[{i}].{key}: {}", e.message))
    })?;
    Ok(http.timeout(w.timeout))
}
