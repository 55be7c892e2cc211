//! `[[alerts]]`: who is told of which events of which jobs, checked with errors that name
//! the key (`alerts[0].on`), like every other part of the configuration.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;
use solocron::AlertEvent;
use solocron_core::parse_duration;
use solocron_spec::{HttpSpec, HttpWork};

use super::errors::KeyError;

/// One `[[alerts]]` entry as written.
#[derive(Debug, Deserialize, Default, Clone)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAlert {
    on: Option<Vec<String>>,
    webhook: Option<String>,
    method: Option<String>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    #[serde(default)]
    headers_env: BTreeMap<String, String>,
    #[serde(default)]
    headers_file: BTreeMap<String, String>,
    timeout: Option<String>,
    expect_status: Option<String>,
    ca_file: Option<String>,
    command: Option<Vec<String>>,
    jobs: Option<Vec<String>>,
    stale_after: Option<String>,
    max_per_hour: Option<u32>,
}

/// A webhook's timeout unless the entry says.
const WEBHOOK_TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);

/// A checked `[[alerts]]` entry. A webhook's secrets stay where they are until the
/// scheduler is built (`wiring::scheduler`), and are never printed.
#[derive(Debug, Clone)]
pub struct AlertConfig {
    /// `on`: the events it is told of.
    pub events: Vec<AlertEvent>,
    /// Who is told.
    pub target: AlertTargetConfig,
    /// `None`: every job of the node.
    pub jobs: Option<Vec<String>>,
    /// `stale_after`: how long without a success before a job counts as stale.
    pub stale_after: Option<Duration>,
    /// `max_per_hour`: most deliveries per job for events of the last hour.
    pub max_per_hour: u32,
}

/// Where an alert goes: exactly one of `webhook` and `command`.
#[derive(Debug, Clone)]
pub enum AlertTargetConfig {
    /// `webhook`: a request, checked like an HTTP job's.
    Webhook(Box<Webhook>),
    /// `command`: a non-empty argv, the alert's JSON in `$SOLOCRON_ALERT`.
    Command(Vec<String>),
}

/// An alert's `webhook`: a request checked by the HTTP job's rules, its secrets unread.
#[derive(Debug, Clone)]
pub struct Webhook {
    /// The request.
    pub work: HttpWork,
    /// `timeout`: the longest a delivery may take (default 10 s).
    pub timeout: Duration,
}

/// Every `[[alerts]]` entry, checked.
pub(super) fn resolve_alerts(raw: &[RawAlert]) -> Result<Vec<AlertConfig>, KeyError> {
    if raw.len() > solocron::ALERT_RULES_MAX {
        let why = format!("at most {} entries", solocron::ALERT_RULES_MAX);
        return Err((format!("alerts[{}]", solocron::ALERT_RULES_MAX), why));
    }
    raw.iter().enumerate().map(|(i, a)| resolve_alert(i, a)).collect()
}

fn resolve_alert(i: usize, a: &RawAlert) -> Result<AlertConfig, KeyError> {
    let key = |k: &str| format!("alerts[{i}].{k}");
    let events = resolve_events(a.on.as_deref(), &key)?;
    let target = match (&a.webhook, &a.command) {
        (Some(_), Some(_)) => {
            return Err((key("command"), "an alert goes to a `webhook` or a `command`, not both: remove one".into()))
        }
        (None, None) => return Err((
            key("webhook"),
            "is required (a URL, e.g. \"https://hooks.slack.com/services/...\"), or instead command = [\"/usr/local/bin/page\"]"
                .into(),
        )),
        (None, Some(command)) => {
            if command.is_empty() || command[0].is_empty() {
                return Err((key("command"), "must name a program: a non-empty argv array".into()));
            }
            if let Some(k) = webhook_only_key(a) {
                return Err((key(k), "is for a `webhook`; a `command` gets the alert in its environment".into()));
            }
            AlertTargetConfig::Command(command.clone())
        }
        (Some(url), None) => AlertTargetConfig::Webhook(Box::new(webhook(i, a, url)?)),
    };
    let stale_after = match &a.stale_after {
        Some(s) => Some(parse_duration(s).map_err(|e| (key("stale_after"), e.to_string()))?),
        None => None,
    };
    if events.contains(&AlertEvent::Stale) && stale_after.is_none() {
        return Err((
            key("stale_after"),
            "is required with the `stale` event: how long without a success, e.g. \"1h\"".into(),
        ));
    }
    if stale_after.is_some_and(|d| d < Duration::from_secs(1)) {
        return Err((key("stale_after"), "must be at least 1s".into()));
    }
    if let Some(jobs) = &a.jobs {
        for (j, name) in jobs.iter().enumerate() {
            solocron_core::validate_job_name(name).map_err(|e| (key(&format!("jobs[{j}]")), e.to_string()))?;
        }
    }
    let max_per_hour = a.max_per_hour.unwrap_or(solocron::ALERTS_PER_HOUR_DEFAULT);
    if max_per_hour == 0 {
        return Err((key("max_per_hour"), "must be at least 1 (0 would send nothing)".into()));
    }
    Ok(AlertConfig { events, target, jobs: a.jobs.clone(), stale_after, max_per_hour })
}

/// `on`: a non-empty list of known events.
fn resolve_events(on: Option<&[String]>, key: &dyn Fn(&str) -> String) -> Result<Vec<AlertEvent>, KeyError> {
    let valid: Vec<&str> = AlertEvent::ALL.iter().map(|e| e.as_str()).collect();
    let on = on
        .filter(|on| !on.is_empty())
        .ok_or_else(|| (key("on"), format!("is required: the events to alert on, some of {}", valid.join(", "))))?;
    let mut events = Vec::new();
    for (n, word) in on.iter().enumerate() {
        let event = word.parse::<AlertEvent>().map_err(|why| (key(&format!("on[{n}]")), why))?;
        if !events.contains(&event) {
            events.push(event);
        }
    }
    Ok(events)
}

/// A key only a webhook takes, if the entry has one.
fn webhook_only_key(a: &RawAlert) -> Option<&'static str> {
    let set = [
        ("method", a.method.is_some()),
        ("headers", !a.headers.is_empty()),
        ("headers_env", !a.headers_env.is_empty()),
        ("headers_file", !a.headers_file.is_empty()),
        ("timeout", a.timeout.is_some()),
        ("expect_status", a.expect_status.is_some()),
        ("ca_file", a.ca_file.is_some()),
    ];
    set.into_iter().find(|(_, is)| *is).map(|(k, _)| k)
}

/// The webhook's request, checked by the HTTP job's rules, each error at the alert's key.
fn webhook(i: usize, a: &RawAlert, url: &str) -> Result<Webhook, KeyError> {
    let http = HttpSpec {
        url: Some(url.to_owned()),
        method: a.method.clone(),
        headers: Some(a.headers.clone()),
        headers_env: Some(a.headers_env.clone()),
        headers_file: Some(a.headers_file.clone()),
        expect_status: a.expect_status.clone(),
        ca_file: a.ca_file.clone(),
        ..HttpSpec::default()
    };
    let key = |k: &str| match k.strip_prefix("http.") {
        Some("url") => format!("alerts[{i}].webhook"),
        Some(rest) => format!("alerts[{i}].{rest}"),
        None => format!("alerts[{i}].{k}"),
    };
    let work = http.check().map_err(|e| (key(&e.key), e.message))?;
    let timeout = match &a.timeout {
        Some(t) => parse_duration(t).map_err(|e| (key("timeout"), e.to_string()))?,
        None => WEBHOOK_TIMEOUT_DEFAULT,
    };
    Ok(Webhook { work, timeout })
}

#[cfg(test)]
mod tests {
    use super::super::Config;
    use super::AlertTargetConfig;

    const HOOK: &str =
        "[[alerts]]\non = [\"failed\", \"stale\"]\nwebhook = \"https://hooks.example.com/x\"\nstale_after = \"1h\"\n";

    fn error_of(toml: &str) -> String {
        Config::parse("a.toml", toml).unwrap_err().to_string()
    }

    #[test]
    fn an_alert_takes_a_webhook_or_a_command_with_its_events_and_defaults() {
        let c = Config::parse("a.toml", HOOK).unwrap();
        let a = &c.alerts[0];
        assert_eq!(a.events, [solocron::AlertEvent::Failed, solocron::AlertEvent::Stale]);
        assert_eq!(a.max_per_hour, solocron::ALERTS_PER_HOUR_DEFAULT);
        assert!(matches!(&a.target, AlertTargetConfig::Webhook(_)) && a.jobs.is_none());
        let cmd =
            Config::parse("a.toml", "[[alerts]]\non = [\"lost\"]\ncommand = [\"/bin/page\"]\njobs = [\"backup\"]\n");
        let cmd = cmd.unwrap();
        assert!(matches!(&cmd.alerts[0].target, AlertTargetConfig::Command(argv) if argv == &["/bin/page"]));
    }

    #[test]
    fn each_bad_alert_key_is_named_with_what_is_wrong() {
        let cases = [
            (HOOK.replace("on = [\"failed\", \"stale\"]\n", ""), "a.toml: alerts[0].on: is required"),
            (
                HOOK.replace("\"stale\"]", "\"faild\"]"),
                "alerts[0].on[1]: unknown alert event `faild`; expected one of: failed",
            ),
            (HOOK.replace("stale_after = \"1h\"\n", ""), "alerts[0].stale_after: is required with the `stale` event"),
            (HOOK.replace("\"1h\"", "\"soon\""), "alerts[0].stale_after"),
            (
                HOOK.replace("https://hooks.example.com/x", "ftp://x"),
                "alerts[0].webhook: `ftp://x` must start with http://",
            ),
            (
                format!("{HOOK}command = [\"/bin/page\"]\n"),
                "alerts[0].command: an alert goes to a `webhook` or a `command`, not both",
            ),
            (HOOK.replace("webhook = \"https://hooks.example.com/x\"\n", ""), "alerts[0].webhook: is required"),
            (format!("{HOOK}max_per_hour = 0\n"), "alerts[0].max_per_hour: must be at least 1"),
            (format!("{HOOK}jobs = [\"a b\"]\n"), "alerts[0].jobs[0]: job name `a b` contains"),
            (format!("{HOOK}headers = {{ \"Bad Name\" = \"x\" }}\n"), "alerts[0].headers"),
            (format!("{HOOK}timeout = \"forever\"\n"), "alerts[0].timeout"),
            (format!("{HOOK}retries = 3\n"), "retries"),
            (
                "[[alerts]]\non = [\"lost\"]\ncommand = [\"/bin/page\"]\ntimeout = \"5s\"\n".to_owned(),
                "alerts[0].timeout: is for a `webhook`",
            ),
        ];
        for (toml, expected) in cases {
            let e = error_of(&toml);
            assert!(e.contains(expected), "expected `{expected}` in: {e}\n--- for:\n{toml}");
        }
    }
}
