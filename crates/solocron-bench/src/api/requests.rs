//! The client and what it asks, in sequence, as one operator's browser would: every
//! endpoint (each answer checked against what the store was filled with), `/metrics`, the
//! console's first render, then the idle watch once the client is gone.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use serde_json::Value;
use solocron_core::Store;

use super::fill::{beat, job, record_metrics};
use super::{
    Idle, Measured, Plan, Row, CONSOLE_P95_MS_MAX, CONSOLE_PATHS, JOBS_P95_MS_MAX, METRICS_P95_MS_MAX, ONE_JOB,
    REQUEST_TIMEOUT, SAMPLING_PER_ROUND_MAX, SEARCH, SECRET, WARMUP_REQUESTS,
};
use crate::counting::Counting;
use crate::fleet::cpu_ms;

/// Every request of the scenario, then the idle watch once the client is gone.
pub(super) async fn exercise(
    plan: Plan,
    base: String,
    counting: &Counting,
    store: &dyn Store,
    out: &mut Measured,
) -> anyhow::Result<Idle> {
    // reqwest refuses to build a client without a TLS crypto provider in this workspace
    // (its `rustls-no-provider` feature); an earlier install is as good.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = Client { http: reqwest::Client::builder().timeout(REQUEST_TIMEOUT).build()?, base };
    if plan.metrics {
        record_metrics(plan.jobs, false);
    } else {
        out.notes.push("`/metrics` not measured: another metrics recorder was installed first".into());
    }
    sample_endpoints(plan, &client, counting, store, out).await?;
    if plan.metrics {
        record_metrics(plan.jobs, true);
        let mut every =
            Row::new(format!("GET /metrics ({} jobs, every series a job can have: 12 each)", plan.jobs), None);
        client.sample("/metrics", plan.requests, &mut every).await?;
        out.rows.push(every);
    }
    console(&client, plan.requests, out).await?;
    drop(client);
    idle_calls(counting, plan.idle).await
}

/// The HTTP client and the server's address.
struct Client {
    http: reqwest::Client,
    base: String,
}

/// One answer: its time (ms, from sending to the last byte of the body), status and body.
struct Got {
    ms: f64,
    status: reqwest::StatusCode,
    body: Vec<u8>,
}

impl Client {
    async fn get(&self, path: &str) -> anyhow::Result<Got> {
        let t0 = Instant::now();
        let res = self.http.get(format!("{}{path}", self.base)).bearer_auth(SECRET).send().await?;
        let status = res.status();
        let body = res.bytes().await?;
        let ms = t0.elapsed().as_secs_f64() * 1e3;
        Ok(Got { ms, status, body: body.to_vec() })
    }

    /// A GET that must succeed: a server error fails the scenario.
    async fn ok(&self, path: &str) -> anyhow::Result<Got> {
        let got = self.get(path).await?;
        anyhow::ensure!(
            got.status.is_success(),
            "GET {path} answered {}: {}",
            got.status,
            String::from_utf8_lossy(&got.body).chars().take(500).collect::<String>()
        );
        Ok(got)
    }

    /// Up to `n` GETs of `path` into `row` (fewer once [`SAMPLING_PER_ROUND_MAX`] passed).
    async fn sample(&self, path: &str, n: usize, row: &mut Row) -> anyhow::Result<()> {
        let began = Instant::now();
        for _ in 0..n {
            if began.elapsed() > SAMPLING_PER_ROUND_MAX {
                break;
            }
            let got = self.ok(path).await?;
            row.times.push(got.ms);
            row.bytes = got.body.len();
        }
        Ok(())
    }
}

/// The endpoints measured: what the table calls each, its path, its p95 target (ms).
fn endpoints(plan: Plan) -> Vec<(String, String, Option<f64>)> {
    let jobs = plan.jobs;
    let mut list = vec![
        (format!("GET /api/v1/jobs (first page: 50 of {jobs})"), "/api/v1/jobs".into(), Some(JOBS_P95_MS_MAX)),
        (format!("GET /api/v1/jobs?search={SEARCH}"), format!("/api/v1/jobs?search={SEARCH}"), None),
        (format!("GET /api/v1/jobs/{ONE_JOB} (detail)"), format!("/api/v1/jobs/{ONE_JOB}"), None),
        ("GET /api/v1/runs (first page: 50)".into(), "/api/v1/runs".into(), None),
        (format!("GET /api/v1/runs?job={ONE_JOB}"), format!("/api/v1/runs?job={ONE_JOB}"), None),
        ("GET /api/v1/whoami (no store call: HTTP and auth alone)".into(), "/api/v1/whoami".into(), None),
    ];
    if plan.metrics {
        let what = format!("GET /metrics ({jobs} jobs: ticks, last success; the node's lateness)");
        list.push((what, "/metrics".into(), Some(METRICS_P95_MS_MAX)));
    }
    list
}

/// Each endpoint, `plan.requests` times in all, interleaved over the rounds, each round
/// followed by the jobs page's parts.
async fn sample_endpoints(
    plan: Plan,
    client: &Client,
    counting: &Counting,
    store: &dyn Store,
    out: &mut Measured,
) -> anyhow::Result<()> {
    let endpoints = endpoints(plan);
    let mut rows: Vec<Row> = endpoints.iter().map(|(what, _, target)| Row::new(what.clone(), *target)).collect();
    let mut calls = vec![0u64; rows.len()];
    for round in 0..plan.rounds {
        // Keep the nodes alive (a heartbeat is stale after 15 s) as a running fleet's are.
        beat(store, plan.jobs).await;
        let n = plan.requests / plan.rounds + usize::from(round < plan.requests % plan.rounds);
        for (i, (what, path, _)) in endpoints.iter().enumerate() {
            if round == 0 {
                for _ in 0..WARMUP_REQUESTS {
                    check(what, path, &client.ok(path).await?.body, plan.jobs)?;
                }
            }
            let before = counting.calls.load(Ordering::Relaxed);
            client.sample(path, n, &mut rows[i]).await?;
            calls[i] += counting.calls.load(Ordering::Relaxed) - before;
        }
        out.parts.sample(store, n).await?;
    }
    for (row, calls) in rows.iter_mut().zip(calls) {
        row.calls_per_request = Some(calls as f64 / row.times.len() as f64);
    }
    out.rows.extend(rows);
    Ok(())
}

/// Fails on an answer that is not what the filled store holds.
fn check(what: &str, path: &str, body: &[u8], jobs: usize) -> anyhow::Result<()> {
    if path == "/metrics" {
        let text = String::from_utf8_lossy(body);
        let series = text.lines().filter(|l| l.starts_with(solocron::metrics::TICKS_TOTAL)).count();
        anyhow::ensure!(series >= jobs, "{what}: {series} ticks series, expected one per job ({jobs})");
        return Ok(());
    }
    let v: Value = serde_json::from_slice(body)?;
    let count = |key: &str| v[key].as_array().map_or(0, Vec::len);
    let (ok, expected) = match path {
        "/api/v1/jobs" => (v["total"] == jobs && count("items") == 50.min(jobs), format!("total {jobs}, 50 jobs")),
        p if p.starts_with("/api/v1/jobs?search=") => {
            let matching = (0..jobs).filter(|&j| job(j).contains(SEARCH)).count();
            (v["total"] == matching, format!("total {matching}"))
        }
        p if p.starts_with("/api/v1/jobs/") => (v["name"] == ONE_JOB, format!("job {ONE_JOB}")),
        p if p.starts_with("/api/v1/runs") => (count("items") > 0, "runs".to_owned()),
        _ => (true, String::new()),
    };
    let shown: String = String::from_utf8_lossy(body).chars().take(300).collect();
    anyhow::ensure!(ok, "{what}: expected {expected}, got {shown}");
    Ok(())
}

/// The server's share of the console's first render: its page, style, script and icon,
/// then the two API calls the page makes (`app.js`: who am I, then the first jobs page),
/// in sequence, without cached files (a browser fetches the files in parallel: this is an
/// upper bound). The browser's own share is the console's end-to-end test's. Skipped, with
/// a note, while the server has no console (a 404).
async fn console(client: &Client, requests: usize, out: &mut Measured) -> anyhow::Result<()> {
    for path in CONSOLE_PATHS {
        let got = client.get(path).await?;
        if got.status == reqwest::StatusCode::NOT_FOUND {
            out.notes
                .push(format!("console's first render not measured: `GET {path}` answers 404 (no console served)"));
            return Ok(());
        }
        anyhow::ensure!(got.status.is_success(), "GET {path} answered {}", got.status);
    }
    let what = format!("console's first render, server's share ({} in sequence)", CONSOLE_PATHS.join(", "));
    let mut row = Row::new(what, Some(CONSOLE_P95_MS_MAX));
    let began = Instant::now();
    for _ in 0..requests {
        if began.elapsed() > SAMPLING_PER_ROUND_MAX {
            break;
        }
        let (mut ms, mut bytes) = (0.0, 0);
        for path in CONSOLE_PATHS {
            let got = client.ok(path).await?;
            ms += got.ms;
            bytes += got.body.len();
        }
        row.times.push(ms);
        row.bytes = bytes;
    }
    out.rows.push(row);
    Ok(())
}

/// Watches the server with no client connected (the client dropped, its connections
/// closed): it must make no store call. The process's CPU time is shown beside it.
async fn idle_calls(counting: &Counting, watched: Duration) -> anyhow::Result<Idle> {
    // Let the server see the client's connections close before the watch begins.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let pid = std::process::id();
    let (calls0, cpu0) = (counting.calls.load(Ordering::Relaxed), cpu_ms(pid));
    tokio::time::sleep(watched).await;
    let (calls1, cpu1) = (counting.calls.load(Ordering::Relaxed), cpu_ms(pid));
    let idle = Idle { watched, store_calls: calls1 - calls0, cpu_ms: cpu1.saturating_sub(cpu0) };
    anyhow::ensure!(
        idle.store_calls == 0,
        "an idle HTTP server made {} store calls in {} s with no client: it must make none",
        idle.store_calls,
        watched.as_secs()
    );
    Ok(idle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_jobs_page_that_does_not_hold_the_filled_jobs_fails_the_scenario() {
        let jobs: Vec<Value> = (0..50).map(|j| serde_json::json!({ "name": job(j) })).collect();
        let right = serde_json::json!({ "items": jobs, "total": 500 }).to_string();
        assert!(check("jobs", "/api/v1/jobs", right.as_bytes(), 500).is_ok());
        let short = serde_json::json!({ "items": jobs, "total": 499 }).to_string();
        assert!(check("jobs", "/api/v1/jobs", short.as_bytes(), 500).is_err());
        assert!(check("jobs", "/api/v1/jobs", b"not json", 500).is_err());
        assert!(check("runs", "/api/v1/runs", br#"{"items": []}"#, 500).is_err());
    }
}
