//! What is particular to the SQLite store: URLs and files, schema versions, its clock and
//! its indexes. Store behaviour every store shares is checked by the conformance suite
//! (`tests/conformance.rs`).
#![forbid(unsafe_code)]

use chrono::{DateTime, Utc};
use solocron_conformance::checks::definition;
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
use solocron_core::{
    ActionKind, ActionQuery, ClaimMode, ClaimOutcome, ClaimRequest, HistoryQuery, NodeBeat, Prefix, RecoverAction,
    RecoverOutcome, RunCounts, RunState, SchemaState, StoreError, Tick, Trigger,
};
use solocron_sqlite::SqliteStore;
use tempfile::TempDir;

async fn fresh() -> (TempDir, SqliteStore) {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open_path(&dir.path().join("solocron.db"), &Prefix::default()).await.unwrap();
    store.migrate().await.unwrap();
    (dir, store)
}

/// A second pool on the test database, for raw SQL.
async fn raw(dir: &TempDir) -> sqlx::SqlitePool {
    sqlx::SqlitePool::connect(&format!("sqlite://{}", dir.path().join("solocron.db").display())).await.unwrap()
}

#[tokio::test]
async fn a_schema_newer_than_this_crate_is_refused() {
    let (dir, store) = fresh().await;
    let pool = raw(&dir).await;
    sqlx::query("UPDATE solocron_schema SET version = 7").execute(&pool).await.unwrap();
    let err = store.migrate().await.unwrap_err();
    assert!(matches!(err, StoreError::Invalid(_)) && err.to_string().contains("version 7"), "{err}");
}

/// A file in a directory that does not exist is a typo in a path, not a store that may come
/// up later: bad input (`Invalid`), so a node exits at once instead of waiting for it.
#[tokio::test]
async fn connecting_where_the_directory_is_missing_is_invalid_and_names_the_directory() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("no-such-dir").join("solocron.db");
    for result in [
        SqliteStore::connect(&format!("sqlite://{}", path.display()), &Prefix::default()).await,
        SqliteStore::open_path(&path, &Prefix::default()).await,
    ] {
        let err = result.unwrap_err();
        assert!(matches!(err, StoreError::Invalid(_)), "{err}");
        assert!(err.to_string().contains(&path.display().to_string()), "{err}");
        let missing = path.parent().unwrap().display().to_string();
        assert!(err.to_string().contains(&format!("directory {missing} does not exist")), "{err}");
    }
    assert!(!path.parent().unwrap().exists(), "nothing is created");
}

#[tokio::test]
async fn connect_creates_the_file_and_describes_it_by_absolute_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("new.db");
    let store = SqliteStore::connect(&format!("sqlite:{}", path.display()), &Prefix::default()).await.unwrap();
    assert!(path.exists());
    assert_eq!(store.describe(), format!("sqlite://{}", path.display()));
    assert!(store.describe().starts_with("sqlite:///"));
}

#[tokio::test]
async fn the_store_clock_is_the_database_hosts_clock_in_milliseconds() {
    let (_dir, store) = fresh().await;
    let before = chrono::Utc::now();
    let now = store.now().await.unwrap();
    let after = chrono::Utc::now();
    // SQLite reads the same system clock, truncated to milliseconds.
    assert!(now >= before - chrono::Duration::milliseconds(1) && now <= after, "{before} {now} {after}");
    assert_eq!(now.timestamp_subsec_nanos() % 1_000_000, 0);
}

#[tokio::test]
async fn each_index_serves_the_query_it_is_for() {
    let (dir, _store) = fresh().await;
    let pool = raw(&dir).await;
    let plans = [
        (
            "SELECT * FROM solocron_runs WHERE state = 'running' AND lease_until < 5 ORDER BY lease_until LIMIT 9",
            "solocron_runs_expiry",
        ),
        (
            "SELECT job, scheduled_at, attempt FROM solocron_runs WHERE job = 'x' AND state = 'running'
             ORDER BY scheduled_at DESC, attempt DESC LIMIT 1",
            "solocron_runs_running",
        ),
        (
            "SELECT * FROM solocron_runs WHERE 1 = 1 ORDER BY scheduled_at DESC, attempt DESC LIMIT 9",
            "solocron_runs_newest",
        ),
        (
            "SELECT * FROM solocron_runs WHERE 1 = 1 AND state = 'running' ORDER BY scheduled_at DESC, attempt DESC LIMIT 9",
            "solocron_runs_running_newest",
        ),
        (
            "SELECT * FROM solocron_runs WHERE 1 = 1 AND job = 'x' ORDER BY scheduled_at DESC, attempt DESC LIMIT 9",
            "sqlite_autoindex_solocron_runs_1",
        ),
        (
            "SELECT job, requested_at, requested_by FROM solocron_requests AS r
             WHERE NOT EXISTS (SELECT 1 FROM solocron_runs
                               WHERE job = r.job AND scheduled_at = r.requested_at AND attempt = 1)
             ORDER BY requested_at, job LIMIT 9",
            "solocron_requests_oldest",
        ),
        (
            "SELECT rowid FROM solocron_runs WHERE state <> 'running' AND scheduled_at < 5
             ORDER BY scheduled_at, attempt LIMIT 9",
            "solocron_runs_newest",
        ),
        (
            "SELECT job, kind, done_by, reason, done_at, detail FROM solocron_actions
             ORDER BY done_at DESC, id DESC LIMIT 9",
            "solocron_actions_newest",
        ),
        (
            "SELECT job, kind, done_by, reason, done_at, detail FROM solocron_actions
             WHERE job = 'x' ORDER BY done_at DESC, id DESC LIMIT 9",
            "solocron_actions_job",
        ),
        ("SELECT id FROM solocron_actions WHERE done_at < 5 ORDER BY done_at LIMIT 9", "solocron_actions_newest"),
        (
            r#"DELETE FROM solocron_registry WHERE node = 'n' AND job NOT IN (SELECT value FROM json_each('["a"]'))"#,
            "solocron_registry_node",
        ),
    ];
    for (sql, index) in plans {
        let rows: Vec<(i64, i64, i64, String)> =
            sqlx::query_as(&format!("EXPLAIN QUERY PLAN {sql}")).fetch_all(&pool).await.unwrap();
        let plan: Vec<&str> = rows.iter().map(|r| r.3.as_str()).collect();
        assert!(plan.iter().any(|p| p.contains(index)), "{sql}: {plan:?}");
        assert!(!plan.iter().any(|p| p.contains("TEMP B-TREE")), "{sql} sorts: {plan:?}");
    }
}

/// The tables and version row of a version 1 database, as the first release wrote them.
const VERSION_1: &[&str] = &[
    "CREATE TABLE solocron_schema (version INTEGER NOT NULL)",
    "INSERT INTO solocron_schema (version) VALUES (1)",
    r#"CREATE TABLE solocron_runs (
        job TEXT NOT NULL, scheduled_at INTEGER NOT NULL, attempt INTEGER NOT NULL CHECK (attempt >= 1),
        "trigger" TEXT NOT NULL, node TEXT NOT NULL, token INTEGER NULL, state TEXT NOT NULL,
        reason TEXT NULL, claimed_at INTEGER NOT NULL, started_at INTEGER NULL, finished_at INTEGER NULL,
        lease_until INTEGER NULL, exit_code INTEGER NULL, output TEXT NOT NULL DEFAULT '',
        PRIMARY KEY (job, scheduled_at, attempt)
    )"#,
    "CREATE TABLE solocron_fences (job TEXT PRIMARY KEY, token INTEGER NOT NULL)",
    "INSERT INTO solocron_runs VALUES ('backup', 0, 1, 'schedule', 'a', 7, 'succeeded', NULL, 0, 0, 1, NULL, 0, 'ok')",
    "INSERT INTO solocron_fences VALUES ('backup', 7)",
];

#[tokio::test]
async fn a_version_1_database_is_upgraded_in_place_keeping_its_runs_and_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open_path(&dir.path().join("solocron.db"), &Prefix::default()).await.unwrap();
    let pool = raw(&dir).await;
    for statement in VERSION_1 {
        sqlx::query(statement).execute(&pool).await.unwrap();
    }
    store.migrate().await.unwrap();
    store.migrate().await.unwrap();
    let versions: Vec<i64> = sqlx::query_scalar("SELECT version FROM solocron_schema").fetch_all(&pool).await.unwrap();
    assert_eq!(versions, [6]);

    let history = store.history(&HistoryQuery::default()).await.unwrap();
    assert_eq!((history.len(), history[0].state, history[0].output.as_str()), (1, RunState::Succeeded, "ok"));
    store.set_paused("sync", true, "alice", None).await.unwrap();
    store.request_run("sync", "alice", None).await.unwrap();
    assert_eq!(store.pending_requests(10, &solocron_core::Namespaces::ALL).await.unwrap().len(), 1);
    let request = ClaimRequest {
        tick: Tick::new("backup", "2026-01-01T00:00:00Z".parse().unwrap()),
        trigger: Trigger::Schedule,
        node: "a".into(),
        lease: std::time::Duration::from_secs(30),
        mode: ClaimMode::Run { skip_if_running: true },
        nonce: 0,
    };
    match store.claim(&[request]).await.unwrap().remove(0) {
        ClaimOutcome::Won(lease) => assert_eq!(lease.fencing_token, 8, "the token counter carries on"),
        other => panic!("expected Won, got {other:?}"),
    }
}

/// A version 2 database (before the nodes and actions tables) is brought to the current
/// version by `migrate`, keeping its data; heartbeats and the audit log then work on it.
#[tokio::test]
async fn a_version_2_database_gets_the_nodes_and_actions_tables() {
    let (dir, store) = fresh().await;
    let pool = raw(&dir).await;
    store.set_paused("sync", true, "alice", Some("disk")).await.unwrap();
    for sql in ["DROP TABLE solocron_nodes", "DROP TABLE solocron_actions", "UPDATE solocron_schema SET version = 2"] {
        sqlx::query(sql).execute(&pool).await.unwrap();
    }
    let beat = NodeBeat { node: "a".into(), version: "1".into(), jobs: 1, running: 0 };
    assert!(store.heartbeat(&beat).await.is_err(), "version 2 has no nodes table");
    store.migrate().await.unwrap();
    let versions: Vec<i64> = sqlx::query_scalar("SELECT version FROM solocron_schema").fetch_all(&pool).await.unwrap();
    assert_eq!(versions, [6]);
    assert_eq!(store.controls().await.unwrap()[0].reason.as_deref(), Some("disk"), "the switches survive");
    store.heartbeat(&beat).await.unwrap();
    assert_eq!(store.nodes().await.unwrap().len(), 1);
    store.set_paused("sync", false, "bob", None).await.unwrap();
    let actions = store.actions(&ActionQuery::default()).await.unwrap();
    assert_eq!(actions.iter().map(|a| (a.kind, a.by.as_str())).collect::<Vec<_>>(), [(ActionKind::Resume, "bob")]);
}

/// A version 2 database written by a build before the `solocron_runs_fence` trigger gets
/// it at `migrate`, and tokens carry on from the stored counters, through one-tick claims
/// (which rely on the trigger alone) and batches alike.
#[tokio::test]
async fn a_database_from_before_the_fence_trigger_gets_it_and_tokens_carry_on() {
    let (dir, store) = fresh().await;
    let pool = raw(&dir).await;
    sqlx::query("DROP TRIGGER solocron_runs_fence").execute(&pool).await.unwrap();
    sqlx::query("INSERT INTO solocron_fences VALUES ('backup', 41)").execute(&pool).await.unwrap();
    store.migrate().await.unwrap();
    let request = |at: &str| ClaimRequest {
        tick: Tick::new("backup", at.parse().unwrap()),
        trigger: Trigger::Schedule,
        node: "a".into(),
        lease: std::time::Duration::from_secs(30),
        mode: ClaimMode::Run { skip_if_running: false },
        nonce: 0,
    };
    let tokens = |outcomes: Vec<ClaimOutcome>| -> Vec<u64> {
        outcomes
            .into_iter()
            .map(|o| match o {
                ClaimOutcome::Won(lease) => lease.fencing_token,
                other => panic!("expected Won, got {other:?}"),
            })
            .collect()
    };
    assert_eq!(tokens(store.claim(&[request("2026-01-01T00:00:00Z")]).await.unwrap()), [42]);
    let batch = [request("2026-01-01T00:01:00Z"), request("2026-01-01T00:02:00Z")];
    assert_eq!(tokens(store.claim(&batch).await.unwrap()), [43, 44]);
    assert_eq!(tokens(store.claim(&[request("2026-01-01T00:03:00Z")]).await.unwrap()), [45]);
    let counter: i64 =
        sqlx::query_scalar("SELECT token FROM solocron_fences WHERE job = 'backup'").fetch_one(&pool).await.unwrap();
    assert_eq!(counter, 45, "the counter holds the largest token handed out");
}

#[tokio::test]
async fn a_node_opening_while_another_migrates_waits_instead_of_failing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("solocron.db");
    // The first node has just created the file, not yet switched it to WAL, and holds its
    // write lock: switching to WAL then answers "database is locked" without waiting.
    let pool = sqlx::SqlitePool::connect(&format!("sqlite://{}?mode=rwc", path.display())).await.unwrap();
    let mut conn = pool.acquire().await.unwrap();
    sqlx::query("BEGIN IMMEDIATE").execute(&mut *conn).await.unwrap();
    sqlx::query("CREATE TABLE held (x)").execute(&mut *conn).await.unwrap();
    let release = tokio::spawn(async move {
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        sqlx::query("COMMIT").execute(&mut *conn).await.unwrap();
    });
    let second = SqliteStore::open_path(&path, &Prefix::default())
        .await
        .expect("a second node opening during a migration must wait");
    second.migrate().await.unwrap();
    release.await.unwrap();
}

/// A version 5 database (before failure retries) gets the index of waiting retries at
/// `migrate`, and `expired` uses it: it never walks the history to find them.
#[tokio::test]
async fn a_version_5_database_gets_the_waiting_retries_index_and_expired_uses_it() {
    let (dir, store) = fresh().await;
    let pool = raw(&dir).await;
    for sql in ["DROP INDEX solocron_runs_waiting", "UPDATE solocron_schema SET version = 5"] {
        sqlx::query(sql).execute(&pool).await.unwrap();
    }
    store.migrate().await.unwrap();
    let versions: Vec<i64> = sqlx::query_scalar("SELECT version FROM solocron_schema").fetch_all(&pool).await.unwrap();
    assert_eq!(versions, [6]);
    // A connection opened after the migration (one opened before plans with the schema it read).
    let pool = raw(&dir).await;
    let rows: Vec<(i64, i64, i64, String)> = sqlx::query_as(
        "EXPLAIN QUERY PLAN SELECT job FROM solocron_runs WHERE state = 'waiting' AND lease_until < 5 ORDER BY lease_until LIMIT 10",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let detail: Vec<&str> = rows.iter().map(|r| r.3.as_str()).collect();
    assert!(detail.iter().any(|d| d.contains("solocron_runs_waiting")), "the plan does not use the index: {detail:?}");
    assert!(store.expired(10, &solocron_core::Namespaces::ALL).await.unwrap().is_empty());
}

/// A version 4 database (before the runs' nonce column) gets the column at `migrate`,
/// keeping its records, which have no nonce: asked again with any nonce, their ticks are
/// taken. New claims store their nonce, and asked again with it are won again, alone and
/// in a batch, with their token: no token is handed out for them.
#[tokio::test]
async fn a_version_4_database_gets_the_nonce_column_and_its_records_have_none() {
    let (dir, store) = fresh().await;
    let pool = raw(&dir).await;
    for sql in [
        "ALTER TABLE solocron_runs DROP COLUMN nonce",
        "UPDATE solocron_schema SET version = 4",
        // A running claim as a version 4 build writes it (the trigger counts its token).
        r#"INSERT INTO solocron_runs (job, scheduled_at, attempt, "trigger", node, token, state, claimed_at, lease_until)
           VALUES ('backup', 1767225600000, 1, 'schedule', 'n', 1, 'running', 0, 0)"#,
    ] {
        sqlx::query(sql).execute(&pool).await.unwrap();
    }
    store.migrate().await.unwrap();
    store.migrate().await.unwrap();
    let versions: Vec<i64> = sqlx::query_scalar("SELECT version FROM solocron_schema").fetch_all(&pool).await.unwrap();
    assert_eq!(versions, [6]);
    let asked = |at: &str, nonce: u64| ClaimRequest { nonce, ..tick_request("backup", at) };
    let old = asked("2026-01-01T00:00:00Z", 7);
    assert_eq!(store.claim(std::slice::from_ref(&old)).await.unwrap(), [ClaimOutcome::Taken], "no nonce stored");

    let lease = |outcome: &ClaimOutcome| match outcome {
        ClaimOutcome::Won(lease) => lease.clone(),
        other => panic!("expected Won, got {other:?}"),
    };
    let new = asked("2026-01-01T00:01:00Z", u64::MAX);
    let first = lease(&store.claim(std::slice::from_ref(&new)).await.unwrap()[0]);
    assert_eq!(first.fencing_token, 2);
    let again = lease(&store.claim(std::slice::from_ref(&new)).await.unwrap()[0]);
    assert_eq!((again.fencing_token, again.claimed_at), (2, first.claimed_at), "alone");
    let batch = [old, new, asked("2026-01-01T00:02:00Z", 8)];
    let outcomes = store.claim(&batch).await.unwrap();
    assert_eq!(outcomes[0], ClaimOutcome::Taken);
    let (again, next) = (lease(&outcomes[1]), lease(&outcomes[2]));
    assert_eq!((again.fencing_token, again.claimed_at, next.fencing_token), (2, first.claimed_at, 3), "in a batch");
    let stored: Vec<(Option<i64>, Option<i64>)> =
        sqlx::query_as("SELECT nonce, lease_until FROM solocron_runs ORDER BY scheduled_at")
            .fetch_all(&pool)
            .await
            .unwrap();
    let ms = |lease: &solocron_core::Lease| Some(lease.lease_until.timestamp_millis());
    assert_eq!(stored, [(None, Some(0)), (Some(-1), ms(&again)), (Some(8), ms(&next))]);
    let counter: i64 =
        sqlx::query_scalar("SELECT token FROM solocron_fences WHERE job = 'backup'").fetch_one(&pool).await.unwrap();
    assert_eq!(counter, 3, "a claim won again hands out no token");
}

fn tick_request(job: &str, at: &str) -> ClaimRequest {
    ClaimRequest {
        tick: Tick::new(job, at.parse().unwrap()),
        trigger: Trigger::Schedule,
        node: "n".into(),
        lease: std::time::Duration::from_secs(60),
        mode: ClaimMode::Run { skip_if_running: false },
        nonce: 0,
    }
}

/// A write whose caller gave up while it waited for another process's write lock (its
/// future dropped mid-`BEGIN IMMEDIATE`, and mid-claim) must not leave a connection of the
/// store inside a transaction: the store's next writes work, and what the abandoned claim
/// may have written is whole or absent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_abandoned_while_waiting_for_the_lock_leaves_the_writer_usable() {
    let (dir, store) = fresh().await;
    let pool = raw(&dir).await;
    for round in 0..5 {
        let mut holder = pool.acquire().await.unwrap();
        sqlx::query("BEGIN IMMEDIATE").execute(&mut *holder).await.unwrap();
        let batch: Vec<ClaimRequest> =
            (0..3).map(|j| tick_request(&format!("job-{round}-{j}"), "2026-01-01T00:00:00Z")).collect();
        let single = [tick_request(&format!("one-{round}"), "2026-01-01T00:00:00Z")];
        let gave_up = tokio::time::timeout(std::time::Duration::from_millis(50), store.claim(&batch)).await;
        assert!(gave_up.is_err(), "the claim waits for the lock another process holds");
        let gave_up = tokio::time::timeout(std::time::Duration::from_millis(50), store.claim(&single)).await;
        assert!(gave_up.is_err(), "the one-tick claim waits too");
        sqlx::query("COMMIT").execute(&mut *holder).await.unwrap();
        drop(holder);
        // The batch was never begun, or was rolled back: claiming it again wins every tick.
        let outcomes = store.claim(&batch).await.expect("the writer works after an abandoned write");
        assert!(outcomes.iter().all(|o| matches!(o, ClaimOutcome::Won(_))), "{outcomes:?}");
        // The single statement either ran after the lock was released, or never did.
        let again = store.claim(&single).await.expect("claim");
        assert!(matches!(again[..], [ClaimOutcome::Won(_)] | [ClaimOutcome::Taken]), "{again:?}");
    }
    let history = store.history(&HistoryQuery { limit: 100, ..HistoryQuery::default() }).await.unwrap();
    assert_eq!(history.len(), 5 * 4, "one record per tick, none lost or doubled");
}

/// Writes of one store from many tasks at once queue for its connection instead of
/// contending for SQLite's lock: all succeed, each exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_tasks_writing_through_one_store_at_once_all_succeed() {
    let (_dir, store) = fresh().await;
    let tasks: Vec<_> = (0..64)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                let won = store
                    .claim(&[tick_request(&format!("job-{}", i % 8), &format!("2026-01-01T00:{:02}:00Z", i / 8))])
                    .await;
                let Ok(outcomes) = won else { panic!("claim {i}: {won:?}") };
                let [ClaimOutcome::Won(lease)] = &outcomes[..] else { panic!("claim {i}: {outcomes:?}") };
                let end = solocron_core::RunEnd {
                    state: RunState::Succeeded,
                    reason: None,
                    exit_code: Some(0),
                    output: String::new(),
                    started_after: None,
                };
                assert!(store.finish(lease, &end).await.expect("finish"), "finish {i}");
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let history = store.history(&HistoryQuery { limit: 100, ..HistoryQuery::default() }).await.unwrap();
    assert_eq!(history.len(), 64);
    assert!(history.iter().all(|r| r.state == RunState::Succeeded));
}

/// Every object of the schema under `prefix` in the database (tables, indexes, triggers,
/// SQLite's automatic indexes), by type and name.
async fn objects(pool: &sqlx::SqlitePool, prefix: &Prefix) -> Vec<(String, String)> {
    sqlx::query_as("SELECT type, name FROM sqlite_master WHERE name GLOB ?1 OR tbl_name GLOB ?1 ORDER BY type, name")
        .bind(format!("{}*", prefix.table_prefix()))
        .fetch_all(pool)
        .await
        .unwrap()
}

/// A store with some of everything: a claimed run, a pause, a registration, a request, a
/// heartbeat (and the audit log's actions).
async fn used(dir: &TempDir, prefix: &Prefix) -> SqliteStore {
    let store = SqliteStore::open_path(&dir.path().join("solocron.db"), prefix).await.unwrap();
    store.migrate().await.unwrap();
    let won = store.claim(&[tick_request("backup", "2026-01-01T00:00:00Z")]).await.unwrap();
    assert!(matches!(won[..], [ClaimOutcome::Won(_)]), "{won:?}");
    store.set_paused("sync", true, "alice", None).await.unwrap();
    store.request_run("sync", "alice", None).await.unwrap();
    let definition = solocron_core::JobDefinition {
        job: "backup".into(),
        schedule: "0 * * * * *".into(),
        timezone: "UTC".into(),
        definition_hash: "h".into(),
        summary: "s".into(),
    };
    store.register("n", &[definition]).await.unwrap();
    store.heartbeat(&NodeBeat { node: "n".into(), version: "1".into(), jobs: 1, running: 1 }).await.unwrap();
    store
}

/// Two prefixes in one file keep apart: each has the whole schema under its own names,
/// `uninstall` drops one prefix's every table, index and trigger and leaves the other's
/// data working, and repeating it is fine.
#[tokio::test]
async fn uninstall_drops_everything_of_its_prefix_only_and_may_be_repeated() {
    let dir = tempfile::tempdir().unwrap();
    let billing = Prefix::parse("billing").unwrap();
    let (other, default) = (used(&dir, &billing).await, used(&dir, &Prefix::default()).await);
    let pool = raw(&dir).await;
    let before = objects(&pool, &Prefix::default()).await;
    assert!(before.contains(&("trigger".into(), "solocron_runs_fence".into())), "{before:?}");
    let renamed: Vec<_> = objects(&pool, &billing)
        .await
        .into_iter()
        .map(|(kind, name)| (kind, name.replace("billing_", "solocron_")))
        .collect();
    assert_eq!(renamed, before, "every name of the schema carries the prefix");

    other.uninstall().await.unwrap();
    assert_eq!(objects(&pool, &billing).await, [], "nothing of the prefix is left");
    other.uninstall().await.expect("uninstalling an empty prefix is fine");
    assert_eq!(objects(&pool, &Prefix::default()).await, before, "the other prefix is untouched");
    assert_eq!(default.history(&HistoryQuery::default()).await.unwrap().len(), 1);
    assert_eq!(default.pending_requests(10, &solocron_core::Namespaces::ALL).await.unwrap().len(), 1);
    let again = default.claim(&[tick_request("backup", "2026-01-01T00:01:00Z")]).await.unwrap();
    assert!(matches!(&again[..], [ClaimOutcome::Won(lease)] if lease.fencing_token == 2), "{again:?}");

    other.migrate().await.expect("an uninstalled prefix can be installed again");
    assert_eq!(other.history(&HistoryQuery::default()).await.unwrap().len(), 0, "and starts empty");
    other.uninstall().await.unwrap();
    default.uninstall().await.unwrap();
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM sqlite_master").fetch_one(&pool).await.unwrap();
    assert_eq!(left, 0, "the two prefixes held everything in the file");
}

#[tokio::test]
async fn connect_errors_and_descriptions_never_show_a_password() {
    let dir = tempfile::tempdir().unwrap();
    let secret = "s3cret";
    for url in [
        format!("sqlite://app:{secret}@localhost/solocron.db"),
        format!("sqlite://{secret}@{}/solocron.db", dir.path().display()),
        format!("sqlite://{}/solocron.db?password={secret}", dir.path().display()),
        format!("postgres://app:{secret}@127.0.0.1:1/x"),
    ] {
        let err = SqliteStore::connect(&url, &Prefix::default()).await.unwrap_err();
        assert!(matches!(err, StoreError::Invalid(_)), "{url}: {err}");
        assert!(!err.to_string().contains(secret), "{url}: {err}");
    }
    let path = dir.path().join("solocron.db");
    let store = SqliteStore::connect(&format!("sqlite://{}", path.display()), &Prefix::parse("billing").unwrap())
        .await
        .unwrap();
    assert_eq!(store.describe(), format!("sqlite://{} (prefix billing)", path.display()));
}

/// A version 3 database (before managed jobs) is brought to the current version by
/// `migrate`; managed jobs then work on it.
#[tokio::test]
async fn a_version_3_database_gets_the_managed_jobs_tables() {
    let (dir, store) = fresh().await;
    let pool = raw(&dir).await;
    for sql in
        ["DROP TABLE solocron_managed", "DROP TABLE solocron_job_revisions", "UPDATE solocron_schema SET version = 3"]
    {
        sqlx::query(sql).execute(&pool).await.unwrap();
    }
    let spec = r#"{"schedule": "* * * * *"}"#;
    assert!(store.put_job("a", spec, "ann", None).await.is_err(), "version 3 has no managed jobs table");
    store.migrate().await.unwrap();
    let versions: Vec<i64> = sqlx::query_scalar("SELECT version FROM solocron_schema").fetch_all(&pool).await.unwrap();
    assert_eq!(versions, [6]);
    assert_eq!(store.put_job("a", spec, "ann", None).await.unwrap(), solocron_core::JobWrite::Written(1));
}

/// `register` sends the node's whole list as one parameter: a list longer than SQLite's
/// cap on parameters (32,766) works, names JSON must escape are kept and removed exactly,
/// and other nodes' registrations of the same names stay.
#[tokio::test]
async fn register_removes_unlisted_jobs_from_lists_past_the_parameter_cap_and_odd_names() {
    let (_dir, store) = fresh().await;
    let odd = ["quo\"te", "back\\slash", "ünï😀", "bell\u{7}", "[\"x\"]"];
    let many: Vec<_> = (0..33_000).map(|i| definition(&format!("job-{i:05}"), "h")).collect();
    let listed: Vec<_> = odd.iter().map(|name| definition(name, "h")).chain(many.iter().cloned()).collect();
    store.register("b", &[definition(odd[0], "h"), definition("job-00001", "h")]).await.unwrap();
    store.register("a", &listed).await.unwrap();
    assert_eq!(store.registrations().await.unwrap().len(), listed.len() + 2);

    // Keep every other odd name and a few of the many.
    let kept: Vec<_> = [odd[1], odd[3], "job-00001", "job-32999"].map(|name| definition(name, "h2")).into();
    store.register("a", &kept).await.unwrap();
    let left: Vec<(String, String)> =
        store.registrations().await.unwrap().into_iter().map(|r| (r.node, r.definition.job)).collect();
    let mut expected: Vec<(String, String)> = kept.iter().map(|d| ("a".to_owned(), d.job.clone())).collect();
    expected.extend([("b".to_owned(), odd[0].to_owned()), ("b".to_owned(), "job-00001".to_owned())]);
    expected.sort_by(|x, y| (&x.1, &x.0).cmp(&(&y.1, &y.0)));
    assert_eq!(left, expected);
}

/// A database migrated before `{p}registry_node` existed gets it from `migrate`.
#[tokio::test]
async fn migrate_adds_the_registry_index_by_node_to_a_database_without_it() {
    let (dir, store) = fresh().await;
    let pool = raw(&dir).await;
    sqlx::query("DROP INDEX solocron_registry_node").execute(&pool).await.unwrap();
    store.migrate().await.unwrap();
    let found: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM sqlite_master WHERE type = 'index' AND name = 'solocron_registry_node'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(found, 1);
}

/// A scheduled claim too far ahead of SQLite's clock writes nothing on either path (no
/// record, the job's counter unchanged), whatever its mode and even where its tick has a
/// record; other triggers are never refused; and claims of the same texts go on as before
/// around refusals (won, taken, refused in turn).
#[tokio::test]
async fn a_claim_refused_as_too_early_writes_nothing_on_either_path_and_claims_go_on() {
    let (dir, store) = fresh().await;
    let pool = raw(&dir).await;
    let now = store.now().await.unwrap();
    let at = |ahead_s: i64| (now + chrono::Duration::seconds(ahead_s)).to_rfc3339();
    let early = |outcomes: &[ClaimOutcome]| outcomes.iter().all(|o| matches!(o, ClaimOutcome::TooEarly { .. }));
    let past = tick_request("backup", &at(-60));
    let far = tick_request("backup", &at(60));
    let skip = ClaimRequest { mode: ClaimMode::Skip { reason: "missed".into() }, ..tick_request("backup", &at(61)) };
    for _ in 0..3 {
        let outcomes = store.claim(std::slice::from_ref(&far)).await.unwrap();
        assert!(early(&outcomes), "alone: {outcomes:?}");
        let outcomes = store.claim(std::slice::from_ref(&skip)).await.unwrap();
        assert!(early(&outcomes), "a skip alone: {outcomes:?}");
        let outcomes = store.claim(&[far.clone(), skip.clone()]).await.unwrap();
        assert!(early(&outcomes), "in a batch: {outcomes:?}");
        let outcomes = store.claim(std::slice::from_ref(&past)).await.unwrap();
        assert!(matches!(outcomes[..], [ClaimOutcome::Won(_)] | [ClaimOutcome::Taken]), "{outcomes:?}");
    }
    // A manual run of the far tick gives it a record; a scheduled claim of it is still early.
    let manual = ClaimRequest { trigger: Trigger::Manual, nonce: 5, ..far.clone() };
    assert!(matches!(store.claim(std::slice::from_ref(&manual)).await.unwrap()[..], [ClaimOutcome::Won(_)]));
    let again = ClaimRequest { trigger: Trigger::Schedule, ..manual.clone() };
    assert!(early(&store.claim(std::slice::from_ref(&again)).await.unwrap()), "alone, with a record");
    assert!(early(&store.claim(&[again.clone(), again]).await.unwrap()), "in a batch, with a record");
    for trigger in [Trigger::Catchup, Trigger::Retry] {
        let request = ClaimRequest { trigger, ..tick_request(&format!("{trigger:?}"), &at(60)) };
        let outcomes = store.claim(&[request]).await.unwrap();
        assert!(matches!(outcomes[..], [ClaimOutcome::Won(_)]), "{trigger:?}: {outcomes:?}");
    }
    let runs: Vec<(String, String)> =
        sqlx::query_as(r#"SELECT job, "trigger" FROM solocron_runs ORDER BY job, "trigger""#)
            .fetch_all(&pool)
            .await
            .unwrap();
    let expected = [("Catchup", "catchup"), ("Retry", "retry"), ("backup", "manual"), ("backup", "schedule")];
    let expected: Vec<(String, String)> = expected.iter().map(|(j, t)| (j.to_string(), t.to_string())).collect();
    assert_eq!(runs, expected, "only the past tick, the manual run and the other triggers' ticks");
    let counter: i64 =
        sqlx::query_scalar("SELECT token FROM solocron_fences WHERE job = 'backup'").fetch_one(&pool).await.unwrap();
    assert_eq!(counter, 2, "refusals advance no counter");
}

/// The schema version this build writes (the crate's `SCHEMA_VERSION`).
const CURRENT: u32 = 6;

/// `schema` on a prefix with no tables says Missing and creates nothing: not the schema
/// table, not any other object of the prefix (a second look still finds nothing).
#[tokio::test]
async fn schema_of_a_fresh_prefix_is_missing_and_creates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open_path(&dir.path().join("solocron.db"), &Prefix::default()).await.unwrap();
    assert_eq!(store.schema().await.unwrap(), SchemaState::Missing);
    assert_eq!(store.schema().await.unwrap(), SchemaState::Missing);
    assert_eq!(objects(&raw(&dir).await, &Prefix::default()).await, [], "schema() wrote nothing");
}

/// After `migrate` the schema is Current; another prefix in the same file is still Missing.
#[tokio::test]
async fn schema_after_migrate_is_current_and_other_prefixes_stay_missing() {
    let (dir, store) = fresh().await;
    assert_eq!(store.schema().await.unwrap(), SchemaState::Current);
    let billing =
        SqliteStore::open_path(&dir.path().join("solocron.db"), &Prefix::parse("billing").unwrap()).await.unwrap();
    assert_eq!(billing.schema().await.unwrap(), SchemaState::Missing);
}

/// A stored version above this build's is Newer, one below Older, each naming both.
#[tokio::test]
async fn schema_reports_a_stored_version_above_as_newer_and_below_as_older() {
    let (dir, store) = fresh().await;
    let pool = raw(&dir).await;
    sqlx::query("UPDATE solocron_schema SET version = ?").bind(CURRENT + 1).execute(&pool).await.unwrap();
    assert_eq!(store.schema().await.unwrap(), SchemaState::Newer { found: CURRENT + 1, current: CURRENT });
    sqlx::query("UPDATE solocron_schema SET version = ?").bind(CURRENT - 1).execute(&pool).await.unwrap();
    assert_eq!(store.schema().await.unwrap(), SchemaState::Older { found: CURRENT - 1, current: CURRENT });
}

/// A schema table without its version row (a migration that never committed one) is Missing.
#[tokio::test]
async fn schema_with_an_empty_version_table_is_missing() {
    let (dir, store) = fresh().await;
    sqlx::query("DELETE FROM solocron_schema").execute(&raw(&dir).await).await.unwrap();
    assert_eq!(store.schema().await.unwrap(), SchemaState::Missing);
}

/// A claim of `tick` for node `n` with a lease of `lease`, running it, that must be won.
async fn won_for(store: &SqliteStore, tick: Tick, lease: std::time::Duration) -> solocron_core::Lease {
    let request = ClaimRequest { lease, ..tick_request(&tick.job, &tick.scheduled_at.to_rfc3339()) };
    match store.claim(&[request]).await.unwrap().remove(0) {
        ClaimOutcome::Won(lease) => lease,
        other => panic!("expected Won, got {other:?}"),
    }
}

/// An end in `state`.
fn ended(state: RunState) -> solocron_core::RunEnd {
    solocron_core::RunEnd { state, reason: None, exit_code: None, output: String::new(), started_after: None }
}

/// Counts by state, sorted by name: `RunCounts` lists them in no order.
fn by_name(counts: impl IntoIterator<Item = (RunState, u64)>) -> Vec<(&'static str, u64)> {
    let mut counts: Vec<(&'static str, u64)> = counts.into_iter().map(|(s, n)| (s.as_str(), n)).collect();
    counts.sort_unstable();
    counts
}

/// What the trait's default `count_runs` counts: every record of `job` in the history
/// scheduled at or after `since`, by state (read whole here, filtered in the test).
async fn counted_from_history(store: &SqliteStore, job: &str, since: DateTime<Utc>) -> Vec<(&'static str, u64)> {
    let all = store.history(&HistoryQuery::default()).await.unwrap();
    let mut counts = RunCounts::default();
    for r in all.iter().filter(|r| r.id.tick.job == job && r.id.tick.scheduled_at >= since) {
        counts.add(r.state, 1);
    }
    by_name(counts.by_state)
}

/// Records of two jobs in every state the store's own steps make (won and held, finished
/// three ways, failed with a waiting retry, expired and retried, expired and abandoned,
/// skipped), around `since`: one of each job exactly at `since`, one a millisecond before.
async fn records_around(store: &SqliteStore, since: DateTime<Utc>) {
    let at = |job: &str, ms: i64| Tick::new(job, since + chrono::Duration::milliseconds(ms));
    let long = std::time::Duration::from_secs(60);
    let short = std::time::Duration::from_millis(1);
    for job in ["backup", "sync"] {
        for (ms, state) in [(-1, RunState::Succeeded), (0, RunState::Succeeded), (60_000, RunState::TimedOut)] {
            let lease = won_for(store, at(job, ms), long).await;
            assert!(store.finish(&lease, &ended(state)).await.unwrap());
        }
        let lease = won_for(store, at(job, 120_000), long).await;
        assert!(store.finish_for_retry(&lease, &ended(RunState::Failed), long).await.unwrap());
        let skip = ClaimRequest {
            mode: ClaimMode::Skip { reason: "missed".into() },
            ..tick_request(job, &at(job, 180_000).scheduled_at.to_rfc3339())
        };
        assert!(matches!(store.claim(&[skip]).await.unwrap()[..], [ClaimOutcome::Skipped { .. }]));
        won_for(store, at(job, 240_000), long).await;
    }
    let retried = won_for(store, at("backup", 300_000), short).await;
    let abandoned = won_for(store, at("backup", 360_000), short).await;
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    let retry = RecoverAction::Retry { node: "m".into(), lease: long };
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
    let (_dir, store) = fresh().await;
    let since: DateTime<Utc> = "2026-01-01T00:10:00Z".parse().unwrap();
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
    let (dir, store) = fresh().await;
    let since: DateTime<Utc> = "2026-01-01T00:10:00Z".parse().unwrap();
    won_for(&store, Tick::new("backup", since), std::time::Duration::from_secs(60)).await;
    sqlx::query("UPDATE solocron_runs SET state = 'paused_forever'").execute(&raw(&dir).await).await.unwrap();
    let query = HistoryQuery { job: Some("backup".into()), since: Some(since), ..HistoryQuery::default() };
    let history = store.history(&query).await.unwrap_err();
    let count = store.count_runs("backup", since).await.unwrap_err();
    for err in [history, count] {
        assert!(matches!(&err, StoreError::Invalid(m) if m.contains("solocron_runs.state")), "{err}");
    }
    assert_eq!(store.count_runs("sync", since).await.unwrap(), RunCounts::default(), "other jobs still count");
}

/// `count_runs`'s query reads a range of the primary key (job, then the instant), not the
/// whole table nor the job's whole history.
#[tokio::test]
async fn count_runs_reads_a_range_of_the_primary_key() {
    let (dir, _store) = fresh().await;
    let rows: Vec<(i64, i64, i64, String)> = sqlx::query_as(
        "EXPLAIN QUERY PLAN SELECT state, count(*) AS n FROM solocron_runs WHERE job = 'x' AND scheduled_at >= 5 GROUP BY state",
    )
    .fetch_all(&raw(&dir).await)
    .await
    .unwrap();
    let plan: Vec<&str> = rows.iter().map(|r| r.3.as_str()).collect();
    let range = "SEARCH solocron_runs USING INDEX sqlite_autoindex_solocron_runs_1 (job=? AND scheduled_at>?)";
    assert!(plan.contains(&range), "{plan:?}");
}
