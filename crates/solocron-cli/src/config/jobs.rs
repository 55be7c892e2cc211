//! The `[[jobs]]` entries: a job as written ([`RawJob`], with its `retry` and `http`
//! tables), and as checked ([`JobConfig`]): its full name, schedule, work and policies, each
//! error at its key (`jobs[1] (b).lease`).
//!
//! Self-contained on purpose (it needs only [`KeyError`]): this is the job definition
//! language, which a configuration, a jobs document and a managed job's definition share.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use serde::Deserialize;
use solocron_core::{parse_duration, JobPolicy, Misfire, OnCrash, Overlap, RetryPolicy, Schedule};

use super::errors::KeyError;

/// One `[[jobs]]` entry, or `[defaults]` (where `name`, `schedule`, `command` and `http` are
/// refused).
#[derive(Debug, Deserialize, Default, Clone)]
#[serde(deny_unknown_fields)]
pub(super) struct RawJob {
    name: Option<String>,
    schedule: Option<String>,
    command: Option<Vec<String>>,
    timezone: Option<String>,
    namespace: Option<String>,
    timeout: Option<String>,
    lease: Option<String>,
    overlap: Option<String>,
    misfire: Option<String>,
    catchup: Option<String>,
    max_catchup: Option<u32>,
    on_crash: Option<String>,
    max_attempts: Option<u32>,
    kill_grace: Option<String>,
    retry: Option<RawRetry>,
    http: Option<RawHttpJob>,
}

/// A job's `retry = { ... }`: failure retries. Every key is optional (see [`resolve_retry`]).
#[derive(Debug, Deserialize, Default, Clone)]
#[serde(deny_unknown_fields)]
struct RawRetry {
    attempts: Option<u32>,
    backoff: Option<String>,
    max_backoff: Option<String>,
    jitter: Option<bool>,
}

/// Attempts of a `retry` that does not say, the first included.
const RETRY_ATTEMPTS_DEFAULT: u32 = 3;
/// The first wait of a `retry` that does not say.
const RETRY_BACKOFF_DEFAULT: Duration = Duration::from_secs(10);
/// The longest wait of a `retry` that does not say (or its `backoff`, if longer).
const RETRY_MAX_BACKOFF_DEFAULT: Duration = Duration::from_secs(300);

/// A job's `http = { ... }`: a request instead of a command.
#[derive(Debug, Deserialize, Default, Clone)]
#[serde(deny_unknown_fields)]
pub(super) struct RawHttpJob {
    pub(super) url: Option<String>,
    pub(super) method: Option<String>,
    #[serde(default)]
    pub(super) headers: BTreeMap<String, String>,
    /// Header name to the environment variable holding its (secret) value.
    #[serde(default)]
    pub(super) headers_env: BTreeMap<String, String>,
    /// Header name to the file holding its (secret) value.
    #[serde(default)]
    pub(super) headers_file: BTreeMap<String, String>,
    pub(super) body: Option<String>,
    pub(super) timeout: Option<String>,
    pub(super) expect_status: Option<String>,
    pub(super) ca_file: Option<String>,
}

impl RawJob {
    /// The key that put this job in its namespace, for errors: `namespace` where the job or
    /// `[defaults]` sets one, else `name` (a full name carries its namespace).
    pub(super) fn namespace_key(&self, defaults: &RawJob) -> &'static str {
        if self.namespace.is_some() || defaults.namespace.is_some() {
            "namespace"
        } else {
            "name"
        }
    }
}

/// Where a secret is read from.
#[derive(Debug, Clone)]
pub enum SecretSource {
    /// The environment variable holding it.
    Env(String),
    /// The file holding it (a trailing newline is no part of it).
    File(String),
}

/// A validated job.
#[derive(Debug, Clone)]
pub struct JobConfig {
    /// Its full name, namespace included (`billing/sync`; `backup` in `default`).
    pub name: String,
    /// When it fires, in its zone.
    pub schedule: Schedule,
    /// What it runs.
    pub work: Work,
    /// Its lease, timeout, overlap, misfire, catch-up, crash and retry policies.
    pub policy: JobPolicy,
}

/// What a job runs: exactly one of `command` and `http`.
#[derive(Debug, Clone)]
pub enum Work {
    /// `command`: a non-empty argv.
    Command(Vec<String>),
    /// `http`: a request.
    Http(Box<HttpWork>),
}

/// A job's `http`, checked by the library's rules. Its secrets and CA file stay where they
/// are until the scheduler is built (`wiring::scheduler`), and are never printed.
#[derive(Debug, Clone)]
pub struct HttpWork {
    /// The request without its secret headers or CA file.
    pub request: solocron::HttpJob,
    /// `http.headers_env` and `http.headers_file`, read when the scheduler is built.
    pub secret_headers: Vec<SecretHeader>,
    /// `http.ca_file`, as written (relative paths from the working directory, like every
    /// other `*_file` key).
    pub ca_file: Option<String>,
    /// The key of the job's `http`, for errors: `jobs[0] (sync).http`.
    pub key: String,
}

/// One entry of `http.headers_env` or `http.headers_file`.
#[derive(Debug, Clone)]
pub struct SecretHeader {
    /// The key, for errors: `jobs[0] (sync).http.headers_env.Authorization`.
    pub key: String,
    /// The header's name.
    pub name: String,
    /// Where its value is.
    pub source: SecretSource,
}

/// `[defaults]` may not hold what only a job can say.
pub(super) fn check_defaults(defaults: &RawJob) -> Result<(), KeyError> {
    for key in ["name", "schedule", "command", "http"] {
        let set = match key {
            "name" => defaults.name.is_some(),
            "schedule" => defaults.schedule.is_some(),
            "command" => defaults.command.is_some(),
            _ => defaults.http.is_some(),
        };
        if set {
            return Err((format!("defaults.{key}"), "cannot be defaulted; set it on each job".into()));
        }
    }
    Ok(())
}

/// Every `[[jobs]]` entry, `[defaults]` applied, checked, names unique.
pub(super) fn resolve_jobs(defaults: &RawJob, raw: &[RawJob]) -> Result<Vec<JobConfig>, KeyError> {
    let mut jobs = Vec::new();
    let mut seen: HashMap<String, usize> = HashMap::new();
    for (i, j) in raw.iter().enumerate() {
        let job = resolve_job(i, j, defaults)?;
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

/// The full name of job `i`, `name` in `namespace` (see [`solocron_core::namespace_of`]),
/// checked by the library's rule, so a configuration names only jobs the scheduler accepts.
fn full_name(i: usize, name: &str, namespace: Option<&str>) -> Result<String, KeyError> {
    let Some(namespace) = namespace else {
        solocron_core::validate_job_name(name).map_err(|e| (format!("jobs[{i}].name"), e.to_string()))?;
        return Ok(name.to_owned());
    };
    let key = || format!("jobs[{i}] ({name}).namespace");
    solocron_core::validate_namespace(namespace).map_err(|e| (key(), e.to_string()))?;
    if namespace == solocron_core::DEFAULT_NAMESPACE && name.contains('/') {
        return Err((
            format!("jobs[{i}].name"),
            format!("`{name}` is in namespace `default`, where a name holds no `/` (the part before it would be its namespace)"),
        ));
    }
    let full = solocron_core::full_job_name(namespace, name);
    solocron_core::validate_job_name(&full).map_err(|e| (format!("jobs[{i}].name"), e.to_string()))?;
    Ok(full)
}

/// Job `i`, `[defaults]` (`d`) filling in what it leaves out.
fn resolve_job(i: usize, j: &RawJob, d: &RawJob) -> Result<JobConfig, KeyError> {
    let name = j.name.clone().ok_or_else(|| (format!("jobs[{i}].name"), "is required".into()))?;
    let name = full_name(i, &name, j.namespace.as_deref().or(d.namespace.as_deref()))?;
    let key = |k: &str| format!("jobs[{i}] ({name}).{k}");
    let schedule_expr = j.schedule.as_deref().ok_or_else(|| (key("schedule"), "is required".into()))?;
    let zone = j.timezone.as_deref().or(d.timezone.as_deref()).unwrap_or("UTC");
    let schedule = Schedule::parse(schedule_expr, zone).map_err(|e| {
        let k = if matches!(e, solocron_core::ScheduleError::TimeZone(_)) { "timezone" } else { "schedule" };
        (key(k), e.to_string())
    })?;
    let (work, policy) = match (&j.command, &j.http) {
        (Some(_), Some(_)) => {
            return Err((key("http"), "a job runs a `command` or calls `http`, not both: remove one".into()))
        }
        (None, None) => return Err((
            key("command"),
            "is required (an argv array, e.g. [\"/usr/bin/env\", \"sh\", \"-c\", \"echo hi\"]), or instead http = { url = \"https://...\" }"
                .into(),
        )),
        (Some(command), None) => {
            if command.is_empty() || command[0].is_empty() {
                return Err((key("command"), "must name a program: a non-empty argv array".into()));
            }
            (Work::Command(command.clone()), resolve_policy(j, d, &key)?)
        }
        (None, Some(http)) => {
            let work = resolve_http_job(http, &key)?;
            (Work::Http(Box::new(work)), http_policy(j, http, d, &key)?)
        }
    };
    Ok(JobConfig { name, schedule, work, policy })
}

/// A job's `http`, checked by the library's rules (`solocron::HttpJob`), each error at its key.
pub(super) fn resolve_http_job(h: &RawHttpJob, key: &dyn Fn(&str) -> String) -> Result<HttpWork, KeyError> {
    let at = |e: solocron::HttpJobError| (key(&format!("http.{}", e.field)), e.why);
    let url = h.url.as_deref().ok_or_else(|| {
        (key("http.url"), "is required: the endpoint to call, e.g. \"https://billing.internal/jobs/invoices\"".into())
    })?;
    let mut request = solocron::HttpJob::new(url).map_err(at)?;
    if let Some(m) = &h.method {
        request = request.method(m).map_err(at)?;
    }
    for (name, value) in &h.headers {
        request = request.header(name, value).map_err(|e| (key(&format!("http.headers.{name}")), e.why))?;
    }
    if let Some(b) = &h.body {
        request = request.body(b.as_bytes());
    }
    if let Some(s) = &h.expect_status {
        request = request.expect_status(s).map_err(at)?;
    }
    let mut names = std::collections::HashSet::new();
    let tables = [("headers", &h.headers), ("headers_env", &h.headers_env), ("headers_file", &h.headers_file)];
    for (table, name) in tables.iter().flat_map(|(t, m)| m.keys().map(move |n| (t, n))) {
        if !names.insert(name.to_ascii_lowercase()) {
            let why = format!("`{name}` is set twice (in headers, headers_env or headers_file): keep one");
            return Err((key(&format!("http.{table}.{name}")), why));
        }
    }
    let mut secret_headers = Vec::new();
    let sources = h.headers_env.iter().map(|(n, v)| ("headers_env", n, SecretSource::Env(v.clone())));
    let sources = sources.chain(h.headers_file.iter().map(|(n, v)| ("headers_file", n, SecretSource::File(v.clone()))));
    for (table, name, source) in sources {
        let k = key(&format!("http.{table}.{name}"));
        let (SecretSource::Env(what) | SecretSource::File(what)) = &source;
        if what.is_empty() {
            let what = if table == "headers_env" { "an environment variable" } else { "a file" };
            return Err((k, format!("must name {what}")));
        }
        // The name by the library's rule; the value is read when the scheduler is built.
        request.clone().secret_header(name, "").map_err(|e| (k.clone(), e.why))?;
        secret_headers.push(SecretHeader { key: k, name: name.clone(), source });
    }
    if h.ca_file.as_deref() == Some("") {
        return Err((key("http.ca_file"), "must name a PEM file of CA certificates".into()));
    }
    Ok(HttpWork { request, secret_headers, ca_file: h.ca_file.clone(), key: key("http") })
}

/// An HTTP job's policy: `http.timeout` is the job's `timeout` (one limit: past it the
/// request is dropped and the run recorded `timed_out`), so setting both is refused.
fn http_policy(j: &RawJob, h: &RawHttpJob, d: &RawJob, key: &dyn Fn(&str) -> String) -> Result<JobPolicy, KeyError> {
    let Some(t) = &h.timeout else { return resolve_policy(j, d, key) };
    if j.timeout.is_some() {
        return Err((key("http.timeout"), "is the job's timeout: set `timeout` or `http.timeout`, not both".into()));
    }
    parse_duration(t).map_err(|e| (key("http.timeout"), e.to_string()))?;
    let with = RawJob { timeout: Some(t.clone()), ..j.clone() };
    let http_key = |k: &str| if k == "timeout" { key("http.timeout") } else { key(k) };
    resolve_policy(&with, d, &http_key)
}

/// A job's policies: its own keys, else `[defaults]`'s, else the library's defaults;
/// checked by the library's rules, each error at its key.
fn resolve_policy(j: &RawJob, d: &RawJob, key: &dyn Fn(&str) -> String) -> Result<JobPolicy, KeyError> {
    let base = JobPolicy::default();
    let dur = |k: &str, v: &Option<String>, dv: &Option<String>| -> Result<Option<Duration>, KeyError> {
        match v.as_ref().or(dv.as_ref()) {
            Some(s) => parse_duration(s).map(Some).map_err(|e| (key(k), e.to_string())),
            None => Ok(None),
        }
    };
    fn pick<T: std::str::FromStr<Err = String>>(
        key: &dyn Fn(&str) -> String,
        k: &str,
        v: &Option<String>,
        dv: &Option<String>,
        default: T,
    ) -> Result<T, KeyError> {
        match v.as_ref().or(dv.as_ref()) {
            Some(s) => s.parse().map_err(|e| (key(k), e)),
            None => Ok(default),
        }
    }
    let lease = dur("lease", &j.lease, &d.lease)?.unwrap_or(base.lease);
    let policy = JobPolicy {
        lease,
        timeout: dur("timeout", &j.timeout, &d.timeout)?,
        overlap: pick::<Overlap>(key, "overlap", &j.overlap, &d.overlap, base.overlap)?,
        misfire: pick::<Misfire>(key, "misfire", &j.misfire, &d.misfire, base.misfire)?,
        catchup: dur("catchup", &j.catchup, &d.catchup)?.unwrap_or(base.catchup),
        max_catchup: j.max_catchup.or(d.max_catchup).unwrap_or(base.max_catchup),
        on_crash: pick::<OnCrash>(key, "on_crash", &j.on_crash, &d.on_crash, base.on_crash)?,
        max_attempts: j.max_attempts.or(d.max_attempts).unwrap_or(base.max_attempts),
        kill_grace: dur("kill_grace", &j.kill_grace, &d.kill_grace)?.unwrap_or(JobPolicy::default_kill_grace(lease)),
        retry: j.retry.as_ref().or(d.retry.as_ref()).map(|r| resolve_retry(r, key)).transpose()?,
    };
    policy.validate().map_err(|e| (key(e.field), e.why))?;
    Ok(policy)
}

/// A `retry` table (the job's, or else `[defaults]`'s, taken whole) with its defaults: 3
/// attempts, 10 s doubling up to 5 min, with jitter.
fn resolve_retry(r: &RawRetry, key: &dyn Fn(&str) -> String) -> Result<RetryPolicy, KeyError> {
    let dur = |k: &str, v: &Option<String>| -> Result<Option<Duration>, KeyError> {
        v.as_ref().map(|s| parse_duration(s).map_err(|e| (key(k), e.to_string()))).transpose()
    };
    let backoff = dur("retry.backoff", &r.backoff)?.unwrap_or(RETRY_BACKOFF_DEFAULT);
    Ok(RetryPolicy {
        attempts: r.attempts.unwrap_or(RETRY_ATTEMPTS_DEFAULT),
        backoff,
        max_backoff: dur("retry.max_backoff", &r.max_backoff)?.unwrap_or(RETRY_MAX_BACKOFF_DEFAULT.max(backoff)),
        jitter: r.jitter.unwrap_or(true),
    })
}
