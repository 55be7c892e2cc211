//! The one checker of a job's definition: a [`JobSpec`] (with the `[defaults]` spec filling
//! in what it leaves out) becomes a [`CheckedJob`] (its full name, schedule, policies and
//! work), or a [`SpecError`] naming the key at fault (`lease`, `http.url`, `retry.backoff`)
//! and what is wrong. A configuration, a jobs document, a managed job's stored definition
//! and the API's body are all checked here, so each accepts exactly the jobs the others do.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use solocron_core::{parse_duration, JobPolicy, Misfire, OnCrash, Overlap, RetryPolicy, Schedule};

use crate::http;
use crate::spec::{HttpSpec, JobSpec, RetrySpec};

/// Attempts of a `retry` that does not say, the first included.
pub const RETRY_ATTEMPTS_DEFAULT: u32 = 3;
/// The first wait of a `retry` that does not say.
pub const RETRY_BACKOFF_DEFAULT: Duration = Duration::from_secs(10);
/// The longest wait of a `retry` that does not say (or its `backoff`, if longer).
pub const RETRY_MAX_BACKOFF_DEFAULT: Duration = Duration::from_secs(300);

/// A refused definition: the key at fault, and what is wrong.
///
/// A configuration names the key in its file (`jobs[1] (b).lease`): `job` is the name the
/// entry goes by there. The API and a managed job's definition name `key` alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecError {
    /// The dotted key at fault within the definition (`lease`, `http.url`,
    /// `http.headers_env.Authorization`, `retry.backoff`), or `(body)` where no one key is.
    pub key: String,
    /// What is wrong, and what to write instead where that is known.
    pub message: String,
    /// The job the key is in, by the name errors show for it: its full name, or its name as
    /// written where its namespace is at fault. `None` where the name itself is at fault,
    /// or no name was known.
    pub job: Option<String>,
}

impl SpecError {
    /// An error at `key` of no named job.
    pub fn new(key: impl Into<String>, message: impl Into<String>) -> SpecError {
        SpecError { key: key.into(), message: message.into(), job: None }
    }
}

impl std::fmt::Display for SpecError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.key, self.message)
    }
}

impl std::error::Error for SpecError {}

/// A key and what is wrong with its value, inside the checker.
type KeyError = (String, String);

impl From<KeyError> for SpecError {
    fn from((key, message): KeyError) -> SpecError {
        SpecError::new(key, message)
    }
}

/// A checked job: what a node runs, every default filled in. Secrets (secret headers, a CA
/// file) stay where they are: reading them is the runner's (`solocron::spec`).
#[derive(Debug, Clone)]
pub struct CheckedJob {
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
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Work {
    /// `command`: a non-empty argv, its program named.
    Command(Vec<String>),
    /// `http`: a request.
    Http(Box<HttpWork>),
}

/// A job's `http`, checked: every part valid for the HTTP job that makes the request. Its
/// timeout is the job's (in [`CheckedJob::policy`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpWork {
    /// The endpoint: `http://` or `https://`, with a host.
    pub url: String,
    /// The method, as written (sent in upper case); `None`: `POST`.
    pub method: Option<String>,
    /// The plain headers, by name.
    pub headers: BTreeMap<String, String>,
    /// The request body; `None`: none.
    pub body: Option<String>,
    /// The statuses that count as success, as written; `None`: `2xx`.
    pub expect_status: Option<String>,
    /// `headers_env`, then `headers_file`, each by name: read by whoever runs the job.
    pub secret_headers: Vec<SecretHeader>,
    /// A PEM file of CA certificates trusted besides the system's roots, as written.
    pub ca_file: Option<String>,
}

/// One entry of `http.headers_env` or `http.headers_file`: a header whose value is a secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretHeader {
    /// The header's name.
    pub name: String,
    /// Where its value is.
    pub source: SecretSource,
}

impl SecretHeader {
    /// Its key in the definition: `http.headers_env.Authorization`.
    pub fn key(&self) -> String {
        let table = match self.source {
            SecretSource::Env(_) => "headers_env",
            SecretSource::File(_) => "headers_file",
        };
        format!("http.{table}.{}", self.name)
    }
}

/// Where a secret is read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretSource {
    /// The environment variable holding it.
    Env(String),
    /// The file holding it (a trailing newline is no part of it).
    File(String),
}

impl JobSpec {
    /// Refuses, in a `[defaults]` spec, what only a job can say: `name`, `schedule`,
    /// `command` and `http`.
    ///
    /// ```
    /// use solocron_spec::JobSpec;
    /// let defaults = JobSpec { schedule: Some("@daily".into()), ..JobSpec::default() };
    /// let e = defaults.check_defaults().unwrap_err();
    /// assert_eq!((e.key.as_str(), e.message.as_str()), ("schedule", "cannot be defaulted; set it on each job"));
    /// ```
    pub fn check_defaults(&self) -> Result<(), SpecError> {
        let set = [
            ("name", self.name.is_some()),
            ("schedule", self.schedule.is_some()),
            ("command", self.command.is_some()),
            ("http", self.http.is_some()),
        ];
        match set.into_iter().find(|(_, is)| *is) {
            Some((key, _)) => Err(SpecError::new(key, "cannot be defaulted; set it on each job")),
            None => Ok(()),
        }
    }

    /// This job, `defaults` (a `[defaults]` spec, [`JobSpec::default`] where there is none)
    /// filling in what it leaves out, checked: the job a node runs, or the key at fault.
    ///
    /// ```
    /// use solocron_spec::{JobSpec, Work};
    /// let spec: JobSpec = serde_json::from_str(r#"{"name": "backup", "schedule": "@daily", "command": ["/usr/local/bin/backup"]}"#)?;
    /// let defaults = JobSpec { lease: Some("10s".into()), ..JobSpec::default() };
    /// let job = spec.check(&defaults)?;
    /// assert_eq!((job.name.as_str(), job.policy.lease.as_secs()), ("backup", 10));
    /// assert!(matches!(job.work, Work::Command(_)));
    ///
    /// let late = JobSpec { lease: Some("a while".into()), ..spec };
    /// assert_eq!(late.check(&defaults).unwrap_err().key, "lease");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn check(&self, defaults: &JobSpec) -> Result<CheckedJob, SpecError> {
        let (j, d) = (self, defaults);
        let written = j.name.as_deref().ok_or_else(|| SpecError::new("name", "is required"))?;
        let name = full_name(written, j.namespace.as_deref().or(d.namespace.as_deref()))?;
        let named = |(key, message): KeyError| SpecError { key, message, job: Some(name.clone()) };
        check_named(j, d).map_err(named).map(|(schedule, work, policy)| CheckedJob {
            name: name.clone(),
            schedule,
            work,
            policy,
        })
    }
}

impl HttpSpec {
    /// This `http` table, checked by the HTTP job's rules; each error at its key
    /// (`http.url`, `http.headers.X-Token`). Its `timeout` is the job's, checked with the
    /// job's policies ([`JobSpec::check`]).
    ///
    /// ```
    /// use solocron_spec::HttpSpec;
    /// let http = HttpSpec { url: Some("ftp://files.internal/x".into()), ..HttpSpec::default() };
    /// let e = http.check().unwrap_err();
    /// assert_eq!(e.to_string(), "http.url: `ftp://files.internal/x` must start with http:// or https://");
    /// ```
    pub fn check(&self) -> Result<HttpWork, SpecError> {
        check_http(self).map_err(SpecError::from)
    }
}

/// The full name of a job written `name` in `namespace` (see [`solocron_core::namespace_of`]),
/// checked by the library's rule, so a definition names only jobs the scheduler accepts.
fn full_name(name: &str, namespace: Option<&str>) -> Result<String, SpecError> {
    let at_name = |e: &dyn std::fmt::Display| SpecError::new("name", e.to_string());
    let Some(namespace) = namespace else {
        solocron_core::validate_job_name(name).map_err(|e| at_name(&e))?;
        return Ok(name.to_owned());
    };
    solocron_core::validate_namespace(namespace).map_err(|e| SpecError {
        key: "namespace".into(),
        message: e.to_string(),
        job: Some(name.to_owned()),
    })?;
    if namespace == solocron_core::DEFAULT_NAMESPACE && name.contains('/') {
        return Err(SpecError::new(
            "name",
            format!("`{name}` is in namespace `default`, where a name holds no `/` (the part before it would be its namespace)"),
        ));
    }
    let full = solocron_core::full_job_name(namespace, name);
    solocron_core::validate_job_name(&full).map_err(|e| at_name(&e))?;
    Ok(full)
}

/// Job `j` once named, `[defaults]` (`d`) filling in what it leaves out.
fn check_named(j: &JobSpec, d: &JobSpec) -> Result<(Schedule, Work, JobPolicy), KeyError> {
    let key = |k: &str| k.to_owned();
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
            (Work::Command(command.clone()), check_policy(j, d, &key)?)
        }
        (None, Some(http)) => {
            let work = check_http(http)?;
            (Work::Http(Box::new(work)), http_policy(j, http, d, &key)?)
        }
    };
    Ok((schedule, work, policy))
}

/// A job's `http`, checked by the HTTP job's rules, each error at its key, in the order the
/// request is built: url, method, headers, expect_status, then the secret headers.
fn check_http(h: &HttpSpec) -> Result<HttpWork, KeyError> {
    let key = |k: &str| k.to_owned();
    let at = |(field, why): http::PartError| (key(&format!("http.{field}")), why);
    let url = h.url.as_deref().ok_or_else(|| {
        (key("http.url"), "is required: the endpoint to call, e.g. \"https://billing.internal/jobs/invoices\"".into())
    })?;
    http::check_url(url).map_err(at)?;
    if let Some(m) = &h.method {
        http::check_method(m).map_err(at)?;
    }
    let none = BTreeMap::new();
    let (headers, headers_env, headers_file) = (
        h.headers.as_ref().unwrap_or(&none),
        h.headers_env.as_ref().unwrap_or(&none),
        h.headers_file.as_ref().unwrap_or(&none),
    );
    for (name, value) in headers {
        http::check_header(name, value).map_err(|(_, why)| (key(&format!("http.headers.{name}")), why))?;
    }
    if let Some(s) = &h.expect_status {
        http::check_expect_status(s).map_err(at)?;
    }
    let mut names = HashSet::new();
    let tables = [("headers", headers), ("headers_env", headers_env), ("headers_file", headers_file)];
    for (table, name) in tables.iter().flat_map(|(t, m)| m.keys().map(move |n| (t, n))) {
        if !names.insert(name.to_ascii_lowercase()) {
            let why = format!("`{name}` is set twice (in headers, headers_env or headers_file): keep one");
            return Err((key(&format!("http.{table}.{name}")), why));
        }
    }
    let mut secret_headers = Vec::new();
    let sources = headers_env.iter().map(|(n, v)| (n, SecretSource::Env(v.clone())));
    let sources = sources.chain(headers_file.iter().map(|(n, v)| (n, SecretSource::File(v.clone()))));
    for (name, source) in sources {
        let header = SecretHeader { name: name.clone(), source };
        let (SecretSource::Env(what) | SecretSource::File(what)) = &header.source;
        if what.is_empty() {
            let what = if matches!(header.source, SecretSource::Env(_)) { "an environment variable" } else { "a file" };
            return Err((header.key(), format!("must name {what}")));
        }
        // The name by the HTTP job's rule; the value is read by whoever runs the job.
        http::header_name(name).map_err(|(_, why)| (header.key(), why))?;
        secret_headers.push(header);
    }
    if h.ca_file.as_deref() == Some("") {
        return Err((key("http.ca_file"), "must name a PEM file of CA certificates".into()));
    }
    Ok(HttpWork {
        url: url.to_owned(),
        method: h.method.clone(),
        headers: headers.clone(),
        body: h.body.clone(),
        expect_status: h.expect_status.clone(),
        secret_headers,
        ca_file: h.ca_file.clone(),
    })
}

/// An HTTP job's policy: `http.timeout` is the job's `timeout` (one limit: past it the
/// request is dropped and the run recorded `timed_out`), so setting both is refused.
fn http_policy(j: &JobSpec, h: &HttpSpec, d: &JobSpec, key: &dyn Fn(&str) -> String) -> Result<JobPolicy, KeyError> {
    let Some(t) = &h.timeout else { return check_policy(j, d, key) };
    if j.timeout.is_some() {
        return Err((key("http.timeout"), "is the job's timeout: set `timeout` or `http.timeout`, not both".into()));
    }
    parse_duration(t).map_err(|e| (key("http.timeout"), e.to_string()))?;
    let with = JobSpec { timeout: Some(t.clone()), ..j.clone() };
    let http_key = |k: &str| if k == "timeout" { key("http.timeout") } else { key(k) };
    check_policy(&with, d, &http_key)
}

/// A job's policies: its own keys, else `[defaults]`'s, else the library's defaults;
/// checked by the library's rules, each error at its key.
fn check_policy(j: &JobSpec, d: &JobSpec, key: &dyn Fn(&str) -> String) -> Result<JobPolicy, KeyError> {
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
        retry: j.retry.as_ref().or(d.retry.as_ref()).map(|r| check_retry(r, key)).transpose()?,
    };
    policy.validate().map_err(|e| (key(e.field), e.why))?;
    Ok(policy)
}

/// A `retry` table (the job's, or else `[defaults]`'s, taken whole) with its defaults:
/// [`RETRY_ATTEMPTS_DEFAULT`] attempts, [`RETRY_BACKOFF_DEFAULT`] doubling up to
/// [`RETRY_MAX_BACKOFF_DEFAULT`], with jitter.
fn check_retry(r: &RetrySpec, key: &dyn Fn(&str) -> String) -> Result<RetryPolicy, KeyError> {
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
