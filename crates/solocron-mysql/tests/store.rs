//! MySQL-specific checks beyond the conformance suite: races between separate pools (as
//! separate processes hold), a full-size batch, the overlap race under READ COMMITTED,
//! the basics of every method, concurrent migrations, and what errors and descriptions
//! show. Skips when the server is unreachable, unless `CI` is set.
#![forbid(unsafe_code)]

mod support;

use solocron_core::AuditStore;
use solocron_core::ClaimStore;
use solocron_core::ControlStore;
use solocron_core::FleetStore;
use solocron_core::HistoryStore;
use solocron_core::ManagedStore;
use solocron_core::RegistryStore;
use solocron_core::RequestStore;
use solocron_core::RunStore;
use solocron_core::SchemaStore;
use solocron_core::StoreBase;
use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use solocron_conformance::checks::definition;
use solocron_core::{
    ActionKind, ActionQuery, ClaimMode, ClaimOutcome, ClaimRequest, HistoryQuery, Lease, NodeBeat, Prefix,
    RecoverAction, RecoverOutcome, RunCounts, RunEnd, RunState, SchemaState, StoreError, Tick, Trigger,
    CLAIM_BATCH_MAX,
};
use solocron_mysql::MySqlStore;
use support::Namespace;
use tokio::sync::Barrier;

const LONG: Duration = Duration::from_secs(60);

/// A scheduled tick of `job` at minute `minute` of 2020-01-01 (a whole second).
fn tick(job: &str, minute: u32) -> Tick {
    Tick::new(job, DateTime::from_timestamp(1_577_836_800 + i64::from(minute) * 60, 0).expect("in range"))
}

/// A scheduled claim to run `tick`.
fn run(tick: Tick, node: &str, lease: Duration, skip_if_running: bool) -> ClaimRequest {
    ClaimRequest {
        tick,
        trigger: Trigger::Schedule,
        node: node.into(),
        lease,
        mode: ClaimMode::Run { skip_if_running },
        nonce: 0,
    }
}

/// The lease of a lone claim that must be won.
async fn won(store: &MySqlStore, request: ClaimRequest) -> Lease {
    match store.claim(&[request]).await.expect("claim").remove(0) {
        ClaimOutcome::Won(lease) => lease,
        other => panic!("expected Won, got {other:?}"),
    }
}

fn succeeded() -> RunEnd {
    RunEnd { state: RunState::Succeeded, reason: None, exit_code: Some(0), output: "ok".into(), started_after: None }
}

/// `n` new stores (own pools) on the namespace, migrated.
async fn stores(ns: &Namespace, n: usize) -> Vec<Arc<MySqlStore>> {
    let mut stores = Vec::with_capacity(n);
    for _ in 0..n {
        stores.push(Arc::new(ns.migrated().await));
    }
    stores
}

/// Runs `op` on every store at once (separate tasks released by a barrier).
async fn race<T, F, Fut>(stores: &[Arc<MySqlStore>], op: F) -> Vec<T>
where
    F: Fn(usize, Arc<MySqlStore>) -> Fut,
    Fut: Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let barrier = Arc::new(Barrier::new(stores.len()));
    let tasks: Vec<_> = stores
        .iter()
        .enumerate()
        .map(|(i, store)| {
            let (barrier, op) = (barrier.clone(), op(i, store.clone()));
            tokio::spawn(async move {
                barrier.wait().await;
                op.await
            })
        })
        .collect();
    let mut results = Vec::new();
    for task in tasks {
        results.push(task.await.expect("a racing task panicked"));
    }
    results
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eight_pools_racing_for_one_tick_yield_exactly_one_winner() {
    let Some(ns) = Namespace::new().await else { return };
    let stores = stores(&ns, 8).await;
    let started = Instant::now();
    for minute in 0..10 {
        let outcomes = race(&stores, |i, store| async move {
            store.claim(&[run(tick("backup", minute), &format!("node-{i}"), LONG, false)]).await.expect("claim")
        })
        .await
        .concat();
        let wins = outcomes.iter().filter(|o| matches!(o, ClaimOutcome::Won(_))).count();
        let taken = outcomes.iter().filter(|o| **o == ClaimOutcome::Taken).count();
        assert_eq!((wins, taken), (1, 7), "tick {minute}: {outcomes:?}");
    }
    eprintln!("10 rounds of 8 racing claims: {:?}", started.elapsed());
    let records = stores[0].history(&HistoryQuery::default()).await.expect("history");
    let tokens: Vec<u64> = records.iter().rev().map(|r| r.fencing_token.expect("a token")).collect();
    // A one-tick claim advances the counter before it knows it wins: the losers' leave gaps.
    assert_eq!(tokens.len(), 10, "one record per tick: {tokens:?}");
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "tokens grow with the ticks: {tokens:?}");
}

/// 1000 requests: ten ticks of each of 100 jobs, the jobs interleaved.
fn big_batch(skip_if_running: bool) -> Vec<ClaimRequest> {
    let mut batch = Vec::new();
    for minute in 0..10 {
        for job in 0..100 {
            batch.push(run(tick(&format!("job-{job:03}"), minute), "a", LONG, skip_if_running));
        }
    }
    assert_eq!(batch.len(), CLAIM_BATCH_MAX);
    batch
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_batch_of_1000_ticks_over_100_jobs_is_won_in_one_call_with_increasing_tokens() {
    let Some(ns) = Namespace::new().await else { return };
    let store = &stores(&ns, 1).await[0];
    let batch = big_batch(false);
    let started = Instant::now();
    let outcomes = store.claim(&batch).await.expect("claim");
    eprintln!("1000 new ticks in one claim: {:?}", started.elapsed());
    let mut last: HashMap<&str, u64> = HashMap::new();
    for (request, outcome) in batch.iter().zip(&outcomes) {
        let ClaimOutcome::Won(lease) = outcome else { panic!("expected Won for {:?}, got {outcome:?}", request.tick) };
        assert_eq!(lease.run.tick, request.tick, "outcomes in request order");
        let previous = last.insert(&request.tick.job, lease.fencing_token).unwrap_or(0);
        assert_eq!(lease.fencing_token, previous + 1, "tokens increase per job: {lease:?}");
        assert_eq!(lease.lease_until - lease.claimed_at, chrono::Duration::seconds(60));
    }
    let started = Instant::now();
    let again = store.claim(&batch).await.expect("claim");
    eprintln!("1000 taken ticks in one claim: {:?}", started.elapsed());
    assert_eq!(again, vec![ClaimOutcome::Taken; batch.len()]);
    assert_eq!(store.history(&HistoryQuery::default()).await.expect("history").len(), 1000);

    // The same shape with overlap checks, on fresh ticks: the first of each job wins, the
    // other nine see it (or the one already running) and skip.
    let overlapping: Vec<ClaimRequest> = big_batch(true)
        .into_iter()
        .map(|mut r| {
            r.tick = Tick::new(r.tick.job.clone(), r.tick.scheduled_at + chrono::Duration::hours(1));
            r
        })
        .collect();
    let outcomes = store.claim(&overlapping).await.expect("claim");
    assert!(outcomes.iter().all(|o| matches!(o, ClaimOutcome::Skipped { reason } if reason.starts_with("overlap: "))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_nodes_claiming_different_ticks_of_one_job_never_both_run_it() {
    let Some(ns) = Namespace::new().await else { return };
    let stores = stores(&ns, 2).await;
    for round in 0..20 {
        let outcomes = race(&stores, |i, store| async move {
            let request = run(tick("backup", 2 * round + i as u32), &format!("node-{i}"), LONG, true);
            store.claim(&[request]).await.expect("claim").remove(0)
        })
        .await;
        let winners: Vec<&Lease> =
            outcomes.iter().filter_map(|o| if let ClaimOutcome::Won(l) = o { Some(l) } else { None }).collect();
        assert_eq!(winners.len(), 1, "round {round}: {outcomes:?}");
        let skipped = outcomes.iter().find(|o| !matches!(o, ClaimOutcome::Won(_))).expect("a loser");
        let reason = format!("overlap: previous run {} still running", winners[0].run);
        assert_eq!(*skipped, ClaimOutcome::Skipped { reason }, "round {round}");
        assert!(stores[0].finish(winners[0], &succeeded()).await.expect("finish"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn renew_and_finish_hold_only_for_the_owner_while_running() {
    let Some(ns) = Namespace::new().await else { return };
    let store = &stores(&ns, 1).await[0];
    let lease = won(store, run(tick("backup", 0), "a", LONG, false)).await;
    assert!(store.renew(&lease, LONG).await.expect("renew"));
    // Twice in a row, likely within one millisecond: the row matches though unchanged.
    assert!(store.renew(&lease, LONG).await.expect("renew"));
    let stale = Lease { fencing_token: lease.fencing_token + 1, ..lease.clone() };
    assert!(!store.renew(&stale, LONG).await.expect("renew"));
    assert!(!store.finish(&stale, &succeeded()).await.expect("finish"));
    let end = RunEnd { started_after: Some(Duration::from_millis(40)), ..succeeded() };
    assert!(store.finish(&lease, &end).await.expect("finish"));
    assert!(!store.finish(&lease, &end).await.expect("finish"), "the first end stands");
    assert!(!store.renew(&lease, LONG).await.expect("renew"));
    let record = &store.history(&HistoryQuery::default()).await.expect("history")[0];
    assert_eq!((record.state, record.output.as_str(), record.lease_until), (RunState::Succeeded, "ok", None));
    assert_eq!(record.started_at, Some(lease.claimed_at + chrono::Duration::milliseconds(40)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_expired_run_is_recovered_once_with_a_larger_token() {
    let Some(ns) = Namespace::new().await else { return };
    let stores = stores(&ns, 4).await;
    let lease = won(&stores[0], run(tick("backup", 0), "a", Duration::from_millis(200), false)).await;
    let retry = RecoverAction::Retry { node: "b".into(), lease: LONG };
    assert_eq!(stores[1].recover(&lease.run, &retry).await.expect("recover"), RecoverOutcome::NotNeeded);
    tokio::time::sleep(Duration::from_millis(400)).await;
    let expired = stores[1].expired(10, &solocron_core::Namespaces::ALL).await.expect("expired");
    assert_eq!(expired.iter().map(|r| &r.id).collect::<Vec<_>>(), [&lease.run]);
    let outcomes = race(&stores, |_, store| {
        let (run, retry) = (lease.run.clone(), retry.clone());
        async move { store.recover(&run, &retry).await.expect("recover") }
    })
    .await;
    let retried: Vec<&Lease> =
        outcomes.iter().filter_map(|o| if let RecoverOutcome::Retried(l) = o { Some(l) } else { None }).collect();
    assert_eq!(retried.len(), 1, "{outcomes:?}");
    assert!(retried[0].fencing_token > lease.fencing_token);
    assert_eq!((retried[0].run.attempt, retried[0].owner.as_str()), (2, "b"));
    assert!(!stores[0].renew(&lease, LONG).await.expect("renew"), "the old owner is fenced out");
    let next = won(&stores[2], run(tick("backup", 1), "c", LONG, false)).await;
    assert!(next.fencing_token > retried[0].fencing_token);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unlock_pause_and_manual_requests() {
    let Some(ns) = Namespace::new().await else { return };
    let store = &stores(&ns, 1).await[0];
    let a = won(store, run(tick("backup", 0), "a", LONG, false)).await;
    let b = won(store, run(tick("backup", 1), "b", LONG, false)).await;
    let mut unlocked = store.unlock("backup", "ops", "stuck").await.expect("unlock");
    unlocked.sort();
    assert_eq!(unlocked, [a.run.clone(), b.run.clone()]);
    assert!(!store.renew(&a, LONG).await.expect("renew"));
    assert!(store.unlock("backup", "ops", "again").await.expect("unlock").is_empty());

    store.set_paused("backup", true, "ops", Some("maintenance")).await.expect("pause");
    let paused = ClaimOutcome::Skipped { reason: "paused by ops: maintenance".into() };
    assert_eq!(store.claim(&[run(tick("backup", 2), "a", LONG, true)]).await.expect("claim"), [paused]);
    let requested = store.request_run("backup", "alice", None).await.expect("request_run");
    assert_ne!(requested.scheduled_at.timestamp_subsec_millis(), 0, "off the whole second");
    let pending = store.pending_requests(10, &solocron_core::Namespaces::ALL).await.expect("pending");
    assert_eq!((&pending[0].tick, pending[0].requested_by.as_str()), (&requested, "alice"));
    let manual = ClaimRequest { trigger: Trigger::Manual, ..run(requested, "a", LONG, true) };
    assert!(matches!(store.claim(&[manual]).await.expect("claim")[0], ClaimOutcome::Won(_)), "manual runs go");
    assert!(store.pending_requests(10, &solocron_core::Namespaces::ALL).await.expect("pending").is_empty());
    let controls = store.controls().await.expect("controls");
    assert_eq!((controls.len(), controls[0].paused, controls[0].reason.as_deref()), (1, true, Some("maintenance")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn prune_deletes_old_ended_records_oldest_first_never_running_ones() {
    let Some(ns) = Namespace::new().await else { return };
    let store = &stores(&ns, 1).await[0];
    for minute in 0..5 {
        let lease = won(store, run(tick("report", minute), "a", LONG, false)).await;
        assert!(store.finish(&lease, &succeeded()).await.expect("finish"));
    }
    won(store, run(tick("stuck", 0), "a", LONG, false)).await;
    let hour = Duration::from_secs(3600);
    assert_eq!(store.prune(hour, 3, &solocron_core::Namespaces::ALL).await.expect("prune"), 3);
    let left: Vec<String> =
        store.history(&HistoryQuery::default()).await.expect("history").iter().map(|r| r.id.to_string()).collect();
    assert_eq!(
        left,
        ["report@2020-01-01T00:04:00.000Z#1", "report@2020-01-01T00:03:00.000Z#1", "stuck@2020-01-01T00:00:00.000Z#1"]
    );
    assert_eq!(store.prune(hour, 100, &solocron_core::Namespaces::ALL).await.expect("prune"), 2);
    assert_eq!(store.prune(hour, 100, &solocron_core::Namespaces::ALL).await.expect("prune"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ten_pools_migrating_an_empty_prefix_at_once_all_succeed() {
    let Some(ns) = Namespace::new().await else { return };
    let mut stores = Vec::new();
    for _ in 0..10 {
        stores.push(Arc::new(ns.store().await));
    }
    let started = Instant::now();
    let results = race(&stores, |_, store| async move { store.migrate().await }).await;
    eprintln!("10 concurrent migrations: {:?}", started.elapsed());
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    won(&stores[3], run(tick("backup", 0), "a", LONG, false)).await;
    stores[0].migrate().await.expect("migrating again is a no-op");
    assert_eq!(stores[9].history(&HistoryQuery::default()).await.expect("history").len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn descriptions_and_errors_never_show_the_password() {
    let Some(ns) = Namespace::new().await else { return };
    let url = ns.url.clone();
    let store = ns.store().await;
    let expected = format!("{} (prefix {})", solocron_core::redact_url(&url), ns.prefix);
    assert_eq!(store.describe(), expected);
    assert!(!format!("{store:?}").contains("password"));
    let default = Prefix::default();

    // The test account has no such password: the login is refused, which is not a
    // transient condition.
    let (scheme, rest) = url.split_once("://").expect("a URL");
    let (user, host) = rest.split_once('@').expect("a user");
    let user = user.split(':').next().unwrap_or(user);
    let with_password = format!("{scheme}://{user}:hunter2-secret@{host}");
    let err = MySqlStore::connect(&with_password, &default).await.expect_err("a wrong password");
    assert!(matches!(err, StoreError::Invalid(_)), "{err}");
    assert!(!err.to_string().contains("hunter2"), "{err}");
    assert!(err.to_string().contains(":***@"), "{err}");

    let err = MySqlStore::connect("mysql://u:hunter2@127.0.0.1:1/test", &default).await.expect_err("no server");
    assert!(matches!(err, StoreError::Unavailable(_)), "{err}");
    assert!(!err.to_string().contains("hunter2"), "{err}");
    assert!(err.to_string().contains("mysql://u:***@127.0.0.1:1/test"), "{err}");
    let err = MySqlStore::connect("mariadb://u:hunter2@127.0.0.1:1/test", &default).await.expect_err("no server");
    assert!(matches!(err, StoreError::Unavailable(_)) && !err.to_string().contains("hunter2"), "{err}");
    let err = MySqlStore::connect("hunter2", &default).await.expect_err("not a URL");
    assert!(matches!(err, StoreError::Invalid(_)) && !err.to_string().contains("hunter2"), "{err}");
    // A bad prefix never reaches `connect`: the `Prefix` type is the check.
    assert!(Prefix::parse("Bad-Prefix").is_err());
}

/// Every table, routine and trigger of the test database whose name starts with `start`,
/// as `kind name`.
async fn objects_named(pool: &sqlx::MySqlPool, start: &str) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT CAST(CONCAT(kind, ' ', name) AS CHAR) FROM (
             SELECT 'table' AS kind, table_name AS name FROM information_schema.tables
             WHERE table_schema = DATABASE()
             UNION ALL SELECT LOWER(routine_type), routine_name FROM information_schema.routines
             WHERE routine_schema = DATABASE()
             UNION ALL SELECT 'trigger', trigger_name FROM information_schema.triggers
             WHERE trigger_schema = DATABASE()
         ) o WHERE BINARY LEFT(name, CHAR_LENGTH(?)) = BINARY ? ORDER BY 1",
    )
    .bind(start)
    .bind(start)
    .fetch_all(pool)
    .await
    .expect("list the schema's objects")
}

/// `uninstall` drops every table and routine of its prefix, even those of a prefix whose
/// names begin like its own stays whole and working, and a second `uninstall` finds
/// nothing to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn uninstall_removes_everything_of_its_prefix_and_nothing_else() {
    let Some(ns) = Namespace::new().await else { return };
    // Its names begin with ns's: `{ns}_other_runs` beside `{ns}_runs`.
    let other_ns = ns.nested("other");
    let (store, other) = (&stores(&ns, 1).await[0], &stores(&other_ns, 1).await[0]);
    won(store, run(tick("backup", 0), "a", LONG, false)).await;
    won(other, run(tick("backup", 0), "a", LONG, false)).await;
    let pool = sqlx::MySqlPool::connect(&ns.url).await.expect("connect");
    let others = objects_named(&pool, &other_ns.prefix.table_prefix()).await;
    let mine: Vec<String> =
        objects_named(&pool, &ns.prefix.table_prefix()).await.into_iter().filter(|o| !others.contains(o)).collect();
    let p = ns.prefix.table_prefix();
    for object in ["table {p}runs", "table {p}schema", "table {p}fences", "procedure {p}claim_one_v7"] {
        assert!(mine.contains(&object.replace("{p}", &p)), "{object} is missing from {mine:?}");
    }
    assert_eq!(others.len(), mine.len(), "the other prefix has the same schema: {others:?}");

    store.uninstall().await.expect("uninstall");
    assert_eq!(objects_named(&pool, &p).await, others, "only the other prefix's objects are left");
    store.uninstall().await.expect("uninstalling again is fine");
    let err = store.claim(&[run(tick("backup", 1), "a", LONG, false)]).await.expect_err("no schema");
    assert!(matches!(err, StoreError::Invalid(_)), "{err}");

    assert_eq!(other.history(&HistoryQuery::default()).await.expect("history").len(), 1);
    let next = won(other, run(tick("backup", 1), "a", LONG, false)).await;
    assert!(next.fencing_token > 1, "the other prefix keeps its counters");
    // The uninstalled prefix starts afresh.
    store.migrate().await.expect("migrate again");
    assert_eq!(won(store, run(tick("backup", 0), "a", LONG, false)).await.fencing_token, 1);
    pool.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn names_insert_ignore_would_truncate_are_refused() {
    let Some(ns) = Namespace::new().await else { return };
    let store = &stores(&ns, 1).await[0];
    for job in ["x".repeat(192), "backup ".to_string()] {
        let err = store.claim(&[run(tick(&job, 0), "a", LONG, false)]).await.expect_err("a bad name");
        assert!(matches!(err, StoreError::Invalid(_)), "{err}");
    }
    let longest = "é".repeat(191);
    won(store, run(tick(&longest, 0), &longest, LONG, false)).await;
    let records =
        store.history(&HistoryQuery { job: Some(longest.clone()), ..Default::default() }).await.expect("history");
    assert_eq!((records.len(), records[0].node.as_str()), (1, longest.as_str()));
    // Names are exact: no case folding.
    won(store, run(tick("Backup", 0), "a", LONG, false)).await;
    won(store, run(tick("backup", 0), "a", LONG, false)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_clock_is_the_servers_in_utc() {
    let Some(ns) = Namespace::new().await else { return };
    let store = &stores(&ns, 1).await[0];
    let before: DateTime<Utc> = Utc::now();
    let server = store.now().await.expect("now");
    // The server runs on this host here: the clocks agree unless the zone were wrong.
    assert!((server - before).num_seconds().abs() < 5, "server {server}, host {before}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eight_pools_claiming_overlapping_batches_in_different_orders_never_fail() {
    let Some(ns) = Namespace::new().await else { return };
    let stores = stores(&ns, 8).await;
    let started = Instant::now();
    for round in 0..15 {
        // New jobs every few rounds, so that fence rows are also created concurrently.
        let outcomes = race(&stores, |i, store| async move {
            let mut batch: Vec<ClaimRequest> = (0..20)
                .map(|j| {
                    run(tick(&format!("job-{}", j + round / 5 * 20), round), &format!("node-{i}"), LONG, j % 2 == 0)
                })
                .collect();
            batch.rotate_left(i * 3 % 20);
            if i % 2 == 1 {
                batch.reverse();
            }
            let outcomes = store.claim(&batch).await.expect("claim");
            batch.into_iter().map(|r| r.tick).zip(outcomes).collect::<Vec<_>>()
        })
        .await
        .concat();
        let mut decided: HashMap<Tick, usize> = HashMap::new();
        for (tick, outcome) in &outcomes {
            if !matches!(outcome, ClaimOutcome::Taken) {
                *decided.entry(tick.clone()).or_default() += 1;
            }
        }
        assert_eq!(decided.len(), 20, "round {round}: every tick decided");
        assert!(decided.values().all(|n| *n == 1), "round {round}: one decision per tick: {decided:?}");
    }
    eprintln!("15 rounds of 8 racing 20-tick batches: {:?}", started.elapsed());
}

/// Claims are sent as SQL text with their values written in: names and reasons that hold
/// quotes, backslashes, placeholders, comment and statement separators, non-ASCII text
/// and names that differ only in case are stored and read back exactly, and change
/// nothing else, whether claimed in a batch or one at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn names_with_sql_syntax_in_them_are_stored_as_written() {
    let Some(ns) = Namespace::new().await else { return };
    let store = &stores(&ns, 1).await[0];
    let names = [
        "it's",
        "back\\slash",
        "q?mark",
        "semi; DROP TABLE x; --",
        "é日本\u{1F600}",
        "\"dq\" /* c */",
        "%_",
        "Case",
        "case",
    ];
    let mut batch: Vec<ClaimRequest> =
        names.iter().map(|n| run(tick(n, 1), n, Duration::from_secs(60), false)).collect();
    let mut skip = run(tick("it's", 2), "node'; --", Duration::from_secs(60), false);
    skip.mode = ClaimMode::Skip { reason: "why? 'because' \\ ; --".into() };
    batch.push(skip);
    let outcomes = store.claim(&batch).await.expect("claim");
    for (request, outcome) in batch.iter().zip(&outcomes) {
        match (&request.mode, outcome) {
            (ClaimMode::Skip { reason }, ClaimOutcome::Skipped { reason: got }) => assert_eq!(got, reason),
            (ClaimMode::Run { .. }, ClaimOutcome::Won(lease)) => {
                assert_eq!((&lease.run.tick, lease.owner.as_str()), (&request.tick, request.node.as_str()))
            }
            other => panic!("unexpected outcome {other:?}"),
        }
    }
    let history = store.history(&HistoryQuery::default()).await.expect("history");
    assert_eq!(history.len(), batch.len());
    for request in &batch {
        let record = history.iter().find(|r| r.id.tick == request.tick).expect("a record of every tick");
        assert_eq!(record.node, request.node);
        if let ClaimMode::Skip { reason } = &request.mode {
            assert_eq!(record.reason.as_deref(), Some(reason.as_str()));
        }
    }
    assert_eq!(store.claim(&batch).await.expect("claim"), vec![ClaimOutcome::Taken; batch.len()]);
    // One tick at a time: the claim goes through the stored procedure and its arguments.
    for request in &mut batch {
        // (The skip shares its job with a run: another minute.)
        let minute = if matches!(request.mode, ClaimMode::Skip { .. }) { 4 } else { 3 };
        request.tick = tick(&request.tick.job, minute);
        let outcome = store.claim(std::slice::from_ref(request)).await.expect("claim one");
        match (&request.mode, &outcome[..]) {
            (ClaimMode::Skip { reason }, [ClaimOutcome::Skipped { reason: got }]) => assert_eq!(got, reason),
            (ClaimMode::Run { .. }, [ClaimOutcome::Won(lease)]) => {
                assert_eq!((&lease.run.tick, lease.owner.as_str()), (&request.tick, request.node.as_str()))
            }
            other => panic!("unexpected outcome {other:?}"),
        }
        let query = HistoryQuery { job: Some(request.tick.job.clone()), ..HistoryQuery::default() };
        let history = store.history(&query).await.expect("history");
        let record = history.iter().find(|r| r.id.tick == request.tick).expect("a record of the tick");
        assert_eq!(record.node, request.node);
    }
}

/// A schema of version 1 (the tables alone, before the one-tick claim's stored procedure,
/// the nodes and the actions) is brought to the current version by `migrate`; a one-tick
/// claim fails before and works after.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_version_1_schema_is_migrated_to_the_current_version() {
    let Some(ns) = Namespace::new().await else { return };
    let store = &stores(&ns, 1).await[0];
    let pool = sqlx::MySqlPool::connect(&ns.url).await.expect("connect");
    let p = &ns.prefix.table_prefix();
    for sql in [
        format!("DROP PROCEDURE {p}claim_one_v7"),
        format!("DROP TABLE {p}nodes, {p}actions"),
        format!("ALTER TABLE {p}runs DROP COLUMN nonce"),
        format!("UPDATE {p}schema SET version = 1"),
    ] {
        sqlx::query(&sql).execute(&pool).await.expect("make a version 1 schema");
    }
    let one = [run(tick("backup", 0), "a", LONG, false)];
    assert!(store.claim(&one).await.is_err(), "the procedure is missing");
    store.migrate().await.expect("migrate from version 1");
    let version: i64 = sqlx::query_scalar(&format!("SELECT CAST(version AS SIGNED) FROM {p}schema"))
        .fetch_one(&pool)
        .await
        .expect("version");
    assert_eq!(version, 7);
    assert!(matches!(store.claim(&one).await.expect("claim")[..], [ClaimOutcome::Won(_)]));
    assert_eq!(store.claim(&one).await.expect("claim"), vec![ClaimOutcome::Taken]);
    store.set_paused("backup", true, "ops", None).await.expect("the audit log is there");
    sqlx::query(&format!("UPDATE {p}schema SET version = 8")).execute(&pool).await.expect("a newer schema");
    let refused = store.migrate().await.expect_err("a newer schema is refused");
    assert!(refused.to_string().contains("schema version 8"), "{refused}");
    pool.close().await;
}

/// A schema of version 2 (before the nodes and actions tables) is brought to the current
/// version by `migrate`, keeping its data; heartbeats and the audit log then work on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_version_2_schema_gets_the_nodes_and_actions_tables() {
    let Some(ns) = Namespace::new().await else { return };
    let store = &stores(&ns, 1).await[0];
    store.set_paused("sync", true, "alice", Some("disk")).await.expect("pause");
    let pool = sqlx::MySqlPool::connect(&ns.url).await.expect("connect");
    let p = &ns.prefix.table_prefix();
    for sql in [format!("DROP TABLE {p}nodes, {p}actions"), format!("UPDATE {p}schema SET version = 2")] {
        sqlx::query(&sql).execute(&pool).await.expect("make a version 2 schema");
    }
    let beat = NodeBeat { node: "a".into(), version: "1".into(), jobs: 1, running: 0 };
    assert!(store.heartbeat(&beat).await.is_err(), "version 2 has no nodes table");
    store.migrate().await.expect("migrate from version 2");
    let version: i64 = sqlx::query_scalar(&format!("SELECT CAST(version AS SIGNED) FROM {p}schema"))
        .fetch_one(&pool)
        .await
        .expect("version");
    assert_eq!(version, 7);
    assert_eq!(store.controls().await.expect("controls")[0].reason.as_deref(), Some("disk"), "the switches survive");
    store.heartbeat(&beat).await.expect("heartbeat");
    assert_eq!(store.nodes().await.expect("nodes").len(), 1);
    store.set_paused("sync", false, "bob", None).await.expect("resume");
    let actions = store.actions(&ActionQuery::default()).await.expect("actions");
    assert_eq!(actions.iter().map(|a| (a.kind, a.by.as_str())).collect::<Vec<_>>(), [(ActionKind::Resume, "bob")]);
    pool.close().await;
}

/// A schema of version 3 (before managed jobs) is brought to the current version by `migrate`,
/// keeping its data; managed jobs are then written from revision 1, and a second migrate
/// keeps the revision counter.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_version_3_schema_gets_the_managed_jobs_tables() {
    let Some(ns) = Namespace::new().await else { return };
    let store = &stores(&ns, 1).await[0];
    store.set_paused("sync", true, "alice", Some("disk")).await.expect("pause");
    let pool = sqlx::MySqlPool::connect(&ns.url).await.expect("connect");
    let p = &ns.prefix.table_prefix();
    for sql in [
        format!("DROP TABLE {p}managed, {p}job_revisions, {p}managed_version"),
        format!("UPDATE {p}schema SET version = 3"),
    ] {
        sqlx::query(&sql).execute(&pool).await.expect("make a version 3 schema");
    }
    let spec = r#"{"schedule":"0 * * * * *","command":["true"]}"#;
    assert!(store.put_job("sync", spec, "ann", None).await.is_err(), "version 3 has no managed jobs");
    store.migrate().await.expect("migrate from version 3");
    let version: i64 = sqlx::query_scalar(&format!("SELECT CAST(version AS SIGNED) FROM {p}schema"))
        .fetch_one(&pool)
        .await
        .expect("version");
    assert_eq!(version, 7);
    assert_eq!(store.controls().await.expect("controls")[0].reason.as_deref(), Some("disk"), "the switches survive");
    assert_eq!(store.managed_version().await.expect("version"), 0);
    let wrote = store.put_job("sync", spec, "ann", Some(0)).await.expect("put");
    assert_eq!(wrote, solocron_core::JobWrite::Written(1));
    store.migrate().await.expect("migrate again");
    assert_eq!(store.managed_version().await.expect("version"), 1, "a second migrate keeps the counter");
    pool.close().await;
}

/// A schema of version 4 (before the runs' nonce column and the procedure that takes it)
/// is brought to the current version by `migrate`, keeping its records, which have no
/// nonce: asked again with any nonce, their ticks are taken. Version 4's procedure stays
/// for the nodes still calling it, until `uninstall`. New claims store their nonce and,
/// asked again with it, are won again alone and in a batch with their token, handing out
/// none.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_version_4_schema_gets_the_nonce_column_and_its_records_have_none() {
    let Some(ns) = Namespace::new().await else { return };
    let store = &stores(&ns, 1).await[0];
    let pool = sqlx::MySqlPool::connect(&ns.url).await.expect("connect");
    let p = &ns.prefix.table_prefix();
    let old = ClaimRequest { nonce: 7, ..run(tick("backup", 0), "a", LONG, false) };
    for sql in [
        format!("DROP PROCEDURE {p}claim_one_v7"),
        format!("CREATE PROCEDURE {p}claim_one() BEGIN END"),
        format!("ALTER TABLE {p}runs DROP COLUMN nonce"),
        format!("UPDATE {p}schema SET version = 4"),
        // A running claim as a version 4 build writes it.
        format!(
            "INSERT INTO {p}runs (job, scheduled_at, attempt, `trigger`, node, token, state, claimed_at, lease_until,
             output) VALUES ('backup', {}, 1, 'schedule', 'a', 1, 'running', 0, 0, '')",
            old.tick.scheduled_at.timestamp_millis()
        ),
        format!("INSERT INTO {p}fences VALUES ('backup', 1)"),
    ] {
        sqlx::query(&sql).execute(&pool).await.expect("make a version 4 schema");
    }
    assert!(store.claim(std::slice::from_ref(&old)).await.is_err(), "version 7's procedure is missing");
    store.migrate().await.expect("migrate from version 4");
    store.migrate().await.expect("migrate again");
    let version: i64 = sqlx::query_scalar(&format!("SELECT CAST(version AS SIGNED) FROM {p}schema"))
        .fetch_one(&pool)
        .await
        .expect("version");
    assert_eq!(version, 7);
    assert_eq!(store.claim(std::slice::from_ref(&old)).await.expect("claim"), [ClaimOutcome::Taken], "no nonce");

    let new = ClaimRequest { nonce: u64::MAX, ..run(tick("backup", 1), "a", LONG, false) };
    // The taken one-tick claim left a gap in the tokens.
    let first = won(store, new.clone()).await;
    let t = first.fencing_token;
    let again = won(store, new.clone()).await;
    assert_eq!((again.fencing_token, again.claimed_at), (t, first.claimed_at), "alone");
    let batch = [old, new, ClaimRequest { nonce: 8, ..run(tick("backup", 2), "a", LONG, false) }];
    let outcomes = store.claim(&batch).await.expect("claim");
    let lease = |o: &ClaimOutcome| match o {
        ClaimOutcome::Won(lease) => lease.clone(),
        other => panic!("expected Won, got {other:?}"),
    };
    assert_eq!(outcomes[0], ClaimOutcome::Taken);
    let (again, next) = (lease(&outcomes[1]), lease(&outcomes[2]));
    assert_eq!((again.fencing_token, again.claimed_at, next.fencing_token), (t, first.claimed_at, t + 1), "in a batch");
    let stored: Vec<(Option<i64>, Option<i64>)> =
        sqlx::query_as(&format!("SELECT nonce, lease_until FROM {p}runs ORDER BY scheduled_at"))
            .fetch_all(&pool)
            .await
            .expect("records");
    let ms = |lease: &Lease| Some(lease.lease_until.timestamp_millis());
    assert_eq!(stored, [(None, Some(0)), (Some(-1), ms(&again)), (Some(8), ms(&next))]);
    let counter: i64 = sqlx::query_scalar(&format!("SELECT token FROM {p}fences WHERE job = 'backup'"))
        .fetch_one(&pool)
        .await
        .expect("counter");
    assert_eq!(counter, t as i64 + 1, "a claim won again hands out no token");

    assert!(objects_named(&pool, p).await.contains(&format!("procedure {p}claim_one")), "version 4's stays");
    store.uninstall().await.expect("uninstall");
    assert_eq!(objects_named(&pool, p).await, Vec::<String>::new());
    pool.close().await;
}

/// What the claim's second round trip relies on: the server stops a multi-statement query
/// at the first statement that fails, so the `COMMIT` after a failed insert never runs; the
/// rollback then leaves nothing, and the connection goes on working.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failed_statement_stops_the_rest_of_a_multi_statement_query() {
    use sqlx::{Connection, Executor, Row};
    let Some(ns) = Namespace::new().await else { return };
    let table = format!("{}multi", ns.prefix.table_prefix());
    let mut conn = sqlx::MySqlConnection::connect(&ns.url).await.expect("connect");
    conn.execute(format!("CREATE TABLE {table} (id INT PRIMARY KEY)").as_str()).await.expect("create");
    conn.execute(format!("INSERT INTO {table} VALUES (1)").as_str()).await.expect("insert");
    let failed = conn
        .execute(
            format!("START TRANSACTION; INSERT INTO {table} VALUES (2); INSERT INTO {table} VALUES (1); COMMIT")
                .as_str(),
        )
        .await;
    assert!(failed.is_err(), "the duplicate must fail the query");
    conn.execute("ROLLBACK").await.expect("rollback");
    let ids: Vec<i32> = conn
        .fetch_all(format!("SELECT id FROM {table} ORDER BY id").as_str())
        .await
        .expect("select")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(ids, [1], "the row before the failure was not committed");
    conn.execute(format!("DROP TABLE {table}").as_str()).await.expect("drop");
}

/// Each registration as `(node, job)`, by job then node.
async fn registered(store: &MySqlStore) -> Vec<(String, String)> {
    store.registrations().await.expect("registrations").into_iter().map(|r| (r.node, r.definition.job)).collect()
}

/// A schema of version 5 (before the registry's mark and key by node) is brought to the
/// current version by `migrate`; the registrations a version 5 build wrote (no mark) are
/// kept when listed again, keeping `first_seen`, and removed when not.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_version_5_schema_gets_the_registry_mark_and_its_rows_are_removed_once_unlisted() {
    let Some(ns) = Namespace::new().await else { return };
    let store = &stores(&ns, 1).await[0];
    let pool = sqlx::MySqlPool::connect(&ns.url).await.expect("connect");
    let p = &ns.prefix.table_prefix();
    for sql in [
        format!("ALTER TABLE {p}registry DROP KEY {p}registry_node"),
        format!("ALTER TABLE {p}registry DROP COLUMN mark"),
        format!("UPDATE {p}schema SET version = 5"),
        // Registrations as a version 5 build writes them.
        format!(
            "INSERT INTO {p}registry (job, node, schedule, timezone, definition_hash, summary, first_seen, last_seen)
             VALUES ('backup', 'a', 's', 'UTC', 'h', 's', 5, 5), ('sync', 'a', 's', 'UTC', 'h', 's', 5, 5),
                    ('sync', 'b', 's', 'UTC', 'h', 's', 5, 5)"
        ),
    ] {
        sqlx::query(&sql).execute(&pool).await.expect("make a version 5 schema");
    }
    assert!(store.register("a", &[definition("backup", "h2")]).await.is_err(), "version 5 has no mark");
    store.migrate().await.expect("migrate from version 5");
    store.migrate().await.expect("migrate again");
    let version: i64 = sqlx::query_scalar(&format!("SELECT CAST(version AS SIGNED) FROM {p}schema"))
        .fetch_one(&pool)
        .await
        .expect("version");
    assert_eq!(version, 7);
    store.register("a", &[definition("backup", "h2")]).await.expect("register");
    let left = store.registrations().await.expect("registrations");
    let keys: Vec<_> = left.iter().map(|r| (r.node.as_str(), r.definition.job.as_str())).collect();
    assert_eq!(keys, [("a", "backup"), ("b", "sync")], "a no longer lists sync; b is untouched");
    assert_eq!((left[0].first_seen.timestamp_millis(), left[0].definition.definition_hash.as_str()), (5, "h2"));
    pool.close().await;
}

/// The job's fencing counter, `None` while it has no fence row.
async fn counter(pool: &sqlx::MySqlPool, p: &str, job: &str) -> Option<i64> {
    sqlx::query_scalar(&format!("SELECT token FROM {p}fences WHERE job = ?"))
        .bind(job)
        .fetch_optional(pool)
        .await
        .expect("counter")
}

/// A schema of version 6 (before the procedure that refuses a tick claimed too early) is
/// brought to the current version by `migrate`, keeping version 5's procedure for the
/// nodes still calling it, until `uninstall`. A scheduled tick too far ahead of the
/// server's clock is then refused alone and in a batch, without a record, a counter change
/// or even a fence row for a new job; a manual one is won, and the counter is where the
/// wins left it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_version_6_schema_gets_the_procedure_that_refuses_early_ticks_and_keeps_the_old_one() {
    let Some(ns) = Namespace::new().await else { return };
    let store = &stores(&ns, 1).await[0];
    let pool = sqlx::MySqlPool::connect(&ns.url).await.expect("connect");
    let p = &ns.prefix.table_prefix();
    for sql in [
        format!("DROP PROCEDURE {p}claim_one_v7"),
        format!("CREATE PROCEDURE {p}claim_one_v5() BEGIN END"),
        format!("UPDATE {p}schema SET version = 6"),
    ] {
        sqlx::query(&sql).execute(&pool).await.expect("make a version 6 schema");
    }
    let past = run(tick("backup", 0), "a", LONG, false);
    assert!(store.claim(std::slice::from_ref(&past)).await.is_err(), "version 7's procedure is missing");
    store.migrate().await.expect("migrate from version 6");
    store.migrate().await.expect("migrate again");
    let version: i64 = sqlx::query_scalar(&format!("SELECT CAST(version AS SIGNED) FROM {p}schema"))
        .fetch_one(&pool)
        .await
        .expect("version");
    assert_eq!(version, 7);
    assert_eq!(won(store, past).await.fencing_token, 1);

    let now = store.now().await.expect("now");
    let ahead = DateTime::from_timestamp_millis((now + chrono::Duration::seconds(30)).timestamp_millis()).expect("ms");
    let early = |job: &str| run(Tick::new(job, ahead), "a", LONG, false);
    for batch in [vec![early("backup")], vec![early("backup"), early("fresh")]] {
        let outcomes = store.claim(&batch).await.expect("claim");
        for outcome in &outcomes {
            let ClaimOutcome::TooEarly { store_now } = outcome else { panic!("too early: {outcomes:?}") };
            assert!((*store_now - now).num_seconds().abs() < 5, "the server's clock: {store_now}, read {now}");
        }
        assert_eq!(counter(&pool, p, "backup").await, Some(1), "no counter change");
        assert_eq!(counter(&pool, p, "fresh").await, None, "no fence row");
    }
    let manual = ClaimRequest { trigger: Trigger::Manual, ..early("fresh") };
    let mixed = [early("backup"), manual.clone(), run(tick("backup", 1), "a", LONG, false)];
    let outcomes = store.claim(&mixed).await.expect("claim");
    assert!(matches!(outcomes[..], [ClaimOutcome::TooEarly { .. }, ClaimOutcome::Won(_), ClaimOutcome::Won(_)]));
    assert_eq!((counter(&pool, p, "backup").await, counter(&pool, p, "fresh").await), (Some(2), Some(1)));
    assert_eq!(won(store, ClaimRequest { tick: tick("manual", 0), ..manual }).await.fencing_token, 1, "alone");
    assert_eq!(store.history(&HistoryQuery::default()).await.expect("history").len(), 4, "no early record");

    assert!(objects_named(&pool, p).await.contains(&format!("procedure {p}claim_one_v5")), "version 5's stays");
    store.uninstall().await.expect("uninstall");
    assert_eq!(objects_named(&pool, p).await, Vec::<String>::new());
    pool.close().await;
}

/// `register` takes lists of more rows than one statement's placeholders hold (chunks of
/// upserts, one delete by mark); two calls in a row, however close, each leave exactly
/// their own list.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn register_removes_unlisted_jobs_for_long_lists_and_quick_calls() {
    let Some(ns) = Namespace::new().await else { return };
    let store = &stores(&ns, 1).await[0];
    let many: Vec<_> = (0..12_000).map(|i| definition(&format!("job-{i:05}"), "h")).collect();
    store.register("b", &many[..2]).await.expect("register b");
    store.register("a", &many).await.expect("register a");
    assert_eq!(store.registrations().await.expect("registrations").len(), many.len() + 2);
    for round in 0..5 {
        let (kept, other) = (&many[round..round + 1], &many[round + 7..round + 9]);
        store.register("a", &[kept, other].concat()).await.expect("register a");
        store.register("a", kept).await.expect("register a again at once");
        let mut expected: Vec<_> = [("a", &kept[0].job), ("b", &many[0].job), ("b", &many[1].job)]
            .map(|(node, job)| (node.to_owned(), job.clone()))
            .into();
        expected.sort_by(|x, y| (&x.1, &x.0).cmp(&(&y.1, &y.0)));
        assert_eq!(registered(store).await, expected, "round {round}");
    }
    store.register("a", &[]).await.expect("register nothing");
    assert_eq!(registered(store).await.len(), 2, "only b's are left");
}

/// `register`'s delete finds the node's rows by `{p}registry_node` in a registry of many
/// nodes, not by reading every node's registrations.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_removal_of_unlisted_jobs_reads_the_registry_by_node() {
    let Some(ns) = Namespace::new().await else { return };
    let store = &stores(&ns, 1).await[0];
    let jobs: Vec<_> = (0..100).map(|i| definition(&format!("job-{i:03}"), "h")).collect();
    for node in 0..40 {
        store.register(&format!("node-{node:02}"), &jobs).await.expect("register");
    }
    let pool = sqlx::MySqlPool::connect(&ns.url).await.expect("connect");
    let p = &ns.prefix.table_prefix();
    sqlx::query(&format!("ANALYZE TABLE {p}registry")).execute(&pool).await.expect("analyze");
    let plan: Vec<sqlx::mysql::MySqlRow> =
        sqlx::query(&format!("EXPLAIN DELETE FROM {p}registry WHERE node = 'node-07' AND mark <> 7"))
            .fetch_all(&pool)
            .await
            .expect("explain");
    let key: Option<String> = sqlx::Row::try_get(&plan[0], "key").expect("the plan's key");
    assert_eq!(key, Some(format!("{p}registry_node")));
    pool.close().await;
}

/// A failed end (exit code 3), for retries.
fn failed() -> RunEnd {
    RunEnd {
        state: RunState::Failed,
        reason: Some("exit code 3".into()),
        exit_code: Some(3),
        output: "boom".into(),
        started_after: None,
    }
}

/// A waiting retry stays until someone starts or drops it: `prune` never deletes it,
/// however old its tick. `expired` lists due retries and expired runs together, oldest
/// `lease_until` first, at most `limit`, and reads each kind in order from the key
/// `{p}runs_expiry`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn waiting_retries_are_listed_with_expired_runs_and_never_pruned() {
    let Some(ns) = Namespace::new().await else { return };
    let store = &stores(&ns, 1).await[0];
    // Due in this order: a's lease, b's retry, c's lease (each step starts no earlier).
    let a = won(store, run(tick("a", 0), "n", Duration::from_millis(100), false)).await;
    let b = won(store, run(tick("b", 0), "n", LONG, false)).await;
    assert!(store.finish_for_retry(&b, &failed(), Duration::from_millis(150)).await.expect("finish_for_retry"));
    let c = won(store, run(tick("c", 0), "n", Duration::from_millis(200), false)).await;
    let b2 = solocron_core::RunId { tick: b.run.tick.clone(), attempt: 2 };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let ids = |records: Vec<solocron_core::RunRecord>| records.into_iter().map(|r| r.id).collect::<Vec<_>>();
    assert_eq!(
        ids(store.expired(10, &solocron_core::Namespaces::ALL).await.expect("expired")),
        [a.run.clone(), b2.clone(), c.run.clone()]
    );
    assert_eq!(
        ids(store.expired(2, &solocron_core::Namespaces::ALL).await.expect("expired")),
        [a.run.clone(), b2.clone()]
    );
    assert_eq!(
        store.prune(Duration::from_secs(3600), 100, &solocron_core::Namespaces::ALL).await.expect("prune"),
        1,
        "only b's failed attempt 1"
    );
    let left = store.history(&HistoryQuery::default()).await.expect("history");
    assert!(left.iter().any(|r| r.id == b2 && r.state == RunState::Waiting), "{left:?}");

    let pool = sqlx::MySqlPool::connect(&ns.url).await.expect("connect");
    let p = &ns.prefix.table_prefix();
    sqlx::query(&format!("ANALYZE TABLE {p}runs")).execute(&pool).await.expect("analyze");
    let due = |state: &str| {
        format!("(SELECT job, lease_until FROM {p}runs WHERE state = '{state}' AND lease_until < 9 ORDER BY lease_until LIMIT 5)")
    };
    let sql = format!("EXPLAIN {} UNION ALL {} ORDER BY lease_until LIMIT 5", due("running"), due("waiting"));
    let plan: Vec<sqlx::mysql::MySqlRow> = sqlx::query(&sql).fetch_all(&pool).await.expect("explain");
    let key = |row| -> Option<String> { sqlx::Row::try_get(&plan[row], "key").expect("the plan's key") };
    assert_eq!((key(0), key(1)), (Some(format!("{p}runs_expiry")), Some(format!("{p}runs_expiry"))));
    pool.close().await;
}

/// `finish_for_retry` is one transaction: if the next attempt cannot be written (here it
/// exists already), the end is not recorded either, and the run is still running.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_finish_for_retry_that_cannot_write_its_retry_records_nothing() {
    let Some(ns) = Namespace::new().await else { return };
    let store = &stores(&ns, 1).await[0];
    let lease = won(store, run(tick("flaky", 0), "a", LONG, false)).await;
    let pool = sqlx::MySqlPool::connect(&ns.url).await.expect("connect");
    let p = &ns.prefix.table_prefix();
    sqlx::query(&format!(
        "INSERT INTO {p}runs (job, scheduled_at, attempt, `trigger`, node, state, claimed_at, output)
         VALUES ('flaky', ?, 2, 'retry', 'x', 'skipped', 0, '')"
    ))
    .bind(lease.run.tick.scheduled_at.timestamp_millis())
    .execute(&pool)
    .await
    .expect("insert attempt 2");
    pool.close().await;
    assert!(store.finish_for_retry(&lease, &failed(), LONG).await.is_err(), "attempt 2 exists");
    let records = store.history(&HistoryQuery::default()).await.expect("history");
    let first = records.iter().find(|r| r.id == lease.run).expect("attempt 1");
    assert_eq!((first.state, first.finished_at), (RunState::Running, None));
    assert!(store.finish(&lease, &succeeded()).await.expect("finish"), "the lease still holds");
}

/// The schema version this build writes (the crate's `SCHEMA_VERSION`).
const CURRENT: u32 = 7;

/// `schema` on a fresh prefix says Missing and creates nothing (a second look still finds
/// nothing: no version table, no other table or routine of the prefix).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn schema_of_a_fresh_prefix_is_missing_and_creates_nothing() {
    let Some(ns) = Namespace::new().await else { return };
    let store = ns.store().await;
    assert_eq!(store.schema().await.expect("schema"), SchemaState::Missing);
    assert_eq!(store.schema().await.expect("schema"), SchemaState::Missing);
    let pool = sqlx::MySqlPool::connect(&ns.url).await.expect("connect");
    assert_eq!(objects_named(&pool, &ns.prefix.table_prefix()).await, Vec::<String>::new(), "schema() wrote nothing");
    pool.close().await;
}

/// After `migrate` the schema is Current; a prefix whose names begin like it is still Missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn schema_after_migrate_is_current_and_other_prefixes_stay_missing() {
    let Some(ns) = Namespace::new().await else { return };
    assert_eq!(ns.migrated().await.schema().await.expect("schema"), SchemaState::Current);
    assert_eq!(ns.nested("other").store().await.schema().await.expect("schema"), SchemaState::Missing);
}

/// A stored version above this build's is Newer, one below Older; an emptied version table
/// is Missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn schema_reports_a_stored_version_above_as_newer_below_as_older_and_none_as_missing() {
    let Some(ns) = Namespace::new().await else { return };
    let store = ns.migrated().await;
    let pool = sqlx::MySqlPool::connect(&ns.url).await.expect("connect");
    let p = &ns.prefix.table_prefix();
    let set = format!("UPDATE {p}schema SET version = ?");
    sqlx::query(&set).bind(CURRENT + 1).execute(&pool).await.expect("a newer version");
    assert_eq!(store.schema().await.expect("schema"), SchemaState::Newer { found: CURRENT + 1, current: CURRENT });
    sqlx::query(&set).bind(CURRENT - 1).execute(&pool).await.expect("an older version");
    assert_eq!(store.schema().await.expect("schema"), SchemaState::Older { found: CURRENT - 1, current: CURRENT });
    sqlx::query(&format!("DELETE FROM {p}schema")).execute(&pool).await.expect("no version row");
    assert_eq!(store.schema().await.expect("schema"), SchemaState::Missing);
    pool.close().await;
}

/// A store that cannot reach its server (here: its pool closed) answers Unavailable.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn schema_of_an_unreachable_store_is_unavailable() {
    let Some(ns) = Namespace::new().await else { return };
    let store = ns.migrated().await;
    store.close().await;
    let err = store.schema().await.expect_err("closed");
    assert!(matches!(err, StoreError::Unavailable(_)), "{err}");
}

/// An end in `state`.
fn ended(state: RunState) -> RunEnd {
    RunEnd { state, reason: None, exit_code: None, output: String::new(), started_after: None }
}

/// Counts by state, sorted by name: `RunCounts` lists them in no order.
fn by_name(counts: impl IntoIterator<Item = (RunState, u64)>) -> Vec<(&'static str, u64)> {
    let mut counts: Vec<(&'static str, u64)> = counts.into_iter().map(|(s, n)| (s.as_str(), n)).collect();
    counts.sort_unstable();
    counts
}

/// What the trait's default `count_runs` counts: every record of `job` in the history
/// scheduled at or after `since`, by state (read whole here, filtered in the test).
async fn counted_from_history(store: &MySqlStore, job: &str, since: DateTime<Utc>) -> Vec<(&'static str, u64)> {
    let all = store.history(&HistoryQuery::default()).await.expect("history");
    let mut counts = RunCounts::default();
    for r in all.iter().filter(|r| r.id.tick.job == job && r.id.tick.scheduled_at >= since) {
        counts.add(r.state, 1);
    }
    by_name(counts.by_state)
}

/// Records of two jobs in every state the store's own steps make (won and held, finished
/// two ways, failed with a waiting retry, expired and retried, expired and abandoned,
/// skipped), around `since`: one of each job exactly at `since`, one a millisecond before.
async fn records_around(store: &MySqlStore, since: DateTime<Utc>) {
    let at = |job: &str, ms: i64| Tick::new(job, since + chrono::Duration::milliseconds(ms));
    for job in ["backup", "sync"] {
        for (ms, state) in [(-1, RunState::Succeeded), (0, RunState::Succeeded), (60_000, RunState::TimedOut)] {
            let lease = won(store, run(at(job, ms), "a", LONG, false)).await;
            assert!(store.finish(&lease, &ended(state)).await.expect("finish"));
        }
        let lease = won(store, run(at(job, 120_000), "a", LONG, false)).await;
        assert!(store.finish_for_retry(&lease, &ended(RunState::Failed), LONG).await.expect("finish for retry"));
        let skip = ClaimRequest {
            mode: ClaimMode::Skip { reason: "missed".into() },
            ..run(at(job, 180_000), "a", LONG, false)
        };
        assert!(matches!(store.claim(&[skip]).await.expect("skip")[..], [ClaimOutcome::Skipped { .. }]));
        won(store, run(at(job, 240_000), "a", LONG, false)).await;
    }
    let short = Duration::from_millis(200);
    let retried = won(store, run(at("backup", 300_000), "a", short, false)).await;
    let abandoned = won(store, run(at("backup", 360_000), "a", short, false)).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    let retry = RecoverAction::Retry { node: "b".into(), lease: LONG };
    assert!(matches!(store.recover(&retried.run, &retry).await.expect("retry"), RecoverOutcome::Retried(_)));
    let abandon = RecoverAction::Abandon { reason: "gone".into() };
    assert_eq!(store.recover(&abandoned.run, &abandon).await.expect("abandon"), RecoverOutcome::Abandoned);
}

/// `count_runs` counts, in one query, the records of the job asked (every attempt) whose
/// tick is at or after `since`, by state: one exactly at `since` is counted, one a
/// millisecond before is not, another job's never; the counts are those its history gives
/// (the trait's default), and never truncated.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn count_runs_counts_every_attempt_of_the_job_from_since_by_state_as_history_does() {
    let Some(ns) = Namespace::new().await else { return };
    let store = ns.migrated().await;
    let since = tick("backup", 10).scheduled_at;
    records_around(&store, since).await;
    let counts = store.count_runs("backup", since).await.expect("count");
    assert!(!counts.truncated);
    let expected = [
        ("abandoned", 1),
        ("failed", 1),
        ("lost", 1),
        ("running", 2),
        ("skipped", 1),
        ("succeeded", 1),
        ("timed_out", 1),
        ("waiting", 1),
    ];
    assert_eq!(by_name(counts.by_state), expected);
    for (job, from) in [("backup", since), ("sync", since), ("backup", since - chrono::Duration::milliseconds(1))] {
        let counts = store.count_runs(job, from).await.expect("count");
        assert_eq!(by_name(counts.by_state), counted_from_history(&store, job, from).await, "{job} from {from}");
    }
    let before = store.count_runs("backup", since - chrono::Duration::milliseconds(1)).await.expect("count");
    assert!(by_name(before.by_state).contains(&("succeeded", 2)), "the record a millisecond before");
    let later = since + chrono::Duration::milliseconds(360_001);
    assert_eq!(store.count_runs("backup", later).await.expect("count"), RunCounts::default(), "nothing after the last");
    assert_eq!(store.count_runs("nothing", since).await.expect("count"), RunCounts::default(), "a job never run");
}

/// A record in a state this version cannot read fails `count_runs` as it fails `history`
/// (`Invalid`, naming the column), rather than being counted as something else.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn count_runs_fails_on_a_state_it_cannot_read_as_history_does() {
    let Some(ns) = Namespace::new().await else { return };
    let store = ns.migrated().await;
    let since = tick("backup", 10).scheduled_at;
    won(&store, run(Tick::new("backup", since), "a", LONG, false)).await;
    let pool = sqlx::MySqlPool::connect(&ns.url).await.expect("connect");
    let p = &ns.prefix.table_prefix();
    sqlx::query(&format!("UPDATE {p}runs SET state = 'paused_forever'")).execute(&pool).await.expect("update");
    pool.close().await;
    let query = HistoryQuery { job: Some("backup".into()), since: Some(since), ..HistoryQuery::default() };
    let history = store.history(&query).await.expect_err("history");
    let count = store.count_runs("backup", since).await.expect_err("count");
    for err in [history, count] {
        assert!(matches!(&err, StoreError::Invalid(m) if m.contains("column state")), "{err}");
    }
    assert_eq!(store.count_runs("sync", since).await.expect("count"), RunCounts::default(), "other jobs still count");
}

/// `count_runs`'s query reads a range of the primary key over both the job and the instant
/// (its key length covers both columns), not the whole table nor `{p}runs_job_state`'s
/// every record of the job.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn count_runs_reads_a_range_of_the_primary_key() {
    let Some(ns) = Namespace::new().await else { return };
    let store = ns.migrated().await;
    let batch: Vec<ClaimRequest> =
        (0..1000).map(|i| run(tick(&format!("job-{:02}", i % 50), i / 50), "a", LONG, false)).collect();
    assert!(store.claim(&batch).await.expect("claim").iter().all(|o| matches!(o, ClaimOutcome::Won(_))));
    let pool = sqlx::MySqlPool::connect(&ns.url).await.expect("connect");
    let p = &ns.prefix.table_prefix();
    sqlx::query(&format!("ANALYZE TABLE {p}runs")).execute(&pool).await.expect("analyze");
    let since = tick("job-07", 15).scheduled_at.timestamp_millis();
    let plan: Vec<sqlx::mysql::MySqlRow> = sqlx::query(&format!(
        "EXPLAIN SELECT state, COUNT(*) AS n FROM {p}runs WHERE job = 'job-07' AND scheduled_at >= {since} GROUP BY state"
    ))
    .fetch_all(&pool)
    .await
    .expect("explain");
    let column = |name: &str| -> Option<String> { sqlx::Row::try_get(&plan[0], name).expect("the plan's column") };
    assert_eq!((column("type"), column("key")), (Some("range".into()), Some("PRIMARY".into())));
    // utf8mb4 `job` (191 characters, 4 bytes each, and a 2-byte length) and the BIGINT instant.
    assert_eq!(column("key_len"), Some((191 * 4 + 2 + 8).to_string()));
    pool.close().await;
}
