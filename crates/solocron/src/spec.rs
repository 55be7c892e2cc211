//! Job definitions made runnable: a definition checked by `solocron-spec` (a
//! [`CheckedJob`]: a configuration's `[[jobs]]` entry, a managed job's stored definition,
//! an API body) becomes a [`Job`] with its [`Command`] or [`HttpJob`] handler.
//!
//! Secrets are read only where the embedding program says: a job's secret headers
//! (`http.headers_env`, `http.headers_file`) get their values from the `secret` function it
//! passes ([`read_secret`] reads the environment variable or file each names, as
//! `solocron run` does). A job's CA file is read when its request is built, as
//! [`HttpJob::ca_file`] always does.
//!
//! ```
//! use solocron::spec::{check_definition, job, read_secret};
//!
//! let checked = check_definition("billing/send-invoices", r#"{
//!     "schedule": "0 */15 * * * *",
//!     "http": {"url": "https://billing.internal/jobs/send-invoices", "headers_env": {"Authorization": "BILLING_TOKEN"}}
//! }"#)?;
//! std::env::set_var("BILLING_TOKEN", "Bearer s3cret");
//! let job = job(&checked, &read_secret)?;
//! assert_eq!(job.name(), "billing/send-invoices");
//! assert!(!format!("{job:?}").contains("s3cret"));
//!
//! // Without secrets to read, a job that needs one is refused at its key.
//! let none = |_: &solocron::spec::SecretSource| Err("no secrets here".to_owned());
//! let e = solocron::spec::job(&checked, &none).unwrap_err();
//! assert_eq!(e.to_string(), "http.headers_env.Authorization: no secrets here");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub use solocron_spec::{
    check_definition, CheckedJob, HttpSpec, HttpWork, JobSpec, RetrySpec, SecretHeader, SecretSource, SpecError, Work,
};

use crate::{Command, HttpJob, HttpJobError, Job};

/// A checked job that could not be made runnable: the key of its definition at fault
/// (`http.headers_env.Authorization`, `http.ca_file`) and why (a secret not readable or
/// not a header value, a CA file not readable). Never holds a secret's value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key}: {message}")]
pub struct SpecJobError {
    /// The key at fault, within the job's definition.
    pub key: String,
    /// What is wrong.
    pub message: String,
}

/// `checked` as the scheduler runs it: its command, or its request with its secret headers
/// from `secret` and its CA file read. Its fingerprint (what drift compares) is its argv,
/// or its request without secret values ([`HttpJob::fingerprint`]), so a rotated token is
/// no drift.
pub fn job(
    checked: &CheckedJob,
    secret: &dyn Fn(&SecretSource) -> Result<String, String>,
) -> Result<Job, SpecJobError> {
    let schedule = checked.schedule.detached();
    let job = match &checked.work {
        Work::Command(argv) => {
            let cmd = Command::new(argv.clone()).expect("checked: a non-empty argv");
            Job::new(checked.name.clone(), schedule, cmd).with_fingerprint(format!("command {argv:?}"))
        }
        Work::Http(work) => {
            let http = http_job(work, secret)?;
            let fingerprint = http.fingerprint();
            Job::new(checked.name.clone(), schedule, http).with_fingerprint(fingerprint)
        }
    };
    Ok(job.with_policy(checked.policy.clone()))
}

/// The request of a checked `http`, its secret headers from `secret` and its CA file read.
/// No timeout is set: a job's is its policy's (an alert's webhook sets its own).
pub fn http_job(
    work: &HttpWork,
    secret: &dyn Fn(&SecretSource) -> Result<String, String>,
) -> Result<HttpJob, SpecJobError> {
    let mut http = request(work)?;
    for h in &work.secret_headers {
        let value = secret(&h.source).map_err(|message| SpecJobError { key: h.key(), message })?;
        let from = match &h.source {
            SecretSource::Env(var) => format!("the environment variable {var}"),
            SecretSource::File(path) => path.clone(),
        };
        // A file's trailing newline is no part of a token.
        http = http.secret_header(&h.name, value.trim()).map_err(|_| SpecJobError {
            key: h.key(),
            message: format!("the value in {from} holds a line break, a control character or non-ASCII"),
        })?;
    }
    if let Some(ca) = &work.ca_file {
        http = http.ca_file(ca).map_err(|e| SpecJobError { key: "http.ca_file".into(), message: e.why })?;
    }
    Ok(http)
}

/// The request of a checked `http` without its secret headers and CA file: its URL,
/// method, plain headers, body and expected statuses.
///
/// ```
/// let checked = solocron::spec::check_definition("sync", r#"{"schedule": "@hourly", "http": {"url": "https://x.example/run", "method": "put"}}"#)?;
/// let solocron::spec::Work::Http(work) = &checked.work else { unreachable!() };
/// let request = solocron::spec::request(work)?;
/// assert!(request.fingerprint().starts_with("http PUT https://x.example/run"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn request(work: &HttpWork) -> Result<HttpJob, SpecJobError> {
    // The checker applied these very rules (solocron-spec's http.rs): a refusal here is
    // the two drifting apart, said at the key as the checker would.
    let at = |e: HttpJobError| SpecJobError { key: format!("http.{}", e.field), message: e.why };
    let mut http = HttpJob::new(&work.url).map_err(at)?;
    if let Some(m) = &work.method {
        http = http.method(m).map_err(at)?;
    }
    for (name, value) in &work.headers {
        http = http
            .header(name, value)
            .map_err(|e| SpecJobError { key: format!("http.headers.{name}"), message: e.why })?;
    }
    if let Some(b) = &work.body {
        http = http.body(b.as_bytes());
    }
    if let Some(s) = &work.expect_status {
        http = http.expect_status(s).map_err(at)?;
    }
    Ok(http)
}

/// A secret's value from where `source` says: its environment variable, or its file.
/// Errors name the variable or file, never a value.
pub fn read_secret(source: &SecretSource) -> Result<String, String> {
    match source {
        SecretSource::Env(var) => std::env::var(var).map_err(|_| format!("the environment variable {var} is not set")),
        SecretSource::File(path) => std::fs::read_to_string(path).map_err(|e| format!("cannot read {path}: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use solocron_spec::HttpSpec;

    use super::*;

    /// The checker's HTTP rules (solocron-spec, without the client) and the HTTP job's
    /// builder accept and refuse the same parts, in the same words.
    #[test]
    fn the_spec_checker_and_the_http_job_agree_on_every_part() {
        let urls = [
            "https://x.example/a",
            "http://h:8080",
            "ftp://x",
            "localhost:8080/x",
            "https://ops:pw@",
            "http://",
            "https://[::1]:9/",
            "http://a b/",
        ];
        let methods = ["GET", "post", "P T", "", "GÉT", "PURGE", "M!#$%&'*+-.^_`|~9"];
        let headers = [
            ("Content-Type", "application/json"),
            ("Bad Name", "x"),
            ("Idempotency-Key", "x"),
            ("solocron-job", "x"),
            ("Content-Length", "3"),
            ("X-Note", "a\nb"),
            ("X-Note", "tab\tand é"),
            ("X-Ünï", "x"),
            ("", "x"),
        ];
        let statuses = ["2xx", "200-299", "2xx,abc", "299-200", "600", "20", "2xx, 304"];
        let mut specs = Vec::new();
        for url in urls {
            specs.push(HttpSpec { url: Some(url.into()), ..HttpSpec::default() });
        }
        let base = || HttpSpec { url: Some("https://x.example/a".into()), ..HttpSpec::default() };
        for m in methods {
            specs.push(HttpSpec { method: Some(m.into()), ..base() });
        }
        for (n, v) in headers {
            specs.push(HttpSpec { headers: Some([(n.to_owned(), v.to_owned())].into()), ..base() });
            specs.push(HttpSpec { headers_env: Some([(n.to_owned(), "VAR".to_owned())].into()), ..base() });
        }
        for s in statuses {
            specs.push(HttpSpec { expect_status: Some(s.into()), ..base() });
        }
        for spec in specs {
            let checked = spec.check();
            let built = built(&spec);
            match (&checked, &built) {
                (Ok(work), Ok(())) => assert!(request(work).is_ok(), "{spec:?}"),
                (Err(e), Err(b)) => assert_eq!((&e.key, &e.message), (&b.key, &b.message), "{spec:?}"),
                _ => panic!("{spec:?}: the checker says {checked:?}, the HTTP job {built:?}"),
            }
        }
    }

    /// `spec` built by the HTTP job's own builder, in the checker's order, errors at the
    /// checker's keys.
    fn built(spec: &HttpSpec) -> Result<(), SpecJobError> {
        let at = |e: HttpJobError| SpecJobError { key: format!("http.{}", e.field), message: e.why };
        let mut http = HttpJob::new(spec.url.as_deref().unwrap_or_default()).map_err(at)?;
        if let Some(m) = &spec.method {
            http = http.method(m).map_err(at)?;
        }
        for (name, value) in spec.headers.iter().flatten() {
            let key = format!("http.headers.{name}");
            http = http.header(name, value).map_err(|e| SpecJobError { key, message: e.why })?;
        }
        if let Some(s) = &spec.expect_status {
            http = http.expect_status(s).map_err(at)?;
        }
        for name in spec.headers_env.iter().flat_map(|m| m.keys()) {
            let key = format!("http.headers_env.{name}");
            http.clone().secret_header(name, "").map_err(|e| SpecJobError { key, message: e.why })?;
        }
        Ok(())
    }

    #[test]
    fn a_secret_that_is_no_header_value_is_refused_naming_where_it_was_never_what() {
        let checked = check_definition(
            "sync",
            r#"{"schedule": "@hourly", "http": {"url": "https://x.example/", "headers_file": {"X-Key": "/run/key"}}}"#,
        )
        .unwrap();
        let e = job(&checked, &|_| Ok("line\nbreak".to_owned())).unwrap_err();
        assert_eq!(e.key, "http.headers_file.X-Key");
        assert_eq!(e.message, "the value in /run/key holds a line break, a control character or non-ASCII");
        let trimmed = job(&checked, &|_| Ok("token\n".to_owned()));
        assert!(trimmed.is_ok(), "a file's trailing newline is no part of it");
        let e = read_secret(&SecretSource::Env("SOLOCRON_SPEC_TEST_UNSET".into())).unwrap_err();
        assert_eq!(e, "the environment variable SOLOCRON_SPEC_TEST_UNSET is not set");
    }
}
