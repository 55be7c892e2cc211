//! HTTP jobs: a run is one request to the business service's own endpoint, carrying the
//! run's facts as headers so the service can fence its writes, judged by the status.
//!
//! Here: the job, its request and how its response is judged and kept. `status.rs`: which
//! statuses count as success. `tls.rs`: the TLS client (rustls, the system's roots plus a
//! job's CA file), shared by the process.

mod status;
mod tls;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::SecondsFormat;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use reqwest::{Method, Url};
use rustls::pki_types::CertificateDer;
use solocron_core::{redact_url, OUTPUT_TAIL_BYTES_MAX};

use crate::job::{Handler, Outcome, RunContext};
pub use status::ExpectStatus;
use tls::{client_for, read_ca_file};

/// Most bytes of a response body read: past it the rest is left unread and the connection
/// dropped, so a runaway endpoint costs a bounded time and memory; the record keeps the tail
/// of what was read.
pub const RESPONSE_READ_BYTES_MAX: usize = 1024 * 1024;

/// The headers every request carries, set from the run's facts; a job cannot set them.
const FACT_HEADERS: [&str; 7] = [
    "solocron-job",
    "solocron-scheduled-at",
    "solocron-fencing-token",
    "solocron-node-id",
    "solocron-run-id",
    "solocron-attempt",
    "idempotency-key",
];

/// A bad part of an HTTP job: which part (`url`, `method`, `headers`, `expect_status`,
/// `ca_file`) and why. Never holds a secret header's value or a URL's password.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {why}")]
pub struct HttpJobError {
    /// The part: the name of the builder method, and of the configuration key.
    pub field: &'static str,
    /// What is wrong, in words the user can act on.
    pub why: String,
}

fn bad(field: &'static str, why: impl Into<String>) -> HttpJobError {
    HttpJobError { field, why: why.into() }
}

/// A [`Handler`] that calls an HTTP endpoint: the business service's own, which does the
/// job's work.
///
/// Every request carries the run's facts: `Solocron-Job`, `Solocron-Scheduled-At` (RFC 3339,
/// milliseconds, UTC), `Solocron-Fencing-Token`, `Solocron-Node-Id`, `Solocron-Run-Id`,
/// `Solocron-Attempt`, and `Idempotency-Key`: the tick, `job@instant`, the same for every
/// attempt of a tick and different for every tick. The run succeeds when the status is in
/// [`ExpectStatus`] (default `2xx`); its record's exit code is the status and its output is
/// `HTTP <status>` then the tail of the body (at most [`RESPONSE_READ_BYTES_MAX`] is read).
/// Redirects are not followed (a 3xx is a status like any other), so secret headers go to
/// the configured host only. A lost lease, the job's timeout or shutdown drop the request,
/// closing its connection; no connection is kept between runs.
///
/// ```
/// use std::time::Duration;
/// let job = solocron::HttpJob::new("https://billing.internal/jobs/invoices")?
///     .method("POST")?
///     .header("Content-Type", "application/json")?
///     .secret_header("Authorization", "Bearer s3cret")?
///     .body(r#"{"batch": 500}"#)
///     .timeout(Duration::from_secs(30))
///     .expect_status("2xx,409")?;
/// assert!(!format!("{job:?}").contains("s3cret"));
/// # Ok::<(), solocron::HttpJobError>(())
/// ```
#[derive(Clone)]
pub struct HttpJob {
    url: Url,
    method: Method,
    /// The configured headers, secret ones marked sensitive.
    headers: HeaderMap,
    /// Names of the secret headers: they enter the fingerprint, their values never do.
    secret_names: Vec<String>,
    body: Option<Vec<u8>>,
    timeout: Option<Duration>,
    expect: ExpectStatus,
    ca: Option<CaFile>,
    /// The URL's path and query are a secret (a Slack webhook's are): shown as `…`.
    secret_path: bool,
}

/// A CA file's path and the certificates read from it.
#[derive(Clone)]
struct CaFile {
    path: PathBuf,
    certs: Arc<Vec<CertificateDer<'static>>>,
}

impl std::fmt::Debug for HttpJob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Header names only: a plain header's value may still be something a user would
        // rather not see in a panic message.
        let names: Vec<&str> = self.headers.keys().map(HeaderName::as_str).collect();
        f.debug_struct("HttpJob")
            .field("method", &self.method.as_str())
            .field("url", &self.shown_url())
            .field("headers", &names)
            .field("timeout", &self.timeout)
            .field("expect_status", &self.expect.to_string())
            .field("ca_file", &self.ca.as_ref().map(|c| c.path.display().to_string()))
            .finish_non_exhaustive()
    }
}

impl HttpJob {
    /// A `POST` to `url` (`http://` or `https://`), with no body, expecting `2xx`.
    pub fn new(url: &str) -> Result<HttpJob, HttpJobError> {
        let shown = redact_url(url);
        let parsed = Url::parse(url).map_err(|e| bad("url", format!("`{shown}` is not a URL: {e}")))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(bad("url", format!("`{shown}` must start with http:// or https://")));
        }
        if parsed.host_str().is_none_or(str::is_empty) {
            return Err(bad("url", format!("`{shown}` has no host")));
        }
        Ok(HttpJob {
            url: parsed,
            method: Method::POST,
            headers: HeaderMap::new(),
            secret_names: Vec::new(),
            body: None,
            timeout: None,
            expect: ExpectStatus::default(),
            ca: None,
            secret_path: false,
        })
    }

    /// The method (`GET`, `POST`, `PUT`, ...), sent in upper case: methods are
    /// case-sensitive and a server would refuse `post`.
    pub fn method(mut self, method: &str) -> Result<HttpJob, HttpJobError> {
        let shown: String = method.chars().take(40).collect();
        self.method = Method::from_bytes(method.to_ascii_uppercase().as_bytes())
            .ok()
            .filter(|_| !method.is_empty())
            .ok_or_else(|| bad("method", format!("`{shown}` is not an HTTP method, such as GET or POST")))?;
        Ok(self)
    }

    /// Adds a header. The run's facts (`Solocron-*`, `Idempotency-Key`) are set by the job
    /// and cannot be.
    pub fn header(mut self, name: &str, value: &str) -> Result<HttpJob, HttpJobError> {
        let name = header_name(name)?;
        let value = HeaderValue::from_str(value)
            .map_err(|_| bad("headers", format!("the value of `{name}` holds a line break or a control character")))?;
        self.headers.append(name, value);
        Ok(self)
    }

    /// Adds a header whose value is a secret (a token): it is never printed or logged, and
    /// not part of the job's fingerprint, so changing it is not drift.
    pub fn secret_header(mut self, name: &str, value: &str) -> Result<HttpJob, HttpJobError> {
        let name = header_name(name)?;
        let mut value = HeaderValue::from_str(value).map_err(|_| {
            bad("headers", format!("the secret value of `{name}` holds a line break, a control character or non-ASCII"))
        })?;
        value.set_sensitive(true);
        self.secret_names.push(name.as_str().to_owned());
        self.headers.append(name, value);
        Ok(self)
    }

    /// The request body, sent as is (set `Content-Type` with [`HttpJob::header`]).
    pub fn body(mut self, body: impl Into<Vec<u8>>) -> HttpJob {
        self.body = Some(body.into());
        self
    }

    /// This request with `body` as its JSON body (`Content-Type: application/json`, in place
    /// of any configured): an alert's delivery (`alerts/deliver.rs`).
    pub(crate) fn with_json(mut self, body: Vec<u8>) -> HttpJob {
        self.headers.insert(reqwest::header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        self.body = Some(body);
        self
    }

    /// This request with its URL's path and query kept out of every record, log and error
    /// (an alert's webhook: a Slack one carries its secret there).
    pub(crate) fn with_secret_path(mut self) -> HttpJob {
        self.secret_path = true;
        self
    }

    /// The URL as records and logs show it: without its password, and without its path and
    /// query when they are a secret.
    fn shown_url(&self) -> String {
        if !self.secret_path {
            return redact_url(self.url.as_str());
        }
        let port = self.url.port().map(|p| format!(":{p}")).unwrap_or_default();
        format!("{}://{}{port}/…", self.url.scheme(), self.url.host_str().unwrap_or_default())
    }

    /// Whether a timeout is set ([`HttpJob::timeout`]).
    pub(crate) fn has_timeout(&self) -> bool {
        self.timeout.is_some()
    }

    /// The longest a request may take, from connecting to the body's end; past it the run
    /// fails. The job's own timeout (its policy) instead ends it `timed_out`.
    pub fn timeout(mut self, timeout: Duration) -> HttpJob {
        self.timeout = Some(timeout);
        self
    }

    /// The statuses that count as success; see [`ExpectStatus`].
    pub fn expect_status(mut self, expect: &str) -> Result<HttpJob, HttpJobError> {
        self.expect = expect.parse().map_err(|why| bad("expect_status", why))?;
        Ok(self)
    }

    /// Trusts the PEM certificates in `path` as roots, besides the system's (a private CA).
    pub fn ca_file(mut self, path: impl AsRef<Path>) -> Result<HttpJob, HttpJobError> {
        let path = path.as_ref();
        let certs = read_ca_file(path).map_err(|why| bad("ca_file", format!("{}: {why}", path.display())))?;
        self.ca = Some(CaFile { path: path.to_owned(), certs: Arc::new(certs) });
        Ok(self)
    }

    /// What the job calls, for [`crate::Job::with_fingerprint`]: method, URL (password
    /// masked), headers (secret ones by name only), a digest of the body, the timeout, the
    /// expected statuses and the CA file's path and certificates' digest.
    pub fn fingerprint(&self) -> String {
        let mut plain: Vec<String> = Vec::new();
        for (name, value) in &self.headers {
            if !value.is_sensitive() {
                plain.push(format!("{name}: {}", String::from_utf8_lossy(value.as_bytes())));
            }
        }
        let ca = self.ca.as_ref().map(|c| {
            let ders: Vec<&[u8]> = c.certs.iter().map(|d| d.as_ref()).collect();
            format!("{} {}", c.path.display(), digest(&ders))
        });
        format!(
            "http {} {} headers {plain:?} secret headers {:?} body {} timeout {:?} expect {} ca {ca:?}",
            self.method,
            redact_url(self.url.as_str()),
            self.secret_names,
            self.body.as_deref().map_or("none".to_owned(), |b| digest(&[b])),
            self.timeout,
            self.expect,
        )
    }

    /// One request, start to judged end: the status, the body's tail, or why there is none.
    async fn call(&self, ctx: &RunContext) -> Outcome {
        let client = match client_for(self.ca.as_ref().map_or(&[][..], |c| &c.certs[..])) {
            Ok(c) => c,
            Err(e) => return failed(format!("cannot set up the HTTP client: {e}")),
        };
        let mut request = client.request(self.method.clone(), self.url.clone()).headers(self.headers.clone());
        request = request.headers(facts(ctx));
        if let Some(body) = &self.body {
            request = request.body(body.clone());
        }
        let exchange = async {
            let response = request.send().await.map_err(|e| self.unreachable(e))?;
            let status = response.status().as_u16();
            let (tail, note) = read_tail(response).await;
            Ok::<_, String>(self.judged(status, &tail, note.as_deref()))
        };
        let result = match self.timeout {
            Some(t) => tokio::time::timeout(t, exchange).await.unwrap_or_else(|_| {
                Err(format!(
                    "no complete response within {} (the request's timeout)",
                    solocron_core::format_duration(t)
                ))
            }),
            None => exchange.await,
        };
        result.unwrap_or_else(failed)
    }

    /// A request that got no response, said without the URL's password.
    fn unreachable(&self, e: reqwest::Error) -> String {
        let e = e.without_url();
        let mut why = format!("{} {} failed: {e}", self.method, self.shown_url());
        let mut source = std::error::Error::source(&e);
        while let Some(s) = source {
            why.push_str(": ");
            why.push_str(&s.to_string());
            source = s.source();
        }
        why
    }

    /// The outcome of a response: success if its status is expected.
    fn judged(&self, status: u16, body: &[u8], note: Option<&str>) -> Outcome {
        let success = self.expect.matches(status);
        Outcome {
            success,
            exit_code: Some(i32::from(status)),
            output: output(status, body, note),
            reason: (!success).then(|| format!("HTTP status {status} is not in expect_status {}", self.expect)),
        }
    }
}

#[async_trait]
impl Handler for HttpJob {
    async fn run(&self, ctx: RunContext) -> Outcome {
        // Dropping the request closes its connection (none is pooled): the service sees the
        // caller go, and the engine records the run lost, timed out or interrupted.
        tokio::select! {
            biased;
            _ = ctx.cancel.cancelled() => Outcome {
                output: "request aborted: the run was stopped".to_owned(),
                ..Outcome::default()
            },
            outcome = self.call(&ctx) => outcome,
        }
    }
}

/// A failed outcome with no response: `why` is its reason and its output.
fn failed(why: String) -> Outcome {
    Outcome { success: false, exit_code: None, output: why.clone(), reason: Some(why) }
}

/// A header name a job may set.
fn header_name(name: &str) -> Result<HeaderName, HttpJobError> {
    let shown: String = name.chars().take(60).collect();
    let parsed = HeaderName::from_bytes(name.as_bytes())
        .map_err(|_| bad("headers", format!("`{shown}` is not a header name (letters, digits and -)")))?;
    // All of `Solocron-*`, so a fact added later cannot meet a job's header of its name.
    if parsed.as_str().starts_with("solocron-") || FACT_HEADERS.contains(&parsed.as_str()) {
        return Err(bad("headers", format!("`{shown}` is set by solocron on every request, from the run")));
    }
    if matches!(parsed.as_str(), "content-length" | "transfer-encoding") {
        return Err(bad("headers", format!("`{shown}` is set from the body")));
    }
    Ok(parsed)
}

/// The run's facts as headers, the same facts a command job gets as `SOLOCRON_*`.
fn facts(ctx: &RunContext) -> HeaderMap {
    let at = ctx.scheduled_at.to_rfc3339_opts(SecondsFormat::Millis, true);
    let values = [
        ctx.job.clone(),
        at.clone(),
        ctx.fencing_token.to_string(),
        ctx.node_id.clone(),
        ctx.run_id.clone(),
        ctx.attempt.to_string(),
        format!("{}@{at}", ctx.job),
    ];
    let mut headers = HeaderMap::with_capacity(FACT_HEADERS.len());
    for (name, value) in FACT_HEADERS.iter().zip(values) {
        // Job names and node ids hold no control character (checked where they are made);
        // other UTF-8 is sent as its bytes.
        match HeaderValue::from_bytes(value.as_bytes()) {
            Ok(v) => {
                headers.insert(HeaderName::from_static(name), v);
            }
            Err(_) => debug_assert!(false, "{name} holds a control character"),
        }
    }
    headers
}

/// Reads the body up to [`RESPONSE_READ_BYTES_MAX`], keeping its tail; the note says why the
/// read stopped early, if it did.
async fn read_tail(mut response: reqwest::Response) -> (Vec<u8>, Option<String>) {
    let mut tail: Vec<u8> = Vec::new();
    let mut read = 0usize;
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                read += chunk.len();
                tail.extend_from_slice(&chunk);
                if tail.len() > 2 * OUTPUT_TAIL_BYTES_MAX {
                    tail.drain(..tail.len() - OUTPUT_TAIL_BYTES_MAX);
                }
                if read >= RESPONSE_READ_BYTES_MAX {
                    let kib = RESPONSE_READ_BYTES_MAX / 1024;
                    return (tail, Some(format!("[body longer than {kib} KiB: the rest was not read]")));
                }
            }
            Ok(None) => return (tail, None),
            Err(e) => return (tail, Some(format!("[body broken off: {}]", e.without_url()))),
        }
    }
}

/// `HTTP <status>`, then the body's tail and the note, within `OUTPUT_TAIL_BYTES_MAX` (the
/// status line is never the part cut).
fn output(status: u16, body: &[u8], note: Option<&str>) -> String {
    let head = format!("HTTP {status}");
    let note = note.map(|n| format!("\n{n}")).unwrap_or_default();
    if body.is_empty() && note.is_empty() {
        return head;
    }
    let budget = OUTPUT_TAIL_BYTES_MAX.saturating_sub(head.len() + 1 + note.len());
    let text = String::from_utf8_lossy(&body[body.len().saturating_sub(budget)..]);
    let mut start = text.len().saturating_sub(budget);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    let out = format!("{head}\n{}{note}", &text[start..]);
    debug_assert!(out.len() <= OUTPUT_TAIL_BYTES_MAX);
    out
}

/// A short digest of byte strings, for fingerprints.
fn digest(parts: &[&[u8]]) -> String {
    use sha2::Digest as _;
    let mut h = sha2::Sha256::new();
    for p in parts {
        h.update((p.len() as u64).to_le_bytes());
        h.update(p);
    }
    h.finalize().iter().take(8).map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_output_keeps_the_status_line_and_the_bodys_tail_within_the_bound() {
        assert_eq!(output(204, b"", None), "HTTP 204");
        assert_eq!(output(200, b"ok\n", None), "HTTP 200\nok\n");
        let body = "é".repeat(OUTPUT_TAIL_BYTES_MAX) + "end";
        let note = "[body longer than 1024 KiB: the rest was not read]";
        let out = output(500, body.as_bytes(), Some(note));
        assert!(out.starts_with("HTTP 500\né") && out.ends_with(&format!("éend\n{note}")), "{out}");
        assert!(out.len() <= OUTPUT_TAIL_BYTES_MAX && out.len() > OUTPUT_TAIL_BYTES_MAX - 4);
        // The tail starts inside an `é` (an odd budget over 2-byte characters): the broken
        // half is dropped, not shown as U+FFFD.
        let out = output(200, "é".repeat(OUTPUT_TAIL_BYTES_MAX).as_bytes(), None);
        assert!((OUTPUT_TAIL_BYTES_MAX - "HTTP 200\n".len()) % 2 == 1, "the case needs an odd budget");
        assert!(!out.contains('\u{FFFD}') && out.len() <= OUTPUT_TAIL_BYTES_MAX, "{out}");
    }
}
