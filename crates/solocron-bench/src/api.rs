//! Scenario 7, the HTTP API: the targets at 10,000 jobs and 1,000,000 run records.
//!
//! The store is filled through its public steps only (`register`, `heartbeat`, batched
//! `claim`, `finish_all`), then `solocron_http::router` serves it in this process on a
//! loopback port, and one HTTP client asks in sequence, as one operator's browser would:
//! each figure includes the TCP round trip, HTTP parsing, the store calls and the JSON.
//! The server's store is wrapped in [`Counting`], which gives the store calls per request,
//! and proves that an idle server (no client) makes none.
//!
//! The scenario's knobs, the server's setup and the report are here; the rest is in
//! `api/`: `fill.rs` fills the store (and the metrics recorder), `requests.rs` is the
//! client and every request it makes (and the idle watch after it), `parts.rs` times the
//! store calls of a jobs page made directly.

mod fill;
mod parts;
mod requests;

use std::sync::Arc;
use std::time::Duration;

use solocron_core::{Prefix, Store, CLAIM_BATCH_MAX};
use solocron_http::{HttpOptions, Role, Token};

use crate::counting::Counting;
use crate::fleet::fresh;
use crate::raw::cleanup;
use crate::scenarios::Ctx;
use crate::stats::{fmt, quantile, table};
use fill::{populate, HISTORY_DAYS, NODES, RUN_ROUNDS};
use parts::Parts;
use requests::exercise;

/// The fleet: jobs, and run records in the store.
const JOBS: usize = 10_000;
const ROWS: usize = 1_000_000;
/// `--quick` (CI's smoke run on SQLite): small enough to stay within seconds.
const JOBS_QUICK: usize = 500;
const ROWS_QUICK: usize = 20_000;
/// Requests per endpoint (over all rounds).
const REQUESTS: usize = 200;
const REQUESTS_QUICK: usize = 10;
/// Untimed requests per endpoint before its first timed one (connection, store caches).
const WARMUP_REQUESTS: usize = 2;
/// How long the server is watched with no client.
const IDLE: Duration = Duration::from_secs(10);
const IDLE_QUICK: Duration = Duration::from_secs(2);
/// A request taking longer than this fails the scenario.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// Sampling of one endpoint (or part) in one round stops after this long, however few
/// requests were made: a request far over its target says so in a few samples, and a run
/// whose every page takes seconds still ends in minutes (the table shows the count).
const SAMPLING_PER_ROUND_MAX: Duration = Duration::from_secs(20);
/// The benchmark's operate token (loopback only, made fresh each run; not a secret).
const SECRET: &str = "bench-operate-token-0123456789";
/// The targets, in ms: p95 of the jobs page's first page, of the console's first render
/// (the server's share), of `/metrics`.
const JOBS_P95_MS_MAX: f64 = 50.0;
const CONSOLE_P95_MS_MAX: f64 = 1000.0;
const METRICS_P95_MS_MAX: f64 = 20.0;
/// The job every per-job request names, and the search (matches 111 of 10,000 names).
const ONE_JOB: &str = "job-77";
const SEARCH: &str = "job-77";
/// What the console fetches for its first render, in the order it needs them.
const CONSOLE_PATHS: [&str; 6] =
    ["/", "/console/style.css", "/console/app.js", "/console/icon.svg", "/api/v1/whoami", "/api/v1/jobs?limit=50"];

/// 7. HTTP API. Fails on a server error, a wrong answer, or a store call by an idle server.
pub fn api(c: &Ctx) -> anyhow::Result<String> {
    let rt = tokio::runtime::Handle::current();
    std::thread::scope(|s| s.spawn(|| rt.block_on(measure(c))).join())
        .map_err(|_| anyhow::anyhow!("the api scenario panicked"))?
}

async fn measure(c: &Ctx) -> anyhow::Result<String> {
    let (jobs, rows) = if c.quick { (JOBS_QUICK, ROWS_QUICK) } else { (JOBS, ROWS) };
    let (url, prefix) = fresh(&c.store, &c.dir, "api");
    let store = solocron_stores::open(&url, &prefix).await?;
    store.migrate().await?;
    let result = measure_in(c, store, jobs, rows, (&url, &prefix)).await;
    cleanup(&url, &prefix).await;
    result
}

/// What one run asks, how often.
#[derive(Clone, Copy)]
struct Plan {
    jobs: usize,
    /// Requests per endpoint, over all rounds.
    requests: usize,
    rounds: usize,
    /// Whether `/metrics` is served (this process's Prometheus recorder is solocron's).
    metrics: bool,
    idle: Duration,
}

async fn measure_in(
    c: &Ctx,
    store: Arc<dyn Store>,
    jobs: usize,
    rows: usize,
    (url, prefix): (&str, &Prefix),
) -> anyhow::Result<String> {
    let filled = populate(store.as_ref(), jobs, rows).await?;
    println!("api: {} records written in {:.1} s", filled.records, filled.took.as_secs_f64());
    crate::raw::settle(url, prefix).await?;
    let requests = if c.quick { REQUESTS_QUICK } else { REQUESTS };
    let prometheus = solocron_http::install_prometheus();
    let plan = Plan {
        jobs,
        requests,
        rounds: c.rounds.clamp(1, requests),
        metrics: prometheus.is_some(),
        idle: if c.quick { IDLE_QUICK } else { IDLE },
    };
    let counting = Arc::new(Counting::new(store.clone()));
    let tokens = vec![Token::new("bench", Role::Operate, SECRET)?];
    let app = solocron_http::router(counting.clone(), HttpOptions { tokens, prometheus, ..HttpOptions::default() });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let mut out = Measured::default();
    let idle = exercise(plan, base, &counting, store.as_ref(), &mut out).await;
    server.abort();
    Ok(section(jobs, &filled, &out, &idle?))
}

/// What the store was filled with, and how long it took.
struct Filled {
    records: usize,
    took: Duration,
    claim_calls: usize,
    claims_took: Duration,
    finish_calls: usize,
    finishes_took: Duration,
    /// Why nodes have no heartbeat, if the store refused one.
    heartbeat: Option<String>,
}

/// One measured line of the table.
struct Row {
    what: String,
    times: Vec<f64>,
    calls_per_request: Option<f64>,
    bytes: usize,
    target_ms: Option<f64>,
}

impl Row {
    fn new(what: String, target_ms: Option<f64>) -> Row {
        Row { what, times: Vec::new(), calls_per_request: None, bytes: 0, target_ms }
    }
}

#[derive(Default)]
struct Measured {
    rows: Vec<Row>,
    notes: Vec<String>,
    parts: Parts,
}

/// What an idle server costs.
struct Idle {
    watched: Duration,
    store_calls: u64,
    cpu_ms: u64,
}

fn section(jobs: usize, filled: &Filled, out: &Measured, idle: &Idle) -> String {
    let rows: Vec<Vec<String>> = out
        .rows
        .iter()
        .map(|r| {
            let p95 = quantile(&r.times, 0.95);
            let target = r
                .target_ms
                .map_or("—".to_owned(), |t| format!("p95 < {} ms {}", fmt(t), if p95 < t { "✓" } else { "✗" }));
            vec![
                r.what.clone(),
                r.times.len().to_string(),
                r.calls_per_request.map_or("—".to_owned(), fmt),
                fmt(quantile(&r.times, 0.5)),
                fmt(p95),
                fmt(quantile(&r.times, 0.99)),
                fmt(quantile(&r.times, 1.0)),
                r.bytes.to_string(),
                target,
            ]
        })
        .collect();
    let idle_row = vec![vec![
        format!("{} s", idle.watched.as_secs()),
        idle.store_calls.to_string(),
        format!("{} ms", idle.cpu_ms),
        "0 store calls ✓".to_owned(),
    ]];
    let mut notes = out.notes.clone();
    notes.extend(filled.heartbeat.clone());
    format!(
        "## 7. HTTP API ({jobs} jobs registered by {NODES} nodes, {} run records over {HISTORY_DAYS} days; the router served in this process on loopback, one client, requests in sequence, keep-alive; ms from sending to the body's last byte, after {WARMUP_REQUESTS} untimed requests)\n\n\
         Filled through the store's own steps in {:.1} s: {} claim calls of up to {CLAIM_BATCH_MAX} ticks ({:.1} s; each job's newest {RUN_ROUNDS} ticks claimed to run, older ones recorded skipped), {} `finish_all` calls ({:.1} s).{}\n\n{}\n\
         Idle server, no client (the benchmark process's CPU beside it):\n\n{}\n\
         Where a jobs page's time goes (the same store calls, made directly, sampled in the same rounds):\n\n{}",
        filled.records,
        filled.took.as_secs_f64(),
        filled.claim_calls,
        filled.claims_took.as_secs_f64(),
        filled.finish_calls,
        filled.finishes_took.as_secs_f64(),
        notes.iter().map(|n| format!(" Note: {n}.")).collect::<String>(),
        table(&["request", "requests", "store calls / request", "p50 ms", "p95 ms", "p99 ms", "max ms", "bytes", "target"], &rows),
        table(&["watched", "store calls", "CPU", "target"], &idle_row),
        table(&["part", "samples", "records (JSON: bytes)", "p50 ms", "p95 ms"], &out.parts.table_rows()),
    )
}
