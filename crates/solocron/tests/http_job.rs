//! HTTP jobs against real local servers (axum, and a TLS server with a CA made here), run
//! by a real scheduler over a SQLite file: the headers a service fences with, what the
//! record keeps, and how a stop aborts the request.
#![forbid(unsafe_code)]

use solocron_core::SchemaStore;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use axum::Router;
use chrono::{SecondsFormat, Utc};
use solocron::{HttpJob, Job, Scheduler};
use solocron_core::{
    ClaimMode, ClaimOutcome, ClaimRequest, HistoryQuery, JobPolicy, OnCrash, RunRecord, RunState, Schedule, Store,
    Tick, Trigger, OUTPUT_TAIL_BYTES_MAX,
};
use solocron_sqlite::SqliteStore;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// What the test server saw: each request's headers and body, and each request dropped
/// before its handler finished (the client went away).
#[derive(Clone, Default)]
struct Seen {
    requests: Arc<Mutex<Vec<(HeaderMap, String)>>>,
    dropped: Arc<Mutex<Option<mpsc::UnboundedSender<Instant>>>>,
}

/// Sends the instant it is dropped, unless the handler finished.
struct DropWatch(Option<mpsc::UnboundedSender<Instant>>);

impl Drop for DropWatch {
    fn drop(&mut self) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(Instant::now());
        }
    }
}

async fn record(State(seen): State<Seen>, headers: HeaderMap, body: String) -> (StatusCode, String) {
    seen.requests.lock().unwrap().push((headers, body));
    (StatusCode::OK, "invoices sent: 12\n".to_owned())
}

async fn down(State(seen): State<Seen>, headers: HeaderMap) -> (StatusCode, String) {
    seen.requests.lock().unwrap().push((headers, String::new()));
    (StatusCode::SERVICE_UNAVAILABLE, format!("{}\ndown for maintenance", "x".repeat(10_000)))
}

async fn slow(State(seen): State<Seen>, headers: HeaderMap) -> &'static str {
    seen.requests.lock().unwrap().push((headers, String::new()));
    let mut watch = DropWatch(seen.dropped.lock().unwrap().clone());
    tokio::time::sleep(Duration::from_secs(60)).await;
    watch.0 = None;
    "too late"
}

/// An endless body: the job must stop reading after RESPONSE_READ_BYTES_MAX.
async fn endless() -> axum::body::Body {
    let chunk = axum::body::Bytes::from(vec![b'y'; 64 * 1024]);
    axum::body::Body::from_stream(futures_util::stream::repeat_with(move || Ok::<_, std::io::Error>(chunk.clone())))
}

/// A server on a free local port; its base URL.
async fn server(seen: Seen) -> String {
    let app = Router::new()
        .route("/ok", post(record).put(record))
        .route("/down", post(down))
        .route("/slow", post(slow))
        .route("/endless", get(endless))
        .with_state(seen);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

async fn store(dir: &tempfile::TempDir) -> Arc<dyn Store> {
    let url = format!("sqlite://{}/s.db", dir.path().display());
    let s = SqliteStore::connect(&url, &solocron::Prefix::default()).await.unwrap();
    s.migrate().await.unwrap();
    Arc::new(s)
}

/// A job that never fires by its schedule in a test: runs come from `run_here`.
fn job(name: &str, http: HttpJob, policy: JobPolicy) -> Job {
    let fingerprint = http.fingerprint();
    Job::new(name, Schedule::parse("0 0 0 1 1 *", "UTC").unwrap(), http)
        .with_policy(policy)
        .with_fingerprint(fingerprint)
}

/// One manual run of `job`, in a scheduler of its own; its record.
async fn run_once(st: Arc<dyn Store>, job: Job, interrupt: CancellationToken) -> RunRecord {
    let name = job.name().to_owned();
    let s = Scheduler::builder(st).node_id("n1").job(job).build().unwrap();
    s.run_here(&name, "test", interrupt).await.unwrap().expect("ran here")
}

fn header<'a>(h: &'a HeaderMap, name: &str) -> &'a str {
    h.get(name).unwrap_or_else(|| panic!("no {name} header in {h:?}")).to_str().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_carries_the_runs_facts_and_the_record_keeps_status_and_body() {
    let dir = tempfile::tempdir().unwrap();
    let seen = Seen::default();
    let base = server(seen.clone()).await;
    let http = HttpJob::new(&format!("{base}/ok"))
        .unwrap()
        .method("PUT")
        .unwrap()
        .header("Content-Type", "application/json")
        .unwrap()
        .secret_header("Authorization", "Bearer s3cret-token")
        .unwrap()
        .body(r#"{"batch":500}"#);
    let rec = run_once(store(&dir).await, job("invoices", http, JobPolicy::default()), CancellationToken::new()).await;
    assert_eq!(rec.state, RunState::Succeeded, "{rec:#?}");
    assert_eq!(rec.exit_code, Some(200), "the exit code is the status");
    assert_eq!(rec.output, "HTTP 200\ninvoices sent: 12\n");
    let requests = seen.requests.lock().unwrap().clone();
    let [(h, body)] = requests.as_slice() else { panic!("{} requests", requests.len()) };
    let at = rec.id.tick.scheduled_at.to_rfc3339_opts(SecondsFormat::Millis, true);
    assert_eq!(header(h, "solocron-job"), "invoices");
    assert_eq!(header(h, "solocron-scheduled-at"), at);
    assert_eq!(header(h, "solocron-fencing-token"), rec.fencing_token.unwrap().to_string());
    assert_eq!(header(h, "solocron-run-id"), rec.id.to_string());
    assert_eq!(header(h, "solocron-attempt"), "1");
    assert_eq!(header(h, "solocron-node-id"), "n1");
    assert_eq!(header(h, "idempotency-key"), format!("invoices@{at}"), "the tick, not the attempt");
    assert_eq!(header(h, "authorization"), "Bearer s3cret-token");
    assert_eq!(header(h, "content-type"), "application/json");
    assert_eq!(body, r#"{"batch":500}"#);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_outside_expect_status_fails_the_run_naming_it_with_the_body_tail() {
    let dir = tempfile::tempdir().unwrap();
    let st = store(&dir).await;
    let base = server(Seen::default()).await;
    let http = HttpJob::new(&format!("{base}/down")).unwrap();
    let rec = run_once(st.clone(), job("report", http, JobPolicy::default()), CancellationToken::new()).await;
    assert_eq!(rec.state, RunState::Failed, "{rec:#?}");
    assert_eq!(rec.exit_code, Some(503));
    assert_eq!(rec.reason.as_deref(), Some("HTTP status 503 is not in expect_status 2xx"));
    assert!(rec.output.starts_with("HTTP 503\nxxx"), "the status line survives the cut: {:?}", &rec.output[..20]);
    assert!(rec.output.ends_with("\ndown for maintenance"));
    assert!(rec.output.len() <= OUTPUT_TAIL_BYTES_MAX);
    // The same status, expected: success.
    let http = HttpJob::new(&format!("{base}/down")).unwrap().expect_status("2xx, 503").unwrap();
    let rec = run_once(st, job("report2", http, JobPolicy::default()), CancellationToken::new()).await;
    assert_eq!((rec.state, rec.exit_code), (RunState::Succeeded, Some(503)), "{rec:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_jobs_timeout_the_request_is_aborted_and_the_run_recorded_timed_out() {
    let dir = tempfile::tempdir().unwrap();
    let seen = Seen::default();
    let (tx, mut dropped) = mpsc::unbounded_channel();
    *seen.dropped.lock().unwrap() = Some(tx);
    let base = server(seen.clone()).await;
    let policy = JobPolicy { timeout: Some(Duration::from_millis(500)), ..JobPolicy::default() };
    let http = HttpJob::new(&format!("{base}/slow")).unwrap();
    let started = Instant::now();
    let rec = run_once(store(&dir).await, job("slow", http, policy), CancellationToken::new()).await;
    assert_eq!(rec.state, RunState::TimedOut, "{rec:#?}");
    assert!(rec.output.contains("request aborted"), "{rec:#?}");
    let at = tokio::time::timeout(Duration::from_secs(5), dropped.recv()).await.expect("the server saw the client go");
    let after = at.unwrap() - started;
    assert!(after < Duration::from_secs(3), "the connection closed {after:?} after the start, not at the timeout");
    assert_eq!(seen.requests.lock().unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_aborts_the_request_and_the_run_is_recorded_interrupted() {
    let dir = tempfile::tempdir().unwrap();
    let seen = Seen::default();
    let (tx, mut dropped) = mpsc::unbounded_channel();
    *seen.dropped.lock().unwrap() = Some(tx);
    let base = server(seen.clone()).await;
    let interrupt = CancellationToken::new();
    let stop = interrupt.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(500)).await;
        stop.cancel();
    });
    let http = HttpJob::new(&format!("{base}/slow")).unwrap();
    let rec = run_once(store(&dir).await, job("slow", http, JobPolicy::default()), interrupt).await;
    assert_eq!(rec.state, RunState::Interrupted, "{rec:#?}");
    tokio::time::timeout(Duration::from_secs(5), dropped.recv()).await.expect("the server saw the client go");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_body_is_read_up_to_its_bound_and_the_run_still_ends() {
    let dir = tempfile::tempdir().unwrap();
    let base = server(Seen::default()).await;
    let http = HttpJob::new(&format!("{base}/endless")).unwrap().method("GET").unwrap();
    let started = Instant::now();
    let rec = run_once(store(&dir).await, job("endless", http, JobPolicy::default()), CancellationToken::new()).await;
    assert_eq!(rec.state, RunState::Succeeded, "{rec:#?}");
    assert!(rec.output.starts_with("HTTP 200\nyyyy"), "{:?}", &rec.output[..20]);
    assert!(rec.output.ends_with("y\n[body longer than 1024 KiB: the rest was not read]"), "{:?}", &rec.output[4000..]);
    assert!(rec.output.len() <= OUTPUT_TAIL_BYTES_MAX);
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_endpoint_fails_with_a_reason_that_hides_the_urls_password() {
    let dir = tempfile::tempdir().unwrap();
    // A port nobody listens on: bound, then closed.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let http = HttpJob::new(&format!("http://ops:hunter2@127.0.0.1:{port}/run")).unwrap();
    let fingerprint = http.fingerprint();
    assert!(!fingerprint.contains("hunter2") && !format!("{http:?}").contains("hunter2"));
    let rec = run_once(store(&dir).await, job("gone", http, JobPolicy::default()), CancellationToken::new()).await;
    assert_eq!(rec.state, RunState::Failed, "{rec:#?}");
    assert_eq!(rec.exit_code, None);
    let reason = rec.reason.clone().expect("a reason");
    assert!(reason.starts_with(&format!("POST http://ops:***@127.0.0.1:{port}/run failed: ")), "{reason}");
    assert!(reason.to_lowercase().contains("connect"), "{reason}");
    assert!(!format!("{rec:?}").contains("hunter2"), "{rec:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_retry_sends_the_same_idempotency_key_with_the_next_attempt_and_a_larger_token() {
    let dir = tempfile::tempdir().unwrap();
    let st = store(&dir).await;
    let seen = Seen::default();
    let base = server(seen.clone()).await;
    // Attempt 1, claimed by a node that then died: its lease lapses unrenewed.
    let tick = Tick::new("retried", Utc::now() - chrono::Duration::seconds(2));
    let request = ClaimRequest {
        tick: tick.clone(),
        trigger: Trigger::Schedule,
        node: "died".into(),
        lease: Duration::from_millis(500),
        mode: ClaimMode::Run { skip_if_running: false },
        nonce: 0,
    };
    let outcomes = st.claim(&[request]).await.unwrap();
    let [ClaimOutcome::Won(first)] = outcomes.as_slice() else { panic!("{outcomes:?}") };
    let policy = JobPolicy { on_crash: OnCrash::Retry, max_attempts: 3, ..JobPolicy::default() };
    let http = HttpJob::new(&format!("{base}/ok")).unwrap();
    let s = Scheduler::builder(st.clone())
        .node_id("n2")
        .recovery_interval(Duration::from_millis(200))
        .job(job("retried", http, policy))
        .build()
        .unwrap();
    let shutdown = CancellationToken::new();
    let node = tokio::spawn(s.run(shutdown.clone()));
    let deadline = Instant::now() + Duration::from_secs(10);
    while seen.requests.lock().unwrap().is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    shutdown.cancel();
    node.await.unwrap();
    let requests = seen.requests.lock().unwrap().clone();
    let [(h, _)] = requests.as_slice() else { panic!("{} requests", requests.len()) };
    let at = tick.scheduled_at.to_rfc3339_opts(SecondsFormat::Millis, true);
    assert_eq!(header(h, "solocron-attempt"), "2");
    assert_eq!(header(h, "solocron-run-id"), format!("retried@{at}#2"));
    assert_eq!(header(h, "idempotency-key"), format!("retried@{at}"), "attempt 1 had this key too");
    let token: u64 = header(h, "solocron-fencing-token").parse().unwrap();
    assert!(token > first.fencing_token, "the retry's token {token} is above attempt 1's {}", first.fencing_token);
    let history = st.history(&HistoryQuery { job: Some("retried".into()), ..HistoryQuery::default() }).await.unwrap();
    let second = history.iter().find(|r| r.id.attempt == 2).expect("attempt 2 recorded");
    assert_eq!((second.state, second.fencing_token), (RunState::Succeeded, Some(token)), "{history:#?}");
}

/// A CA and a certificate it signed for 127.0.0.1; (CA PEM, server TLS config).
fn private_ca() -> (String, Arc<rustls::ServerConfig>) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = rcgen::CertifiedIssuer::self_signed(ca_params, ca_key).unwrap();
    let leaf_key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()]).unwrap().signed_by(&leaf_key, &ca).unwrap();
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(leaf_key.serialize_der().into());
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![leaf.der().clone()], key)
        .unwrap();
    (ca.pem(), Arc::new(config))
}

/// An HTTPS server answering every request `204`; its URL.
async fn tls_server(config: Arc<rustls::ServerConfig>) -> String {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else { return };
                let mut buf = Vec::new();
                let mut chunk = [0u8; 1024];
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                    match tls.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                let _ = tls.write_all(b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n").await;
                let _ = tls.shutdown().await;
            });
        }
    });
    format!("https://{addr}/tls")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_endpoint_signed_by_a_private_ca_is_trusted_only_with_its_ca_file() {
    let dir = tempfile::tempdir().unwrap();
    let st = store(&dir).await;
    let (ca_pem, config) = private_ca();
    let url = tls_server(config).await;
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, ca_pem).unwrap();
    let trusted = HttpJob::new(&url).unwrap().ca_file(&ca_file).unwrap();
    let rec = run_once(st.clone(), job("tls", trusted, JobPolicy::default()), CancellationToken::new()).await;
    assert_eq!(
        (rec.state, rec.exit_code, rec.output.as_str()),
        (RunState::Succeeded, Some(204), "HTTP 204"),
        "{rec:#?}"
    );
    let untrusted = HttpJob::new(&url).unwrap();
    let rec = run_once(st, job("tls2", untrusted, JobPolicy::default()), CancellationToken::new()).await;
    assert_eq!(rec.state, RunState::Failed, "{rec:#?}");
    assert!(rec.reason.as_deref().unwrap_or_default().contains("certificate"), "{rec:#?}");
}

#[test]
fn bad_parts_are_refused_naming_the_part_and_never_a_secret() {
    let ok = || HttpJob::new("https://svc.internal/run").unwrap();
    let cases = [
        (HttpJob::new("ftp://svc/x").unwrap_err(), "url", "must start with http:// or https://"),
        (HttpJob::new("https://u:pw@").unwrap_err(), "url", "u:***@"),
        (HttpJob::new("not a url").unwrap_err(), "url", "is not a URL"),
        (ok().method("GE T").unwrap_err(), "method", "`GE T` is not an HTTP method"),
        (ok().header("Bad Name", "x").unwrap_err(), "headers", "`Bad Name` is not a header name"),
        (ok().header("Idempotency-Key", "x").unwrap_err(), "headers", "set by solocron"),
        (ok().header("Solocron-Fencing-Token", "1").unwrap_err(), "headers", "set by solocron"),
        (ok().secret_header("Authorization", "Bearer a\nb").unwrap_err(), "headers", "`authorization` holds"),
        (ok().expect_status("2xx,abc").unwrap_err(), "expect_status", "`abc` is not a status"),
        (ok().expect_status("299-200").unwrap_err(), "expect_status", "write 200-299"),
        (ok().expect_status("700").unwrap_err(), "expect_status", "`700` is not a status"),
        (ok().ca_file("/nonexistent/ca.pem").unwrap_err(), "ca_file", "/nonexistent/ca.pem: cannot read"),
    ];
    for (e, field, want) in cases {
        assert_eq!(e.field, field, "{e}");
        assert!(e.why.contains(want), "expected `{want}` in: {e}");
    }
    let e = ok().secret_header("Authorization", "Bearer a\nb").unwrap_err().to_string();
    assert!(!e.contains("Bearer"), "{e}");
    let empty = tempfile::NamedTempFile::new().unwrap();
    let e = ok().ca_file(empty.path()).unwrap_err();
    assert!(e.why.ends_with("holds no certificate (-----BEGIN CERTIFICATE-----)"), "{e}");
}

#[test]
fn a_secret_headers_value_is_in_no_fingerprint_and_no_debug_output() {
    let with = |token: &str| HttpJob::new("https://svc/run").unwrap().secret_header("Authorization", token).unwrap();
    let (a, b) = (with("Bearer first-secret"), with("Bearer second-secret"));
    assert_eq!(a.fingerprint(), b.fingerprint(), "a rotated secret is no drift");
    assert!(a.fingerprint().contains("authorization"), "its name is part of the definition");
    assert!(!format!("{a:?} {}", a.fingerprint()).contains("first-secret"));
    let plain = |v: &str| HttpJob::new("https://svc/run").unwrap().header("X-Batch", v).unwrap().fingerprint();
    assert_ne!(plain("1"), plain("2"), "a plain header is part of the definition");
}
