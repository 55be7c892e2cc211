//! The engine's metrics, read back from a recorder while a real scheduler runs jobs on a
//! real SQLite file: what the metrics say must be what the store recorded.
#![forbid(unsafe_code)]

use solocron_core::SchemaStore;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use solocron::metrics as m;
use solocron::{handler_fn, Handler, Job, JobPolicy, Misfire, OnCrash, Overlap, RunContext, Scheduler, Store};
use solocron_core::{
    ClaimMode, ClaimOutcome, ClaimRequest, HistoryQuery, RunRecord, RunState, Schedule, Tick, Trigger, LEASE_MIN,
};
use solocron_sqlite::SqliteStore;
use tokio_util::sync::CancellationToken;

/// How long the scheduler runs: ticks of three or four seconds, every job due every second.
const RUN_FOR: Duration = Duration::from_millis(3500);
/// How long a run of the `overlaps` job lasts: more than a second, so the next tick finds it
/// running, and more than its renew interval, so its lease is renewed.
const LONG_RUN: Duration = Duration::from_millis(1600);

/// A metric's name and labels, sorted: `(name, [(label, value)])`.
type Key = (String, Vec<(String, String)>);

/// What the recorder saw. Taken once, at the end: a snapshot of the debugging recorder
/// resets what it reads (counters and gauges to 0, histograms emptied).
#[derive(Default)]
struct Readings {
    counters: HashMap<Key, u64>,
    gauges: HashMap<Key, f64>,
    histograms: HashMap<Key, Vec<f64>>,
    described: Vec<String>,
}

impl Readings {
    fn take(&mut self, snapshotter: &Snapshotter) {
        for (key, _unit, description, value) in snapshotter.snapshot().into_vec() {
            let (_, key) = key.into_parts();
            let mut labels: Vec<_> = key.labels().map(|l| (l.key().to_owned(), l.value().to_owned())).collect();
            labels.sort();
            let k = (key.name().to_owned(), labels);
            if description.is_some() {
                self.described.push(k.0.clone());
            }
            match value {
                DebugValue::Counter(n) => drop(self.counters.insert(k, n)),
                DebugValue::Gauge(v) => drop(self.gauges.insert(k, v.into_inner())),
                DebugValue::Histogram(vs) => self.histograms.entry(k).or_default().extend(vs.into_iter().map(|v| *v)),
            }
        }
    }

    fn gauge(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.gauges.get(&key(name, labels)).copied()
    }

    /// The counters of `name`, by labels.
    fn counters(&self, name: &str) -> HashMap<Vec<(String, String)>, u64> {
        self.counters.iter().filter(|((n, _), _)| n == name).map(|((_, l), v)| (l.clone(), *v)).collect()
    }
}

fn key(name: &str, labels: &[(&str, &str)]) -> Key {
    let mut labels: Vec<_> = labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    labels.sort();
    (name.to_owned(), labels)
}

/// The `ticks_total` labels a record of this node's (a single node) is counted under.
fn counted_as(r: &RunRecord) -> Vec<(String, String)> {
    let mut labels = vec![("job", r.id.tick.job.as_str())];
    let reason = r.reason.as_deref().unwrap_or("");
    match r.state {
        RunState::Skipped if reason.starts_with("missed") => labels.push(("outcome", "missed")),
        RunState::Skipped => {
            labels.push(("outcome", "skipped"));
            let kind = ["overlap", "paused"].into_iter().find(|k| reason.starts_with(k)).unwrap_or("other");
            labels.push(("reason", kind));
        }
        state => labels.push(("outcome", state.as_str())),
    }
    key("", &labels).1
}

/// A job of `handler`, due every second.
fn job(name: &str, handler: impl Handler) -> Job {
    Job::new(name, Schedule::parse("* * * * * *", "UTC").unwrap(), handler)
}

/// The node said to have recorded a tick before the test's node started.
const EARLIER: &str = "earlier";

/// One node with a job of each kind of end: succeeds, fails, times out, runs so long its
/// next tick is skipped as an overlap, is paused, and had ticks missed before the node
/// started (its misfire policy records them skipped).
async fn run_node(store: Arc<dyn Store>) {
    store.set_paused("paused", true, "alice", Some("disk full")).await.unwrap();
    let timed =
        JobPolicy { timeout: Some(Duration::from_millis(200)), overlap: Overlap::Allow, ..JobPolicy::default() };
    let long = JobPolicy { lease: Duration::from_secs(3), kill_grace: Duration::from_secs(1), ..JobPolicy::default() };
    let missing = JobPolicy { misfire: Misfire::Skip, catchup: Duration::from_secs(15), ..JobPolicy::default() };
    // `missed` existed before this node started (a job the store never saw missed
    // nothing): a record of its, by an earlier node, 20 s ago.
    let earlier = solocron_core::ClaimRequest {
        tick: solocron_core::Tick::new("missed", chrono::Utc::now() - chrono::Duration::seconds(20)),
        trigger: Trigger::Catchup,
        node: EARLIER.into(),
        lease: Duration::from_secs(10),
        mode: solocron_core::ClaimMode::Skip { reason: "before this test".into() },
        nonce: 0,
    };
    store.claim(&[earlier]).await.unwrap();
    let scheduler = Scheduler::builder(store)
        .node_id("n1")
        .shutdown_grace(Duration::from_secs(5))
        .job(job("succeeds", handler_fn(|_| async { Ok(()) })))
        .job(job("fails", handler_fn(|_| async { Err("boom".into()) })))
        .job(
            job(
                "times-out",
                handler_fn(|ctx: RunContext| async move {
                    ctx.cancel.cancelled().await;
                    Err("stopped".into())
                }),
            )
            .with_policy(timed),
        )
        .job(
            job(
                "overlaps",
                handler_fn(|_| async {
                    tokio::time::sleep(LONG_RUN).await;
                    Ok(())
                }),
            )
            .with_policy(long),
        )
        .job(job("paused", handler_fn(|_| async { Ok(()) })))
        .job(job("missed", handler_fn(|_| async { Ok(()) })).with_policy(missing))
        .build()
        .unwrap();
    let shutdown = CancellationToken::new();
    let node = tokio::spawn(scheduler.run(shutdown.clone()));
    tokio::time::sleep(RUN_FOR).await;
    shutdown.cancel();
    node.await.unwrap();
}

/// Runs `scenario` on a current-thread runtime under a recorder local to this thread (so it
/// sees every task of the scheduler, and tests in this file run side by side, each with its
/// own recorder), with a fresh SQLite store in `dir`; what the recorder saw, and what
/// `scenario` returned.
fn recorded<T, F: std::future::Future<Output = T>>(
    dir: &tempfile::TempDir,
    scenario: impl FnOnce(Arc<dyn Store>) -> F,
) -> (Readings, T) {
    let recorder = DebuggingRecorder::new();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let out = metrics::with_local_recorder(&recorder, || {
        rt.block_on(async {
            let store = SqliteStore::connect(&url(dir), &solocron::Prefix::default()).await.unwrap();
            store.migrate().await.unwrap();
            scenario(Arc::new(store)).await
        })
    });
    let mut readings = Readings::default();
    readings.take(&recorder.snapshotter());
    (readings, out)
}

fn url(dir: &tempfile::TempDir) -> String {
    format!("sqlite://{}/s.db", dir.path().display())
}

#[test]
fn metrics_count_every_tick_as_the_store_recorded_it() {
    let dir = tempfile::tempdir().unwrap();
    let (readings, history) = recorded(&dir, |store| async move {
        run_node(store.clone()).await;
        let all = store.history(&HistoryQuery { limit: 1000, ..HistoryQuery::default() }).await.unwrap();
        all.into_iter().filter(|r| r.node != EARLIER).collect::<Vec<_>>()
    });

    // Every record of the store is counted once, under its job and outcome, and nothing else.
    let mut expected: HashMap<Vec<(String, String)>, u64> = HashMap::new();
    for r in &history {
        *expected.entry(counted_as(r)).or_default() += 1;
    }
    let ticks = readings.counters(m::TICKS_TOTAL);
    assert_eq!(ticks, expected, "ticks_total against the store's records: {history:#?}");
    let at_least = |labels: &[(&str, &str)], n: u64| {
        let got = ticks.get(&key("", labels).1).copied().unwrap_or(0);
        assert!(got >= n, "{labels:?}: {got} < {n}; {ticks:?}");
    };
    at_least(&[("job", "succeeds"), ("outcome", "succeeded")], 3);
    at_least(&[("job", "fails"), ("outcome", "failed")], 3);
    at_least(&[("job", "times-out"), ("outcome", "timed_out")], 3);
    at_least(&[("job", "overlaps"), ("outcome", "succeeded")], 1);
    at_least(&[("job", "overlaps"), ("outcome", "skipped"), ("reason", "overlap")], 1);
    at_least(&[("job", "paused"), ("outcome", "skipped"), ("reason", "paused")], 3);
    at_least(&[("job", "missed"), ("outcome", "missed")], 4);

    // Each start on schedule's lateness was observed (not catch-ups'), and was small but
    // for the `missed` job's ticks run within its late tolerance.
    let late = &readings.histograms[&key(m::START_LATENESS_SECONDS, &[])];
    let on_time = |r: &&RunRecord| r.trigger == Trigger::Schedule && r.started_at.is_some();
    assert!(history.iter().filter(on_time).count() >= 6, "{history:#?}");
    assert_eq!(late.len(), history.iter().filter(on_time).count(), "one lateness per start on schedule");
    let punctual = history.iter().filter(on_time).filter(|r| r.id.tick.job != "missed").count();
    assert!(late.iter().filter(|&&s| (0.0..1.0).contains(&s)).count() >= punctual, "lateness {late:?}");
    let rounds = &readings.histograms[&key(m::CLAIM_ROUND_DURATION_SECONDS, &[])];
    assert!(rounds.len() >= 3 && rounds.iter().all(|&s| s > 0.0 && s < 5.0), "claim rounds {rounds:?}");

    // Set (so runs came and went) and back to 0: as many runs left as entered.
    assert_eq!(readings.gauge(m::RUNS_IN_PROGRESS, &[]), Some(0.0), "every run ended");
    assert_eq!(readings.gauge(m::JOBS, &[]), Some(6.0));
    let lead = readings.gauge(m::CLAIM_LEAD_SECONDS, &[]).expect("the lead is set");
    assert!((solocron::CLAIM_AHEAD.as_secs_f64()..=solocron::CLAIM_AHEAD_MAX.as_secs_f64()).contains(&lead));
    let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs_f64();
    let last = readings.gauge(m::LAST_SUCCESS_TIMESTAMP_SECONDS, &[("job", "succeeds")]).expect("a success");
    assert!(now - last < RUN_FOR.as_secs_f64() + 1.0 && last <= now, "last success {last}, now {now}");
    assert_eq!(readings.gauge(m::LAST_SUCCESS_TIMESTAMP_SECONDS, &[("job", "fails")]), None);

    let renewals = readings.counters(m::LEASE_RENEWALS_TOTAL);
    assert!(renewals.get(&key("", &[("result", "ok")]).1) >= Some(&1), "renewals {renewals:?}");
    assert_eq!(renewals.len(), 1, "only successful renewals: {renewals:?}");
    assert!(readings.counters(m::STORE_ERRORS_TOTAL).is_empty(), "no store error");
    assert!(readings.counters(m::LEASES_LOST_TOTAL).is_empty(), "no lease lost");
    for name in [m::TICKS_TOTAL, m::START_LATENESS_SECONDS, m::RUNS_IN_PROGRESS, m::JOBS] {
        assert!(readings.described.iter().any(|d| d == name), "{name} has a description");
    }
}

/// A tick of `job` claimed a minute ago by a node that then died: its 500 ms lease runs out.
async fn claimed_by_a_dead_node(store: &dyn Store, job: &str) {
    let at = chrono::DateTime::from_timestamp(chrono::Utc::now().timestamp() - 60, 0).unwrap();
    let request = ClaimRequest {
        tick: Tick::new(job, at),
        trigger: Trigger::Schedule,
        node: "dead".into(),
        lease: LEASE_MIN,
        mode: ClaimMode::Run { skip_if_running: false },
        nonce: 0,
    };
    let won = store.claim(&[request]).await.unwrap();
    assert!(matches!(won[..], [ClaimOutcome::Won(_)]), "{won:?}");
}

/// Polls until `job` has a run in progress.
async fn until_running(store: &dyn Store, job: &str) {
    let q = HistoryQuery { job: Some(job.into()), state: Some(RunState::Running), ..HistoryQuery::default() };
    while store.history(&q).await.unwrap().is_empty() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A node that recovers two dead nodes' runs (one retried, one abandoned), loses the lease
/// of a run an operator unlocks, and then finds its store broken (the runs table renamed).
async fn run_troubled_node(store: Arc<dyn Store>, url: &str) {
    claimed_by_a_dead_node(store.as_ref(), "retried").await;
    claimed_by_a_dead_node(store.as_ref(), "abandoned").await;
    let yearly = || Schedule::parse("0 0 0 1 1 *", "UTC").unwrap();
    let ok = || handler_fn(|_| async { Ok(()) });
    let retry = JobPolicy { on_crash: OnCrash::Retry, ..JobPolicy::default() };
    // Renewed every 500 ms: the unlock is noticed within that.
    let short = JobPolicy {
        lease: Duration::from_millis(1500),
        kill_grace: Duration::from_millis(300),
        overlap: Overlap::Allow,
        ..JobPolicy::default()
    };
    let until_stopped = handler_fn(|ctx: RunContext| async move {
        ctx.cancel.cancelled().await;
        Err("stopped".into())
    });
    let scheduler = Scheduler::builder(store.clone())
        .node_id("n1")
        .recovery_interval(Duration::from_millis(200))
        .shutdown_grace(Duration::from_secs(1))
        .job(Job::new("retried", yearly(), ok()).with_policy(retry))
        .job(Job::new("abandoned", yearly(), ok()))
        .job(job("unlocked", until_stopped).with_policy(short))
        .build()
        .unwrap();
    let shutdown = CancellationToken::new();
    let node = tokio::spawn(scheduler.run(shutdown.clone()));
    until_running(store.as_ref(), "unlocked").await;
    // Paused first, so that no later tick of the job is running when the store breaks.
    store.set_paused("unlocked", true, "ops", None).await.unwrap();
    assert_eq!(store.unlock("unlocked", "ops", "stuck").await.unwrap().len(), 1);
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let mut conn = <sqlx::SqliteConnection as sqlx::Connection>::connect(url).await.unwrap();
    sqlx::query(&format!("ALTER TABLE {p}runs RENAME TO {p}runs_gone", p = solocron::Prefix::default().table_prefix()))
        .execute(&mut conn)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    shutdown.cancel();
    node.await.unwrap();
}

#[test]
fn recoveries_lost_leases_and_store_errors_are_counted() {
    let dir = tempfile::tempdir().unwrap();
    let url = url(&dir);
    let (readings, ()) = recorded(&dir, |store| async move { run_troubled_node(store, &url).await });
    let ticks = readings.counters(m::TICKS_TOTAL);
    let count = |job: &str, outcome: &str| ticks.get(&key("", &[("job", job), ("outcome", outcome)]).1).copied();
    assert_eq!(count("abandoned", "abandoned"), Some(1), "{ticks:?}");
    // The dead node's attempt recorded lost by the recovery, and the retry run here.
    assert_eq!(count("retried", "lost"), Some(1), "{ticks:?}");
    assert_eq!(count("retried", "succeeded"), Some(1), "{ticks:?}");
    // The unlocked run's end stands as the operator's `abandoned`, recorded by nobody here.
    assert_eq!(count("unlocked", "lost"), None, "{ticks:?}");
    assert!(count("unlocked", "skipped").is_none() && count("unlocked", "abandoned").is_none(), "{ticks:?}");
    let lost = readings.counters(m::LEASES_LOST_TOTAL);
    assert_eq!(lost, HashMap::from([(key("", &[("job", "unlocked")]).1, 1)]));
    let renewals = readings.counters(m::LEASE_RENEWALS_TOTAL);
    assert_eq!(renewals.get(&key("", &[("result", "refused")]).1), Some(&1), "{renewals:?}");
    let errors = readings.counters(m::STORE_ERRORS_TOTAL);
    for operation in ["claim", "recover"] {
        assert!(errors.get(&key("", &[("operation", operation)]).1) >= Some(&1), "{operation}: {errors:?}");
    }
    // Retries are late by design: only starts on schedule are observed (the `unlocked`
    // job's, one per tick it started).
    let late = readings.histograms.get(&key(m::START_LATENESS_SECONDS, &[])).map_or(0, Vec::len);
    let retried = count("retried", "succeeded").unwrap_or(0) as usize;
    assert!(retried == 1 && late <= 3, "retries are not observed: {late} observations");
    assert_eq!(readings.gauge(m::RUNS_IN_PROGRESS, &[]), Some(0.0));
}
