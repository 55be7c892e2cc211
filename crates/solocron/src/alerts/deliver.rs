//! Deliveries: an alert's delivery is a run of an on-demand job of its own, one per rule
//! and job (named `#alert{rule}:{job}`), that reads the event back from the store and sends
//! it to the rule's target.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, SecondsFormat, Utc};
use solocron_core::{
    HistoryQuery, JobPolicy, NodeStore, OnCrash, RetryPolicy, RunRecord, StoreError, JOB_NAME_CHARS_MAX,
};

use super::{AlertEvent, AlertRule, AlertTarget, Alerts};
use crate::engine::Engine;
use crate::http_job::HttpJob;
use crate::job::{Handler, Job, Outcome, RunContext};
use crate::store_call::bounded;

/// Attempts of a delivery (the first included), and their waits: 2 s doubling up to 5
/// minutes, so a receiver down for about a quarter of an hour still gets the alert.
pub const DELIVERY_RETRY: RetryPolicy =
    RetryPolicy { attempts: 10, backoff: Duration::from_secs(2), max_backoff: Duration::from_secs(300), jitter: true };
/// A delivery's lease.
const DELIVERY_LEASE: Duration = Duration::from_secs(30);
/// The longest one delivery attempt may take (a webhook's own `timeout` is usually shorter).
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(60);
/// Most bytes of a run's output an alert carries.
const ALERT_OUTPUT_BYTES_MAX: usize = 1024;
/// Most deliveries kept built; past it the map starts again (they are cheap to rebuild).
const DELIVERIES_KEPT_MAX: usize = 10_000;

impl Alerts {
    /// The delivery job named `name`, if it is one of this node's rules'.
    pub(super) fn delivery(&self, e: &Engine, name: &str) -> Option<Arc<Job>> {
        let (index, namespace, rest) = parse_delivery_name(name)?;
        let job = if is_shortened(index, namespace, rest) {
            let jobs = e.jobs.get();
            jobs.jobs.iter().map(|j| j.name().to_owned()).find(|j| delivery_name(index, j) == name)?
        } else {
            format!("{namespace}{rest}")
        };
        self.delivery_for(e, index, &job)
    }

    /// The delivery of rule `index`'s alerts about `job`, if that rule covers it.
    pub(super) fn delivery_for(&self, e: &Engine, index: usize, job: &str) -> Option<Arc<Job>> {
        let name = delivery_name(index, job);
        if let Some(built) = self.deliveries.lock().expect("deliveries lock").get(&name) {
            return Some(built.clone());
        }
        let rule = self.rules.get(index).filter(|r| r.covers(job))?;
        let handler = Delivery { rule: rule.clone(), job: job.to_owned(), store: e.store.clone() };
        let built = Arc::new(Job::on_demand(name.clone(), delivery_policy(), handler));
        let mut deliveries = self.deliveries.lock().expect("deliveries lock");
        if deliveries.len() >= DELIVERIES_KEPT_MAX {
            deliveries.clear();
        }
        deliveries.insert(name, built.clone());
        Some(built)
    }
}

/// A delivery's policy: retried by [`DELIVERY_RETRY`] when the receiver fails, and again
/// when the delivering node dies. (Cut short by its node's shutdown, it is handed to
/// another node too: a delivery is an on-demand job, see `Job::interrupted_handoff`.)
fn delivery_policy() -> JobPolicy {
    JobPolicy {
        lease: DELIVERY_LEASE,
        timeout: Some(DELIVERY_TIMEOUT),
        on_crash: OnCrash::Retry,
        max_attempts: DELIVERY_RETRY.attempts,
        retry: Some(DELIVERY_RETRY),
        ..JobPolicy::default()
    }
}

/// The name of the deliveries of `rule` (its index) about `job`: `#alert{rule}:{job}`, or
/// `{namespace}/#alert{rule}:{name}` for a job of another namespace than `default` (so a
/// delivery lives in its job's namespace), within [`JOB_NAME_CHARS_MAX`] (a long job name
/// is cut and a digest of it added).
fn delivery_name(rule: usize, job: &str) -> String {
    let (namespace, plain) = job.split_once('/').map_or(("", job), |(ns, rest)| (&job[..=ns.len()], rest));
    let prefix = format!("{namespace}#alert{rule}:");
    let room = JOB_NAME_CHARS_MAX - prefix.chars().count();
    if plain.chars().count() <= room {
        return format!("{prefix}{plain}");
    }
    use sha2::Digest as _;
    let digest: String = sha2::Sha256::digest(job.as_bytes()).iter().take(8).map(|b| format!("{b:02x}")).collect();
    let kept: String = plain.chars().take(room - 17).collect();
    format!("{prefix}{kept}~{digest}")
}

/// Whether `name` is an alert delivery's (no job's name has a `#`).
pub(crate) fn is_delivery_name(name: &str) -> bool {
    parse_delivery_name(name).is_some()
}

/// A delivery's name read back: the rule's index, the job's namespace prefix (`""` or
/// `billing/`) and the rest; `None` for any other name.
fn parse_delivery_name(name: &str) -> Option<(usize, &str, &str)> {
    let at = name.find("#alert")?;
    let (namespace, rest) = name.split_at(at);
    if !(namespace.is_empty() || namespace.ends_with('/') && !namespace[..namespace.len() - 1].contains('/')) {
        return None;
    }
    let (index, rest) = rest.strip_prefix("#alert")?.split_once(':')?;
    Some((index.parse().ok()?, namespace, rest))
}

/// Whether `rest` (of rule `index`'s delivery name in `namespace`) is a cut name with a
/// digest.
fn is_shortened(index: usize, namespace: &str, rest: &str) -> bool {
    let room = JOB_NAME_CHARS_MAX - format!("{namespace}#alert{index}:").chars().count();
    rest.chars().count() == room && rest.chars().rev().nth(16) == Some('~')
}

/// One delivery: reads the event back from the store, then sends it to the rule's target.
struct Delivery {
    rule: Arc<AlertRule>,
    /// The job the alert is about.
    job: String,
    store: Arc<dyn NodeStore>,
}

#[async_trait]
impl Handler for Delivery {
    async fn run(&self, ctx: RunContext) -> Outcome {
        let alert = match self.read_event(ctx.scheduled_at).await {
            Ok(alert) => alert,
            Err(err) => {
                return Outcome { output: format!("cannot read the event from the store: {err}"), ..Outcome::default() }
            }
        };
        let body = alert.body(&ctx);
        let outcome = match &self.rule.target {
            AlertTarget::Webhook(request) => {
                let mut request = HttpJob::clone(request).with_secret_path();
                if !request.has_timeout() {
                    request = request.timeout(DELIVERY_TIMEOUT / 2);
                }
                request.with_json(body.to_string().into_bytes()).run(ctx).await
            }
            AlertTarget::Command(command) => {
                let command = command
                    .clone()
                    .env("SOLOCRON_ALERT", body.to_string())
                    .env("SOLOCRON_ALERT_EVENT", alert.event.as_str())
                    .env("SOLOCRON_ALERT_JOB", &self.job)
                    .env("SOLOCRON_ALERT_TEXT", &alert.text);
                command.run(ctx).await
            }
        };
        let reason = Some(format!("{} alert about {}", alert.event, alert.about));
        Outcome { reason: outcome.reason.or(reason), ..outcome }
    }
}

/// An event as read back from the store.
struct Alert {
    event: AlertEvent,
    /// The run (or the job, for a stale one) it is about.
    about: String,
    text: String,
    run: Option<RunRecord>,
}

impl Delivery {
    /// The event at `at`: the tick's newest record; none for a stale alert.
    async fn read_event(&self, at: DateTime<Utc>) -> Result<Alert, StoreError> {
        let query = HistoryQuery {
            job: Some(self.job.clone()),
            since: Some(at),
            until: Some(at + chrono::Duration::milliseconds(1)),
            limit: 100,
            ..Default::default()
        };
        let newest = bounded(self.store.history(&query)).await?.into_iter().max_by_key(|r| r.id.attempt);
        let stale = at.timestamp_subsec_millis() == 999 && self.rule.events.contains(&AlertEvent::Stale);
        let Some(run) = newest.filter(|_| !stale) else {
            if !stale {
                // Pruned, or a lagging read: failing lets a retry read it again.
                return Err(StoreError::Invalid(format!("no record of job {} at {at}: the event is gone", self.job)));
            }
            let silent = self.rule.stale_after.map_or("a while".into(), solocron_core::format_duration);
            return Ok(Alert {
                event: AlertEvent::Stale,
                about: format!("job {}", self.job),
                text: format!("solocron: job {} has had no success for {silent}", self.job),
                run: None,
            });
        };
        let event = AlertEvent::of_end(run.state)
            .ok_or_else(|| StoreError::Invalid(format!("run {} is {}, which no alert is about", run.id, run.state)))?;
        let why = run.reason.as_deref().map(|r| format!(": {r}")).unwrap_or_default();
        let text = match event {
            AlertEvent::Recovered => {
                format!("solocron: job {} succeeded again (run {} on {})", self.job, run.id, run.node)
            }
            _ => format!("solocron: job {} {} (run {} on {}){why}", self.job, words(event), run.id, run.node),
        };
        Ok(Alert { event, about: format!("run {}", run.id), text, run: Some(run) })
    }
}

/// How an event reads in an alert's text.
fn words(event: AlertEvent) -> &'static str {
    match event {
        AlertEvent::Failed => "failed",
        AlertEvent::TimedOut => "timed out",
        AlertEvent::Lost => "was lost",
        AlertEvent::Abandoned => "was abandoned",
        AlertEvent::Missed => "missed a tick",
        AlertEvent::Stale => "is stale",
        AlertEvent::Recovered => "recovered",
    }
}

impl Alert {
    /// The JSON body: the event, a Slack-compatible `text`, the run, and the delivery.
    fn body(&self, ctx: &RunContext) -> serde_json::Value {
        let time = |t: Option<DateTime<Utc>>| t.map(|t| t.to_rfc3339_opts(SecondsFormat::Millis, true));
        let run = self.run.as_ref().map(|r| {
            let output = solocron_core::output_tail(&r.output);
            let cut = output.len().saturating_sub(ALERT_OUTPUT_BYTES_MAX);
            let cut = (cut..=output.len()).find(|&i| output.is_char_boundary(i)).unwrap_or(output.len());
            serde_json::json!({
                "id": r.id.to_string(),
                "job": r.id.tick.job,
                "scheduled_at": time(Some(r.id.tick.scheduled_at)),
                "attempt": r.id.attempt,
                "trigger": r.trigger.as_str(),
                "state": r.state.as_str(),
                "reason": r.reason,
                "node": r.node,
                "fencing_token": r.fencing_token,
                "started_at": time(r.started_at),
                "finished_at": time(r.finished_at),
                "exit_code": r.exit_code,
                "output_tail": &output[cut..],
            })
        });
        serde_json::json!({
            "event": self.event.as_str(),
            "job": run_job(self, ctx),
            "text": self.text,
            "run": run,
            "alert": { "id": ctx.run_id, "attempt": ctx.attempt, "node": ctx.node_id },
        })
    }
}

/// The job an alert is about.
fn run_job(alert: &Alert, ctx: &RunContext) -> String {
    match &alert.run {
        Some(r) => r.id.tick.job.clone(),
        None => alert.about.strip_prefix("job ").unwrap_or(&ctx.job).to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delivery_names_fit_every_store_and_read_back() {
        assert_eq!(delivery_name(3, "backup"), "#alert3:backup");
        assert_eq!(parse_delivery_name("#alert3:backup"), Some((3, "", "backup")));
        assert_eq!(parse_delivery_name("backup"), None);
        // A namespaced job's delivery is in the job's namespace.
        assert_eq!(delivery_name(3, "billing/a/b"), "billing/#alert3:a/b");
        assert_eq!(parse_delivery_name("billing/#alert3:a/b"), Some((3, "billing/", "a/b")));
        assert_eq!(solocron_core::namespace_of(&delivery_name(3, "billing/a/b")), "billing");
        assert!(solocron_core::validate_job_name(&delivery_name(3, "billing/a")).is_err(), "never a job's name");
        let long = "x".repeat(JOB_NAME_CHARS_MAX);
        let name = delivery_name(42, &long);
        assert_eq!(name.chars().count(), JOB_NAME_CHARS_MAX, "{name}");
        let (index, namespace, rest) = parse_delivery_name(&name).unwrap();
        assert!(index == 42 && is_shortened(index, namespace, rest));
        let long = format!("billing/{}", "x".repeat(JOB_NAME_CHARS_MAX - 8));
        let name = delivery_name(42, &long);
        assert!(name.starts_with("billing/#alert42:") && name.chars().count() == JOB_NAME_CHARS_MAX, "{name}");
        let (index, namespace, rest) = parse_delivery_name(&name).unwrap();
        assert!(index == 42 && namespace == "billing/" && is_shortened(index, namespace, rest));
        assert_ne!(
            name,
            delivery_name(42, &format!("{}y", "x".repeat(JOB_NAME_CHARS_MAX - 1))),
            "the digest tells them apart"
        );
        assert!(!is_shortened(3, "", "backup"));
    }
}
