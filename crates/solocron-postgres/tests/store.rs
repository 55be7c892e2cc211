//! The PostgreSQL store against a real server: concurrency between separate pools (standing
//! in for separate hosts), batch claims, and every method's basics. Each test works on a
//! fresh prefix, dropped at its end (see `solocron_conformance::server`).
#![forbid(unsafe_code)]

mod common;

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
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use common::Namespace;
use solocron_core::{
    ActionKind, ActionQuery, ClaimMode, ClaimOutcome, ClaimRequest, Ending, HistoryQuery, JobDefinition, Lease,
    NodeBeat, Prefix, RecoverAction, RecoverOutcome, RunCounts, RunEnd, RunId, RunRecord, RunState, SchemaState,
    StoreError, Tick, Trigger, FINISH_BATCH_MAX, OUTPUT_TAIL_BYTES_MAX,
};
use solocron_postgres::PgStore;
use tokio::sync::Barrier;

const SHORT_LEASE: Duration = Duration::from_millis(600);
const PAST_SHORT_LEASE: Duration = Duration::from_millis(900);
const LONG_LEASE: Duration = Duration::from_secs(60);

fn tick(job: &str, minute: u32) -> Tick {
    Tick::new(job, format!("2026-01-01T00:{minute:02}:00Z").parse().unwrap())
}

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

async fn won(store: &PgStore, request: ClaimRequest) -> Lease {
    match store.claim(&[request]).await.unwrap().remove(0) {
        ClaimOutcome::Won(lease) => lease,
        other => panic!("expected Won, got {other:?}"),
    }
}

async fn find(store: &PgStore, id: &RunId) -> RunRecord {
    let all = store.history(&HistoryQuery::default()).await.unwrap();
    all.into_iter().find(|r| &r.id == id).unwrap_or_else(|| panic!("no record of {id}"))
}

fn succeeded(output: &str) -> RunEnd {
    RunEnd {
        state: RunState::Succeeded,
        reason: None,
        exit_code: Some(0),
        output: output.into(),
        started_after: Some(Duration::from_millis(250)),
    }
}

/// Runs `f(i, store_i)` on `n` separate stores (own pools) at the same instant.
async fn at_once<T, F, Fut>(namespace: &Namespace, n: usize, f: F) -> Vec<T>
where
    T: Send + 'static,
    F: Fn(usize, PgStore) -> Fut,
    Fut: std::future::Future<Output = T> + Send + 'static,
{
    let barrier = Arc::new(Barrier::new(n));
    let mut tasks = Vec::new();
    for i in 0..n {
        let (store, barrier) = (namespace.store().await, barrier.clone());
        let task = f(i, store);
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            task.await
        }));
    }
    let mut results = Vec::new();
    for task in tasks {
        results.push(task.await.unwrap());
    }
    results
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn exactly_one_of_eight_separate_pools_wins_the_same_tick() {
    let Some(ns) = Namespace::new().await else { return };
    ns.migrated().await;
    let outcomes = at_once(&ns, 8, |i, store| async move {
        store.claim(&[run(tick("backup", 0), &format!("node-{i}"), LONG_LEASE, false)]).await.unwrap().remove(0)
    })
    .await;
    let winners = outcomes.iter().filter(|o| matches!(o, ClaimOutcome::Won(_))).count();
    let taken = outcomes.iter().filter(|o| **o == ClaimOutcome::Taken).count();
    assert_eq!((winners, taken), (1, 7), "{outcomes:?}");
    let records = ns.store().await.history(&HistoryQuery::default()).await.unwrap();
    assert_eq!(records.len(), 1);
    assert_eq!((records[0].state, records[0].fencing_token), (RunState::Running, Some(1)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_batch_of_1000_ticks_over_100_jobs_is_won_in_one_call_with_tokens_rising_per_job() {
    let Some(ns) = Namespace::new().await else { return };
    let store = ns.migrated().await;
    // Job-major order scrambled (minute-major), so each job's ticks are spread over the batch.
    let batch: Vec<ClaimRequest> = (0..10)
        .flat_map(|minute| (0..100).map(move |job| run(tick(&format!("job-{job:03}"), minute), "a", LONG_LEASE, false)))
        .collect();
    let started = Instant::now();
    let outcomes = store.claim(&batch).await.unwrap();
    eprintln!("1000-tick batch claimed in {:?}", started.elapsed());
    assert_eq!(outcomes.len(), 1000);
    let mut last_token = std::collections::HashMap::new();
    for (request, outcome) in batch.iter().zip(&outcomes) {
        let ClaimOutcome::Won(lease) = outcome else { panic!("{request:?}: {outcome:?}") };
        assert_eq!(lease.run, RunId { tick: request.tick.clone(), attempt: 1 }, "outcomes in request order");
        let previous = last_token.insert(request.tick.job.clone(), lease.fencing_token).unwrap_or(0);
        assert_eq!(lease.fencing_token, previous + 1, "{}", lease.run);
    }
    let again = store.claim(&batch).await.unwrap();
    assert!(again.iter().all(|o| *o == ClaimOutcome::Taken));
}

/// A large batch whose ticks are partly claimed already (another node's chunk of a herd)
/// is answered in request order: the claimed ticks taken without waiting for their jobs'
/// locks, the rest decided as in a short batch (tokens, skips, pauses, overlaps).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_large_batch_partly_claimed_elsewhere_answers_every_request_in_order() {
    let Some(ns) = Namespace::new().await else { return };
    let store = ns.migrated().await;
    let other = ns.store().await;
    // Another node already won every third of 300 ticks of 30 jobs (all of job-000's,
    // job-003's, ...).
    let batch: Vec<ClaimRequest> = (0..10)
        .flat_map(|minute| (0..30).map(move |job| run(tick(&format!("job-{job:03}"), minute), "a", LONG_LEASE, false)))
        .collect();
    let elsewhere: Vec<ClaimRequest> =
        batch.iter().step_by(3).map(|r| ClaimRequest { node: "b".into(), ..r.clone() }).collect();
    assert!(other.claim(&elsewhere).await.unwrap().iter().all(|o| matches!(o, ClaimOutcome::Won(_))));
    store.set_paused("job-001", true, "ops", Some("disk")).await.unwrap();
    let mut batch = batch;
    batch[4].mode = ClaimMode::Skip { reason: "missed".into() };
    // job-005's tick at minute 0 (request 5) is won first, so minute 1's overlaps it.
    batch[35].mode = ClaimMode::Run { skip_if_running: true };
    let outcomes = store.claim(&batch).await.unwrap();
    assert_eq!(outcomes.len(), batch.len());
    let mut last_token: std::collections::HashMap<&str, u64> = std::collections::HashMap::new();
    for (k, (request, outcome)) in batch.iter().zip(&outcomes).enumerate() {
        let job = request.tick.job.as_str();
        match outcome {
            _ if k % 3 == 0 => assert_eq!(*outcome, ClaimOutcome::Taken, "{k}: claimed by b"),
            ClaimOutcome::Skipped { reason } if k == 4 => assert_eq!(reason, "missed"),
            ClaimOutcome::Skipped { reason } if k == 35 => {
                assert!(reason.starts_with("overlap: previous run job-005@"))
            }
            ClaimOutcome::Skipped { reason } if job == "job-001" => assert_eq!(reason, "paused by ops: disk"),
            ClaimOutcome::Won(lease) => {
                assert_eq!(lease.run, RunId { tick: request.tick.clone(), attempt: 1 }, "{k}: in request order");
                let floor = last_token.get(job).copied().unwrap_or(0);
                assert!(lease.fencing_token > floor, "{k}: tokens rise per job");
                last_token.insert(job, lease.fencing_token);
            }
            other => panic!("{k} {request:?}: {other:?}"),
        }
    }
    let records = store.history(&HistoryQuery { limit: 1000, ..HistoryQuery::default() }).await.unwrap();
    assert_eq!(records.len(), batch.len(), "one record per tick");
}

/// A `run` claim of `tick` by `node` with `nonce`, skipping if its job is running.
fn with_nonce(tick: Tick, node: &str, nonce: u64) -> ClaimRequest {
    ClaimRequest { nonce, ..run(tick, node, LONG_LEASE, true) }
}

/// The leases of claims that must all be won, in request order.
fn all_won(outcomes: &[ClaimOutcome]) -> Vec<&Lease> {
    outcomes.iter().map(|o| if let ClaimOutcome::Won(lease) = o { lease } else { panic!("{outcomes:?}") }).collect()
}

/// A claim asked again with its nonce is won again through each claim function: the
/// one-tick one (the job paused since: the running run is that very claim), a short batch,
/// and a large batch, whose first, lock-free read must not answer it taken. The same token
/// and `claimed_at`, a fresh lease; requests of another nonce, node or mode in the same
/// batch stay taken, in request order. Nonces keep all their 64 bits.
#[tokio::test]
async fn a_claim_asked_again_with_its_nonce_is_won_again_by_every_claim_function() {
    let Some(ns) = Namespace::new().await else { return };
    let store = ns.migrated().await;
    let first = won(&store, with_nonce(tick("backup", 0), "a", u64::MAX)).await;
    store.set_paused("backup", true, "ops", None).await.unwrap();
    let again = won(&store, with_nonce(tick("backup", 0), "a", u64::MAX)).await;
    assert_eq!(
        (&again.run, again.fencing_token, again.claimed_at),
        (&first.run, first.fencing_token, first.claimed_at)
    );
    assert!(again.lease_until >= first.lease_until, "a fresh lease");
    assert_eq!(find(&store, &first.run).await.lease_until, Some(again.lease_until));
    for nonce in [i64::MAX as u64, 1 << 63, 0] {
        assert_eq!(store.claim(&[with_nonce(tick("backup", 0), "a", nonce)]).await.unwrap(), [ClaimOutcome::Taken]);
    }

    // 300 ticks over 30 jobs, each of its own nonce; then the same batch, every third
    // request with another nonce, every fifth by another node, every seventh a skip.
    let batch: Vec<ClaimRequest> = (0..300u64)
        .map(|k| with_nonce(tick(&format!("job-{:03}", k % 30), (k / 30) as u32), "a", k + 1))
        .map(|r| ClaimRequest { mode: ClaimMode::Run { skip_if_running: false }, ..r })
        .collect();
    let leases: Vec<Lease> = all_won(&store.claim(&batch).await.unwrap()).into_iter().cloned().collect();
    let mut asked = batch.clone();
    for (k, request) in asked.iter_mut().enumerate() {
        match k {
            _ if k % 3 == 1 => request.nonce += 1000,
            _ if k % 5 == 1 => request.node = "b".into(),
            _ if k % 7 == 1 => request.mode = ClaimMode::Skip { reason: "missed".into() },
            _ => {}
        }
    }
    for size in [300, 10] {
        let outcomes = store.claim(&asked[..size]).await.unwrap();
        for (k, (outcome, lease)) in outcomes.iter().zip(&leases).enumerate() {
            if k % 3 == 1 || k % 5 == 1 || k % 7 == 1 {
                assert_eq!(*outcome, ClaimOutcome::Taken, "{size}: {k}");
            } else {
                let ClaimOutcome::Won(again) = outcome else { panic!("{size}: {k}: {outcome:?}") };
                assert_eq!(
                    (&again.run, again.fencing_token, again.claimed_at),
                    (&lease.run, lease.fencing_token, lease.claimed_at)
                );
            }
        }
    }
    // Once a run ends (finished, abandoned), its nonce is taken like any other.
    assert!(store.finish(&leases[0], &succeeded("done")).await.unwrap());
    store.unlock("job-002", "ops", "stuck").await.unwrap();
    let outcomes = store.claim(&batch[..3]).await.unwrap();
    assert!(matches!(outcomes[..], [ClaimOutcome::Taken, ClaimOutcome::Won(_), ClaimOutcome::Taken]), "{outcomes:?}");
}

/// `job`'s tick `ahead_ms` after `now`, in whole milliseconds as the store keeps them.
fn tick_ahead(job: &str, now: DateTime<Utc>, ahead_ms: i64) -> Tick {
    let at = DateTime::from_timestamp_millis(now.timestamp_millis() + ahead_ms).expect("in range");
    Tick::new(job, at)
}

/// The fencing counter of `job` (`None`: never claimed).
async fn fence(ns: &Namespace, job: &str) -> Option<i64> {
    let pool = sqlx::PgPool::connect(&ns.url).await.unwrap();
    let sql = format!("SELECT token FROM {}fences WHERE job = $1", ns.prefix.table_prefix());
    let token = sqlx::query_scalar(&sql).bind(job).fetch_optional(&pool).await.unwrap();
    pool.close().await;
    token
}

/// A scheduled request a minute ahead of the server's clock is refused by every claim
/// function (the one-tick one, a short batch, a large batch with and without ticks taken),
/// before anything else: even when its tick has a record (a manual claim's), and without a
/// fencing token reserved (its job's counter is untouched). The other requests of a batch
/// are decided as usual; other triggers are never refused.
#[tokio::test]
async fn a_claim_too_early_is_refused_by_every_claim_function_and_reserves_no_token() {
    let Some(ns) = Namespace::new().await else { return };
    let store = ns.migrated().await;
    let now = store.now().await.unwrap();
    let far = |job: &str| run(tick_ahead(job, now, 60_000), "a", LONG_LEASE, false);
    let refused = |o: &ClaimOutcome| {
        let ClaimOutcome::TooEarly { store_now } = o else { return false };
        *store_now >= now && *store_now < now + chrono::Duration::seconds(30)
    };

    let outcomes = store.claim(&[far("early")]).await.unwrap();
    assert!(refused(&outcomes[0]), "{outcomes:?}");
    assert_eq!(fence(&ns, "early").await, None, "a refused claim locked or reserved nothing");
    let manual = ClaimRequest { trigger: Trigger::Manual, ..far("early") };
    assert_eq!(won(&store, manual).await.fencing_token, 1);
    let outcomes = store.claim(&[far("early")]).await.unwrap();
    assert!(refused(&outcomes[0]), "refused before its record is read: {outcomes:?}");

    let catchup = ClaimRequest { trigger: Trigger::Catchup, ..far("late") };
    let retry = ClaimRequest { trigger: Trigger::Retry, ..far("again") };
    let short = [far("early"), catchup, run(tick("early", 0), "a", LONG_LEASE, false), far("fresh"), retry];
    let outcomes = store.claim(&short).await.unwrap();
    assert!(refused(&outcomes[0]) && refused(&outcomes[3]), "{outcomes:?}");
    for k in [1, 2, 4] {
        assert!(matches!(&outcomes[k], ClaimOutcome::Won(_)), "request {k}: {outcomes:?}");
    }
    let ClaimOutcome::Won(lease) = &outcomes[2] else { unreachable!() };
    assert_eq!(lease.fencing_token, 2, "no token reserved for the refused request of its job");
    assert_eq!(fence(&ns, "fresh").await, None);

    let mut large: Vec<ClaimRequest> =
        (0..300).map(|job| run(tick(&format!("job-{job:03}"), 0), "a", LONG_LEASE, false)).collect();
    large[5] = far("early");
    large[7] = far("fresh");
    for round in ["every tick open", "every tick but the refused taken"] {
        let outcomes = store.claim(&large).await.unwrap();
        for (k, outcome) in outcomes.iter().enumerate() {
            match k {
                5 | 7 => assert!(refused(outcome), "{round}: {k}: {outcome:?}"),
                _ if round == "every tick open" => assert!(matches!(outcome, ClaimOutcome::Won(_)), "{k}: {outcome:?}"),
                _ => assert_eq!(*outcome, ClaimOutcome::Taken, "{round}: {k}"),
            }
        }
    }
    assert_eq!((fence(&ns, "early").await, fence(&ns, "fresh").await), (Some(2), None));
    let ticks: Vec<Tick> = store
        .history(&HistoryQuery { limit: 1000, ..HistoryQuery::default() })
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.id.tick)
        .collect();
    assert_eq!(ticks.len(), 1 + 3 + 298, "the manual claim, the short batch's three, the large one's");
    assert!(!ticks.contains(&far("fresh").tick));
}

/// A schema of version 5 (before the nodes and actions tables) is brought to the current
/// version by `migrate`, keeping its data; heartbeats and the audit log then work on it.
#[tokio::test]
async fn a_version_5_schema_gets_the_nodes_and_actions_tables() {
    let Some(ns) = Namespace::new().await else { return };
    let store = ns.migrated().await;
    store.set_paused("sync", true, "alice", Some("disk")).await.unwrap();
    let pool = sqlx::PgPool::connect(&ns.url).await.unwrap();
    let p = &ns.prefix.table_prefix();
    for sql in [format!("DROP TABLE {p}nodes, {p}actions"), format!("UPDATE {p}schema SET version = 5")] {
        sqlx::query(&sql).execute(&pool).await.unwrap();
    }
    let beat = NodeBeat { node: "a".into(), version: "1".into(), jobs: 1, running: 0 };
    assert!(store.heartbeat(&beat).await.is_err(), "version 5 has no nodes table");
    store.migrate().await.expect("migrate from version 5");
    let version: i32 = sqlx::query_scalar(&format!("SELECT version FROM {p}schema")).fetch_one(&pool).await.unwrap();
    assert_eq!(version, CURRENT as i32);
    assert_eq!(store.controls().await.unwrap()[0].reason.as_deref(), Some("disk"), "the switches survive");
    store.heartbeat(&beat).await.unwrap();
    assert_eq!(store.nodes().await.unwrap().len(), 1);
    store.set_paused("sync", false, "bob", None).await.unwrap();
    let actions = store.actions(&ActionQuery::default()).await.unwrap();
    assert_eq!(actions.iter().map(|a| (a.kind, a.by.as_str())).collect::<Vec<_>>(), [(ActionKind::Resume, "bob")]);
    pool.close().await;
}

/// A schema of version 6 (before managed jobs) is brought to the current version by `migrate`,
/// keeping its data; managed jobs are then written from revision 1, and the change wakes
/// a request watch.
#[tokio::test]
async fn a_version_6_schema_gets_the_managed_jobs_tables() {
    let Some(ns) = Namespace::new().await else { return };
    let store = ns.migrated().await;
    store.set_paused("sync", true, "alice", Some("disk")).await.unwrap();
    let pool = sqlx::PgPool::connect(&ns.url).await.unwrap();
    let p = &ns.prefix.table_prefix();
    for sql in [
        format!("DROP TABLE {p}managed, {p}job_revisions, {p}managed_version"),
        format!("UPDATE {p}schema SET version = 6"),
    ] {
        sqlx::query(&sql).execute(&pool).await.unwrap();
    }
    let spec = r#"{"schedule":"0 * * * * *","command":["true"]}"#;
    assert!(store.put_job("sync", spec, "ann", None).await.is_err(), "version 6 has no managed jobs");
    store.migrate().await.expect("migrate from version 6");
    let version: i32 = sqlx::query_scalar(&format!("SELECT version FROM {p}schema")).fetch_one(&pool).await.unwrap();
    assert_eq!(version, CURRENT as i32);
    assert_eq!(store.controls().await.unwrap()[0].reason.as_deref(), Some("disk"), "the switches survive");
    assert_eq!(store.managed_version().await.unwrap(), 0);
    let mut watch = store.request_watch().expect("a watch");
    watch.changed().await; // in place
    let (woke, wrote) = tokio::join!(
        tokio::time::timeout(Duration::from_secs(2), watch.changed()),
        store.put_job("sync", spec, "ann", Some(0))
    );
    assert_eq!(wrote.unwrap(), solocron_core::JobWrite::Written(1));
    assert!(woke.is_ok(), "the write woke the watch");
    store.migrate().await.expect("migrate again");
    assert_eq!(store.managed_version().await.unwrap(), 1, "a second migrate keeps the counter");
    pool.close().await;
}

/// A schema of version 1 (before `{p}claim_taken_first`, the job in the index by instant,
/// the claim function of fewer statements, `{p}claim_one` and `{p}claim_set`) is brought to the current
/// version by `migrate`, and large batches and single ticks are claimed on it.
#[tokio::test]
async fn a_version_1_schema_is_migrated_to_the_current_version() {
    let Some(ns) = Namespace::new().await else { return };
    let store = ns.migrated().await;
    let pool = sqlx::PgPool::connect(&ns.url).await.unwrap();
    let p = &ns.prefix.table_prefix();
    for sql in [
        format!("DROP FUNCTION {p}claim_set"),
        format!("DROP FUNCTION {p}claim_taken_first"),
        format!("DROP FUNCTION {p}claim_one"),
        format!("DROP INDEX {p}runs_scheduled_job"),
        format!("CREATE INDEX {p}runs_scheduled ON {p}runs (scheduled_at, attempt)"),
        format!("DROP TABLE {p}nodes, {p}actions"),
        format!("UPDATE {p}schema SET version = 1"),
    ] {
        sqlx::query(&sql).execute(&pool).await.unwrap();
    }
    let batch: Vec<ClaimRequest> =
        (0..300).map(|job| run(tick(&format!("job-{job:03}"), 0), "a", LONG_LEASE, false)).collect();
    assert!(store.claim(&batch).await.is_err(), "the function of version 12 is missing");
    let one = [run(tick("job-one", 0), "a", LONG_LEASE, false)];
    assert!(store.claim(&one).await.is_err(), "the function of version 5 is missing");
    store.migrate().await.expect("migrate from version 1");
    let version: i32 = sqlx::query_scalar(&format!("SELECT version FROM {p}schema")).fetch_one(&pool).await.unwrap();
    assert_eq!(version, CURRENT as i32);
    let claim: String = sqlx::query_scalar("SELECT prosrc FROM pg_proc WHERE proname = $1")
        .bind(format!("{p}claim"))
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(claim.contains("v_rechecks"), "the claim function of version 4 replaced version 1's");
    let indexes: Vec<String> =
        sqlx::query_scalar("SELECT indexname::text FROM pg_indexes WHERE tablename = $1 ORDER BY indexname")
            .bind(format!("{p}runs"))
            .fetch_all(&pool)
            .await
            .unwrap();
    let expected: Vec<String> = ["runs_expiry", "runs_pkey", "runs_running", "runs_scheduled_job", "runs_waiting"]
        .iter()
        .map(|i| format!("{p}{i}"))
        .collect();
    assert_eq!(indexes, expected);
    assert!(store.claim(&batch).await.unwrap().iter().all(|o| matches!(o, ClaimOutcome::Won(_))));
    assert!(store.claim(&batch).await.unwrap().iter().all(|o| *o == ClaimOutcome::Taken));
    assert!(matches!(store.claim(&one).await.unwrap()[..], [ClaimOutcome::Won(_)]));
    assert_eq!(store.claim(&one).await.unwrap(), vec![ClaimOutcome::Taken]);
    pool.close().await;
}

/// A herd's runs all share one instant, and are newer than the table's statistics. A
/// lookup of one of them (renew, finish) must still reach it by an index whose condition
/// holds the job, not scan every run of the instant (818 ms for 256 ends over a
/// 100,000-run herd when the index by instant lacked the job).
#[tokio::test]
async fn a_run_of_a_fresh_herd_is_looked_up_by_an_exact_index() {
    let Some(ns) = Namespace::new().await else { return };
    let store = ns.migrated().await;
    for chunk in 0..3 {
        let batch: Vec<ClaimRequest> = (0..1000)
            .map(|job| run(tick(&format!("job-{:04}", chunk * 1000 + job), 0), "a", LONG_LEASE, false))
            .collect();
        store.claim(&batch).await.unwrap();
    }
    let pool = sqlx::PgPool::connect(&ns.url).await.unwrap();
    let p = &ns.prefix.table_prefix();
    let at = tick("job-1234", 0).scheduled_at.timestamp_millis();
    let plan: Vec<String> = sqlx::query_scalar(&format!(
        "EXPLAIN UPDATE {p}runs SET state = 'succeeded' WHERE job = 'job-1234' AND scheduled_at = {at}
         AND attempt = 1 AND node = 'a' AND token = 1 AND state = 'running'"
    ))
    .fetch_all(&pool)
    .await
    .unwrap();
    let plan = plan.join("\n");
    let condition = plan.lines().find(|l| l.contains("Index Cond")).unwrap_or_else(|| panic!("no index used:\n{plan}"));
    assert!(condition.contains("job ="), "the index condition lacks the job:\n{plan}");
    pool.close().await;
}

/// The entries each index of the runs table (prefix `p`) returned to scans so far in the
/// transaction on `conn`: what a call in it read, however the planner chose to.
async fn runs_index_entries_read(conn: &mut sqlx::PgConnection, p: &str) -> Vec<(String, i64)> {
    sqlx::query_as(
        "SELECT c.relname::text, pg_stat_get_xact_tuples_returned(c.oid) FROM pg_index AS i
           JOIN pg_class AS c ON c.oid = i.indexrelid WHERE i.indrelid = $1::regclass ORDER BY 1",
    )
    .bind(format!("{p}runs"))
    .fetch_all(conn)
    .await
    .unwrap()
}

/// A batch of ends or renewals finds each run by its key, whatever the statistics believe
/// and however many runs are running: here the table was analyzed when none ran (as
/// autovacuum does at a quiet moment) and 2,000 run now. Left to itself the planner read
/// every running run from the partial indexes for each batch (or each item): an end then
/// cost more the more runs were running (1 s per 1,000 ends with 1,000 running).
#[tokio::test]
async fn a_batch_of_ends_or_renewals_reads_only_its_own_runs_however_many_are_running() {
    let Some(ns) = Namespace::new().await else { return };
    let store = ns.migrated().await;
    let batch = |minute: u32, jobs: u32| -> Vec<ClaimRequest> {
        (0..jobs).map(|job| run(tick(&format!("job-{job:04}"), minute), "a", LONG_LEASE, false)).collect()
    };
    let leases = |outcomes: Vec<ClaimOutcome>| -> Vec<Lease> { all_won(&outcomes).into_iter().cloned().collect() };
    let ended: Vec<Ending> = leases(store.claim(&batch(0, 1000)).await.unwrap())
        .into_iter()
        .map(|lease| Ending { lease, end: succeeded("") })
        .collect();
    for chunk in ended.chunks(FINISH_BATCH_MAX) {
        assert!(store.finish_all(chunk).await.unwrap().iter().all(|done| *done));
    }
    let pool = sqlx::PgPool::connect(&ns.url).await.unwrap();
    let p = &ns.prefix.table_prefix();
    sqlx::query(&format!("ANALYZE {p}runs")).execute(&pool).await.unwrap();
    let running = leases(store.claim(&batch(1, 1000)).await.unwrap());
    leases(store.claim(&batch(2, 1000)).await.unwrap());

    let mine = &running[..10];
    let (jobs, ats, tokens): (Vec<&str>, Vec<i64>, Vec<i64>) = mine
        .iter()
        .map(|l| (l.run.tick.job.as_str(), l.run.tick.scheduled_at.timestamp_millis(), l.fencing_token as i64))
        .fold(Default::default(), |(mut j, mut a, mut t), (job, at, token)| {
            j.push(job);
            a.push(at);
            t.push(token);
            (j, a, t)
        });
    let positions: Vec<i32> = (0..10).collect();
    let (ones, nodes) = (vec![1_i32; 10], vec!["a"; 10]);
    let calls = [
        (format!("SELECT * FROM {p}renew_all($1, $2, $3, $4, $5, $6, $7)"), "renew_all"),
        (
            format!(
                "SELECT * FROM {p}finish_all($1, $2, $3, $4, $5, $6, array_fill('succeeded'::text, ARRAY[10]),
                   array_fill(NULL::text, ARRAY[10]), array_fill(0, ARRAY[10]), array_fill(''::text, ARRAY[10]),
                   array_fill(NULL::bigint, ARRAY[10]))"
            ),
            "finish_all",
        ),
    ];
    let mut reads = Vec::new();
    for (sql, what) in calls {
        let mut tx = pool.begin().await.unwrap();
        let query = sqlx::query_scalar::<_, i32>(&sql)
            .bind(&positions)
            .bind(&jobs)
            .bind(&ats)
            .bind(&ones)
            .bind(&nodes)
            .bind(&tokens);
        let query = if what == "renew_all" { query.bind(vec![60_000_i64; 10]) } else { query };
        let done = query.fetch_all(&mut *tx).await.unwrap();
        let read = runs_index_entries_read(&mut tx, p).await;
        tx.commit().await.unwrap();
        reads.push((what, done.len(), read));
    }
    // Asserted once the transactions are over: a failure must not leave the prefix locked.
    pool.close().await;
    for (what, done, read) in reads {
        assert_eq!(done, 10, "{what}: every run of the batch answered");
        let total: i64 = read.iter().map(|(_, n)| n).sum();
        assert!(total <= 2 * 10, "{what}: index entries read for 10 runs, 2,000 running: {read:?}");
    }
}

/// A claim's overlap check (`overlap = skip`: is a run of this job running?) looks up each
/// request's job, whatever the statistics believe and however many runs of other jobs are
/// running: the table analyzed when none ran, 2,000 running now. As a join the planner read
/// every running run per claim (4.4 s for 1,000 requests beside 30,000 running, once its
/// plan went generic), in the batch claim and in the one-tick claim alike.
#[tokio::test]
async fn a_claims_overlap_check_reads_only_its_own_jobs_runs_however_many_are_running() {
    let Some(ns) = Namespace::new().await else { return };
    let store = ns.migrated().await;
    let pool = sqlx::PgPool::connect(&ns.url).await.unwrap();
    let p = &ns.prefix.table_prefix();
    sqlx::query(&format!("ANALYZE {p}runs")).execute(&pool).await.unwrap();
    for chunk in 0..2 {
        let busy: Vec<ClaimRequest> =
            (0..1000).map(|job| run(tick(&format!("busy-{chunk}-{job:04}"), 0), "a", LONG_LEASE, false)).collect();
        all_won(&store.claim(&busy).await.unwrap());
    }
    let at = tick("x", 1).scheduled_at.timestamp_millis();
    let jobs: Vec<String> = (0..10).map(|job| format!("quiet-{job}")).collect();
    let calls = [
        format!(
            "SELECT o_outcome FROM {p}claim_set($1, array_fill($2::bigint, ARRAY[10]), array_fill('schedule'::text, ARRAY[10]),
               array_fill('a'::text, ARRAY[10]), array_fill(60000::bigint, ARRAY[10]),
               array_fill('run-unless-running'::text, ARRAY[10]), array_fill(''::text, ARRAY[10]),
               array_fill(0::bigint, ARRAY[10]))"
        ),
        format!("SELECT o_outcome FROM {p}claim_one($1[1] || '-alone', $2, 'schedule', 'a', 60000, 'run-unless-running', '', 0)"),
    ];
    let mut reads = Vec::new();
    for sql in &calls {
        let mut tx = pool.begin().await.unwrap();
        let outcomes: Vec<String> = sqlx::query_scalar(sql).bind(&jobs).bind(at).fetch_all(&mut *tx).await.unwrap();
        let read = runs_index_entries_read(&mut tx, p).await;
        tx.commit().await.unwrap();
        reads.push((outcomes, read));
    }
    // Asserted once the transactions are over: a failure must not leave the prefix locked.
    pool.close().await;
    for ((outcomes, read), sql) in reads.into_iter().zip(&calls) {
        assert!(outcomes.iter().all(|o| o == "won"), "{outcomes:?} from {sql}");
        let total: i64 = read.iter().map(|(_, n)| n).sum();
        assert!(total <= 2 * 10, "index entries read by {sql}, 2,000 runs running: {read:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_nodes_claiming_different_ticks_of_one_job_never_both_run_it() {
    // The READ COMMITTED overlap race: without the per-job lock both would see "nothing
    // running" and both insert a running run.
    let Some(ns) = Namespace::new().await else { return };
    ns.migrated().await;
    let store = ns.store().await;
    for round in 0..20 {
        let job = format!("report-{round}");
        // An earlier, ended run: the job's fence row exists, so the racers do not serialize
        // on creating it and only the claim's own lock stands between them.
        let earlier = won(&store, run(tick(&job, 0), "setup", LONG_LEASE, false)).await;
        assert!(store.finish(&earlier, &succeeded("")).await.unwrap());
        let outcomes = at_once(&ns, 2, |i, store| {
            let request = run(tick(&job, 1 + i as u32), &format!("node-{i}"), LONG_LEASE, true);
            async move { store.claim(&[request]).await.unwrap().remove(0) }
        })
        .await;
        let (winners, skipped): (Vec<_>, Vec<_>) = outcomes.iter().partition(|o| matches!(o, ClaimOutcome::Won(_)));
        assert_eq!(winners.len(), 1, "round {round}: {outcomes:?}");
        let ClaimOutcome::Won(lease) = winners[0] else { unreachable!() };
        let expected = format!("overlap: previous run {} still running", lease.run);
        assert_eq!(skipped, vec![&ClaimOutcome::Skipped { reason: expected }], "round {round}");
    }
}

#[tokio::test]
async fn renew_and_finish_need_the_owner_and_token_and_a_running_run() {
    let Some(ns) = Namespace::new().await else { return };
    let store = ns.migrated().await;
    let lease = won(&store, run(tick("backup", 0), "a", SHORT_LEASE, false)).await;
    assert!(store.renew(&lease, LONG_LEASE).await.unwrap());
    let record = find(&store, &lease.run).await;
    assert!(record.lease_until.unwrap() >= lease.claimed_at + chrono::Duration::seconds(59));
    let stranger = Lease { owner: "b".into(), ..lease.clone() };
    let stale = Lease { fencing_token: lease.fencing_token + 1, ..lease.clone() };
    assert!(!store.renew(&stranger, LONG_LEASE).await.unwrap());
    assert!(!store.finish(&stale, &succeeded("")).await.unwrap());

    let output = format!("{}tail", "x".repeat(OUTPUT_TAIL_BYTES_MAX));
    assert!(store.finish(&lease, &succeeded(&output)).await.unwrap());
    assert!(!store.finish(&lease, &succeeded("again")).await.unwrap(), "a run ends once");
    assert!(!store.renew(&lease, LONG_LEASE).await.unwrap());
    let record = find(&store, &lease.run).await;
    assert_eq!((record.state, record.exit_code, record.lease_until), (RunState::Succeeded, Some(0), None));
    assert_eq!(record.output.len(), OUTPUT_TAIL_BYTES_MAX);
    assert!(record.output.ends_with("tail"));
    assert_eq!(record.started_at, Some(record.claimed_at + chrono::Duration::milliseconds(250)));
    assert!(record.finished_at.unwrap() >= record.claimed_at);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_expired_run_is_recovered_once_and_only_after_expiry() {
    let Some(ns) = Namespace::new().await else { return };
    let store = ns.migrated().await;
    let lease = won(&store, run(tick("backup", 0), "a", SHORT_LEASE, false)).await;
    let doomed = won(&store, run(tick("sync", 0), "a", SHORT_LEASE, false)).await;
    let retry = RecoverAction::Retry { node: "b".into(), lease: LONG_LEASE };
    assert_eq!(store.recover(&lease.run, &retry).await.unwrap(), RecoverOutcome::NotNeeded, "lease still live");
    assert!(store.expired(10, &solocron_core::Namespaces::ALL).await.unwrap().is_empty());
    tokio::time::sleep(PAST_SHORT_LEASE).await;

    let expired: Vec<RunId> =
        store.expired(10, &solocron_core::Namespaces::ALL).await.unwrap().into_iter().map(|r| r.id).collect();
    assert_eq!(expired.len(), 2);
    assert_eq!(store.expired(1, &solocron_core::Namespaces::ALL).await.unwrap().len(), 1);
    assert!(!store.renew(&lease, LONG_LEASE).await.unwrap(), "an expired lease is not renewed");
    let outcomes = at_once(&ns, 4, |_, store| {
        let (run, retry) = (lease.run.clone(), retry.clone());
        async move { store.recover(&run, &retry).await.unwrap() }
    })
    .await;
    let retried: Vec<&Lease> =
        outcomes.iter().filter_map(|o| if let RecoverOutcome::Retried(l) = o { Some(l) } else { None }).collect();
    assert_eq!(retried.len(), 1, "{outcomes:?}");
    assert_eq!(outcomes.iter().filter(|o| **o == RecoverOutcome::NotNeeded).count(), 3);
    let next = retried[0];
    assert_eq!((next.run.attempt, next.fencing_token, next.owner.as_str()), (2, 2, "b"));
    let old = find(&store, &lease.run).await;
    assert_eq!(old.state, RunState::Lost);
    assert_eq!(old.reason.as_deref(), Some("lease expired; retried as attempt 2 by b"));
    assert_eq!(find(&store, &next.run).await.trigger, Trigger::Retry);

    let abandon = RecoverAction::Abandon { reason: "node gone".into() };
    assert_eq!(store.recover(&doomed.run, &abandon).await.unwrap(), RecoverOutcome::Abandoned);
    assert_eq!(store.recover(&doomed.run, &abandon).await.unwrap(), RecoverOutcome::NotNeeded);
    assert_eq!(find(&store, &doomed.run).await.state, RunState::Abandoned);
}

#[tokio::test]
async fn unlock_abandons_every_running_run_of_the_job_only() {
    let Some(ns) = Namespace::new().await else { return };
    let store = ns.migrated().await;
    let first = won(&store, run(tick("backup", 0), "a", LONG_LEASE, false)).await;
    let second = won(&store, run(tick("backup", 1), "b", LONG_LEASE, false)).await;
    let other = won(&store, run(tick("sync", 0), "a", LONG_LEASE, false)).await;
    let ids = store.unlock("backup", "operator", "stuck").await.unwrap();
    assert_eq!(ids, vec![first.run.clone(), second.run.clone()]);
    assert!(!store.renew(&first, LONG_LEASE).await.unwrap());
    assert!(!store.finish(&second, &succeeded("")).await.unwrap());
    assert!(store.renew(&other, LONG_LEASE).await.unwrap());
    let record = find(&store, &first.run).await;
    assert_eq!((record.state, record.reason.as_deref()), (RunState::Abandoned, Some("unlocked by operator: stuck")));
    assert!(store.unlock("backup", "operator", "again").await.unwrap().is_empty());
}

#[tokio::test]
async fn a_paused_job_skips_scheduled_ticks_and_runs_manual_ones() {
    let Some(ns) = Namespace::new().await else { return };
    let store = ns.migrated().await;
    store.set_paused("backup", true, "alice", Some("disk full")).await.unwrap();
    let outcome = store.claim(&[run(tick("backup", 0), "a", LONG_LEASE, true)]).await.unwrap();
    assert_eq!(outcome, vec![ClaimOutcome::Skipped { reason: "paused by alice: disk full".into() }]);
    let manual = ClaimRequest { trigger: Trigger::Manual, ..run(tick("backup", 1), "a", LONG_LEASE, true) };
    assert!(matches!(store.claim(&[manual]).await.unwrap()[0], ClaimOutcome::Won(_)));
    let controls = store.controls().await.unwrap();
    assert_eq!(controls.len(), 1);
    assert!(controls[0].paused && controls[0].changed_by == "alice");

    store.set_paused("backup", false, "bob", None).await.unwrap();
    let controls = store.controls().await.unwrap();
    assert_eq!((controls[0].paused, controls[0].reason.as_deref()), (false, None));
    assert!(matches!(
        store.claim(&[run(tick("backup", 2), "a", LONG_LEASE, false)]).await.unwrap()[0],
        ClaimOutcome::Won(_)
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn manual_requests_are_unique_off_second_ticks_pending_until_claimed() {
    let Some(ns) = Namespace::new().await else { return };
    ns.migrated().await;
    let mut ticks =
        at_once(&ns, 6, |i, store| async move { store.request_run("backup", &format!("op-{i}"), None).await.unwrap() })
            .await;
    ticks.sort();
    ticks.dedup();
    assert_eq!(ticks.len(), 6, "every request gets its own tick");
    assert!(ticks.iter().all(|t| t.scheduled_at.timestamp_subsec_millis() != 0), "{ticks:?}");
    let store = ns.store().await;
    let pending: Vec<Tick> = store
        .pending_requests(100, &solocron_core::Namespaces::ALL)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.tick)
        .collect();
    assert_eq!(pending, ticks, "oldest first");
    let manual = ClaimRequest { trigger: Trigger::Manual, ..run(ticks[0].clone(), "a", LONG_LEASE, false) };
    won(&store, manual).await;
    assert_eq!(store.pending_requests(100, &solocron_core::Namespaces::ALL).await.unwrap().len(), 5);
    assert_eq!(store.pending_requests(2, &solocron_core::Namespaces::ALL).await.unwrap()[0].tick, ticks[1]);
}

#[tokio::test]
async fn prune_deletes_old_ended_records_in_batches_never_running_ones() {
    let Some(ns) = Namespace::new().await else { return };
    let store = ns.migrated().await;
    for minute in 0..3 {
        let lease = won(&store, run(tick("backup", minute), "a", LONG_LEASE, false)).await;
        assert!(store.finish(&lease, &succeeded("")).await.unwrap());
    }
    let running = won(&store, run(tick("backup", 9), "a", LONG_LEASE, false)).await;
    store.request_run("backup", "op", None).await.unwrap();
    let day = Duration::from_secs(86_400);
    assert_eq!(store.prune(day, 2, &solocron_core::Namespaces::ALL).await.unwrap(), 2);
    assert_eq!(
        store.pending_requests(10, &solocron_core::Namespaces::ALL).await.unwrap().len(),
        1,
        "a fresh request is kept"
    );
    assert_eq!(store.prune(day, 2, &solocron_core::Namespaces::ALL).await.unwrap(), 1);
    assert_eq!(store.prune(day, 2, &solocron_core::Namespaces::ALL).await.unwrap(), 0);
    let left = store.history(&HistoryQuery::default()).await.unwrap();
    assert_eq!(left.iter().map(|r| r.id.clone()).collect::<Vec<_>>(), vec![running.run]);
    tokio::time::sleep(Duration::from_millis(5)).await;
    store.prune(Duration::ZERO, 10, &solocron_core::Namespaces::ALL).await.unwrap();
    assert!(
        store.pending_requests(10, &solocron_core::Namespaces::ALL).await.unwrap().is_empty(),
        "requests older than the cutoff go"
    );
}

#[tokio::test]
async fn history_filters_and_registrations_upsert() {
    let Some(ns) = Namespace::new().await else { return };
    let store = ns.migrated().await;
    won(&store, run(tick("backup", 0), "a", LONG_LEASE, false)).await;
    won(&store, run(tick("backup", 1), "b", LONG_LEASE, false)).await;
    won(&store, run(tick("sync", 2), "a", LONG_LEASE, false)).await;
    let query = |q: HistoryQuery| {
        let store = store.clone();
        async move { store.history(&q).await.unwrap().into_iter().map(|r| r.id.tick).collect::<Vec<_>>() }
    };
    assert_eq!(query(HistoryQuery::default()).await, vec![tick("sync", 2), tick("backup", 1), tick("backup", 0)]);
    assert_eq!(query(HistoryQuery { job: Some("backup".into()), ..Default::default() }).await.len(), 2);
    assert_eq!(query(HistoryQuery { node: Some("b".into()), ..Default::default() }).await, vec![tick("backup", 1)]);
    let window = HistoryQuery {
        since: Some(tick("x", 1).scheduled_at),
        until: Some(tick("x", 2).scheduled_at),
        ..Default::default()
    };
    assert_eq!(query(window).await, vec![tick("backup", 1)]);
    assert_eq!(query(HistoryQuery { limit: 1, ..Default::default() }).await.len(), 1);

    let definition = |job: &str, hash: &str| JobDefinition {
        job: job.into(),
        schedule: "0 * * * * *".into(),
        timezone: "UTC".into(),
        definition_hash: hash.into(),
        summary: "lease 30s".into(),
    };
    store
        .register("a", &[definition("backup", "h1"), definition("sync", "h1"), definition("backup", "h2")])
        .await
        .unwrap();
    let first = store.registrations().await.unwrap();
    assert_eq!(first.len(), 2);
    assert_eq!(first[0].definition.definition_hash, "h2", "the last definition of a job wins");
    tokio::time::sleep(Duration::from_millis(5)).await;
    store.register("a", &[definition("backup", "h3")]).await.unwrap();
    store.register("b", &[definition("backup", "h3")]).await.unwrap();
    let second = store.registrations().await.unwrap();
    let keys: Vec<(&str, &str)> = second.iter().map(|r| (r.definition.job.as_str(), r.node.as_str())).collect();
    assert_eq!(keys, vec![("backup", "a"), ("backup", "b")], "a no longer lists sync");
    assert_eq!(second[0].first_seen, first[0].first_seen);
    assert!(second[0].last_seen > first[0].last_seen);
    store.register("a", &[]).await.unwrap();
    let keys: Vec<String> = store.registrations().await.unwrap().into_iter().map(|r| r.node).collect();
    assert_eq!(keys, ["b"], "a runs nothing");
}

/// `register`'s removal of a node's unlisted jobs finds the node's rows by
/// `{p}registry_node`, not by reading every node's registrations.
#[tokio::test]
async fn the_removal_of_unlisted_jobs_reads_the_registry_by_node() {
    let Some(ns) = Namespace::new().await else { return };
    let store = ns.migrated().await;
    let definition = |job: String| JobDefinition {
        job,
        schedule: "0 * * * * *".into(),
        timezone: "UTC".into(),
        definition_hash: "h".into(),
        summary: "s".into(),
    };
    for node in 0..40 {
        let jobs: Vec<JobDefinition> = (0..250).map(|job| definition(format!("job-{job:03}"))).collect();
        store.register(&format!("node-{node:02}"), &jobs).await.unwrap();
    }
    let pool = sqlx::PgPool::connect(&ns.url).await.unwrap();
    let p = &ns.prefix.table_prefix();
    sqlx::query(&format!("ANALYZE {p}registry")).execute(&pool).await.unwrap();
    let plan: Vec<String> = sqlx::query_scalar(&format!(
        "EXPLAIN DELETE FROM {p}registry WHERE node = 'node-07' AND job NOT IN (SELECT unnest('{{job-001}}'::text[]))"
    ))
    .fetch_all(&pool)
    .await
    .unwrap();
    let plan = plan.join("\n");
    assert!(plan.contains(&format!("{p}registry_node")), "no index by node:\n{plan}");
    assert!(plan.contains("hashed SubPlan"), "the listed names are not hashed:\n{plan}");
    pool.close().await;
}

/// `registered_jobs` answers each name once and sorted by bytes, as `str` orders them
/// (`Z` before `a`, `job-10` before `job-9`), whatever the database's collation: the
/// statement hashes the names and sorts nothing, so the order is the store's own work.
#[tokio::test]
async fn the_registered_names_come_once_each_in_byte_order() {
    let Some(ns) = Namespace::new().await else { return };
    let store = ns.migrated().await;
    let definition = |job: &str| JobDefinition {
        job: job.into(),
        schedule: "0 * * * * *".into(),
        timezone: "UTC".into(),
        definition_hash: "h".into(),
        summary: "s".into(),
    };
    let names: Vec<String> = (0..300)
        .map(|j| format!("job-{j}"))
        .chain(["Zeta", "alpha", "billing/sync", "émile"].map(String::from))
        .collect();
    for (node, skip) in [("node-a", 2), ("node-b", 3), ("node-c", 1)] {
        let jobs: Vec<JobDefinition> = names.iter().step_by(skip).map(|j| definition(j)).collect();
        store.register(node, &jobs).await.unwrap();
    }
    let mut expected = names.clone();
    expected.sort_unstable();
    assert_eq!(store.registered_jobs().await.unwrap(), expected);
    store.register("node-c", &[]).await.unwrap();
    let left = store.registered_jobs().await.unwrap();
    assert!(left.windows(2).all(|w| w[0] < w[1]), "sorted, each once");
    assert_eq!(left.len(), names.iter().enumerate().filter(|(i, _)| i % 2 == 0 || i % 3 == 0).count());
}

/// A schema of version 8 (before the registry's index by node) is brought to the current
/// version by `migrate`, which creates that index.
#[tokio::test]
async fn a_version_8_schema_gets_the_registry_index_by_node() {
    let Some(ns) = Namespace::new().await else { return };
    let store = ns.migrated().await;
    let pool = sqlx::PgPool::connect(&ns.url).await.unwrap();
    let p = &ns.prefix.table_prefix();
    for sql in [format!("DROP INDEX {p}registry_node"), format!("UPDATE {p}schema SET version = 8")] {
        sqlx::query(&sql).execute(&pool).await.unwrap();
    }
    store.migrate().await.expect("migrate from version 8");
    let version: i32 = sqlx::query_scalar(&format!("SELECT version FROM {p}schema")).fetch_one(&pool).await.unwrap();
    assert_eq!(version, CURRENT as i32);
    let indexes: Vec<String> =
        sqlx::query_scalar("SELECT indexname::text FROM pg_indexes WHERE tablename = $1 ORDER BY indexname")
            .bind(format!("{p}registry"))
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(indexes, [format!("{p}registry_node"), format!("{p}registry_pkey")]);
    pool.close().await;
}

/// A schema of version 9 (before waiting retries had their index) is brought to the
/// current version by `migrate`, which creates that index; `expired` then reads running
/// runs and waiting retries from partial indexes, never the history.
#[tokio::test]
async fn a_version_9_schema_gets_the_index_of_waiting_retries() {
    let Some(ns) = Namespace::new().await else { return };
    let store = ns.migrated().await;
    let pool = sqlx::PgPool::connect(&ns.url).await.unwrap();
    let p = &ns.prefix.table_prefix();
    for sql in [format!("DROP INDEX {p}runs_waiting"), format!("UPDATE {p}schema SET version = 9")] {
        sqlx::query(&sql).execute(&pool).await.unwrap();
    }
    store.migrate().await.expect("migrate from version 9");
    let version: i32 = sqlx::query_scalar(&format!("SELECT version FROM {p}schema")).fetch_one(&pool).await.unwrap();
    assert_eq!(version, CURRENT as i32);
    let definition: String = sqlx::query_scalar("SELECT indexdef::text FROM pg_indexes WHERE indexname = $1")
        .bind(format!("{p}runs_waiting"))
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(definition.contains("(lease_until) WHERE (state = 'waiting'::text)"), "{definition}");

    // Enough history that a scan of it would cost more than the partial indexes.
    let batch: Vec<ClaimRequest> =
        (0..1000).map(|job| run(tick(&format!("job-{job:04}"), 0), "a", LONG_LEASE, false)).collect();
    let endings: Vec<Ending> = all_won(&store.claim(&batch).await.unwrap())
        .into_iter()
        .map(|lease| Ending { lease: lease.clone(), end: succeeded("") })
        .collect();
    for chunk in endings.chunks(FINISH_BATCH_MAX) {
        assert!(store.finish_all(chunk).await.unwrap().iter().all(|ended| *ended));
    }
    sqlx::query(&format!("ANALYZE {p}runs")).execute(&pool).await.unwrap();
    let due = |state: &str| {
        format!("(SELECT * FROM {p}runs WHERE state = '{state}' AND lease_until < 1 ORDER BY lease_until LIMIT 10)")
    };
    let plan: Vec<String> = sqlx::query_scalar(&format!(
        "EXPLAIN SELECT * FROM ({} UNION ALL {}) AS due ORDER BY lease_until LIMIT 10",
        due("running"),
        due("waiting")
    ))
    .fetch_all(&pool)
    .await
    .unwrap();
    let plan = plan.join("\n");
    // The running half may read either partial index of running runs.
    assert!(plan.contains(&format!("{p}runs_waiting")), "runs_waiting is not used:\n{plan}");
    for whole in ["Seq Scan", "runs_pkey", "runs_scheduled_job"] {
        assert!(!plan.contains(whole), "the history is scanned ({whole}):\n{plan}");
    }
    pool.close().await;
}

/// `prune` never deletes a waiting retry, however old its tick: it is not ended yet. Once
/// started and ended, it goes like any record.
#[tokio::test]
async fn prune_keeps_waiting_retries() {
    let Some(ns) = Namespace::new().await else { return };
    let store = ns.migrated().await;
    let first = won(&store, run(tick("backup", 0), "a", LONG_LEASE, false)).await;
    let failed = RunEnd { state: RunState::Failed, exit_code: Some(1), ..succeeded("boom") };
    assert!(store.finish_for_retry(&first, &failed, Duration::ZERO).await.unwrap());
    let day = Duration::from_secs(86_400);
    assert_eq!(store.prune(day, 10, &solocron_core::Namespaces::ALL).await.unwrap(), 1, "only the failed attempt goes");
    let left = store.history(&HistoryQuery::default()).await.unwrap();
    let next = RunId { tick: first.run.tick.clone(), attempt: 2 };
    assert_eq!(left.iter().map(|r| (r.id.clone(), r.state)).collect::<Vec<_>>(), [(next.clone(), RunState::Waiting)]);

    tokio::time::sleep(Duration::from_millis(5)).await;
    let start = RecoverAction::Retry { node: "b".into(), lease: LONG_LEASE };
    let RecoverOutcome::Retried(second) = store.recover(&next, &start).await.unwrap() else { panic!("not started") };
    assert_eq!(second.fencing_token, first.fencing_token + 1);
    assert!(store.finish(&second, &succeeded("")).await.unwrap());
    assert_eq!(store.prune(day, 10, &solocron_core::Namespaces::ALL).await.unwrap(), 1);
    assert!(store.history(&HistoryQuery::default()).await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ten_pools_migrating_an_empty_prefix_at_once_all_succeed() {
    let Some(ns) = Namespace::new().await else { return };
    let results = at_once(&ns, 10, |_, store| async move { store.migrate().await }).await;
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    let store = ns.migrated().await;
    assert!(store.history(&HistoryQuery::default()).await.unwrap().is_empty());
    let store_clock = store.now().await.unwrap();
    assert!((store_clock - chrono::Utc::now()).num_seconds().abs() < 5, "the local server's clock");
}

#[tokio::test]
async fn descriptions_and_errors_never_show_the_password() {
    let Some(ns) = Namespace::new().await else { return };
    // Trust auth ignores the password, so this connects.
    let url = ns.url.replacen("postgres@", "postgres:s3cret@", 1);
    let store = PgStore::connect(&url, &ns.prefix).await.unwrap();
    assert!(store.describe().contains("postgres:***@"), "{}", store.describe());
    assert!(store.describe().ends_with(&format!(" (prefix {})", ns.prefix)));
    assert_eq!(store.describe(), format!("{} (prefix {})", solocron_core::redact_url(&url), ns.prefix));
    assert!(!store.describe().contains("s3cret") && !format!("{store:?}").contains("s3cret"));
    // A bad prefix never reaches `connect`: the `Prefix` type is the check.
    assert!(Prefix::parse("Bad-Prefix").is_err());
    let default = Prefix::default();
    let bad_url = PgStore::connect("postgres://u:s3cret@h:port/d", &default).await.unwrap_err();
    assert!(matches!(bad_url, StoreError::Invalid(_)) && !bad_url.to_string().contains("s3cret"), "{bad_url}");
    let not_a_url = PgStore::connect("s3cret", &default).await.unwrap_err();
    assert!(matches!(not_a_url, StoreError::Invalid(_)) && !not_a_url.to_string().contains("s3cret"), "{not_a_url}");
    // Nothing listens on port 1: unavailable after the acquire timeout, password masked.
    let down = PgStore::connect("postgres://u:s3cret@127.0.0.1:1/d", &default).await.unwrap_err();
    assert!(matches!(down, StoreError::Unavailable(_)), "{down}");
    assert!(down.to_string().contains("u:***@127.0.0.1:1/d") && !down.to_string().contains("s3cret"), "{down}");
    // The same with the password as a parameter.
    let down = PgStore::connect("postgres://u@127.0.0.1:1/d?password=s3cret", &default).await.unwrap_err();
    assert!(matches!(down, StoreError::Unavailable(_)), "{down}");
    assert!(down.to_string().contains("password=***") && !down.to_string().contains("s3cret"), "{down}");
}

/// Every relation (table, index), type, function and trigger of the test schema whose
/// name starts with `start`, as `kind name`.
async fn objects_named(pool: &sqlx::PgPool, start: &str) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT kind || ' ' || name FROM (
             SELECT 'relation' AS kind, relname::text AS name FROM pg_class
             WHERE relnamespace = current_schema()::regnamespace
             UNION ALL SELECT 'type', typname::text FROM pg_type WHERE typnamespace = current_schema()::regnamespace
             UNION ALL SELECT 'function', proname::text FROM pg_proc WHERE pronamespace = current_schema()::regnamespace
             UNION ALL SELECT 'trigger', tgname::text FROM pg_trigger
         ) o WHERE left(name, length($1)) = $1 ORDER BY 1",
    )
    .bind(start)
    .fetch_all(pool)
    .await
    .unwrap()
}

/// `uninstall` drops every table, index, function and trigger of its prefix, even those
/// of a prefix whose names begin like its own stays whole and working, and a second
/// `uninstall` finds nothing to do.
#[tokio::test]
async fn uninstall_removes_everything_of_its_prefix_and_nothing_else() {
    let Some(ns) = Namespace::new().await else { return };
    // Its names begin with ns's: `{ns}_other_runs` beside `{ns}_runs`.
    let other_ns = ns.nested("other");
    let (store, other) = (ns.migrated().await, other_ns.migrated().await);
    won(&store, run(tick("backup", 0), "a", LONG_LEASE, false)).await;
    won(&other, run(tick("backup", 0), "a", LONG_LEASE, false)).await;
    let pool = sqlx::PgPool::connect(&ns.url).await.unwrap();
    let others = objects_named(&pool, &other_ns.prefix.table_prefix()).await;
    let mine: Vec<String> =
        objects_named(&pool, &ns.prefix.table_prefix()).await.into_iter().filter(|o| !others.contains(o)).collect();
    let p = ns.prefix.table_prefix();
    let objects = ["relation {p}runs", "relation {p}schema", "relation {p}runs_pkey", "function {p}claim_one"];
    for object in objects.iter().chain(&["relation {p}nodes", "relation {p}actions", "relation {p}actions_job"]) {
        assert!(mine.contains(&object.replace("{p}", &p)), "{object} is missing from {mine:?}");
    }
    assert_eq!(others.len(), mine.len(), "the other prefix has the same schema: {others:?}");

    store.uninstall().await.expect("uninstall");
    assert_eq!(objects_named(&pool, &p).await, others, "only the other prefix's objects are left");
    store.uninstall().await.expect("uninstalling again is fine");
    let err = store.claim(&[run(tick("backup", 1), "a", LONG_LEASE, false)]).await.unwrap_err();
    assert!(matches!(err, StoreError::Invalid(_)), "{err}");

    assert_eq!(other.history(&HistoryQuery::default()).await.unwrap().len(), 1);
    let next = won(&other, run(tick("backup", 1), "a", LONG_LEASE, false)).await;
    assert_eq!(next.fencing_token, 2, "the other prefix keeps its counters");
    // The uninstalled prefix starts afresh.
    store.migrate().await.expect("migrate again");
    assert_eq!(won(&store, run(tick("backup", 0), "a", LONG_LEASE, false)).await.fencing_token, 1);
    pool.close().await;
}

#[tokio::test]
async fn an_unmigrated_prefix_is_an_invalid_store_not_an_outage() {
    let Some(ns) = Namespace::new().await else { return };
    let err = ns.store().await.claim(&[run(tick("backup", 0), "a", LONG_LEASE, false)]).await.unwrap_err();
    assert!(matches!(err, StoreError::Invalid(_)), "{err}");
}

/// The schema version this build writes (the crate's `SCHEMA_VERSION`).
const CURRENT: u32 = 13;

/// `schema` on a fresh prefix says Missing and creates nothing (a second look still finds
/// nothing: no schema table, no other object of the prefix).
#[tokio::test]
async fn schema_of_a_fresh_prefix_is_missing_and_creates_nothing() {
    let Some(ns) = Namespace::new().await else { return };
    let store = ns.store().await;
    assert_eq!(store.schema().await.unwrap(), SchemaState::Missing);
    assert_eq!(store.schema().await.unwrap(), SchemaState::Missing);
    let pool = sqlx::PgPool::connect(&ns.url).await.unwrap();
    assert_eq!(objects_named(&pool, &ns.prefix.table_prefix()).await, Vec::<String>::new(), "schema() wrote nothing");
    pool.close().await;
}

/// After `migrate` the schema is Current; a prefix whose names begin like it is still Missing.
#[tokio::test]
async fn schema_after_migrate_is_current_and_other_prefixes_stay_missing() {
    let Some(ns) = Namespace::new().await else { return };
    assert_eq!(ns.migrated().await.schema().await.unwrap(), SchemaState::Current);
    assert_eq!(ns.nested("other").store().await.schema().await.unwrap(), SchemaState::Missing);
}

/// A stored version above this build's is Newer, one below Older; an emptied version table
/// is Missing.
#[tokio::test]
async fn schema_reports_a_stored_version_above_as_newer_below_as_older_and_none_as_missing() {
    let Some(ns) = Namespace::new().await else { return };
    let store = ns.migrated().await;
    let pool = sqlx::PgPool::connect(&ns.url).await.unwrap();
    let p = &ns.prefix.table_prefix();
    let set = format!("UPDATE {p}schema SET version = $1");
    sqlx::query(&set).bind((CURRENT + 1) as i32).execute(&pool).await.unwrap();
    assert_eq!(store.schema().await.unwrap(), SchemaState::Newer { found: CURRENT + 1, current: CURRENT });
    sqlx::query(&set).bind((CURRENT - 1) as i32).execute(&pool).await.unwrap();
    assert_eq!(store.schema().await.unwrap(), SchemaState::Older { found: CURRENT - 1, current: CURRENT });
    sqlx::query(&format!("DELETE FROM {p}schema")).execute(&pool).await.unwrap();
    assert_eq!(store.schema().await.unwrap(), SchemaState::Missing);
    pool.close().await;
}

/// A store that cannot reach its server (here: its pool closed) answers Unavailable.
#[tokio::test]
async fn schema_of_an_unreachable_store_is_unavailable() {
    let Some(ns) = Namespace::new().await else { return };
    let store = ns.migrated().await;
    store.close().await;
    let err = store.schema().await.unwrap_err();
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
async fn counted_from_history(store: &PgStore, job: &str, since: DateTime<Utc>) -> Vec<(&'static str, u64)> {
    let all = store.history(&HistoryQuery::default()).await.unwrap();
    let mut counts = RunCounts::default();
    for r in all.iter().filter(|r| r.id.tick.job == job && r.id.tick.scheduled_at >= since) {
        counts.add(r.state, 1);
    }
    by_name(counts.by_state)
}

/// Records of two jobs in every state the store's own steps make (won and held, finished
/// two ways, failed with a waiting retry, expired and retried, expired and abandoned,
/// skipped), around `since`: one of each job exactly at `since`, one a millisecond before.
async fn records_around(store: &PgStore, since: DateTime<Utc>) {
    let at = |job: &str, ms: i64| Tick::new(job, since + chrono::Duration::milliseconds(ms));
    for job in ["backup", "sync"] {
        for (ms, state) in [(-1, RunState::Succeeded), (0, RunState::Succeeded), (60_000, RunState::TimedOut)] {
            let lease = won(store, run(at(job, ms), "a", LONG_LEASE, false)).await;
            assert!(store.finish(&lease, &ended(state)).await.unwrap());
        }
        let lease = won(store, run(at(job, 120_000), "a", LONG_LEASE, false)).await;
        assert!(store.finish_for_retry(&lease, &ended(RunState::Failed), LONG_LEASE).await.unwrap());
        let skip = ClaimRequest {
            mode: ClaimMode::Skip { reason: "missed".into() },
            ..run(at(job, 180_000), "a", LONG_LEASE, false)
        };
        assert!(matches!(store.claim(&[skip]).await.unwrap()[..], [ClaimOutcome::Skipped { .. }]));
        won(store, run(at(job, 240_000), "a", LONG_LEASE, false)).await;
    }
    let retried = won(store, run(at("backup", 300_000), "a", SHORT_LEASE, false)).await;
    let abandoned = won(store, run(at("backup", 360_000), "a", SHORT_LEASE, false)).await;
    tokio::time::sleep(PAST_SHORT_LEASE).await;
    let retry = RecoverAction::Retry { node: "b".into(), lease: LONG_LEASE };
    assert!(matches!(store.recover(&retried.run, &retry).await.unwrap(), RecoverOutcome::Retried(_)));
    let abandon = RecoverAction::Abandon { reason: "gone".into() };
    assert_eq!(store.recover(&abandoned.run, &abandon).await.unwrap(), RecoverOutcome::Abandoned);
}

/// `count_runs` counts, in one query, the records of the job asked (every attempt) whose
/// tick is at or after `since`, by state: one exactly at `since` is counted, one a
/// millisecond before is not, another job's never; the counts are those its history gives
/// (the trait's default), and never truncated.
#[tokio::test]
async fn count_runs_counts_every_attempt_of_the_job_from_since_by_state_as_history_does() {
    let Some(ns) = Namespace::new().await else { return };
    let store = ns.migrated().await;
    let since = tick("backup", 10).scheduled_at;
    records_around(&store, since).await;
    let counts = store.count_runs("backup", since).await.unwrap();
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
        let counts = store.count_runs(job, from).await.unwrap();
        assert_eq!(by_name(counts.by_state), counted_from_history(&store, job, from).await, "{job} from {from}");
    }
    let before = store.count_runs("backup", since - chrono::Duration::milliseconds(1)).await.unwrap();
    assert!(by_name(before.by_state).contains(&("succeeded", 2)), "the record a millisecond before");
    let later = since + chrono::Duration::milliseconds(360_001);
    assert_eq!(store.count_runs("backup", later).await.unwrap(), RunCounts::default(), "nothing after the last");
    assert_eq!(store.count_runs("nothing", since).await.unwrap(), RunCounts::default(), "a job never run");
}

/// A record in a state this version cannot read fails `count_runs` as it fails `history`
/// (`Invalid`, naming the column), rather than being counted as something else.
#[tokio::test]
async fn count_runs_fails_on_a_state_it_cannot_read_as_history_does() {
    let Some(ns) = Namespace::new().await else { return };
    let store = ns.migrated().await;
    let since = tick("backup", 10).scheduled_at;
    won(&store, run(Tick::new("backup", since), "a", LONG_LEASE, false)).await;
    let pool = sqlx::PgPool::connect(&ns.url).await.unwrap();
    let p = &ns.prefix.table_prefix();
    sqlx::query(&format!("UPDATE {p}runs SET state = 'paused_forever'")).execute(&pool).await.unwrap();
    pool.close().await;
    let query = HistoryQuery { job: Some("backup".into()), since: Some(since), ..HistoryQuery::default() };
    let history = store.history(&query).await.unwrap_err();
    let count = store.count_runs("backup", since).await.unwrap_err();
    for err in [history, count] {
        assert!(matches!(&err, StoreError::Invalid(m) if m.contains("column state")), "{err}");
    }
    assert_eq!(store.count_runs("sync", since).await.unwrap(), RunCounts::default(), "other jobs still count");
}

/// `count_runs`'s query reads a range of the primary key (the job, then the instant), not
/// the whole table, whether planned for its values or generically (as a statement prepared
/// and run many times may be).
#[tokio::test]
async fn count_runs_reads_a_range_of_the_primary_key() {
    let Some(ns) = Namespace::new().await else { return };
    ns.migrated().await;
    let pool = sqlx::PgPool::connect(&ns.url).await.unwrap();
    let p = &ns.prefix.table_prefix();
    // 200 jobs with 100 ticks each, a minute apart.
    sqlx::query(&format!(
        r#"INSERT INTO {p}runs (job, scheduled_at, attempt, "trigger", node, state, claimed_at)
           SELECT 'job-' || j, t * 60000, 1, 'schedule', 'a', 'succeeded', 0
           FROM generate_series(1, 200) AS j, generate_series(1, 100) AS t"#
    ))
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query(&format!("ANALYZE {p}runs")).execute(&pool).await.unwrap();
    let count =
        format!("SELECT state, count(*) AS n FROM {p}runs WHERE job = $1 AND scheduled_at >= $2 GROUP BY state");
    let mut conn = pool.acquire().await.unwrap();
    sqlx::query(&format!("PREPARE count_runs(text, bigint) AS {count}")).execute(&mut *conn).await.unwrap();
    for mode in ["force_custom_plan", "force_generic_plan"] {
        sqlx::query(&format!("SET plan_cache_mode = {mode}")).execute(&mut *conn).await.unwrap();
        let plan: Vec<String> =
            sqlx::query_scalar("EXPLAIN EXECUTE count_runs('job-7', 5400000)").fetch_all(&mut *conn).await.unwrap();
        let plan = plan.join("\n");
        assert!(!plan.contains("Seq Scan"), "{mode}: the table is scanned:\n{plan}");
        let condition = plan.lines().find(|l| l.contains("Index Cond")).unwrap_or_else(|| panic!("{mode}:\n{plan}"));
        assert!(plan.contains(&format!("{p}runs_pkey")), "{mode}: not the primary key:\n{plan}");
        assert!(condition.contains("job =") && condition.contains("scheduled_at >="), "{mode}:\n{plan}");
    }
    drop(conn);
    pool.close().await;
}
