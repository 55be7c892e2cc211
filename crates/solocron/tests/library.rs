//! The library API with in-process handlers, several schedulers racing on one real SQLite
//! file, each with its own connection pool (as separate processes would have).
#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use solocron::{handler_fn, Job, RunContext, Scheduler};
use solocron_core::{Clock, HistoryQuery, JobPolicy, RunState, Schedule, Store};
use solocron_sqlite::SqliteStore;
use tokio_util::sync::CancellationToken;

/// A node whose wall clock is off by `skew_ms`.
struct Skewed(i64);

impl Clock for Skewed {
    fn now(&self) -> DateTime<Utc> {
        Utc::now() + chrono::Duration::milliseconds(self.0)
    }
}

/// (scheduled instant, node, fencing token, handler start) of each run.
type Seen = Arc<Mutex<Vec<(DateTime<Utc>, String, u64, DateTime<Utc>)>>>;

fn recording_job(name: &str, expr: &str, seen: Seen, policy: JobPolicy) -> Job {
    let handler = handler_fn(move |ctx: RunContext| {
        let seen = seen.clone();
        async move {
            seen.lock().unwrap().push((ctx.scheduled_at, ctx.node_id.clone(), ctx.fencing_token, Utc::now()));
            Ok(())
        }
    });
    Job::new(name, Schedule::parse(expr, "UTC").unwrap(), handler).with_policy(policy)
}

async fn store(dir: &tempfile::TempDir) -> Arc<dyn Store> {
    let s = SqliteStore::connect(&format!("sqlite://{}/s.db", dir.path().display()), &solocron::Prefix::default())
        .await
        .unwrap();
    s.migrate().await.unwrap();
    Arc::new(s)
}

/// A node whose wall clock jumps `by_ms` ahead once `after` has passed.
struct Jumping {
    start: std::time::Instant,
    after: Duration,
    by_ms: i64,
}

impl Clock for Jumping {
    fn now(&self) -> DateTime<Utc> {
        let jump = if self.start.elapsed() >= self.after { self.by_ms } else { 0 };
        Utc::now() + chrono::Duration::milliseconds(jump)
    }
}

/// A node's clock jumps 3 s ahead between two of its store-clock samples: its next claims
/// come 3 s early by the store's clock, the store refuses them as too early (with its time,
/// which corrects the node), and every tick still runs once, none before its instant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_clock_jumps_ahead_is_refused_by_the_store_and_runs_nothing_early() {
    clock_jumps_ahead(3000).await;
}

/// The same with a jump past the late tolerance (10 s): the ticks the node then takes for
/// long missed are still its on-time ones, claimed at their instants.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_clock_jumps_far_ahead_loses_no_tick() {
    clock_jumps_ahead(15_000).await;
}

async fn clock_jumps_ahead(by_ms: i64) {
    let dir = tempfile::tempdir().unwrap();
    let seen: Seen = Arc::default();
    let shutdown = CancellationToken::new();
    let clock = Jumping { start: std::time::Instant::now(), after: Duration::from_millis(2500), by_ms };
    let s = Scheduler::builder(store(&dir).await)
        .node_id("jumpy")
        .clock(Arc::new(clock))
        .job(recording_job("jumpy", "* * * * * *", seen.clone(), JobPolicy::default()))
        .build()
        .unwrap();
    let node = tokio::spawn(s.run(shutdown.clone()));
    tokio::time::sleep(Duration::from_secs(7)).await;
    shutdown.cancel();
    node.await.unwrap();
    let seen = seen.lock().unwrap().clone();
    let early: Vec<_> = seen.iter().filter(|(t, _, _, started)| started < t).collect();
    assert!(early.is_empty(), "started before their instants by the store's clock: {early:?}");
    let mut ticks: Vec<DateTime<Utc>> = seen.iter().map(|(t, _, _, _)| *t).collect();
    let n = ticks.len();
    ticks.dedup();
    assert_eq!(ticks.len(), n, "a tick ran twice: {seen:?}");
    assert!(n >= 6, "ticks were missed after the jump: {seen:?}");
    assert!(ticks.windows(2).all(|w| (w[1] - w[0]).num_milliseconds() == 1000), "a tick is missing: {seen:?}");
    // Refused ticks are claimed again at their instants, not after a backoff or a wait.
    let late: Vec<i64> = seen.iter().map(|(t, _, _, started)| (*started - *t).num_milliseconds()).collect();
    assert!(late.iter().all(|&ms| ms < 300), "ticks started late after the refusals (ms): {late:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_with_skewed_clocks_still_run_each_tick_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let seen: Seen = Arc::default();
    let shutdown = CancellationToken::new();
    let mut nodes = Vec::new();
    for (id, skew) in [("behind", -700), ("exact", 0), ("ahead", 700)] {
        let s = Scheduler::builder(store(&dir).await)
            .node_id(id)
            .clock(Arc::new(Skewed(skew)))
            .job(recording_job("skewed", "* * * * * *", seen.clone(), JobPolicy::default()))
            .build()
            .unwrap();
        nodes.push(tokio::spawn(s.run(shutdown.clone())));
    }
    tokio::time::sleep(Duration::from_secs(8)).await;
    shutdown.cancel();
    for n in nodes {
        n.await.unwrap();
    }
    let seen = seen.lock().unwrap().clone();
    let mut per_tick: BTreeMap<DateTime<Utc>, usize> = BTreeMap::new();
    for (t, _, _, _) in &seen {
        *per_tick.entry(*t).or_default() += 1;
    }
    assert!(per_tick.values().all(|&n| n == 1), "a tick ran twice: {per_tick:?}");
    assert!(per_tick.len() >= 7, "ticks were missed: {per_tick:?}");
    // Schedules follow the store's clock (here the host's), not the nodes' own: no tick
    // starts before its instant, though the node 700 ms ahead claims as early as it can.
    let early: Vec<_> = seen.iter().filter(|(t, _, _, started)| started < t).collect();
    assert!(early.is_empty(), "started before their instants by the store's clock: {early:?}");
    let mut late: Vec<i64> = seen.iter().map(|(t, _, _, started)| (*started - *t).num_milliseconds()).collect();
    late.sort_unstable();
    assert!(late[late.len() / 2] < 100, "the median start is late by the skew (ms): {late:?}");
    let ticks: Vec<_> = per_tick.keys().collect();
    assert!(ticks.windows(2).all(|w| (*w[1] - *w[0]).num_milliseconds() == 1000), "a gap: {ticks:?}");
    // Tokens rise in claim order (the store's guarantee, tested per store); with skew a
    // lagging node may claim an older tick after a newer one, so here: all distinct.
    let mut tokens: Vec<u64> = seen.iter().map(|s| s.2).collect();
    tokens.sort();
    tokens.dedup();
    assert_eq!(tokens.len(), seen.len(), "two runs shared a fencing token: {seen:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_past_its_timeout_is_cancelled_and_recorded_timed_out() {
    let dir = tempfile::tempdir().unwrap();
    let st = store(&dir).await;
    let policy = JobPolicy {
        timeout: Some(Duration::from_millis(300)),
        kill_grace: Duration::from_millis(300),
        lease: Duration::from_secs(2),
        overlap: solocron_core::Overlap::Allow,
        ..JobPolicy::default()
    };
    let polite = handler_fn(|ctx: RunContext| async move {
        ctx.cancel.cancelled().await;
        Err("cancelled as asked".into())
    });
    // Ignores cancellation: the engine drops it after kill_grace (+ slack) and still records.
    let stubborn = handler_fn(|_ctx: RunContext| async move {
        tokio::time::sleep(Duration::from_secs(3600)).await;
        Ok(())
    });
    let s = Scheduler::builder(st.clone())
        .node_id("n1")
        .job(Job::new("polite", Schedule::parse("*/2 * * * * *", "UTC").unwrap(), polite).with_policy(policy.clone()))
        .job(Job::new("stubborn", Schedule::parse("*/2 * * * * *", "UTC").unwrap(), stubborn).with_policy(policy))
        .build()
        .unwrap();
    let shutdown = CancellationToken::new();
    let node = tokio::spawn(s.run(shutdown.clone()));
    tokio::time::sleep(Duration::from_millis(4500)).await;
    shutdown.cancel();
    node.await.unwrap();
    for job in ["polite", "stubborn"] {
        let h = st.history(&HistoryQuery { job: Some(job.into()), ..HistoryQuery::default() }).await.unwrap();
        let ended: Vec<_> = h.iter().filter(|r| r.state != RunState::Skipped).collect();
        assert!(!ended.is_empty(), "{job}: no runs");
        assert!(ended.iter().all(|r| r.state == RunState::TimedOut), "{job}: {h:#?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_the_store_is_unavailable_nothing_runs_and_missed_ticks_follow_misfire_after() {
    let dir = tempfile::tempdir().unwrap();
    let st = store(&dir).await;
    let seen: Seen = Arc::default();
    // overlap = allow: every tick of the outage must run (with skip, a tick arriving while
    // a catch-up run is in progress is rightly recorded skipped instead).
    let policy = JobPolicy {
        misfire: solocron_core::Misfire::All,
        catchup: Duration::from_secs(60),
        max_catchup: 100,
        overlap: solocron_core::Overlap::Allow,
        ..JobPolicy::default()
    };
    let s = Scheduler::builder(st.clone())
        .node_id("n1")
        .job(recording_job("outage", "* * * * * *", seen.clone(), policy))
        .build()
        .unwrap();
    let shutdown = CancellationToken::new();
    let node = tokio::spawn(s.run(shutdown.clone()));
    tokio::time::sleep(Duration::from_secs(2)).await;
    // The outage: another connection holds SQLite's write lock for longer than the store's
    // busy timeout (10 s), so claims fail with "database is locked".
    let url = format!("sqlite://{}/s.db", dir.path().display());
    let mut locker = <sqlx::SqliteConnection as sqlx::Connection>::connect(&url).await.unwrap();
    sqlx::query("BEGIN EXCLUSIVE").execute(&mut locker).await.unwrap();
    let outage_start = Utc::now();
    let ran_before = seen.lock().unwrap().len();
    tokio::time::sleep(Duration::from_secs(15)).await;
    let ran_during: Vec<_> = seen.lock().unwrap()[ran_before..].to_vec();
    let outage_end = Utc::now();
    sqlx::query("ROLLBACK").execute(&mut locker).await.unwrap();
    tokio::time::sleep(Duration::from_secs(4)).await;
    shutdown.cancel();
    node.await.unwrap();
    // Nothing claimed during the outage ran during it (a claim that was in flight when the
    // lock was taken may have started just before).
    assert!(ran_during.len() <= 1, "ran without permission: {ran_during:?}");
    let h = st.history(&HistoryQuery { job: Some("outage".into()), ..HistoryQuery::default() }).await.unwrap();
    let mut per_tick: BTreeMap<DateTime<Utc>, usize> = BTreeMap::new();
    for r in &h {
        *per_tick.entry(r.id.tick.scheduled_at).or_default() += 1;
    }
    assert!(per_tick.values().all(|&n| n == 1), "a tick has two records");
    // Every tick of the outage ran once it was over: the older ones (past the late
    // tolerance) as catch-up runs by the misfire policy, the younger ones as late ticks.
    let in_outage: Vec<_> = h
        .iter()
        .filter(|r| r.id.tick.scheduled_at > outage_start + chrono::Duration::seconds(1))
        .filter(|r| r.id.tick.scheduled_at < outage_end - chrono::Duration::seconds(1))
        .collect();
    assert!(in_outage.len() >= 12, "{h:#?}");
    assert!(in_outage.iter().all(|r| r.state == RunState::Succeeded), "{in_outage:#?}");
    let caught_up = in_outage.iter().filter(|r| r.trigger == solocron_core::Trigger::Catchup).count();
    assert!(caught_up >= 2, "ticks older than the late tolerance went through misfire = all: {in_outage:#?}");
    let seen = seen.lock().unwrap();
    let mut ticks: Vec<_> = seen.iter().map(|s| s.0).collect();
    ticks.sort();
    ticks.dedup();
    assert_eq!(ticks.len(), seen.len(), "a tick ran twice");
    // Catch-up sequences that end with this round's ticks (claimed ahead) wait for them.
    let early: Vec<_> = seen.iter().filter(|s| s.3 < s.0).collect();
    assert!(early.is_empty(), "runs started before their instants: {early:?}");
}

/// Runs a job due every second on one node for `run_for`; (scheduled instant, handler
/// start) of each run, and the runs' records. Asserts that no handler started before its
/// instant and that no tick was claimed more than `CLAIM_AHEAD_MAX` (plus 5 ms for the
/// two clocks' reads) before it.
async fn punctual(
    store: Arc<dyn Store>,
    run_for: Duration,
) -> (Vec<[DateTime<Utc>; 2]>, Vec<solocron_core::RunRecord>) {
    let started: Arc<Mutex<Vec<[DateTime<Utc>; 2]>>> = Arc::default();
    let log = started.clone();
    let handler = handler_fn(move |ctx: RunContext| {
        log.lock().unwrap().push([ctx.scheduled_at, Utc::now()]);
        async { Ok(()) }
    });
    let job = Job::new("punctual", Schedule::parse("* * * * * *", "UTC").unwrap(), handler);
    let shutdown = CancellationToken::new();
    let node = Scheduler::builder(store.clone()).node_id("n").job(job).build().unwrap();
    let task = tokio::spawn(node.run(shutdown.clone()));
    tokio::time::sleep(run_for).await;
    shutdown.cancel();
    task.await.unwrap();
    let mut started = started.lock().unwrap().clone();
    started.sort();
    for [scheduled, at] in &started {
        assert!(at >= scheduled, "a handler started before its instant: {scheduled} at {at}");
    }
    let q = HistoryQuery { job: Some("punctual".into()), limit: 100, ..Default::default() };
    let runs = store.history(&q).await.unwrap();
    let limit = chrono::Duration::from_std(solocron::CLAIM_AHEAD_MAX).unwrap() + chrono::Duration::milliseconds(5);
    assert!(runs.iter().all(|r| r.id.tick.scheduled_at - r.claimed_at <= limit), "claimed too early: {runs:#?}");
    (started, runs)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ticks_are_claimed_just_ahead_and_handlers_start_at_their_instant_never_before() {
    let dir = tempfile::tempdir().unwrap();
    let (started, runs) = punctual(store(&dir).await, Duration::from_millis(4500)).await;
    assert!(started.len() >= 3, "{started:?}");
    // The claim itself happened before the instant (by the store's clock, same host).
    let ahead = runs.iter().filter(|r| r.claimed_at < r.id.tick.scheduled_at).count();
    assert!(ahead * 2 >= runs.len(), "most ticks should be claimed ahead of their instant: {runs:#?}");
}

/// Claims that take longer than `CLAIM_AHEAD` (a slow store, or 1,000 ticks due at once)
/// are sent earlier, once a node has seen them take that long: the runs start at their
/// instant instead of a claim's length after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_claims_take_longer_than_the_lead_ticks_are_claimed_earlier_and_start_on_time() {
    let dir = tempfile::tempdir().unwrap();
    // 20 + 90 ms per claim: 60 ms past the instant with a 50 ms lead.
    let store = Arc::new(Distant { claim_delay: Duration::from_millis(90), ..Distant::new(store(&dir).await) });
    let (started, _) = punctual(store, Duration::from_millis(6500)).await;
    assert!(started.len() >= 5, "{started:?}");
    // The first rounds measure the claim's length; the later ones start on time.
    let mut late: Vec<i64> = started[2..].iter().map(|[scheduled, at]| (*at - *scheduled).num_milliseconds()).collect();
    late.sort();
    assert!(late[late.len() / 2] < 30, "runs still start a claim's length late (ms): {late:?}");
}

/// A node whose wall clock stands still at one instant (the test's stand-in for "this
/// round began exactly then").
struct Frozen(DateTime<Utc>);

impl Clock for Frozen {
    fn now(&self) -> DateTime<Utc> {
        self.0
    }
}

/// Makes `job` known to the store since `at` (a record of its tick then), so that a node
/// starting with it catches up its missed ticks (a job the store never saw missed none).
async fn known_since(store: &dyn Store, job: &str, at: DateTime<Utc>) {
    let request = solocron_core::ClaimRequest {
        tick: solocron_core::Tick::new(job, at),
        trigger: solocron_core::Trigger::Catchup,
        node: "earlier".into(),
        lease: Duration::from_secs(10),
        mode: solocron_core::ClaimMode::Skip { reason: "before this test".into() },
        nonce: 0,
    };
    store.claim(&[request]).await.unwrap();
}

/// A catch-up sequence (here: a node starting with missed ticks in its catch-up window)
/// ends with the round's on-time ticks, claimed up to the lead before their instants: those
/// wait for their instants like any other run claimed ahead, instead of starting as soon as
/// the sequence reaches them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_catch_up_sequence_that_reaches_a_tick_claimed_ahead_waits_for_its_instant() {
    const AHEAD: i64 = 45; // ms before the next whole second: inside the 50 ms lead
    let dir = tempfile::tempdir().unwrap();
    // In the past by the real clock (the SQLite file's, which judges claims): a scheduled
    // claim of a tick ahead of it would be refused as too early.
    let next_second = Utc::now().timestamp() - 60;
    let instant = DateTime::from_timestamp(next_second, 0).unwrap();
    let frozen = instant - chrono::Duration::milliseconds(AHEAD);
    // (scheduled instant, handler start by the monotonic clock)
    type Starts = Arc<Mutex<Vec<(DateTime<Utc>, std::time::Instant)>>>;
    let started: Starts = Arc::default();
    let log = started.clone();
    let handler = handler_fn(move |ctx: RunContext| {
        log.lock().unwrap().push((ctx.scheduled_at, std::time::Instant::now()));
        async { Ok(()) }
    });
    let policy = JobPolicy {
        misfire: solocron_core::Misfire::All,
        catchup: Duration::from_secs(15),
        overlap: solocron_core::Overlap::Allow,
        ..JobPolicy::default()
    };
    let job = Job::new("sequence", Schedule::parse("* * * * * *", "UTC").unwrap(), handler).with_policy(policy);
    let shutdown = CancellationToken::new();
    // The store's clock stands still with the node's: nothing to correct.
    let clock: Arc<dyn Clock> = Arc::new(Frozen(frozen));
    let store =
        Arc::new(Distant { clock: Some(clock.clone()), call: Duration::ZERO, ..Distant::new(store(&dir).await) });
    known_since(store.as_ref(), "sequence", instant - chrono::Duration::seconds(30)).await;
    let node = Scheduler::builder(store).node_id("n").clock(clock).job(job).build().unwrap();
    let task = tokio::spawn(node.run(shutdown.clone()));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    shutdown.cancel();
    task.await.unwrap();
    let started = started.lock().unwrap().clone();
    let start_of = |t: DateTime<Utc>| started.iter().find(|s| s.0 == t).map(|s| s.1);
    let (Some(last_missed), Some(ahead)) = (start_of(instant - chrono::Duration::seconds(1)), start_of(instant)) else {
        panic!("the sequence did not run its last late tick and the tick claimed ahead: {started:?}");
    };
    assert!(started.len() >= 10, "the missed ticks were caught up: {started:?}");
    // By the node's clock, the tick claimed ahead was AHEAD ms away when the sequence
    // claimed it, after the previous run had started.
    let waited = ahead.duration_since(last_missed);
    assert!(
        waited >= Duration::from_millis(AHEAD as u64),
        "the tick claimed ahead started {waited:?} after the previous run of its sequence, before its instant"
    );
}

/// With overlap = skip, a job catching up on a node is busy: the on-time ticks that come due
/// while its catch-up sequence still works through missed and late ticks (slowly: every
/// store call takes 100 ms) are recorded skipped at once, never claimed to run beside the
/// sequence, where one would run before the older ticks or make one of them (the latest
/// missed tick, with misfire = once) be recorded as overlapping it. Once the sequence is
/// over, on-time ticks run again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_time_ticks_that_come_during_a_catch_up_are_skipped_and_never_run_before_its_older_ticks() {
    let dir = tempfile::tempdir().unwrap();
    let inner = store(&dir).await;
    let seen: Seen = Arc::default();
    let policy = JobPolicy {
        misfire: solocron_core::Misfire::Once,
        catchup: Duration::from_secs(16),
        max_catchup: 3,
        ..JobPolicy::default()
    };
    let job = recording_job("ordered", "* * * * * *", seen.clone(), policy);
    let started = Utc::now();
    known_since(inner.as_ref(), "ordered", started - chrono::Duration::seconds(15)).await;
    let store = Arc::new(Distant { call: Duration::from_millis(100), ..Distant::new(inner.clone()) });
    let node = Scheduler::builder(store).node_id("n").job(job).build().unwrap();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(node.run(shutdown.clone()));
    let query = HistoryQuery { job: Some("ordered".into()), ..HistoryQuery::default() };
    // Done once an on-time tick after every one skipped for the catch-up has run: the
    // sequence is over and on-time ticks run again.
    let catching_up =
        |r: &RunRecord| r.state == RunState::Skipped && r.reason.as_deref().is_some_and(|w| w.contains("catch-up"));
    let ran_on_time = |h: &[RunRecord]| {
        let last_skipped = h.iter().filter(|r| catching_up(r)).map(|r| r.id.tick.scheduled_at).max();
        last_skipped.is_some_and(|s| h.iter().any(|r| r.id.tick.scheduled_at > s && r.state == RunState::Succeeded))
    };
    let mut h = Vec::new();
    for _ in 0..120 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        h = inner.history(&query).await.unwrap();
        if ran_on_time(&h) {
            break;
        }
    }
    shutdown.cancel();
    task.await.unwrap();
    assert!(ran_on_time(&h), "no on-time tick ran after the catch-up within 30 s: {h:#?}");
    // The handlers started in schedule order (`seen` is in the order they started).
    let order: Vec<_> = seen.lock().unwrap().iter().map(|s| s.0).collect();
    assert!(order.windows(2).all(|w| w[0] < w[1]), "runs out of schedule order: {order:?}\n{h:#?}");
    // The latest missed tick ran (misfire = once), and every late one after it.
    let missed_ran =
        h.iter().filter(|r| r.trigger == solocron_core::Trigger::Catchup && r.state == RunState::Succeeded);
    assert_eq!(missed_ran.count(), 1, "{h:#?}");
    let late = |r: &&RunRecord| r.trigger == solocron_core::Trigger::Schedule && r.id.tick.scheduled_at < started;
    assert!(h.iter().filter(late).count() >= 4, "{h:#?}");
    assert!(h.iter().filter(late).all(|r| r.state == RunState::Succeeded), "{h:#?}");
    // The sequence outlasted on-time ticks (the case under test): those were recorded
    // skipped as the catch-up's, before the sequence's last claim.
    let last_late = h.iter().filter(late).map(|r| r.claimed_at).max().unwrap();
    let during: Vec<_> = h.iter().filter(|r| r.id.tick.scheduled_at > started && r.claimed_at < last_late).collect();
    assert!(!during.is_empty(), "{h:#?}");
    assert!(during.iter().all(|r| catching_up(r)), "{during:#?}");
}

/// A catch-up sequence whose first runs' ends take the store 5 s each to record (slow, or
/// down and back, after each handler ended) is held by the store, not by its own runs: a
/// late tick it reaches past the late tolerance because of that follows misfire (once: the
/// latest of a stretch runs as a catch-up, the others are recorded skipped), never runs as
/// a scheduled tick that late.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_catch_up_sequence_held_by_slow_end_records_judges_its_late_ticks_missed() {
    let dir = tempfile::tempdir().unwrap();
    let inner = store(&dir).await;
    let seen: Seen = Arc::default();
    let policy =
        JobPolicy { misfire: solocron_core::Misfire::Once, catchup: Duration::from_secs(60), ..JobPolicy::default() };
    let job = recording_job("held", "* * * * * *", seen, policy);
    let started = Utc::now();
    // Missed ticks 12 and 11 s ago (past the 10 s tolerance), late ones queued behind them.
    known_since(inner.as_ref(), "held", started - chrono::Duration::seconds(12)).await;
    let slow = Distant { finish_delay: Duration::from_secs(5), ..Distant::new(inner.clone()) };
    slow.slow_finishes.store(2, Ordering::SeqCst);
    let node = Scheduler::builder(Arc::new(slow)).node_id("n").job(job).build().unwrap();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(node.run(shutdown.clone()));
    let query = HistoryQuery { job: Some("held".into()), limit: 1_000, ..HistoryQuery::default() };
    // Over once a tick due after the start ran on time: the sequence is done.
    let on_time = |r: &RunRecord| {
        r.id.tick.scheduled_at > started
            && r.state == RunState::Succeeded
            && r.claimed_at - r.id.tick.scheduled_at < chrono::Duration::seconds(1)
    };
    let mut h = Vec::new();
    for _ in 0..160 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        h = inner.history(&query).await.unwrap();
        if h.iter().any(on_time) {
            break;
        }
    }
    shutdown.cancel();
    task.await.unwrap();
    assert!(h.iter().any(on_time), "no on-time tick ran after the catch-up within 40 s: {h:#?}");
    let tolerance = chrono::Duration::from_std(solocron_core::LATE_TOLERANCE).unwrap();
    let slack = chrono::Duration::seconds(2);
    let late_scheduled: Vec<_> = h
        .iter()
        .filter(|r| {
            r.trigger == solocron_core::Trigger::Schedule && r.claimed_at - r.id.tick.scheduled_at > tolerance + slack
        })
        .collect();
    assert!(late_scheduled.is_empty(), "scheduled ticks claimed past the late tolerance: {late_scheduled:#?}");
    let judged_missed = |r: &&RunRecord| {
        r.state == RunState::Skipped
            && r.reason.as_deref().is_some_and(|w| w.contains("reached it past the late tolerance"))
    };
    assert!(h.iter().filter(judged_missed).count() >= 2, "late ticks the sequence reached past the tolerance: {h:#?}");
    let mut ticks: Vec<_> = h.iter().map(|r| r.id.tick.scheduled_at).collect();
    ticks.dedup();
    assert_eq!(ticks.len(), h.len(), "one record a tick");
}

/// A store far away: every call waits `DISTANT_CALL` before it goes through (a remote store
/// under load, or a link with a long round trip), so that ends recorded one call each queue
/// behind each other. It refuses (as `Invalid`, like a value the store cannot hold) any
/// end whose output holds `refuse`, and a batch that carries one. Its claims take
/// `claim_delay` more, and it counts the calls that renew leases.
struct Distant {
    inner: Arc<dyn Store>,
    /// How long every call waits before it goes through (`DISTANT_CALL`).
    call: Duration,
    refuse: Option<&'static str>,
    claim_delay: Duration,
    /// Calls of `renew` and of `renew_all`.
    renew_calls: AtomicUsize,
    renew_all_calls: AtomicUsize,
    /// Renewals hang (never answer) while set: a partition that refuses nothing.
    hang_renewals: std::sync::atomic::AtomicBool,
    /// How many claims still to lose the answer of: the claim commits, the caller gets an
    /// error (a connection that broke after the commit).
    lose_claim_answers: AtomicUsize,
    /// The store's clock, when not the host's (a test's frozen instant).
    clock: Option<Arc<dyn Clock>>,
    /// How much longer asking which ticks are taken takes, for the first `slow_taken`
    /// calls.
    taken_delay: Duration,
    slow_taken: AtomicUsize,
    /// How much longer recording ends takes, for the first `slow_finishes` calls.
    finish_delay: Duration,
    slow_finishes: AtomicUsize,
}

const DISTANT_CALL: Duration = Duration::from_millis(20);

impl Distant {
    fn new(inner: Arc<dyn Store>) -> Distant {
        Distant {
            inner,
            call: DISTANT_CALL,
            refuse: None,
            claim_delay: Duration::ZERO,
            renew_calls: AtomicUsize::new(0),
            renew_all_calls: AtomicUsize::new(0),
            hang_renewals: std::sync::atomic::AtomicBool::new(false),
            lose_claim_answers: AtomicUsize::new(0),
            clock: None,
            taken_delay: Duration::ZERO,
            slow_taken: AtomicUsize::new(0),
            finish_delay: Duration::ZERO,
            slow_finishes: AtomicUsize::new(0),
        }
    }

    /// `call`, and `finish_delay` more for the first `slow_finishes` calls that record ends.
    async fn wait_to_finish(&self) {
        let slow = self.slow_finishes.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        tokio::time::sleep(self.call + if slow.is_ok() { self.finish_delay } else { Duration::ZERO }).await;
    }

    async fn hang_if_partitioned(&self) {
        if self.hang_renewals.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
    }

    fn refuses(&self, end: &RunEnd) -> Result<(), StoreError> {
        match self.refuse {
            Some(bad) if end.output.contains(bad) => Err(StoreError::Invalid(format!("cannot store `{bad}`"))),
            _ => Ok(()),
        }
    }
}

/// Each role trait of `Distant`: its own methods (`{ … }`), then those that only wait a
/// round trip and ask the inner store (`[ … ]`).
macro_rules! distant {
    ($($tr:ident { $($own:tt)* } [$($name:ident($($arg:ident: $ty:ty),*) -> $out:ty;)*])*) => {
        $(
            #[async_trait::async_trait]
            impl $tr for Distant {
                $($own)*
                $(async fn $name(&self, $($arg: $ty),*) -> Result<$out, StoreError> {
                    tokio::time::sleep(self.call).await;
                    self.inner.$name($($arg),*).await
                })*
            }
        )*
    };
}

use solocron_core::{
    ActionQuery, ActionRecord, AuditStore, ClaimOutcome, ClaimRequest, ClaimStore, ControlStore, Ending, FleetStore,
    HistoryStore, JobControl, JobDefinition, Lease, ManagedStore, NodeBeat, NodeRecord, RecoverAction, RecoverOutcome,
    Registration, RegistryStore, Renewal, RequestStore, RunEnd, RunId, RunRecord, RunRequest, RunStore, SchemaStore,
    StoreBase, StoreError, Tick,
};

distant! {
    StoreBase {
        fn describe(&self) -> String {
            self.inner.describe()
        }
        async fn now(&self) -> Result<DateTime<Utc>, StoreError> {
            tokio::time::sleep(self.call).await;
            match &self.clock {
                Some(clock) => Ok(clock.now()),
                None => self.inner.now().await,
            }
        }
    } []
    SchemaStore {} [
        migrate() -> ();
        schema() -> solocron_core::SchemaState;
    ]
    ClaimStore {
        async fn claim(&self, requests: &[ClaimRequest]) -> Result<Vec<ClaimOutcome>, StoreError> {
            tokio::time::sleep(self.call + self.claim_delay).await;
            let outcomes = self.inner.claim(requests).await?;
            let lose = self.lose_claim_answers.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
            match lose {
                Ok(_) => Err(StoreError::Unavailable("the connection broke before the answer came".into())),
                Err(_) => Ok(outcomes),
            }
        }
        async fn taken_ticks(&self, ticks: &[Tick]) -> Result<Option<Vec<Tick>>, StoreError> {
            let slow = self.slow_taken.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
            let slow = if slow.is_ok() { self.taken_delay } else { Duration::ZERO };
            tokio::time::sleep(self.call + slow).await;
            self.inner.taken_ticks(ticks).await
        }
    } []
    RunStore {
        async fn finish(&self, lease: &Lease, end: &RunEnd) -> Result<bool, StoreError> {
            self.wait_to_finish().await;
            self.refuses(end)?;
            self.inner.finish(lease, end).await
        }
        async fn finish_all(&self, endings: &[Ending]) -> Result<Vec<bool>, StoreError> {
            self.wait_to_finish().await;
            endings.iter().try_for_each(|e| self.refuses(&e.end))?;
            self.inner.finish_all(endings).await
        }
        async fn renew(&self, lease: &Lease, length: Duration) -> Result<bool, StoreError> {
            self.renew_calls.fetch_add(1, Ordering::SeqCst);
            self.hang_if_partitioned().await;
            tokio::time::sleep(self.call).await;
            self.inner.renew(lease, length).await
        }
        async fn renew_all(&self, renewals: &[Renewal]) -> Result<Vec<bool>, StoreError> {
            self.renew_all_calls.fetch_add(1, Ordering::SeqCst);
            self.hang_if_partitioned().await;
            tokio::time::sleep(self.call).await;
            self.inner.renew_all(renewals).await
        }
    } [
        finish_for_retry(lease: &Lease, end: &RunEnd, after: Duration) -> bool;
        expired(limit: usize, namespaces: &solocron_core::Namespaces) -> Vec<RunRecord>;
        recover(run: &RunId, action: &RecoverAction) -> RecoverOutcome;
    ]
    HistoryStore {} [
        history(query: &HistoryQuery) -> Vec<RunRecord>;
        prune(older_than: Duration, batch: usize, namespaces: &solocron_core::Namespaces) -> u64;
    ]
    RegistryStore {} [
        register(node: &str, jobs: &[JobDefinition]) -> ();
        registrations() -> Vec<Registration>;
        controls() -> Vec<JobControl>;
    ]
    ControlStore {} [
        set_paused(job: &str, paused: bool, by: &str, reason: Option<&str>) -> ();
        unlock(job: &str, by: &str, reason: &str) -> Vec<RunId>;
    ]
    RequestStore {} [
        request_run(job: &str, by: &str, reason: Option<&str>) -> Tick;
        pending_requests(limit: usize, namespaces: &solocron_core::Namespaces) -> Vec<RunRequest>;
    ]
    FleetStore {} [
        heartbeat(beat: &NodeBeat) -> ();
        goodbye(node: &str) -> ();
        nodes() -> Vec<NodeRecord>;
    ]
    AuditStore {} [
        actions(query: &ActionQuery) -> Vec<ActionRecord>;
    ]
    ManagedStore {} []
}

/// Runs `jobs` jobs (leases of `lease`) due once at the same instant on one node over
/// `store`; job `failing` (if any) fails with `failure` as its output. Returns how many
/// handlers ran and the count of records per state once the node drained.
async fn one_herd(
    store: Arc<dyn Store>,
    jobs: usize,
    lease: Duration,
    failing: Option<(usize, &'static str)>,
) -> (usize, BTreeMap<String, usize>) {
    // One tick per job, at a whole second at least 3 s away: the node is claiming by then.
    let at = Utc::now() + chrono::Duration::seconds(4);
    let expr = format!("{} {} {} * * *", at.format("%S"), at.format("%M"), at.format("%H"));
    let ran = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut builder = Scheduler::builder(store.clone())
        .node_id("n")
        .shutdown_grace(Duration::from_secs(20))
        .max_concurrent_runs(jobs);
    for i in 0..jobs {
        let ran = ran.clone();
        let fails = failing.filter(|(f, _)| *f == i).map(|(_, why)| why);
        let handler = handler_fn(move |_ctx: RunContext| {
            ran.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            async move {
                match fails {
                    Some(why) => Err(why.into()),
                    None => Ok(()),
                }
            }
        });
        let job = Job::new(format!("job-{i:04}"), Schedule::parse(&expr, "UTC").unwrap(), handler);
        let policy = JobPolicy { lease, kill_grace: Duration::from_millis(300), ..JobPolicy::default() };
        builder = builder.job(job.with_policy(policy));
    }
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(builder.build().unwrap().run(shutdown.clone()));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(25);
    while ran.load(std::sync::atomic::Ordering::Relaxed) < jobs && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Past every lease: ends not recorded by then are left to recovery.
    tokio::time::sleep(lease + Duration::from_millis(500)).await;
    shutdown.cancel();
    task.await.unwrap();
    let all = store.history(&HistoryQuery { limit: jobs + 10, ..Default::default() }).await.unwrap();
    let mut states: BTreeMap<String, usize> = BTreeMap::new();
    for r in &all {
        *states.entry(r.state.to_string()).or_default() += 1;
    }
    (ran.load(std::sync::atomic::Ordering::Relaxed), states)
}

/// 3,000 runs (3 s leases) that start and end at the same instant on one node, through a
/// store 20 ms away: one `finish` call each would take ~4 s at 16 in flight, past the
/// 2.7 s an owner trusts its lease after the claim, and the last runs would be left to
/// recovery. Batched, every run records its own end, and the node drains with nothing left
/// running. (A 1 s lease made this test depend on the machine's load: a debug build's
/// 1,000-tick claim answered after lease/3 makes each run confirm its lease before it
/// starts, one renewal each.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_runs_ending_together_each_record_their_end() {
    const JOBS: usize = 3_000;
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Distant::new(store(&dir).await));
    let (ran, states) = one_herd(store, JOBS, Duration::from_secs(3), None).await;
    assert_eq!(ran, JOBS, "every job ran once; records by state: {states:?}");
    assert_eq!(states, BTreeMap::from([("succeeded".to_string(), JOBS)]), "every run recorded its own end");
}

/// 1,000 runs (4 s leases) whose one claim is answered 1.5 s late, past the 1.33 s after
/// which an owner confirms its lease before it starts the job: each run renews first, and
/// the node sends those renewals in a few batches rather than a thousand calls queued
/// behind the store (which left most runs `lost` on a loaded machine). Every job runs and
/// records its end. (With 1 s leases and a 400 ms delay, then 2 s and 800 ms, a debug
/// build's 1,000-tick SQLite claim on a host running two test suites took the rest of the
/// lease, and the last batch of renewals came too late: the margin measured the host, not
/// the batching.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_whose_claim_came_late_confirm_their_leases_in_batches() {
    const JOBS: usize = 1_000;
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Distant { claim_delay: Duration::from_millis(1_500), ..Distant::new(store(&dir).await) });
    let (ran, states) = one_herd(store.clone(), JOBS, Duration::from_secs(4), None).await;
    assert_eq!(ran, JOBS, "every job ran once; records by state: {states:?}");
    assert_eq!(states, BTreeMap::from([("succeeded".to_string(), JOBS)]), "every run recorded its own end");
    let (one, batches) = (store.renew_calls.load(Ordering::SeqCst), store.renew_all_calls.load(Ordering::SeqCst));
    println!("renewals: {one} one by one, {batches} batches");
    assert_eq!(one, 0, "the engine renews through batches");
    assert!(batches >= 1, "each run confirmed its late-claimed lease");
    assert!(batches <= JOBS / 10, "{batches} batches for {JOBS} renewals");
}

/// An end the store refuses (a value it cannot hold) fails only itself: the other ends of
/// its batch are recorded, and the refused run is left to recovery.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_end_the_store_refuses_fails_only_itself_not_its_batch() {
    const JOBS: usize = 200;
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Distant { refuse: Some("unstorable"), ..Distant::new(store(&dir).await) });
    let (ran, states) = one_herd(store, JOBS, Duration::from_secs(3), Some((13, "unstorable output"))).await;
    assert_eq!(ran, JOBS, "every job ran once");
    assert_eq!(states.get("succeeded"), Some(&(JOBS - 1)), "every other run recorded its end: {states:?}");
    assert_eq!(states.get("running").or(states.get("abandoned")), Some(&1), "{states:?}");
}

/// A herd of 6,000 jobs due at one instant on node `b`, beside a node that beats but claims
/// nothing (`ghost`): `b` claims the ticks it ranks first at once, and the ghost's (about
/// 3,000, three chunks) as backups once it has asked which are still free. The store takes
/// 4.5 s to answer each of those three questions, so the backups are past the late
/// tolerance by the time `b` would claim them: they follow their misfire policy (skip,
/// with a catch-up window: recorded skipped), none runs that late, and every tick has one
/// record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backups_past_the_late_tolerance_when_claimed_follow_misfire_instead_of_running_late() {
    const JOBS: usize = 6_000;
    let dir = tempfile::tempdir().unwrap();
    let slow = Distant { taken_delay: Duration::from_millis(4_500), ..Distant::new(store(&dir).await) };
    slow.slow_taken.store(3, Ordering::SeqCst);
    let store = Arc::new(slow);
    let ghost = solocron_core::NodeBeat { node: "ghost".into(), version: "t".into(), jobs: JOBS as u32, running: 0 };
    store.heartbeat(&ghost).await.unwrap();
    let beats = {
        let store = store.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                store.heartbeat(&ghost).await.unwrap();
            }
        })
    };
    let at = Utc::now() + chrono::Duration::seconds(5);
    let expr = format!("{} {} {} * * *", at.format("%S"), at.format("%M"), at.format("%H"));
    let mut builder = Scheduler::builder(store.clone()).node_id("b").max_concurrent_runs(JOBS);
    for i in 0..JOBS {
        let handler = handler_fn(|_ctx: RunContext| async { Ok(()) });
        // A catch-up window, so that missed ticks are examined (and recorded skipped).
        let policy =
            JobPolicy { lease: Duration::from_secs(30), catchup: Duration::from_secs(60), ..JobPolicy::default() };
        builder = builder
            .job(Job::new(format!("job-{i:04}"), Schedule::parse(&expr, "UTC").unwrap(), handler).with_policy(policy));
    }
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(builder.build().unwrap().run(shutdown.clone()));
    let query = HistoryQuery { limit: JOBS + 10, ..Default::default() };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(45);
    let mut settled = false;
    while !settled && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let all = store.history(&query).await.unwrap();
        settled = all.len() == JOBS && all.iter().all(|r| r.state != RunState::Running);
    }
    shutdown.cancel();
    task.await.unwrap();
    beats.abort();
    let all = store.history(&query).await.unwrap();
    let mut states: BTreeMap<String, usize> = BTreeMap::new();
    for r in &all {
        *states.entry(r.state.to_string()).or_default() += 1;
    }
    assert!(settled, "every tick has an ended record: {states:?}");
    let mut ticks: Vec<&str> = all.iter().map(|r| r.id.tick.job.as_str()).collect();
    ticks.sort_unstable();
    ticks.dedup();
    assert_eq!(ticks.len(), JOBS, "one record a tick: {states:?}");
    let latest =
        all.iter().filter_map(|r| r.started_at.map(|s| s - r.id.tick.scheduled_at)).max().expect("b ran its own ticks");
    assert!(
        latest < chrono::Duration::from_std(solocron_core::LATE_TOLERANCE).unwrap(),
        "a run started {latest} after its tick, past the late tolerance: {states:?}"
    );
    let skipped = states.get("skipped").copied().unwrap_or(0);
    assert!(skipped >= JOBS / 4, "the ghost's ticks were recorded skipped (misfire), not run late: {states:?}");
    assert_eq!(states.get("succeeded").copied().unwrap_or(0) + skipped, JOBS, "{states:?}");
}

/// A job whose one tick falls 3 s from now, on one node over `distant`, with a 10 s lease
/// (renewed every 3.3 s, local stop at 7 s, local deadline at 9 s): the node and its
/// shutdown token.
fn one_tick_node(
    distant: &Arc<Distant>,
    name: &str,
    handler: impl solocron::Handler,
) -> (tokio::task::JoinHandle<()>, CancellationToken, JobPolicy) {
    let lease = Duration::from_secs(10);
    let policy = JobPolicy { lease, kill_grace: JobPolicy::default_kill_grace(lease), ..JobPolicy::default() };
    let at = Utc::now() + chrono::Duration::seconds(3);
    let expr = format!("{} {} {} * * *", at.format("%S"), at.format("%M"), at.format("%H"));
    let job = Job::new(name, Schedule::parse(&expr, "UTC").unwrap(), handler).with_policy(policy.clone());
    let shutdown = CancellationToken::new();
    let node = Scheduler::builder(distant.clone()).node_id("n").job(job).build().unwrap();
    (tokio::spawn(node.run(shutdown.clone())), shutdown, policy)
}

/// A renewal that hangs (a partition: nothing refused, nothing answered) never keeps the
/// job running past its local stop: the handler is told to stop `kill_grace` before the
/// local lease deadline, as when the store refuses, and the run ends `lost`. (Awaiting the
/// pending renewal used to delay the stop to the deadline itself.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_renewal_does_not_delay_the_stop_of_the_job() {
    let dir = tempfile::tempdir().unwrap();
    let distant = Arc::new(Distant::new(store(&dir).await));
    distant.hang_renewals.store(true, Ordering::SeqCst);
    let times: Arc<Mutex<Vec<std::time::Instant>>> = Arc::default();
    let seen = times.clone();
    let handler = handler_fn(move |ctx: RunContext| {
        let seen = seen.clone();
        async move {
            seen.lock().unwrap().push(std::time::Instant::now());
            ctx.cancel.cancelled().await;
            seen.lock().unwrap().push(std::time::Instant::now());
            Ok(())
        }
    });
    let (node, shutdown, policy) = one_tick_node(&distant, "partitioned", handler);
    let (stop_at, deadline) = (policy.local_stop_deadline(), policy.local_lease_deadline());
    let waited = std::time::Instant::now();
    while times.lock().unwrap().len() < 2 && waited.elapsed() < Duration::from_secs(20) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    shutdown.cancel();
    node.await.unwrap();
    let times = times.lock().unwrap().clone();
    assert_eq!(times.len(), 2, "the job started and was told to stop");
    let ran = times[1] - times[0];
    // The stop counts from the claim, which precedes the start by at most the claim lead.
    assert!(ran + Duration::from_millis(1000) >= stop_at, "stopped after {ran:?}, before its stop at {stop_at:?}");
    assert!(
        ran + Duration::from_millis(700) <= deadline,
        "stopped after {ran:?}: the hung renewal held the stop to the local deadline ({deadline:?}), not {stop_at:?}"
    );
    let q = HistoryQuery { job: Some("partitioned".into()), ..Default::default() };
    let runs = distant.history(&q).await.unwrap();
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].state, RunState::Lost, "{:?}", runs[0]);
}

/// The builder refuses a job name that breaks the core's one rule: an empty name names
/// nothing, and `a@b` would make its run ids (`job@instant#attempt`) ambiguous. The error
/// names the job (by its place, since the name may be empty) and the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_builder_refuses_an_empty_job_name_and_one_with_an_at_sign() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(&dir).await;
    let seen: Seen = Arc::default();
    for (bad, reason) in [("", "the job name is empty"), ("a@b", "job name `a@b` contains `@`")] {
        let built = Scheduler::builder(store.clone())
            .node_id("n")
            .job(recording_job("fine", "* * * * * *", seen.clone(), JobPolicy::default()))
            .job(recording_job(bad, "* * * * * *", seen.clone(), JobPolicy::default()))
            .build();
        let Err(err) = built else { panic!("the job name {bad:?} was accepted") };
        assert!(matches!(&err, solocron::BuildError::JobName { index: 1, job, .. } if job == bad), "{bad:?}: {err:?}");
        let message = err.to_string();
        assert!(message.starts_with("the job added at index 1: ") && message.contains(reason), "{message}");
        assert!(message.contains("no `@` and no `#`"), "says what is allowed: {message}");
    }
    let fine = recording_job("fine", "* * * * * *", seen, JobPolicy::default());
    assert!(Scheduler::builder(store).node_id("n").job(fine).build().is_ok(), "a good name is accepted");
}

/// A handler that ignores its cancellation cannot outlive the lease it lost: with renewals
/// that never answer, it is dropped at the local lease deadline (9 s of a 10 s lease) and
/// the run recorded `lost`; it used to be dropped `kill_grace` + 3 s after the stop (12 s),
/// after the store's lease had ended and another node could have started the tick.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_ignoring_its_stop_is_dropped_at_the_local_deadline_when_the_lease_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    let distant = Arc::new(Distant::new(store(&dir).await));
    distant.hang_renewals.store(true, Ordering::SeqCst);
    let started: Arc<Mutex<Option<std::time::Instant>>> = Arc::default();
    let seen = started.clone();
    let handler = handler_fn(move |_ctx: RunContext| {
        let seen = seen.clone();
        async move {
            *seen.lock().unwrap() = Some(std::time::Instant::now());
            tokio::time::sleep(Duration::from_secs(3600)).await;
            Ok(())
        }
    });
    let (node, shutdown, policy) = one_tick_node(&distant, "stubborn", handler);
    let deadline = policy.local_lease_deadline();
    let q = HistoryQuery { job: Some("stubborn".into()), state: Some(RunState::Lost), ..Default::default() };
    let waited = std::time::Instant::now();
    let mut lost_after = None;
    while waited.elapsed() < Duration::from_secs(25) {
        let start = *started.lock().unwrap();
        if let Some(start) = start {
            if !distant.history(&q).await.unwrap().is_empty() {
                lost_after = Some(start.elapsed());
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    shutdown.cancel();
    node.await.unwrap();
    let lost_after = lost_after.expect("the run was recorded lost");
    assert!(
        lost_after <= deadline + Duration::from_millis(1200),
        "recorded lost {lost_after:?} after its start: the handler outlived the local deadline ({deadline:?})"
    );
}

/// Claims a run of `job`'s tick `ago` before now and, if `end`, ends it `succeeded`.
async fn past_run(store: &dyn Store, job: &str, ago: chrono::Duration, end: bool) -> RunId {
    let request = ClaimRequest {
        tick: Tick::new(job, Utc::now() - ago),
        trigger: solocron_core::Trigger::Schedule,
        node: "earlier".into(),
        // Long enough that no recovery scan sees the running one expire during the test.
        lease: Duration::from_secs(3600),
        mode: solocron_core::ClaimMode::Run { skip_if_running: false },
        nonce: 0,
    };
    let outcomes = store.claim(&[request]).await.unwrap();
    let [ClaimOutcome::Won(lease)] = outcomes.as_slice() else { panic!("claim refused: {outcomes:?}") };
    if end {
        let done = RunEnd {
            state: RunState::Succeeded,
            reason: None,
            exit_code: Some(0),
            output: String::new(),
            started_after: None,
        };
        assert!(store.finish(lease, &done).await.unwrap());
    }
    lease.run.clone()
}

/// Lets the scheduler's tasks do what is due at the current (paused) instant, for `real`
/// real time, until `done` holds; whether it did.
async fn settle(real: Duration, mut done: impl AsyncFnMut() -> bool) -> bool {
    let until = std::time::Instant::now() + real;
    while std::time::Instant::now() < until {
        if done().await {
            return true;
        }
        tokio::task::yield_now().await;
    }
    done().await
}

/// A scheduler with a history retention prunes ended records older than the retention a
/// minute after it starts and then every hour, never a running one nor a newer one. The
/// store's clock (SQLite's: the host's) decides what is old; tokio's paused clock stands
/// in for the minute and the hour.
#[tokio::test]
async fn a_scheduler_with_a_retention_prunes_old_ended_records_after_a_minute_then_hourly() {
    let dir = tempfile::tempdir().unwrap();
    let st = store(&dir).await;
    let day = chrono::Duration::days(1);
    let stuck = past_run(st.as_ref(), "old", day * 41, false).await;
    let gone = past_run(st.as_ref(), "old", day * 40, true).await;
    let stale = past_run(st.as_ref(), "old", day * 3, true).await;
    let young = past_run(st.as_ref(), "old", chrono::Duration::hours(1), true).await;
    let remaining = async || -> Vec<RunId> {
        let q = HistoryQuery { job: Some("old".into()), ..HistoryQuery::default() };
        let mut ids: Vec<RunId> = st.history(&q).await.unwrap().into_iter().map(|r| r.id).collect();
        ids.sort_by_key(|id| id.tick.scheduled_at);
        ids
    };
    let noop = handler_fn(|_ctx: RunContext| async { Ok(()) });
    let s = Scheduler::builder(st.clone())
        .node_id("n1")
        .job(Job::new("yearly", Schedule::parse("0 0 0 1 1 *", "UTC").unwrap(), noop))
        .history_retention(Some(solocron_core::RETENTION_MIN))
        .build()
        .unwrap();
    // A task that always has work keeps paused time from jumping ahead on its own while
    // the store's worker thread answers (it would fire the store calls' timeouts): time
    // moves only when the test advances it.
    let spinner = tokio::spawn(async {
        loop {
            tokio::task::yield_now().await;
        }
    });
    tokio::time::pause();
    let shutdown = CancellationToken::new();
    let node = tokio::spawn(s.run(shutdown.clone()));
    let quiet = Duration::from_millis(500);
    let all = vec![stuck.clone(), gone, stale, young.clone()];
    // Its jobs registered: the scheduler is past its migration and its side tasks, the
    // prune loop among them, have started their timers at the paused instant.
    let registered = async || st.registrations().await.unwrap().iter().any(|r| r.node == "n1");
    assert!(settle(Duration::from_secs(10), registered).await, "the scheduler never registered its job");
    tokio::time::advance(Duration::from_secs(59)).await;
    settle(quiet, async || false).await;
    assert!(remaining().await == all, "pruned before the first minute: {:?}", remaining().await);

    tokio::time::advance(Duration::from_secs(2)).await;
    let first_pass = vec![stuck.clone(), young.clone()];
    let pruned = settle(Duration::from_secs(10), async || remaining().await == first_pass).await;
    assert!(pruned, "a minute in, only the running and the young record should stay: {:?}", remaining().await);

    // An old record added after the first pass waits for the next, an hour after it.
    let later = past_run(st.as_ref(), "old", day * 2, true).await;
    let with_later = vec![stuck.clone(), later, young.clone()];
    tokio::time::advance(Duration::from_secs(3590)).await;
    settle(quiet, async || false).await;
    assert!(remaining().await == with_later, "pruned again within the hour: {:?}", remaining().await);
    tokio::time::advance(Duration::from_secs(20)).await;
    let pruned = settle(Duration::from_secs(10), async || remaining().await == first_pass).await;
    assert!(pruned, "the hourly pass did not prune the newly old record: {:?}", remaining().await);

    shutdown.cancel();
    settle(Duration::from_secs(10), async || node.is_finished()).await;
    assert!(node.is_finished(), "the scheduler did not stop");
    spinner.abort();
}

/// A running node sends heartbeats: at once (its version, its job count), then every
/// `HEARTBEAT_EVERY` with the runs it holds; once drained it says goodbye.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_node_beats_with_its_jobs_and_runs_and_says_goodbye_once_drained() {
    let dir = tempfile::tempdir().unwrap();
    let st = store(&dir).await;
    let slow = handler_fn(|ctx: RunContext| async move {
        ctx.cancel.cancelled().await;
        Ok(())
    });
    let s = Scheduler::builder(st.clone())
        .node_id("n1")
        .job(Job::new("slow", Schedule::parse("* * * * * *", "UTC").unwrap(), slow))
        .build()
        .unwrap();
    let shutdown = CancellationToken::new();
    let node = tokio::spawn(s.run(shutdown.clone()));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let first = st.nodes().await.unwrap();
    assert_eq!(first.len(), 1, "{first:?}");
    assert_eq!((first[0].beat.node.as_str(), first[0].beat.jobs), ("n1", 1));
    assert_eq!(first[0].beat.version, env!("CARGO_PKG_VERSION"));
    tokio::time::sleep(solocron_core::HEARTBEAT_EVERY + Duration::from_millis(500)).await;
    let later = st.nodes().await.unwrap().remove(0);
    assert_eq!(later.beat.running, 1, "the beat counts the run in flight: {later:?}");
    assert!(later.last_seen > first[0].last_seen && later.started_at == first[0].started_at, "{later:?}");
    assert_eq!(later.left_at, None);

    shutdown.cancel();
    node.await.unwrap();
    let gone = st.nodes().await.unwrap().remove(0);
    assert!(gone.left_at.is_some_and(|t| t >= later.last_seen), "no goodbye: {gone:?}");
    assert_eq!(gone.liveness(st.now().await.unwrap()), solocron_core::Liveness::Gone);
}

/// A claim that committed but whose answer was lost (issue 20 §3) still runs its tick,
/// once: the node asks again with the claim's nonce and the store grants the same run
/// again, before the lease lapses and recovery could end it `abandoned`. The record's
/// start is the real one, not the first claim's instant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tick_whose_claim_answer_was_lost_still_runs_once() {
    let dir = tempfile::tempdir().unwrap();
    let distant = Arc::new(Distant::new(store(&dir).await));
    // (scheduled instant, fencing token) of each start.
    type Starts = Arc<Mutex<Vec<(DateTime<Utc>, u64)>>>;
    let starts: Starts = Arc::default();
    let seen = starts.clone();
    let handler = handler_fn(move |ctx: RunContext| {
        let seen = seen.clone();
        async move {
            seen.lock().unwrap().push((ctx.scheduled_at, ctx.fencing_token));
            Ok(())
        }
    });
    distant.lose_claim_answers.store(1, Ordering::SeqCst);
    let (node, shutdown, _) = one_tick_node(&distant, "lost-answer", handler);
    let q = HistoryQuery { job: Some("lost-answer".into()), ..Default::default() };
    let waited = std::time::Instant::now();
    let mut runs = Vec::new();
    while waited.elapsed() < Duration::from_secs(15) {
        runs = distant.history(&q).await.unwrap();
        if runs.iter().any(|r| r.state != RunState::Running) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    shutdown.cancel();
    node.await.unwrap();
    assert_eq!(distant.lose_claim_answers.load(Ordering::SeqCst), 0, "the first claim's answer was lost");
    assert_eq!(runs.len(), 1, "one record of the tick: {runs:?}");
    let run = &runs[0];
    assert_eq!(run.state, RunState::Succeeded, "{run:?}");
    let starts = starts.lock().unwrap().clone();
    assert_eq!(
        starts,
        vec![(run.id.tick.scheduled_at, run.fencing_token.unwrap())],
        "ran once, with the record's token"
    );
    // Counted from the first claim's instant as if the run started when the second try
    // was sent, the start would be recorded before the tick's instant (the first try
    // went out a claim lead ahead of it, the second one 100 ms later).
    let started = run.started_at.expect("started");
    assert!(
        started >= run.id.tick.scheduled_at - chrono::Duration::milliseconds(10),
        "the start is recorded when it happened, at the tick's instant, not before: {run:?}"
    );
}

/// A second scheduler with the id of a live one refuses to run (two processes with one id
/// would renew each other's leases): `check_node_id` says so after watching the id's beats,
/// and `run` returns without claiming anything. Once the first said goodbye, the id is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduler_with_the_id_of_a_live_one_refuses_to_run() {
    let dir = tempfile::tempdir().unwrap();
    let st = store(&dir).await;
    let (seen_a, seen_b): (Seen, Seen) = (Arc::default(), Arc::default());
    let node = |seen: Seen| {
        let job = recording_job("every-second", "* * * * * *", seen, JobPolicy::default());
        Scheduler::builder(st.clone()).node_id("same").job(job).build().unwrap()
    };
    let first_stop = CancellationToken::new();
    let first = tokio::spawn(node(seen_a.clone()).run(first_stop.clone()));
    tokio::time::sleep(Duration::from_millis(500)).await;

    let second = node(seen_b.clone());
    let refused = second.check_node_id().await.expect_err("the id is in use");
    assert!(refused.to_string().starts_with("node id `same` is in use"), "{refused}");
    let ran =
        tokio::time::timeout(solocron::NODE_ID_WATCH + Duration::from_secs(5), second.run(CancellationToken::new()));
    ran.await.expect("run returns at once when the id is in use");
    assert!(seen_b.lock().unwrap().is_empty(), "the refused scheduler ran nothing");
    assert!(!seen_a.lock().unwrap().is_empty(), "the first ran on");

    first_stop.cancel();
    first.await.unwrap();
    assert!(node(seen_b).check_node_id().await.is_ok(), "free once its holder said goodbye");
}

/// A node serves its namespaces only: a job of another is refused by the builder, naming
/// both; a job of a served namespace is accepted by its full name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_builder_refuses_a_job_of_a_namespace_the_node_does_not_serve() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(&dir).await;
    let seen: Seen = Arc::default();
    let job = |name: &str| recording_job(name, "* * * * * *", seen.clone(), JobPolicy::default());
    let err = Scheduler::builder(store.clone()).job(job("billing/sync")).build().err().expect("refused");
    assert_eq!(
        err.to_string(),
        "job `billing/sync` is in namespace `billing`, which this node does not serve (it serves default); add `billing` to the node's namespaces"
    );
    let built = Scheduler::builder(store.clone())
        .namespaces(["billing", "default"])
        .job(job("billing/sync"))
        .job(job("backup"));
    let scheduler = built.build().expect("served");
    assert_eq!(scheduler.jobs().namespaces().names().unwrap(), ["billing", "default"]);
    let err = scheduler.jobs().replace(vec![job("shipping/x")]).expect_err("a reload keeps to the namespaces too");
    assert!(matches!(err, solocron::BuildError::Namespace { .. }), "{err}");
    let err = Scheduler::builder(store).namespaces(["Billing"]).build().err().expect("a bad namespace");
    assert!(err.to_string().starts_with("the node's namespaces: `Billing` is not a namespace name"), "{err}");
}
