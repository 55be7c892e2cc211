//! HTTP jobs through the real daemon on SQLite, calling a real local HTTP server (std
//! sockets and a thread per connection, started here): the run's facts as headers, the
//! record of the status and body, the timeout that closes the connection, a crash retry
//! that keeps the idempotency key, and secrets that appear nowhere but in the request.
#![forbid(unsafe_code)]

mod common;

use std::collections::HashMap;
use std::io::{BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use common::{at, read_http_request, wait_for, Fleet, Node, BIN};
use serde_json::Value;

/// What the server was asked: path, headers (names in lower case), body.
#[derive(Debug, Clone)]
struct Request {
    path: String,
    headers: HashMap<String, String>,
    body: String,
}

/// A local HTTP/1.1 server: `/ok` answers 200, `/fail` 500, `/slow` never answers (and
/// notes when the client closes), `/first-hangs` hangs its first request only.
#[derive(Clone, Default)]
struct Server {
    url: String,
    requests: Arc<Mutex<Vec<Request>>>,
    /// (path, when) of each connection the client closed while waiting for an answer.
    closed: Arc<Mutex<Vec<(String, Instant)>>>,
}

impl Server {
    fn start() -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let server = Server { url: format!("http://{}", listener.local_addr().unwrap()), ..Server::default() };
        let s = server.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().map_while(Result::ok) {
                let s = s.clone();
                std::thread::spawn(move || s.answer(stream));
            }
        });
        server
    }

    fn answer(&self, stream: TcpStream) {
        let (path, headers, body) = read_http_request(&stream);
        let mut reader = BufReader::new(stream.try_clone().unwrap());
        let first = {
            let mut requests = self.requests.lock().unwrap();
            let first = !requests.iter().any(|r| r.path == path);
            requests.push(Request { path: path.clone(), headers, body: String::from_utf8_lossy(&body).into() });
            first
        };
        let (status, text) = match path.as_str() {
            "/ok" => ("200 OK", "invoices sent: 12\n"),
            "/fail" => ("500 Internal Server Error", "boom: the ledger is locked\n"),
            "/first-hangs" if !first => ("200 OK", "done on retry\n"),
            _ => {
                // No answer: wait for the client to go (a read of 0 bytes: it closed).
                let mut rest = [0u8; 64];
                while matches!(reader.read(&mut rest), Ok(n) if n > 0) {}
                self.closed.lock().unwrap().push((path, Instant::now()));
                return;
            }
        };
        let mut out = stream;
        let response =
            format!("HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}", text.len());
        let _ = out.write_all(response.as_bytes());
    }

    fn requests(&self, path: &str) -> Vec<Request> {
        self.requests.lock().unwrap().iter().filter(|r| r.path == path).cloned().collect()
    }
}

/// Starts a node with extra environment variables (the secrets) and verbose HTTP logging,
/// so a header that leaked into any log line would be caught.
fn start(fleet: &mut Fleet, id: &str, env: &[(&str, &str)]) {
    let log = std::fs::File::create(fleet.path(&format!("{id}.log"))).unwrap();
    let child = Command::new(BIN)
        .args(["run", "--config"])
        .arg(fleet.config())
        .args(["--node-id", id, "--log-format", "json"])
        .env("RUST_LOG", "debug,hyper=trace,hyper_util=trace,reqwest=trace,rustls=trace")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    fleet.nodes.push(Node { id: id.to_owned(), child });
}

/// The history record of `run_id`.
fn record(fleet: &Fleet, job: &str, run_id: &str) -> Value {
    let history = fleet.history(job);
    history.into_iter().find(|r| r["id"] == run_id).unwrap_or_else(|| panic!("no record of {run_id}"))
}

fn header<'a>(r: &'a Request, name: &str) -> &'a str {
    r.headers.get(name).unwrap_or_else(|| panic!("no {name} in {r:?}"))
}

const ENV_SECRET: &str = "Bearer env-secret-4c1d";
const FILE_SECRET: &str = "file-secret-9e2b";

#[test]
fn an_http_job_sends_the_runs_facts_and_secrets_and_its_record_keeps_status_and_body() {
    let server = Server::start();
    let jobs = format!(
        r#"
[[jobs]]
name = "sync"
schedule = "* * * * * *"
lease = "3s"
http = {{ url = "{}/ok", headers = {{ "Content-Type" = "application/json" }}, headers_env = {{ Authorization = "SYNC_TOKEN" }}, headers_file = {{ X-Api-Key = "$DIR/api-key" }}, body = '{{"batch": 500}}' }}

[[jobs]]
name = "failing"
schedule = "* * * * * *"
http = {{ url = "{}/fail", method = "PUT", expect_status = "200-299,304" }}
"#,
        server.url, server.url
    );
    let mut fleet = Fleet::new(&jobs);
    std::fs::write(fleet.path("api-key"), format!("{FILE_SECRET}\n")).unwrap();
    start(&mut fleet, "n1", &[("SYNC_TOKEN", ENV_SECRET)]);
    // A second node with another token: a rotated secret must not be drift.
    start(&mut fleet, "n2", &[("SYNC_TOKEN", "Bearer rotated-token-77")]);
    let enough = wait_for(Duration::from_secs(20), || {
        (server.requests("/ok").len() >= 3 && !server.requests("/fail").is_empty()).then_some(())
    });
    assert!(enough.is_some(), "too few requests: {:?}\n{}", server.requests.lock().unwrap(), fleet.log("n1"));
    std::thread::sleep(Duration::from_millis(1500));
    fleet.stop_all();

    let ok = server.requests("/ok");
    for r in &ok {
        let run_id = header(r, "solocron-run-id");
        let rec = record(&fleet, "sync", run_id);
        let (tick, attempt) = run_id.rsplit_once('#').unwrap();
        assert_eq!(header(r, "solocron-job"), "sync");
        assert_eq!(header(r, "solocron-scheduled-at").parse::<DateTime<Utc>>().ok(), Some(at(&rec, "scheduled_at")));
        assert_eq!(header(r, "solocron-fencing-token"), rec["fencing_token"].to_string(), "{rec}");
        assert_eq!(header(r, "solocron-attempt"), attempt);
        assert_eq!(header(r, "solocron-node-id"), rec["node"].as_str().unwrap());
        assert_eq!(header(r, "idempotency-key"), tick, "the tick, job@instant");
        assert_eq!((rec["state"].as_str(), rec["exit_code"].as_i64()), (Some("succeeded"), Some(200)), "{rec}");
        assert_eq!(header(r, "content-type"), "application/json");
        assert_eq!(r.body, r#"{"batch": 500}"#);
        assert_eq!(header(r, "x-api-key"), FILE_SECRET, "the file's trailing newline is dropped");
        assert!(["Bearer rotated-token-77", ENV_SECRET].contains(&header(r, "authorization")));
    }
    let first = header(&ok[0], "solocron-run-id");
    let (code, out, err) = fleet.cli(&["history", "--output", first]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("HTTP 200\ninvoices sent: 12"), "{out}");

    let failed = header(&server.requests("/fail")[0], "solocron-run-id").to_owned();
    let rec = record(&fleet, "failing", &failed);
    assert_eq!(rec["state"], "failed", "{rec}");
    assert_eq!(rec["exit_code"], 500, "the exit code is the status");
    assert_eq!(rec["reason"], "HTTP status 500 is not in expect_status 200-299,304");
    let (_, out, _) = fleet.cli(&["history", "--output", &failed]);
    assert!(out.contains("HTTP 500\nboom: the ledger is locked"), "{out}");

    let detail = fleet.cli_json(&["status", "sync", "--format", "json"]).clone();
    let hashes: Vec<&Value> = detail["registrations"]
        .as_array()
        .unwrap_or_else(|| panic!("{detail}"))
        .iter()
        .map(|n| &n["definition_hash"])
        .collect();
    assert_eq!(hashes.len(), 2, "{detail}");
    assert_eq!(hashes[0], hashes[1], "a rotated secret changed the definition: {detail}");
    assert_eq!(detail["drift"], false, "{detail}");

    let mut seen = fleet.log("n1") + &fleet.log("n2");
    for args in [&["status"][..], &["status", "sync"], &["history"], &["history", "--format", "json"]] {
        let (code, out, err) = fleet.cli(args);
        assert_eq!(code, 0, "{args:?}: {err}");
        seen.push_str(&out);
    }
    assert!(seen.contains("request") || seen.contains("run ended"), "the logs were read");
    for secret in ["env-secret-4c1d", FILE_SECRET, "rotated-token-77"] {
        assert!(!seen.contains(secret), "`{secret}` appeared in a log or in status/history output");
    }
}

#[test]
fn past_http_timeout_the_request_is_dropped_and_the_run_recorded_timed_out() {
    let server = Server::start();
    let jobs = format!(
        "[[jobs]]\nname = \"slow\"\nschedule = \"*/3 * * * * *\"\nlease = \"3s\"\nhttp = {{ url = \"{}/slow\", timeout = \"1s\" }}\n",
        server.url
    );
    let mut fleet = Fleet::new(&jobs);
    start(&mut fleet, "n1", &[]);
    let closed = wait_for(Duration::from_secs(20), || server.closed.lock().unwrap().first().cloned());
    let (_, closed_at) = closed.unwrap_or_else(|| panic!("the server never saw the client go: {}", fleet.log("n1")));
    let run_id = header(&server.requests("/slow")[0], "solocron-run-id").to_owned();
    let rec =
        wait_for(Duration::from_secs(10), || Some(record(&fleet, "slow", &run_id)).filter(|r| r["state"] != "running"))
            .expect("the run ended");
    fleet.stop_all();
    assert_eq!(rec["state"], "timed_out", "{rec}");
    let started = chrono::DateTime::parse_from_rfc3339(rec["started_at"].as_str().unwrap()).unwrap();
    let finished = chrono::DateTime::parse_from_rfc3339(rec["finished_at"].as_str().unwrap()).unwrap();
    let ran = (finished - started).to_std().unwrap();
    assert!(ran >= Duration::from_millis(900) && ran < Duration::from_secs(3), "ran {ran:?}, not about 1s: {rec}");
    assert!(closed_at.elapsed() < Duration::from_secs(30));
}

#[test]
fn a_crash_retry_sends_the_next_attempt_with_the_same_idempotency_key_and_a_larger_token() {
    let server = Server::start();
    let jobs = format!(
        "[[jobs]]\nname = \"charge\"\nschedule = \"* * * * * *\"\nlease = \"2s\"\non_crash = \"retry\"\nmax_attempts = 3\nhttp = {{ url = \"{}/first-hangs\" }}\n",
        server.url
    );
    let mut fleet = Fleet::new(&jobs);
    start(&mut fleet, "doomed", &[]);
    let first = wait_for(Duration::from_secs(20), || server.requests("/first-hangs").first().cloned())
        .unwrap_or_else(|| panic!("no request: {}", fleet.log("doomed")));
    // The node dies mid-request: no end recorded, its connection closed by the kernel.
    fleet.nodes[0].child.kill().unwrap();
    fleet.nodes[0].child.wait().unwrap();
    start(&mut fleet, "heir", &[]);
    let key = header(&first, "idempotency-key").to_owned();
    let retry = wait_for(Duration::from_secs(30), || {
        server
            .requests("/first-hangs")
            .into_iter()
            .find(|r| r.headers["idempotency-key"] == key && r.headers["solocron-attempt"] != "1")
    })
    .unwrap_or_else(|| panic!("no retry of {key}: {:?}\n{}", server.requests("/first-hangs"), fleet.log("heir")));
    fleet.stop_all();
    assert_eq!(header(&first, "solocron-attempt"), "1");
    assert_eq!(header(&retry, "solocron-attempt"), "2");
    assert_eq!(header(&retry, "solocron-run-id"), format!("{key}#2"));
    assert_eq!(header(&retry, "solocron-node-id"), "heir");
    let (t1, t2): (u64, u64) = (
        header(&first, "solocron-fencing-token").parse().unwrap(),
        header(&retry, "solocron-fencing-token").parse().unwrap(),
    );
    assert!(t2 > t1, "the retry's token {t2} is not above the dead attempt's {t1}");
    assert_eq!(record(&fleet, "charge", &format!("{key}#1"))["state"], "lost");
    assert_eq!(record(&fleet, "charge", &format!("{key}#2"))["state"], "succeeded");
}

#[test]
fn a_bad_http_job_is_refused_with_exit_2_naming_its_key() {
    let job = |http: &str| format!("[[jobs]]\nname = \"h\"\nschedule = \"* * * * * *\"\n{http}\n");
    let cases = [
        (
            job("command = [\"/bin/true\"]\nhttp = { url = \"http://127.0.0.1:9/x\" }"),
            "jobs[0] (h).http: a job runs a `command` or calls `http`, not both",
        ),
        (
            job("http = { url = \"localhost:8080/x\" }"),
            "jobs[0] (h).http.url: `localhost:8080/x` must start with http://",
        ),
        (
            job("http = { url = \"http://h/x\", expect_status = \"2xx,20\" }"),
            "jobs[0] (h).http.expect_status: `20` is not",
        ),
        (
            job("http = { url = \"http://h/x\", metod = \"GET\" }"),
            "jobs[0] (h).http.metod: unknown key (line 6); did you mean `method`?",
        ),
    ];
    for (toml, want) in cases {
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("bad.toml");
        std::fs::write(&cfg, format!("[store]\nurl = \"sqlite://{}/s.db\"\n{toml}", dir.path().display())).unwrap();
        for cmd in ["check", "run"] {
            let out = Command::new(BIN).args([cmd, "--config"]).arg(&cfg).output().unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{cmd}: {err}");
            assert!(err.contains(&format!("bad.toml: {want}")), "{cmd}: expected `{want}` in: {err}");
        }
    }
    // A secret that cannot be read stops the daemon at start, naming the key and the
    // variable, and no value.
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("s.toml");
    let http = "http = { url = \"http://h/x\", headers_env = { Authorization = \"SOLOCRON_TEST_UNSET_TOKEN\" } }";
    std::fs::write(&cfg, format!("[store]\nurl = \"sqlite://{}/s.db\"\n{}", dir.path().display(), job(http))).unwrap();
    let out =
        Command::new(BIN).args(["run", "--config"]).arg(&cfg).env_remove("SOLOCRON_TEST_UNSET_TOKEN").output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("s.toml: jobs[0] (h).http.headers_env.Authorization: the environment variable SOLOCRON_TEST_UNSET_TOKEN is not set"),
        "{err}"
    );
}
