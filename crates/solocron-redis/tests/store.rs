//! Redis-specific behaviour beyond the conformance suite: big batches, concurrent
//! claimers on separate connections, fencing across a lost memory, and errors. Each test
//! runs on a fresh key prefix (see `solocron_conformance::server`); an unreachable server skips, or fails under CI.
#![forbid(unsafe_code)]

mod common;

use solocron_core::AuditStore;
use solocron_core::ClaimStore;
use solocron_core::ControlStore;
use solocron_core::FleetStore;
use solocron_core::HistoryStore;
use solocron_core::RegistryStore;
use solocron_core::RequestStore;
use solocron_core::RunStore;
use solocron_core::SchemaStore;
use solocron_core::StoreBase;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use redis::Value;
use solocron_conformance::checks::definition;
use solocron_core::{
    ActionQuery, ClaimMode, ClaimOutcome, ClaimRequest, Ending, HistoryQuery, Lease, Prefix, RecoverAction,
    RecoverOutcome, RunEnd, RunState, SchemaState, StoreError, Tick, Trigger,
};
use solocron_redis::RedisStore;
use tokio::sync::Barrier;

const LONG: Duration = Duration::from_secs(60);

fn at(s: &str) -> DateTime<Utc> {
    s.parse().expect("instant")
}

/// A tick of `job` at `second` seconds after 2020-01-01.
fn tick(job: &str, second: i64) -> Tick {
    Tick::new(job, at("2020-01-01T00:00:00Z") + chrono::Duration::seconds(second))
}

fn run(tick: Tick, node: &str, skip_if_running: bool) -> ClaimRequest {
    ClaimRequest {
        tick,
        trigger: Trigger::Schedule,
        node: node.into(),
        lease: LONG,
        mode: ClaimMode::Run { skip_if_running },
        nonce: 0,
    }
}

async fn won(store: &RedisStore, request: ClaimRequest) -> Lease {
    match store.claim(&[request]).await.expect("claim").remove(0) {
        ClaimOutcome::Won(lease) => lease,
        other => panic!("expected Won, got {other:?}"),
    }
}

fn done() -> RunEnd {
    RunEnd { state: RunState::Succeeded, reason: None, exit_code: Some(0), output: String::new(), started_after: None }
}

#[tokio::test]
async fn a_batch_of_1000_ticks_of_100_jobs_is_won_in_one_call_with_tokens_rising_per_job() {
    let Some(ns) = common::Namespace::new().await else { return };
    let store = ns.migrated().await;
    // Ticks in round-robin order of jobs, so that each job's ticks are spread over the batch.
    let batch: Vec<ClaimRequest> =
        (0..1000).map(|i| run(tick(&format!("job-{:03}", i % 100), i / 100), "a", false)).collect();
    let started = Instant::now();
    let outcomes = store.claim(&batch).await.expect("claim");
    eprintln!("claimed 1000 ticks of 100 jobs in one call in {:?}", started.elapsed());

    assert_eq!(outcomes.len(), 1000);
    let mut last_token = std::collections::HashMap::new();
    for (request, outcome) in batch.iter().zip(&outcomes) {
        let ClaimOutcome::Won(lease) = outcome else { panic!("expected Won for {:?}: {outcome:?}", request.tick) };
        assert_eq!(lease.run.tick, request.tick, "outcomes in request order");
        if let Some(previous) = last_token.insert(request.tick.job.clone(), lease.fencing_token) {
            assert!(lease.fencing_token > previous, "{}: {previous} then {}", request.tick.job, lease.fencing_token);
        }
    }
    let records = store.history(&HistoryQuery::default()).await.expect("history");
    assert_eq!(records.len(), 1000);
    assert!(store.claim(&batch).await.expect("claim").iter().all(|o| *o == ClaimOutcome::Taken));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
async fn exactly_one_of_8_claimers_on_separate_connections_wins_each_tick() {
    let Some(ns) = common::Namespace::new().await else { return };
    let mut stores = Vec::new();
    for _ in 0..8 {
        stores.push(Arc::new(ns.migrated().await));
    }
    for second in 0..20 {
        let barrier = Arc::new(Barrier::new(stores.len()));
        let tasks: Vec<_> = stores
            .iter()
            .enumerate()
            .map(|(i, store)| {
                let (store, barrier) = (store.clone(), barrier.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    store.claim(&[run(tick("backup", second), &format!("node-{i}"), false)]).await.expect("claim")
                })
            })
            .collect();
        let mut outcomes = Vec::new();
        for task in tasks {
            outcomes.extend(task.await.expect("task"));
        }
        let winners = outcomes.iter().filter(|o| matches!(o, ClaimOutcome::Won(_))).count();
        let taken = outcomes.iter().filter(|o| **o == ClaimOutcome::Taken).count();
        assert_eq!((winners, taken), (1, 7), "tick {second}: {outcomes:?}");
    }
}

#[tokio::test]
async fn renewal_by_a_stranger_or_with_a_stale_token_never_extends_the_lease() {
    let Some(ns) = common::Namespace::new().await else { return };
    let store = ns.migrated().await;
    let short = ClaimRequest { lease: Duration::from_millis(300), ..run(tick("backup", 0), "a", false) };
    let old = won(&store, short).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    let retry = RecoverAction::Retry { node: "b".into(), lease: LONG };
    let RecoverOutcome::Retried(current) = store.recover(&old.run, &retry).await.expect("recover") else {
        panic!("the expired run should be retried")
    };
    let record = |store: &RedisStore, lease: &Lease| {
        let (store, id) = (store.clone(), lease.run.clone());
        async move {
            let all = store.history(&HistoryQuery::default()).await.expect("history");
            all.into_iter().find(|r| r.id == id).expect("record")
        }
    };
    let before = record(&store, &current).await;
    let wrong = [
        Lease { owner: "a".into(), ..current.clone() },
        Lease { fencing_token: current.fencing_token - 1, ..current.clone() },
        Lease { fencing_token: current.fencing_token + 1, ..current.clone() },
        Lease { fencing_token: old.fencing_token, ..current.clone() },
    ];
    for lease in wrong.iter().chain([&old]) {
        assert!(!store.renew(lease, Duration::from_secs(3600)).await.expect("renew"), "renewed with {lease:?}");
        assert!(!store.finish(lease, &done()).await.expect("finish"), "finished with {lease:?}");
    }
    assert_eq!(record(&store, &current).await, before, "nothing changed");
    assert!(store.renew(&current, Duration::from_secs(3600)).await.expect("renew"));
}

#[tokio::test]
async fn after_forgetting_everything_tokens_stay_larger_memory_moves_on_and_old_ticks_are_claimable() {
    let Some(ns) = common::Namespace::new().await else { return };
    let store = ns.migrated().await;
    let first = won(&store, run(tick("backup", 0), "a", false)).await;
    assert!(store.finish(&first, &done()).await.expect("finish"));
    let held = won(&store, run(tick("backup", 60), "a", false)).await;
    let remembered_since = store.memory_since().await.expect("memory_since").expect("an epoch");

    tokio::time::sleep(Duration::from_millis(20)).await;
    // What a Redis restart without persistence does to this prefix (the real restart is
    // tested elsewhere): every key is gone.
    assert!(common::forget(&ns).await.expect("forget") > 0);
    let restarted = store.now().await.expect("now");

    // The holder of a running run finds its lease gone at its next renewal and stops.
    assert!(!store.renew(&held, LONG).await.expect("renew"), "the lease was forgotten");
    assert!(!store.finish(&held, &done()).await.expect("finish"));
    // A tick before the store's memory began may have run before it forgot: the claim
    // records it skipped, saying why, and runs it never again (the engine also never looks
    // back before memory_since).
    match store.claim(&[run(tick("backup", 0), "b", false)]).await.expect("claim").remove(0) {
        ClaimOutcome::Skipped { reason } => assert!(reason.contains("the store forgot its data"), "{reason}"),
        other => panic!("a tick from before the store forgot was {other:?}"),
    }
    let later = |minutes: i64| Tick::new("backup", restarted + chrono::Duration::minutes(minutes));
    let again = won(&store, ClaimRequest { trigger: Trigger::Catchup, ..run(later(1), "b", false) }).await;
    assert!(again.fencing_token > held.fencing_token, "{} after {}", again.fencing_token, held.fencing_token);
    let next = won(&store, ClaimRequest { trigger: Trigger::Catchup, ..run(later(2), "b", false) }).await;
    assert!(next.fencing_token > again.fencing_token, "{} after {}", next.fencing_token, again.fencing_token);
    let since = store.memory_since().await.expect("memory_since").expect("an epoch");
    assert!(since > remembered_since, "memory began again: {since} after {remembered_since}");
    assert!(since >= restarted - chrono::Duration::milliseconds(1), "marked by the first claim after the restart");
    assert!(since <= again.claimed_at, "{since} after the first claim at {}", again.claimed_at);
}

#[tokio::test]
async fn memory_since_marks_the_epoch_itself_when_nothing_else_did() {
    let Some(ns) = common::Namespace::new().await else { return };
    let store = ns.store().await;
    let before = store.now().await.expect("now");
    let since = store.memory_since().await.expect("memory_since").expect("an epoch");
    assert!(since >= before - chrono::Duration::milliseconds(1) && since <= store.now().await.expect("now"));
    assert_eq!(store.memory_since().await.expect("memory_since"), Some(since), "marked once");
    store.migrate().await.expect("migrate");
    assert_eq!(store.memory_since().await.expect("memory_since"), Some(since), "migrate keeps the mark");
}

/// Sets the job's token counter as a failover or a clock step could leave it.
async fn set_counter(ns: &common::Namespace, job: &str, value: u64) {
    let mut conn = common::raw(&ns.url).await.expect("connect");
    let () = redis::cmd("HSET")
        .arg(format!("{}fences", ns.prefix.redis_key_prefix()))
        .arg(job)
        .arg(value)
        .query_async(&mut conn)
        .await
        .expect("hset");
}

#[tokio::test]
async fn a_token_is_at_least_the_servers_clock_in_microseconds_even_when_the_counter_lags() {
    let Some(ns) = common::Namespace::new().await else { return };
    let store = ns.migrated().await;
    let a = won(&store, run(tick("backup", 0), "a", false)).await;
    let b = won(&store, run(tick("backup", 1), "a", false)).await;
    assert!(b.fencing_token > a.fencing_token);
    // As after a failover to a replica that missed the last increments (or a restore from
    // an old snapshot): the counter is far behind the tokens handed out.
    set_counter(&ns, "backup", 7).await;
    let before = store.now().await.expect("now");
    let c = won(&store, run(tick("backup", 2), "a", false)).await;
    let micros = u64::try_from(before.timestamp_micros()).expect("after 1970");
    assert!(c.fencing_token >= micros && c.fencing_token > b.fencing_token, "{c:?} at {micros} µs");
    // Several tokens of one job at one instant (one batch) still rise one by one.
    let batch: Vec<ClaimRequest> = (3..6).map(|m| run(tick("backup", m), "a", false)).collect();
    let tokens: Vec<u64> = store
        .claim(&batch)
        .await
        .expect("claim")
        .into_iter()
        .map(|o| match o {
            ClaimOutcome::Won(lease) => lease.fencing_token,
            other => panic!("expected Won, got {other:?}"),
        })
        .collect();
    assert!(tokens[0] > c.fencing_token && tokens.windows(2).all(|w| w[1] == w[0] + 1), "{tokens:?}");
}

#[tokio::test]
async fn a_token_stays_above_the_counter_when_the_servers_clock_went_back() {
    let Some(ns) = common::Namespace::new().await else { return };
    let store = ns.migrated().await;
    // As if the tokens so far were handed out while the clock was an hour ahead.
    let now = u64::try_from(store.now().await.expect("now").timestamp_micros()).expect("after 1970");
    let ahead = now + 3_600_000_000;
    set_counter(&ns, "backup", ahead).await;
    let a = won(&store, run(tick("backup", 0), "a", false)).await;
    assert_eq!(a.fencing_token, ahead + 1, "the counter, not the clock that went back");
}

/// Deletes every solocron Functions library on the server, as a restart without
/// persistence, a failover to a replica that never had it, or `FUNCTION FLUSH` would.
async fn forget_libraries(url: &str) {
    let mut conn = common::raw(url).await.expect("connect");
    let libraries: Vec<Vec<Value>> =
        redis::cmd("FUNCTION").arg("LIST").query_async(&mut conn).await.expect("function list");
    for library in libraries {
        let name = library.iter().skip_while(|v| **v != Value::BulkString(b"library_name".to_vec())).nth(1);
        let Some(Value::BulkString(name)) = name else { panic!("a library without a name: {library:?}") };
        if !name.starts_with(b"solocron_") {
            continue;
        }
        // Another test may have deleted it first.
        let _: redis::RedisResult<()> = redis::cmd("FUNCTION").arg("DELETE").arg(name).query_async(&mut conn).await;
    }
}

/// Claims two runs, makes the server forget the store's code with `forget`, then ends them
/// in one batch and claims again: every call must succeed.
async fn outlives_forgotten_code(store: &RedisStore, forget: impl std::future::Future<Output = ()>) {
    let leases = [won(store, run(tick("a", 0), "n", false)).await, won(store, run(tick("b", 0), "n", false)).await];
    forget.await;
    let endings: Vec<Ending> = leases.iter().map(|l| Ending { lease: l.clone(), end: done() }).collect();
    assert_eq!(store.finish_all(&endings).await.expect("finish_all"), [true, true]);
    let running = HistoryQuery { state: Some(RunState::Running), ..HistoryQuery::default() };
    assert!(store.history(&running).await.expect("history").is_empty(), "both runs ended");
    won(store, run(tick("a", 1), "n", false)).await;
}

#[tokio::test]
async fn the_store_calls_its_library_and_loads_it_again_after_the_server_forgot_it() {
    let Some(ns) = common::Namespace::new().await else { return };
    let store = ns.store().await;
    assert_eq!(store.calls_library(), None, "nothing called yet");
    store.migrate().await.expect("migrate");
    assert_eq!(store.calls_library(), Some(true));
    outlives_forgotten_code(&store, forget_libraries(&ns.url)).await;
    forget_libraries(&ns.url).await;
    store.renew(&won(&store, run(tick("c", 0), "n", false)).await, LONG).await.expect("renew");
    assert_eq!(store.calls_library(), Some(true), "loaded again, not given up");
}

/// A user whose ACL denies `FUNCTION` (so the library cannot be loaded) gets the same
/// behaviour from scripts, and a batch still works after the server forgot its scripts.
#[tokio::test]
async fn a_user_who_may_not_load_functions_is_served_by_scripts() {
    let Some(ns) = common::Namespace::new().await else { return };
    let mut conn = common::raw(&ns.url).await.expect("connect");
    let user = format!("solocron_t_{}", solocron_conformance::naming::fresh_tag());
    let () = redis::cmd("ACL")
        .arg(&["SETUSER", &user, "on", ">pw", "~*", "&*", "+@all", "-function"][..])
        .query_async(&mut conn)
        .await
        .expect("create a user");
    let url = ns.url.replacen("redis://", &format!("redis://{user}:pw@"), 1);
    let limited = RedisStore::connect(&url, &ns.prefix).await.expect("connect as the limited user");
    let migrated = limited.migrate().await;
    let forget_scripts = async {
        let mut conn = common::raw(&ns.url).await.expect("connect");
        let () = redis::cmd("SCRIPT").arg("FLUSH").query_async(&mut conn).await.expect("script flush");
    };
    if migrated.is_ok() {
        outlives_forgotten_code(&limited, forget_scripts).await;
    }
    let _: () = redis::cmd("ACL").arg(&["DELUSER", &user][..]).query_async(&mut conn).await.expect("delete the user");
    migrated.expect("migrate");
    assert_eq!(limited.calls_library(), Some(false));
}

#[tokio::test]
async fn overlap_reasons_name_the_running_run_as_run_ids_display_it_at_any_instant() {
    let Some(ns) = common::Namespace::new().await else { return };
    let store = ns.migrated().await;
    let instants = [
        "1900-03-01T00:00:00.001Z",
        "1969-12-31T23:59:59.999Z",
        "2000-02-29T12:34:56.789Z",
        "9999-12-31T23:59:59.999Z",
    ];
    for (n, instant) in instants.into_iter().enumerate() {
        let job = format!("job:{n}:with colons");
        // A catch-up, as a scheduled claim of the far future would be refused as too early.
        let request =
            ClaimRequest { trigger: Trigger::Catchup, ..run(Tick::new(job.clone(), at(instant)), "a", false) };
        let held = won(&store, request).await;
        let outcome = store.claim(&[run(tick(&job, 0), "b", true)]).await.expect("claim").remove(0);
        let expected = format!("overlap: previous run {} still running", held.run);
        assert_eq!(outcome, ClaimOutcome::Skipped { reason: expected });
    }
}

#[tokio::test]
async fn filtered_history_pages_through_more_records_than_one_page() {
    let Some(ns) = common::Namespace::new().await else { return };
    let store = ns.migrated().await;
    let running = won(&store, run(tick("backup", 0), "a", false)).await;
    for page in 0..3 {
        let skips: Vec<ClaimRequest> = (0..1000)
            .map(|i| ClaimRequest {
                mode: ClaimMode::Skip { reason: "missed".into() },
                nonce: 0,
                ..run(tick("backup", 1 + page * 1000 + i), "b", false)
            })
            .collect();
        store.claim(&skips).await.expect("claim");
    }
    let started = Instant::now();
    let query = HistoryQuery { state: Some(RunState::Running), ..Default::default() };
    let found = store.history(&query).await.expect("history");
    eprintln!("filtered history over 3001 records in {:?}", started.elapsed());
    assert_eq!(found.iter().map(|r| &r.id).collect::<Vec<_>>(), [&running.run]);
    let query = HistoryQuery {
        node: Some("b".into()),
        until: Some(tick("backup", 11).scheduled_at),
        limit: 3,
        ..Default::default()
    };
    let found = store.history(&query).await.expect("history");
    let seconds: Vec<i64> =
        found.iter().map(|r| r.id.tick.scheduled_at.timestamp() - tick("backup", 0).scheduled_at.timestamp()).collect();
    assert_eq!(seconds, [10, 9, 8]);
}

#[tokio::test]
async fn a_layout_version_this_code_does_not_know_is_refused() {
    let Some(ns) = common::Namespace::new().await else { return };
    let store = ns.store().await;
    let mut conn = common::raw(&ns.url).await.expect("connect");
    let () = redis::cmd("SET")
        .arg(format!("{}schema", ns.prefix.redis_key_prefix()))
        .arg("2")
        .query_async(&mut conn)
        .await
        .expect("set");
    let err = store.migrate().await.unwrap_err();
    assert!(matches!(&err, StoreError::Invalid(m) if m.contains("version 2")), "{err}");
    let err = store.claim(&[run(tick("backup", 0), "a", false)]).await.unwrap_err();
    assert!(matches!(err, StoreError::Invalid(_)), "{err}");
}

/// The layout version key of the namespace, read or written behind the store's back.
fn schema_key(ns: &common::Namespace) -> String {
    format!("{}schema", ns.prefix.redis_key_prefix())
}

#[tokio::test]
async fn schema_on_a_fresh_prefix_is_missing_and_writes_nothing() {
    let Some(ns) = common::Namespace::new().await else { return };
    let store = ns.store().await;
    assert_eq!(store.schema().await.expect("schema"), SchemaState::Missing);
    assert_eq!(store.schema().await.expect("schema again"), SchemaState::Missing, "still missing");
    assert_eq!(keys_of(&ns).await, Vec::<String>::new(), "no key written under the prefix");
}

#[tokio::test]
async fn schema_after_migrate_is_current() {
    let Some(ns) = common::Namespace::new().await else { return };
    let store = ns.migrated().await;
    assert_eq!(store.schema().await.expect("schema"), SchemaState::Current);
}

#[tokio::test]
async fn schema_of_a_layout_version_above_or_below_this_builds_is_newer_or_older() {
    let Some(ns) = common::Namespace::new().await else { return };
    let store = ns.migrated().await;
    let mut conn = common::raw(&ns.url).await.expect("connect");
    let marked: String = redis::cmd("GET").arg(schema_key(&ns)).query_async(&mut conn).await.expect("get");
    let current: u32 = marked.parse().expect("a numeric layout version");
    for (found, expected) in [
        (current + 1, SchemaState::Newer { found: current + 1, current }),
        (current - 1, SchemaState::Older { found: current - 1, current }),
    ] {
        let () = redis::cmd("SET").arg(schema_key(&ns)).arg(found).query_async(&mut conn).await.expect("set");
        assert_eq!(store.schema().await.expect("schema"), expected, "layout version {found}");
    }
}

#[tokio::test]
async fn an_unreachable_server_is_unavailable_and_bad_settings_are_invalid() {
    let started = Instant::now();
    let x = Prefix::parse("x").expect("a valid prefix");
    let err = RedisStore::connect("redis://:s3cret@127.0.0.1:1/0", &x).await.unwrap_err();
    assert!(matches!(&err, StoreError::Unavailable(m) if !m.contains("s3cret")), "{err}");
    assert!(started.elapsed() < Duration::from_secs(15), "took {:?}", started.elapsed());
    // A bad prefix cannot reach the store: the one rule refuses it first.
    assert!(Prefix::parse("bad prefix").is_err());
    for url in ["http://x", "redis://:s3cret@"] {
        let err = RedisStore::connect(url, &x).await.unwrap_err();
        assert!(matches!(&err, StoreError::Invalid(m) if !m.contains("s3cret")), "{url}: {err}");
    }
    let Some(ns) = common::Namespace::new().await else { return };
    let store = ns.store().await;
    assert!(store.describe().ends_with(&format!(" (keys {}*)", ns.prefix.redis_key_prefix())), "{}", store.describe());
}

/// A user whose ACL grants keys and commands but no pub/sub channels (Redis 7's default for
/// new users) can still request runs: the wake-up message is best-effort, the request is
/// written once and no error tells the operator to try again (which would run it twice).
#[tokio::test]
async fn a_user_without_channel_rights_requests_runs_without_an_error() {
    let Some(ns) = common::Namespace::new().await else { return };
    let store = ns.store().await;
    store.migrate().await.expect("migrate");
    let mut conn = common::raw(&ns.url).await.expect("connect");
    let user = format!("solocron_t_{}", solocron_conformance::naming::fresh_tag());
    let () = redis::cmd("ACL")
        .arg(&["SETUSER", &user, "on", ">pw", "~*", "+@all", "resetchannels"][..])
        .query_async(&mut conn)
        .await
        .expect("create a user");
    let url = ns.url.replacen("redis://", &format!("redis://{user}:pw@"), 1);
    let limited = RedisStore::connect(&url, &ns.prefix).await.expect("connect as the limited user");
    let requested = limited.request_run("backup", "op", None).await;
    let pending = store.pending_requests(10, &solocron_core::Namespaces::ALL).await.expect("pending");
    let _: () = redis::cmd("ACL").arg(&["DELUSER", &user][..]).query_async(&mut conn).await.expect("delete the user");
    let tick = requested.expect("the request succeeds although the wake-up cannot be published");
    assert_eq!(pending.iter().map(|r| &r.tick).collect::<Vec<_>>(), [&tick], "written once");
}

/// The keys under the namespace's prefix, read behind the store's back.
async fn keys_of(ns: &common::Namespace) -> Vec<String> {
    let mut conn = common::raw(&ns.url).await.expect("connect");
    common::keys(&mut conn, &format!("{}*", ns.prefix.redis_key_prefix())).await.expect("scan")
}

#[tokio::test]
async fn uninstall_removes_every_key_of_its_prefix_and_leaves_other_prefixes_alone() {
    let (Some(gone), Some(kept)) = (common::Namespace::new().await, common::Namespace::new().await) else { return };
    let mut stores = Vec::new();
    for ns in [&gone, &kept] {
        let store = ns.migrated().await;
        let lease = won(&store, run(tick("backup", 0), "a", false)).await;
        store.renew(&lease, LONG).await.expect("renew");
        store.set_paused("backup", true, "ops", None).await.expect("pause");
        store.request_run("report", "ops", None).await.expect("request");
        let definition = solocron_core::JobDefinition {
            job: "backup".into(),
            schedule: "* * * * *".into(),
            timezone: "UTC".into(),
            definition_hash: "h".into(),
            summary: String::new(),
        };
        store.register("a", &[definition]).await.expect("register");
        let beat = solocron_core::NodeBeat { node: "a".into(), version: "1".into(), jobs: 1, running: 1 };
        store.heartbeat(&beat).await.expect("heartbeat");
        stores.push(store);
    }
    let kept_keys = keys_of(&kept).await;
    assert!(!keys_of(&gone).await.is_empty() && !kept_keys.is_empty(), "both prefixes hold keys");

    stores[0].uninstall().await.expect("uninstall");
    assert_eq!(keys_of(&gone).await, Vec::<String>::new(), "nothing left under {}", gone.prefix.redis_key_prefix());
    stores[0].uninstall().await.expect("a second uninstall finds nothing and is fine");
    let mut after = keys_of(&kept).await;
    after.sort();
    let mut before = kept_keys;
    before.sort();
    assert_eq!(after, before, "the other prefix is untouched");
    assert_eq!(stores[1].history(&HistoryQuery::default()).await.expect("history").len(), 1);
    // The library is shared by every prefix: the other prefix's calls still find it.
    assert_eq!(stores[1].calls_library(), Some(true));
    won(&stores[1], run(tick("other", 1), "a", false)).await;
}

/// Neither the description nor any connect error shows a password: not for a server that
/// is down, nor for one that refuses the password, nor for one that takes it.
#[tokio::test]
async fn no_password_shows_in_the_description_or_in_connect_errors() {
    let secret = "s3cret-pw";
    let down = RedisStore::connect(&format!("redis://alice:{secret}@127.0.0.1:1/0"), &Prefix::default()).await;
    let err = down.unwrap_err();
    assert!(matches!(&err, StoreError::Unavailable(_)) && !err.to_string().contains(secret), "{err}");
    let Some(ns) = common::Namespace::new().await else { return };
    let mut conn = common::raw(&ns.url).await.expect("connect");
    let user = format!("solocron_t_{}", solocron_conformance::naming::fresh_tag());
    let () = redis::cmd("ACL")
        .arg(&["SETUSER", &user, "on", &format!(">{secret}"), "~*", "&*", "+@all"][..])
        .query_async(&mut conn)
        .await
        .expect("create a user");
    let with = |password: &str| ns.url.replacen("redis://", &format!("redis://{user}:{password}@"), 1);
    let refused = RedisStore::connect(&with("wr0ng-s3cret"), &ns.prefix).await;
    let taken = RedisStore::connect(&with(secret), &ns.prefix).await;
    let _: () = redis::cmd("ACL").arg(&["DELUSER", &user][..]).query_async(&mut conn).await.expect("delete the user");
    let err = refused.unwrap_err();
    assert!(matches!(&err, StoreError::Invalid(_)) && !err.to_string().contains("wr0ng-s3cret"), "{err}");
    let described = taken.expect("connect with the right password").describe();
    assert!(described.contains(&format!("{user}:***@")) && !described.contains(secret), "{described}");
}

/// The audit log keeps at most `ACTIONS_KEPT_MAX` actions per prefix however many are
/// made, dropping the oldest (their hashes too), without any prune.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_audit_log_keeps_only_its_newest_actions() {
    use futures_util::StreamExt;
    let Some(ns) = common::Namespace::new().await else { return };
    let store = ns.migrated().await;
    for by in ["a", "b", "c"] {
        store.set_paused("first", true, by, None).await.expect("pause");
    }
    let kept = solocron_redis::ACTIONS_KEPT_MAX;
    let flood = futures_util::stream::iter(0..kept).map(|i| {
        let store = store.clone();
        async move { store.set_paused("flood", i % 2 == 0, "ops", None).await.expect("pause") }
    });
    flood.buffer_unordered(64).collect::<Vec<()>>().await;
    let first = ActionQuery { job: Some("first".into()), limit: 0 };
    assert!(store.actions(&first).await.expect("actions").is_empty(), "the oldest actions are dropped");
    let all = store.actions(&ActionQuery::default()).await.expect("actions");
    assert_eq!(all.len(), kept.min(solocron_core::RECORDS_PAGE_MAX));
    assert!(all.iter().all(|a| a.job == "flood"));
    let mut conn = common::raw(&ns.url).await.expect("connect");
    let prefix = ns.prefix.redis_key_prefix();
    let held: usize = redis::cmd("ZCARD").arg(format!("{prefix}acts")).query_async(&mut conn).await.expect("zcard");
    assert_eq!(held, kept);
    let hashes = common::keys(&mut conn, &format!("{prefix}act:*")).await.expect("keys");
    assert_eq!(hashes.len(), kept, "a dropped action's hash goes with it");
}

/// `request` carrying `nonce`.
fn with_nonce(request: ClaimRequest, nonce: u64) -> ClaimRequest {
    ClaimRequest { nonce, ..request }
}

#[tokio::test]
async fn a_nonce_beyond_luas_doubles_is_matched_exactly_and_kept_in_decimal() {
    let Some(ns) = common::Namespace::new().await else { return };
    let store = ns.migrated().await;
    // Each pair is one double in Lua: only a comparison as text tells them apart.
    for (second, nonce, neighbour) in [(0, u64::MAX, u64::MAX - 1), (1, (1 << 53) + 1, 1 << 53)] {
        let first = won(&store, with_nonce(run(tick("backup", second), "a", false), nonce)).await;
        let key = format!(
            "{}run:{}:0000000001:backup",
            ns.prefix.redis_key_prefix(),
            first.run.tick.scheduled_at.timestamp_millis()
        );
        let mut conn = common::raw(&ns.url).await.expect("connect");
        let stored: String = redis::cmd("HGET").arg(&key).arg("nonce").query_async(&mut conn).await.expect("hget");
        assert_eq!(stored, nonce.to_string());
        let asked = store.claim(&[with_nonce(run(tick("backup", second), "a", false), neighbour)]).await;
        assert_eq!(asked.expect("claim"), [ClaimOutcome::Taken], "{neighbour} is not {nonce}");
        let again = won(&store, with_nonce(run(tick("backup", second), "a", false), nonce)).await;
        assert_eq!((again.run, again.fencing_token), (first.run, first.fencing_token));
    }
}

#[tokio::test]
async fn a_run_granted_again_leaves_the_expiry_index_until_its_fresh_lease_lapses() {
    let Some(ns) = common::Namespace::new().await else { return };
    let store = ns.migrated().await;
    let short = |second| {
        with_nonce(ClaimRequest { lease: Duration::from_millis(50), ..run(tick("backup", second), "a", false) }, 7)
    };
    let first = won(&store, short(0)).await;
    tokio::time::sleep(Duration::from_millis(120)).await;
    assert_eq!(store.expired(10, &solocron_core::Namespaces::ALL).await.expect("expired").len(), 1, "lapsed");
    let again = won(&store, with_nonce(run(tick("backup", 0), "a", false), 7)).await;
    assert_eq!((again.fencing_token, again.claimed_at), (first.fencing_token, first.claimed_at));
    assert!(store.expired(10, &solocron_core::Namespaces::ALL).await.expect("expired").is_empty(), "a fresh lease");
    assert!(store.renew(&again, LONG).await.expect("renew"), "the lease granted again is renewable");
    assert!(store.finish(&again, &done()).await.expect("finish"));

    // Abandoned by a recoverer: the tick's attempt ended, the nonce wins nothing.
    let abandoned = won(&store, short(1)).await;
    tokio::time::sleep(Duration::from_millis(120)).await;
    let abandon = RecoverAction::Abandon { reason: "owner vanished".into() };
    assert_eq!(store.recover(&abandoned.run, &abandon).await.expect("recover"), RecoverOutcome::Abandoned);
    let asked = store.claim(&[with_nonce(run(tick("backup", 1), "a", false), 7)]).await.expect("claim");
    assert_eq!(asked, [ClaimOutcome::Taken]);
}

#[tokio::test]
async fn a_record_written_before_nonces_is_never_granted_again() {
    let Some(ns) = common::Namespace::new().await else { return };
    let store = ns.migrated().await;
    let first = won(&store, with_nonce(run(tick("backup", 0), "a", false), 7)).await;
    // As an older build writes it: no `nonce` field.
    let key = format!(
        "{}run:{}:0000000001:backup",
        ns.prefix.redis_key_prefix(),
        first.run.tick.scheduled_at.timestamp_millis()
    );
    let mut conn = common::raw(&ns.url).await.expect("connect");
    let removed: i64 = redis::cmd("HDEL").arg(&key).arg("nonce").query_async(&mut conn).await.expect("hdel");
    assert_eq!(removed, 1);
    for nonce in [0, 7] {
        let asked = store.claim(&[with_nonce(run(tick("backup", 0), "a", false), nonce)]).await.expect("claim");
        assert_eq!(asked, [ClaimOutcome::Taken], "nonce {nonce}");
    }
    let record = store.history(&HistoryQuery::default()).await.expect("history").remove(0);
    assert_eq!((record.state, record.lease_until), (RunState::Running, Some(first.lease_until)), "unchanged");
}

/// `(job, node)` of every registration, as the store lists them.
async fn registered(store: &RedisStore) -> Vec<(String, String)> {
    let all = store.registrations().await.expect("registrations");
    all.into_iter().map(|r| (r.definition.job, r.node)).collect()
}

/// The members of a node's set of registration ids, sorted.
async fn node_set(ns: &common::Namespace, node: &str) -> Vec<String> {
    let mut conn = common::raw(&ns.url).await.expect("connect");
    let key = format!("{}nregs:{node}", ns.prefix.redis_key_prefix());
    let mut members: Vec<String> = redis::cmd("SMEMBERS").arg(&key).query_async(&mut conn).await.expect("smembers");
    members.sort();
    members
}

/// Registrations written by a build that kept no per-node set (behind the store's back
/// here) are found by the node's next registration and removed if unlisted; the node's
/// set is then complete, and other nodes' registrations stay.
#[tokio::test]
async fn a_registration_written_without_the_nodes_set_is_removed_when_no_longer_listed() {
    let Some(ns) = common::Namespace::new().await else { return };
    let store = ns.migrated().await;
    let p = ns.prefix.redis_key_prefix();
    let mut conn = common::raw(&ns.url).await.expect("connect");
    // Node names that end like each other: only the length prefix tells them apart.
    for (job, node) in [("old", "a"), ("old", "xa"), ("a:old", "a")] {
        let id = format!("{}:{job}:{node}", job.len());
        let () = redis::cmd("HSET")
            .arg(format!("{p}reg:{id}"))
            .arg(&["job", job, "node", node, "schedule", "* * * * *", "tz", "UTC", "hash", "h"][..])
            .arg(&["summary", "", "first", "1", "last", "1"][..])
            .query_async(&mut conn)
            .await
            .expect("write an old build's registration");
        let () = redis::cmd("ZADD").arg(format!("{p}regs")).arg(1).arg(&id).query_async(&mut conn).await.expect("zadd");
    }
    store.register("a", &[definition("new", "n1")]).await.expect("register");
    let expected = [("new", "a"), ("old", "xa")].map(|(j, n)| (j.to_owned(), n.to_owned()));
    assert_eq!(registered(&store).await, expected);
    assert_eq!(node_set(&ns, "a").await, ["", "3:new:a"], "the node's set is complete");

    store.register("a", &[]).await.expect("registering nothing");
    assert_eq!(registered(&store).await, expected[1..]);
    assert_eq!(node_set(&ns, "a").await, [""], "the mark stays: the next registration reads the set alone");
}

/// A list of ten thousand jobs is recorded whole in one call, and a refresh dropping some
/// of them removes exactly those.
#[tokio::test]
async fn a_list_of_ten_thousand_jobs_is_recorded_whole_and_refreshed() {
    let Some(ns) = common::Namespace::new().await else { return };
    let store = ns.migrated().await;
    let all: Vec<_> = (0..10_000).map(|i| definition(&format!("job-{i:05}"), "h")).collect();
    store.register("other", &all[..3]).await.expect("register another node");
    store.register("a", &all).await.expect("register ten thousand");
    assert_eq!(store.registrations().await.expect("registrations").len(), 10_003);

    store.register("a", &all[1_000..]).await.expect("refresh without the first thousand");
    let left = store.registrations().await.expect("registrations");
    assert_eq!(left.len(), 9_003);
    assert!(left.iter().all(|r| r.node == "other" || r.definition.job.as_str() >= "job-01000"));
    assert_eq!(node_set(&ns, "a").await.len(), 9_001, "9,000 ids and the mark");
}

/// Pruning a stale registration takes it out of its node's set, and a set left with its
/// mark alone goes: the node's next registration rebuilds it from the registry.
#[tokio::test]
async fn prune_keeps_the_nodes_sets_of_registrations_in_step() {
    let Some(ns) = common::Namespace::new().await else { return };
    let store = ns.migrated().await;
    store.register("a", &[definition("backup", "h")]).await.expect("register");
    store.register("b", &[definition("backup", "h"), definition("sync", "s")]).await.expect("register");
    store.register("b", &[definition("sync", "s")]).await.expect("refresh b");
    // a's registration last refreshed long ago, behind the store's back.
    let mut conn = common::raw(&ns.url).await.expect("connect");
    let regs = format!("{}regs", ns.prefix.redis_key_prefix());
    let () = redis::cmd("ZADD").arg(&regs).arg(1).arg("6:backup:a").query_async(&mut conn).await.expect("zadd");
    store.prune(Duration::from_secs(3600), 100, &solocron_core::Namespaces::ALL).await.expect("prune");
    assert_eq!(registered(&store).await, [("sync".to_owned(), "b".to_owned())]);
    assert_eq!(node_set(&ns, "a").await, Vec::<String>::new(), "a's set went with its last registration");
    assert_eq!(node_set(&ns, "b").await, ["", "4:sync:b"]);
    store.register("a", &[definition("report", "r")]).await.expect("register again");
    assert_eq!(node_set(&ns, "a").await, ["", "6:report:a"]);
}

/// A failed end (exit code 1).
fn failed() -> RunEnd {
    RunEnd { state: RunState::Failed, exit_code: Some(1), ..done() }
}

/// The members of the job's running set (`jrun:<job>`), read behind the store's back.
async fn running_set(ns: &common::Namespace, job: &str) -> Vec<String> {
    let mut conn = common::raw(&ns.url).await.expect("connect");
    let key = format!("{}jrun:{job}", ns.prefix.redis_key_prefix());
    redis::cmd("ZRANGE").arg(&key).arg(0).arg(-1).query_async(&mut conn).await.expect("zrange")
}

/// A waiting retry is not a running run (the overlap check and unlock pass it by, the job's
/// running set never holds it), history finds it by its state, and prune keeps it however
/// old its tick.
#[tokio::test]
async fn a_waiting_retry_is_not_running_is_found_by_its_state_and_is_never_pruned() {
    let Some(ns) = common::Namespace::new().await else { return };
    let store = ns.migrated().await;
    let first = won(&store, run(tick("flaky", 0), "a", false)).await;
    assert!(store.finish_for_retry(&first, &failed(), LONG).await.expect("finish_for_retry"));
    let waiting = store.history(&HistoryQuery { state: Some(RunState::Waiting), ..Default::default() }).await;
    let waiting = waiting.expect("history");
    assert_eq!(waiting.len(), 1, "{waiting:?}");
    assert_eq!((waiting[0].id.attempt, waiting[0].fencing_token), (2, None));
    assert_eq!(running_set(&ns, "flaky").await, Vec::<String>::new());

    let next = won(&store, run(tick("flaky", 1), "b", true)).await;
    assert_eq!(running_set(&ns, "flaky").await.len(), 1, "only the running run");
    assert_eq!(store.unlock("flaky", "op", "test").await.expect("unlock"), [next.run]);
    // Ticks of 2020, long before the cutoff: the failed and the unlocked run go, not the retry.
    assert_eq!(store.prune(Duration::from_secs(3600), 100, &solocron_core::Namespaces::ALL).await.expect("prune"), 2);
    let left = store.history(&HistoryQuery::default()).await.expect("history");
    assert_eq!(left.iter().map(|r| (r.id.attempt, r.state)).collect::<Vec<_>>(), [(2, RunState::Waiting)]);
}

/// `expired` lists lapsed runs and due retries in one list, oldest `lease_until` first, at
/// most `limit` in all; a started retry is a running run again (in the overlap check).
#[tokio::test]
async fn expired_merges_due_retries_with_lapsed_runs_oldest_first() {
    let Some(ns) = common::Namespace::new().await else { return };
    let store = ns.migrated().await;
    let lease = |ms| ClaimRequest { lease: Duration::from_millis(ms), ..run(tick("lapsed", 0), "a", false) };
    let oldest = won(&store, lease(50)).await;
    let failing = won(&store, run(tick("flaky", 0), "a", false)).await;
    assert!(store.finish_for_retry(&failing, &failed(), Duration::from_millis(150)).await.expect("finish_for_retry"));
    let newest = won(&store, ClaimRequest { tick: tick("lapsed", 1), ..lease(300) }).await;
    tokio::time::sleep(Duration::from_millis(450)).await;

    let retry_id = solocron_core::RunId { tick: failing.run.tick.clone(), attempt: 2 };
    let ids = |records: Vec<solocron_core::RunRecord>| records.into_iter().map(|r| r.id).collect::<Vec<_>>();
    let all = ids(store.expired(10, &solocron_core::Namespaces::ALL).await.expect("expired"));
    assert_eq!(all, [oldest.run.clone(), retry_id.clone(), newest.run.clone()]);
    assert_eq!(
        ids(store.expired(2, &solocron_core::Namespaces::ALL).await.expect("expired")),
        [oldest.run, retry_id.clone()]
    );

    let start = RecoverAction::Retry { node: "b".into(), lease: LONG };
    let RecoverOutcome::Retried(started) = store.recover(&retry_id, &start).await.expect("recover") else {
        panic!("the due retry should start")
    };
    assert_eq!(started.run, retry_id);
    let outcome = store.claim(&[run(tick("flaky", 5), "c", true)]).await.expect("claim").remove(0);
    assert_eq!(outcome, ClaimOutcome::Skipped { reason: format!("overlap: previous run {retry_id} still running") });
}

/// A next attempt that exists already (written behind the store's back: no build makes
/// one while its previous attempt runs) makes `finish_for_retry` fail, writing nothing.
#[tokio::test]
async fn finish_for_retry_writes_nothing_when_the_next_attempt_exists() {
    let Some(ns) = common::Namespace::new().await else { return };
    let store = ns.migrated().await;
    let first = won(&store, run(tick("flaky", 0), "a", false)).await;
    let key = format!(
        "{}run:{}:0000000002:flaky",
        ns.prefix.redis_key_prefix(),
        first.run.tick.scheduled_at.timestamp_millis()
    );
    let mut conn = common::raw(&ns.url).await.expect("connect");
    let () = redis::cmd("HSET").arg(&key).arg("state").arg("skipped").query_async(&mut conn).await.expect("hset");
    let error = store.finish_for_retry(&first, &failed(), LONG).await.expect_err("an existing next attempt");
    assert!(matches!(&error, StoreError::Invalid(m) if m.contains("exists already")), "{error}");
    let record = store.history(&HistoryQuery::default()).await.expect("history").remove(0);
    assert_eq!((record.id.attempt, record.state), (1, RunState::Running), "unchanged");
    assert!(store.finish(&first, &failed()).await.expect("finish"), "still held");
}

/// A scheduled claim whose tick is far ahead of the server's clock (by `TIME`, not the
/// node's), in any mode and under a nonce, as part of a batch.
fn ahead(job: &str, ms: i64, mode: ClaimMode, now: DateTime<Utc>) -> ClaimRequest {
    let tick = Tick::new(job, now + chrono::Duration::milliseconds(ms));
    ClaimRequest { mode, nonce: 42, ..run(tick, "fast", false) }
}

#[tokio::test]
async fn a_scheduled_claim_too_early_leaves_every_key_as_it_was_and_other_triggers_are_never_refused() {
    let Some(ns) = common::Namespace::new().await else { return };
    let store = ns.migrated().await;
    let mut keys = keys_of(&ns).await;
    keys.sort();
    let now = store.now().await.expect("now");
    let early_ms = i64::try_from(solocron_core::CLAIM_EARLY_MAX.as_millis()).expect("small");
    let modes = [
        ClaimMode::Run { skip_if_running: false },
        ClaimMode::Run { skip_if_running: true },
        ClaimMode::Skip { reason: "asked".into() },
    ];
    let batch: Vec<ClaimRequest> = modes.iter().map(|m| ahead("backup", early_ms + 2_000, m.clone(), now)).collect();
    for outcome in store.claim(&batch).await.expect("claim") {
        assert!(matches!(outcome, ClaimOutcome::TooEarly { store_now } if store_now >= now), "{outcome:?}");
    }
    let mut after = keys_of(&ns).await;
    after.sort();
    assert_eq!(after, keys, "no record, index or fencing counter written");
    // Every other trigger is claimed whatever its instant.
    for (n, trigger) in [Trigger::Catchup, Trigger::Retry, Trigger::Manual].into_iter().enumerate() {
        let offset = i64::try_from(n).expect("small");
        let request = ClaimRequest { trigger, ..ahead("other", 3_600_000 + offset, modes[0].clone(), now) };
        won(&store, request).await;
    }
}

/// Places the members of the sorted set `key` at these scores, in chunks of one command.
async fn zadd(conn: &mut redis::aio::MultiplexedConnection, key: &str, entries: &[(i64, String)]) {
    for chunk in entries.chunks(10_000) {
        let mut cmd = redis::cmd("ZADD");
        cmd.arg(key);
        for (score, member) in chunk {
            cmd.arg(*score).arg(member);
        }
        let _: i64 = cmd.query_async(conn).await.expect("zadd");
    }
}

/// `expired` for some namespaces passes over other namespaces' due entries, page after
/// page, up to `SCAN_EXAMINED_MAX` of them; a run of its own beyond that bound is listed
/// once enough of those ahead are gone.
#[tokio::test]
async fn expired_passes_over_other_namespaces_entries_up_to_its_bound() {
    let Some(ns) = common::Namespace::new().await else { return };
    let store = ns.migrated().await;
    let billing = solocron_core::Namespaces::only(["billing"]).expect("namespaces");
    let early = won(&store, run(tick("billing/early", 0), "a", false)).await;
    let late = won(&store, run(tick("billing/late", 0), "a", false)).await;
    // The ids of the runs in the expiry set, and a flood of due ids of a gone application
    // between them (no record behind those: the scan reads only ids to filter).
    let expiry = format!("{}expiry", ns.prefix.redis_key_prefix());
    let id =
        |lease: &Lease| format!("{}:0000000001:{}", lease.run.tick.scheduled_at.timestamp_millis(), lease.run.tick.job);
    let bound = i64::try_from(solocron_redis::SCAN_EXAMINED_MAX).expect("small");
    let mut entries: Vec<(i64, String)> = (1..bound).map(|i| (i, format!("{i}:0000000001:gone/job"))).collect();
    entries.push((0, id(&early)));
    entries.push((bound + 10, id(&late)));
    let mut conn = common::raw(&ns.url).await.expect("connect");
    zadd(&mut conn, &expiry, &entries).await;

    let listed = |limit| {
        let (store, billing) = (store.clone(), billing.clone());
        async move { store.expired(limit, &billing).await.expect("expired").into_iter().map(|r| r.id).collect::<Vec<_>>() }
    };
    let started = Instant::now();
    assert_eq!(listed(10).await, std::slice::from_ref(&early.run), "the late run is beyond the bound");
    let took = started.elapsed();
    assert!(took < Duration::from_secs(2), "a scan to the bound took {took:?}");
    let removed: i64 =
        redis::cmd("ZREMRANGEBYRANK").arg(&expiry).arg(1).arg(1).query_async(&mut conn).await.expect("zrem");
    assert_eq!(removed, 1);
    assert_eq!(listed(10).await, [early.run.clone(), late.run.clone()], "one gone ahead: the late run is examined");
    assert_eq!(listed(1).await, [early.run], "the limit counts this namespace's runs only");
}

/// `pending_requests` and `prune` for some namespaces pass over other namespaces'
/// requests across pages of the scan, oldest first.
#[tokio::test]
async fn pending_requests_and_prune_pass_over_other_namespaces_requests_across_pages() {
    let Some(ns) = common::Namespace::new().await else { return };
    let store = ns.migrated().await;
    let billing = solocron_core::Namespaces::only(["billing"]).expect("namespaces");
    let mine = store.request_run("billing/sync", "alice", None).await.expect("request_run");
    // Older requests of another namespace, several pages of them, written behind the
    // store's back as `request_run` writes them.
    let at = mine.scheduled_at.timestamp_millis();
    let others: Vec<(i64, String)> = (1..=2500).map(|i| (at - i, format!("{}:shipping/a", at - i))).collect();
    let mut conn = common::raw(&ns.url).await.expect("connect");
    let prefix = ns.prefix.redis_key_prefix();
    zadd(&mut conn, &format!("{prefix}req"), &others).await;
    zadd(&mut conn, &format!("{prefix}reqpend"), &others).await;

    let pending = store.pending_requests(1, &billing).await.expect("pending_requests");
    assert_eq!(pending.iter().map(|r| &r.tick).collect::<Vec<_>>(), [&mine]);
    tokio::time::sleep(Duration::from_millis(20)).await;
    store.prune(Duration::ZERO, 100, &billing).await.expect("prune");
    assert!(store.pending_requests(10, &billing).await.expect("pending_requests").is_empty(), "billing's went");
    let all = store.pending_requests(10_000, &solocron_core::Namespaces::ALL).await.expect("pending_requests");
    assert_eq!(all.len(), 2500, "shipping's stayed");
}

/// A claim that fails part way (here a key of the wrong type for its second request)
/// keeps what it wrote before whole: the first request's record is in the expiry index,
/// so the run is recovered once its lease lapses, and its token is counted, so the job's
/// next token is larger. (The claim gathers its index and fence writes, and makes them
/// even when it fails; see `gathering` in prelude.lua.)
#[tokio::test]
async fn a_claim_failing_part_way_leaves_its_earlier_runs_indexed_and_their_tokens_counted() {
    let Some(ns) = common::Namespace::new().await else { return };
    let store = ns.migrated().await;
    let mut conn = common::raw(&ns.url).await.expect("connect");
    let running_set_of_b = format!("{}jrun:b", ns.prefix.redis_key_prefix());
    let () =
        redis::cmd("SET").arg(&running_set_of_b).arg("not a sorted set").query_async(&mut conn).await.expect("set");
    let short = |job: &str| ClaimRequest { lease: Duration::from_millis(50), ..run(tick(job, 0), "a", false) };
    let err = store.claim(&[short("a"), short("b")]).await.expect_err("the second request meets a wrong type");
    assert!(err.to_string().contains("WRONGTYPE"), "{err}");

    tokio::time::sleep(Duration::from_millis(120)).await;
    let lapsed = store.expired(10, &solocron_core::Namespaces::ALL).await.expect("expired");
    let ids: Vec<_> = lapsed.iter().map(|r| r.id.tick.job.as_str()).collect();
    assert!(ids.contains(&"a"), "the run written before the failure is recoverable: {ids:?}");
    let first = store.history(&HistoryQuery { job: Some("a".into()), ..Default::default() }).await.expect("history");
    let next = won(&store, run(tick("a", 1), "a", false)).await;
    assert!(next.fencing_token > first[0].fencing_token.expect("a token"), "{next:?} after {first:?}");
}
