//! Scenario 7, the HTTP API: the issue's targets at 10,000 jobs and 1,000,000 run records.
//!
//! The store is filled through its public steps only (`register`, `heartbeat`, batched
//! `claim`, `finish_all`), then `solocron_http::router` serves it in this process on a
//! loopback port, and one HTTP client asks in sequence, as one operator's browser would:
//! each figure includes the TCP round trip, HTTP parsing, the store calls and the JSON.
//! The server's store is wrapped in [`Counting`], which gives the store calls per request,
//! and proves that an idle server (no client) makes none.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use serde_json::Value;
use solocron_core::{
    ClaimMode, ClaimOutcome, ClaimRequest, Ending, HistoryQuery, JobDefinition, NodeBeat, Prefix, RunEnd, RunState,
    Store, Tick, Trigger, CLAIM_BATCH_MAX, FINISH_BATCH_MAX, RECORDS_PAGE_MAX,
};
use solocron_fleet::{Fleet, JobFilter};
use solocron_http::{HttpOptions, Role, Token};

use crate::counting::Counting;
use crate::fleet::{cpu_ms, fresh};
use crate::raw::cleanup;
use crate::scenarios::Ctx;
use crate::stats::{fmt, quantile, table};

/// The issue's fleet: jobs, and run records in the store.
const JOBS: usize = 10_000;
const ROWS: usize = 1_000_000;
/// `--quick` (CI's smoke run on SQLite): small enough to stay within seconds.
const JOBS_QUICK: usize = 500;
const ROWS_QUICK: usize = 20_000;
/// Node ids that register every job (and send heartbeats).
const NODES: usize = 3;
/// The records' ticks are spread over this many days before now.
const HISTORY_DAYS: i64 = 30;
/// Each job's newest ticks, this many per job, are claimed to run and finished (succeeded,
/// some failed); older ticks are recorded skipped (`ClaimMode::Skip`), the cheapest record
/// a claim makes, so that a million records are written in minutes.
const RUN_ROUNDS: usize = 10;
/// Every this many jobs, one has its newest run left `running` (the fleet's runs in progress).
const RUNNING_EVERY_JOBS: usize = 500;
/// The lease of a claimed run: longer than the scenario, so a run left running stays so.
const RUN_LEASE: Duration = Duration::from_secs(3600);
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

/// Every request of the scenario, then the idle watch once the client is gone.
async fn exercise(
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

fn node(n: usize) -> String {
    format!("bench-node-{n}")
}

/// `job-0` … `job-{jobs-1}`, unpadded, so that a search for `job-77` matches 111 names.
fn job(j: usize) -> String {
    format!("job-{j}")
}

/// Node `n`'s definitions of every job: a few schedule shapes and zones; every 1,000th job
/// defined differently by the last node (drift, as a fleet in a rolling deploy shows).
fn definitions(jobs: usize, n: usize) -> Vec<JobDefinition> {
    const ZONES: [&str; 3] = ["UTC", "Europe/Berlin", "America/New_York"];
    (0..jobs)
        .map(|j| {
            let schedule = match j % 4 {
                0 => format!("{} * * * *", j % 60),
                1 => format!("{} {} * * *", j % 60, j % 24),
                2 => "*/5 * * * *".to_owned(),
                _ => format!("0 {} * * 1-5", j % 24),
            };
            let drift = n == NODES - 1 && j.is_multiple_of(1000);
            JobDefinition {
                job: job(j),
                timezone: ZONES[j % ZONES.len()].to_owned(),
                definition_hash: format!("{:016x}", j as u64 * 0x9e37_79b9 + u64::from(drift)),
                summary: "lease 30s, overlap skip, misfire skip, catchup 0s, on_crash abandon".to_owned(),
                schedule,
            }
        })
        .collect()
}

/// Sends each node's heartbeat; the store's refusal (a store without heartbeats yet) is
/// returned as a note, not an error: the pages are still measured, with stale nodes.
async fn beat(store: &dyn Store, jobs: usize) -> Option<String> {
    for n in 0..NODES {
        let b = NodeBeat { node: node(n), version: env!("CARGO_PKG_VERSION").into(), jobs: jobs as u32, running: 0 };
        if let Err(e) = store.heartbeat(&b).await {
            return Some(format!("no heartbeats (the store refused one: {e})"));
        }
    }
    None
}

/// Registers `jobs` jobs from [`NODES`] nodes, sends their heartbeats, and writes `rows`
/// run records (rows / jobs per job, spread over [`HISTORY_DAYS`]) through batched claims.
async fn populate(store: &dyn Store, jobs: usize, rows: usize) -> anyhow::Result<Filled> {
    let started = Instant::now();
    for n in 0..NODES {
        store.register(&node(n), &definitions(jobs, n)).await?;
    }
    let heartbeat = beat(store, jobs).await;
    let per_job = (rows / jobs).max(1);
    let interval_s = HISTORY_DAYS * 86_400 / per_job as i64;
    let now = store.now().await?;
    let first = DateTime::from_timestamp(now.timestamp() - HISTORY_DAYS * 86_400, 0).expect("in range");
    let mut filled = Filled {
        records: 0,
        took: Duration::ZERO,
        claim_calls: 0,
        claims_took: Duration::ZERO,
        finish_calls: 0,
        finishes_took: Duration::ZERO,
        heartbeat,
    };
    for round in 0..per_job {
        let run = round + RUN_ROUNDS >= per_job;
        let newest = round + 1 == per_job;
        let ids: Vec<usize> = (0..jobs).collect();
        for chunk in ids.chunks(CLAIM_BATCH_MAX) {
            // Each job's ticks are `interval_s` apart; jobs are offset within the interval,
            // so that no two records share an instant (the runs page's cursor stays simple).
            let at = |j: usize| {
                first + chrono::Duration::seconds(round as i64 * interval_s + j as i64 * interval_s / jobs as i64)
            };
            let requests: Vec<ClaimRequest> = chunk.iter().map(|&j| claim_request(j, at(j), run)).collect();
            let endings = claim_batch(store, &requests, &mut filled).await?;
            let endings: Vec<Ending> = endings
                .into_iter()
                .filter(|e| !(newest && job_index(&e.lease.run.tick.job).is_multiple_of(RUNNING_EVERY_JOBS)))
                .collect();
            finish_batches(store, &endings, &mut filled).await?;
        }
    }
    filled.took = started.elapsed();
    Ok(filled)
}

fn job_index(name: &str) -> usize {
    name.trim_start_matches("job-").parse().expect("the benchmark's job names")
}

fn claim_request(j: usize, at: DateTime<Utc>, run: bool) -> ClaimRequest {
    ClaimRequest {
        tick: Tick::new(job(j), at),
        trigger: Trigger::Schedule,
        node: node(j % NODES),
        lease: RUN_LEASE,
        mode: if run {
            ClaimMode::Run { skip_if_running: false }
        } else {
            ClaimMode::Skip { reason: "missed (misfire = skip)".into() }
        },
        nonce: 0,
    }
}

/// One claim call; every tick is new, so each must be won (to run) or recorded skipped.
/// Returns the endings of the runs won (every 7th failed).
async fn claim_batch(store: &dyn Store, requests: &[ClaimRequest], filled: &mut Filled) -> anyhow::Result<Vec<Ending>> {
    let t0 = Instant::now();
    let outcomes = store.claim(requests).await?;
    filled.claims_took += t0.elapsed();
    filled.claim_calls += 1;
    anyhow::ensure!(
        outcomes.len() == requests.len(),
        "a claim of {} ticks answered {}",
        requests.len(),
        outcomes.len()
    );
    let mut endings = Vec::new();
    for (i, outcome) in outcomes.into_iter().enumerate() {
        match outcome {
            ClaimOutcome::Won(lease) => {
                let failed = i.is_multiple_of(7);
                let end = RunEnd {
                    state: if failed { RunState::Failed } else { RunState::Succeeded },
                    reason: failed.then(|| "exit code 1".to_owned()),
                    exit_code: Some(i32::from(failed)),
                    output: if failed { "error: upstream timed out\n" } else { "done\n" }.to_owned(),
                    started_after: Some(Duration::ZERO),
                };
                endings.push(Ending { lease, end });
            }
            ClaimOutcome::Skipped { .. } => {}
            ClaimOutcome::Taken => anyhow::bail!("tick {:?} of a fresh namespace was taken", requests[i].tick),
            ClaimOutcome::TooEarly { .. } => {
                anyhow::bail!("tick {:?} (in the past) was refused as early", requests[i].tick)
            }
        }
        filled.records += 1;
    }
    Ok(endings)
}

async fn finish_batches(store: &dyn Store, endings: &[Ending], filled: &mut Filled) -> anyhow::Result<()> {
    for batch in endings.chunks(FINISH_BATCH_MAX) {
        let t0 = Instant::now();
        let answers = store.finish_all(batch).await?;
        filled.finishes_took += t0.elapsed();
        filled.finish_calls += 1;
        anyhow::ensure!(answers.iter().all(|&a| a), "a run just won could not be finished");
    }
    Ok(())
}

/// Records what a node's engine records for each job, through the `metrics` facade under
/// the engine's own names (`solocron::metrics`; its recording functions are the crate's
/// own): a run's end (`tick_ended`: the ticks counter and the last success), and the node's
/// start lateness. With `every_series`, also every other series a job can have (12 per
/// job, the bound `solocron::metrics` states).
fn record_metrics(jobs: usize, every_series: bool) {
    use solocron::metrics::*;
    describe();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    for j in 0..jobs {
        let name = job(j);
        if !every_series {
            metrics::counter!(TICKS_TOTAL, "job" => name.clone(), "outcome" => "succeeded").increment(100);
            metrics::gauge!(LAST_SUCCESS_TIMESTAMP_SECONDS, "job" => name).set(now.as_secs_f64());
            metrics::histogram!(START_LATENESS_SECONDS).record(0.002);
            continue;
        }
        for outcome in ["failed", "timed_out", "lost", "abandoned", "interrupted", "missed"] {
            metrics::counter!(TICKS_TOTAL, "job" => name.clone(), "outcome" => outcome).increment(1);
        }
        for reason in ["overlap", "paused", "other"] {
            metrics::counter!(TICKS_TOTAL, "job" => name.clone(), "outcome" => "skipped", "reason" => reason)
                .increment(1);
        }
        metrics::counter!(LEASES_LOST_TOTAL, "job" => name).increment(1);
    }
    metrics::gauge!(JOBS).set(jobs as f64);
    metrics::histogram!(CLAIM_ROUND_DURATION_SECONDS).record(0.003);
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
        "/api/v1/jobs" => (v["total"] == jobs && count("jobs") == 50.min(jobs), format!("total {jobs}, 50 jobs")),
        p if p.starts_with("/api/v1/jobs?search=") => {
            let matching = (0..jobs).filter(|&j| job(j).contains(SEARCH)).count();
            (v["total"] == matching, format!("total {matching}"))
        }
        p if p.starts_with("/api/v1/jobs/") => (v["name"] == ONE_JOB, format!("job {ONE_JOB}")),
        p if p.starts_with("/api/v1/runs") => (count("runs") > 0, "runs".to_owned()),
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

/// What an idle server costs.
struct Idle {
    watched: Duration,
    store_calls: u64,
    cpu_ms: u64,
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

/// What `Fleet::jobs` reads per job view (`solocron_fleet`'s `RECENT_RUNS_MAX` and
/// `READS_IN_FLIGHT_MAX`, private there), to time its reads apart from its own work.
const RECENT_RUNS: usize = 20;
const PAGE_READS_IN_FLIGHT: usize = 8;

/// The parts of a jobs page, as [`Parts`] names them.
const PARTS: [&str; 11] = [
    "`registrations()` (the whole registry: `Fleet::read`, the CLI's)",
    "`registered_jobs()` (the names: `Fleet::read_names`, the server's)",
    "`registrations_of(the page's 50 jobs)`",
    "`controls()`",
    "`nodes()`",
    "`history(state = running)`",
    "`now()`",
    "`Fleet::read_names` (names, controls, nodes, running, now, in sequence)",
    "`Fleet::jobs`: the page's 50 views (their registrations, 50 `history` reads, 8 in flight)",
    "of which: the 50 `history` reads alone, 8 in flight (the rest is `Fleet`'s own work)",
    "the page's JSON (`serde_json::to_vec`)",
];

/// Where a jobs page's time goes: each store call of `Fleet::read_names`, then the page's views
/// (one history read per job, a few in flight) and its JSON, made directly (no HTTP),
/// sampled in the same rounds as the requests so that both meet the store in one state.
#[derive(Default)]
struct Parts {
    /// Per part, every sample (ms).
    ms: Vec<Vec<f64>>,
    /// Per part, what its last sample returned (records, or bytes of JSON).
    rows: Vec<usize>,
}

impl Parts {
    async fn sample(&mut self, store: &dyn Store, n: usize) -> anyhow::Result<()> {
        let running =
            HistoryQuery { state: Some(RunState::Running), limit: RECORDS_PAGE_MAX, ..HistoryQuery::default() };
        let fleet = Fleet::read_names(store, Vec::new()).await?;
        let page = fleet.jobs(store, &JobFilter::default()).await?;
        let page_jobs: Vec<String> = page.jobs.iter().map(|j| j.name.clone()).collect();
        self.ms.resize(PARTS.len(), Vec::new());
        self.rows.resize(PARTS.len(), 0);
        let began = Instant::now();
        for _ in 0..n {
            if began.elapsed() > SAMPLING_PER_ROUND_MAX {
                break;
            }
            let mut part = 0;
            macro_rules! timed {
                ($e:expr) => {{
                    let t0 = Instant::now();
                    let rows: usize = $e;
                    self.ms[part].push(t0.elapsed().as_secs_f64() * 1e3);
                    self.rows[part] = rows;
                    part += 1;
                }};
            }
            timed!(store.registrations().await?.len());
            timed!(store.registered_jobs().await?.len());
            timed!(store.registrations_of(&page_jobs).await?.len());
            timed!(store.controls().await?.len());
            timed!(store.nodes().await?.len());
            timed!(store.history(&running).await?.len());
            timed!(store.now().await.map(|_| 1)?);
            timed!(Fleet::read_names(store, Vec::new()).await.map(|_| 1)?);
            timed!(fleet.jobs(store, &JobFilter::default()).await?.jobs.len());
            timed!(recent_runs(store, &page).await?);
            timed!(serde_json::to_vec(&page)?.len());
            debug_assert_eq!(part, PARTS.len());
        }
        Ok(())
    }

    fn table_rows(&self) -> Vec<Vec<String>> {
        (0..self.ms.len())
            .map(|i| {
                let ms = &self.ms[i];
                let (p50, p95) = (fmt(quantile(ms, 0.5)), fmt(quantile(ms, 0.95)));
                vec![PARTS[i].to_owned(), ms.len().to_string(), self.rows[i].to_string(), p50, p95]
            })
            .collect()
    }
}

/// The history reads of a jobs page's views, made as `Fleet::jobs` makes them (each job's
/// newest runs, [`PAGE_READS_IN_FLIGHT`] at once); returns the records read.
async fn recent_runs(store: &dyn Store, page: &solocron_fleet::JobPage) -> anyhow::Result<usize> {
    use futures_util::{StreamExt as _, TryStreamExt as _};
    let reads = futures_util::stream::iter(&page.jobs)
        .map(|j| {
            let q = HistoryQuery { job: Some(j.name.clone()), limit: RECENT_RUNS, ..HistoryQuery::default() };
            async move { store.history(&q).await.map(|r| r.len()) }
        })
        .buffered(PAGE_READS_IN_FLIGHT);
    let counts: Vec<usize> = reads.try_collect().await?;
    Ok(counts.iter().sum())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_jobs_page_that_does_not_hold_the_filled_jobs_fails_the_scenario() {
        let jobs: Vec<Value> = (0..50).map(|j| serde_json::json!({ "name": job(j) })).collect();
        let right = serde_json::json!({ "jobs": jobs, "total": 500 }).to_string();
        assert!(check("jobs", "/api/v1/jobs", right.as_bytes(), 500).is_ok());
        let short = serde_json::json!({ "jobs": jobs, "total": 499 }).to_string();
        assert!(check("jobs", "/api/v1/jobs", short.as_bytes(), 500).is_err());
        assert!(check("jobs", "/api/v1/jobs", b"not json", 500).is_err());
        assert!(check("runs", "/api/v1/runs", br#"{"runs": []}"#, 500).is_err());
    }

    #[test]
    fn the_fleet_drifts_only_where_meant_and_the_search_matches_111_of_10000() {
        let first = definitions(JOBS, 0);
        let last = definitions(JOBS, NODES - 1);
        let drifted: Vec<&str> = first.iter().zip(&last).filter(|(a, b)| a != b).map(|(a, _)| a.job.as_str()).collect();
        assert_eq!(drifted.len(), JOBS / 1000);
        assert!(drifted.iter().all(|j| job_index(j).is_multiple_of(1000)), "{drifted:?}");
        for d in &first {
            solocron_core::Schedule::parse(&d.schedule, &d.timezone).expect("every benchmark schedule parses");
        }
        assert_eq!((0..JOBS).filter(|&j| job(j).contains(SEARCH)).count(), 111);
    }
}
