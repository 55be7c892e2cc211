//! The schema's tests: the released steps never change, the current files in `sql/` are
//! what they leave installed, and schemas of older versions are upgraded in place.

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use chrono::DateTime;
use solocron_conformance::server::{self, Failure, Namespace, TestServer};
use solocron_core::{ClaimMode, ClaimOutcome, ClaimRequest, ClaimStore, Prefix, SchemaStore, StoreBase, Tick, Trigger};

use super::*;

/// The current schema as `sql/` spells it: the tables and indexes (a script of several
/// statements, which nothing but these tests runs)...
const CURRENT_TABLES: &str = include_str!("sql/tables.sql");

/// ...and each stored routine, by name.
const CURRENT_ROUTINES: [(&str, &str); 6] = [
    ("claim", statement(include_str!("sql/claim.sql"))),
    ("claim_one", statement(include_str!("sql/claim_one.sql"))),
    ("claim_set", statement(include_str!("sql/claim_set.sql"))),
    ("claim_taken_first", statement(include_str!("sql/claim_taken_first.sql"))),
    ("finish_all", statement(include_str!("sql/finish_all.sql"))),
    ("renew_all", statement(include_str!("sql/renew_all.sql"))),
];

/// Each released step's fingerprint ([`fingerprint`]), recorded when it was released: a
/// new version appends its own.
const RELEASED: &[(i32, u64)] = &[
    (1, 0x7fc4_2eda_c650_7510),
    (2, 0xdebc_a916_3b85_b9e6),
    (3, 0x21cc_7ca0_6855_b756),
    (4, 0x4629_588e_42d7_b18c),
    (5, 0x3888_519e_887f_cc79),
    (6, 0x9057_dac9_66ba_3ad7),
    (7, 0x9a1b_3dc0_c2fb_7b9f),
    (8, 0x96ce_8d42_5558_b4cb),
    (9, 0xb9d3_8424_4132_985d),
    (10, 0x928b_63cc_c1d8_7670),
    (11, 0x3c2e_1c06_297e_e258),
    (12, 0x58a2_a009_2c24_761a),
    (13, 0xf3ae_c6ba_18af_8823),
];

/// FNV-1a (64 bits) of a step's statements as executed ([`executed`]), each followed by a
/// zero byte.
fn fingerprint(statements: &[&str]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for statement in statements {
        for byte in executed(statement).bytes().chain([0]) {
            hash = (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    hash
}

/// A released step's text (as executed) never changes: databases were upgraded through it.
#[test]
fn released_migrations_never_change() {
    let found: Vec<(i32, u64)> = MIGRATIONS.iter().map(|(version, step)| (*version, fingerprint(step))).collect();
    for ((version, found), released) in found.iter().zip(RELEASED) {
        assert_eq!(
            (*version, *found),
            *released,
            "schema version {version} was released: databases were upgraded through its very text; \
             put the change in a new version"
        );
    }
    assert_eq!(found.len(), RELEASED.len(), "a new version appends its fingerprint to RELEASED once released");
    assert_eq!(found.last().map(|(version, _)| *version), Some(SCHEMA_VERSION), "the last step is this version");
}

/// A `.sql` file's header is documentation, not part of what runs.
#[test]
fn a_sql_files_statement_is_its_text_after_the_header_without_the_last_newline() {
    assert_eq!(statement("-- a header\n--\n-- more of it\n\nCREATE x\n    y\n"), "\nCREATE x\n    y");
    assert_eq!(statement("SELECT 1"), "SELECT 1");
    assert_eq!(
        statement("-- a header\nSELECT 1 -- not the header\n-- nor this\n"),
        "SELECT 1 -- not the header\n-- nor this"
    );
}

/// The name of the function a statement creates (`CREATE`) or drops (`DROP`), if any.
fn routine(statement: &str) -> Option<(&str, &str)> {
    let statement = statement.trim_start();
    let (verb, rest) = if let Some(rest) = statement.strip_prefix("CREATE OR REPLACE FUNCTION {p}") {
        ("CREATE", rest)
    } else {
        ("DROP", statement.strip_prefix("DROP FUNCTION IF EXISTS {p}")?)
    };
    rest.split_once('(').map(|(name, _)| (verb, name))
}

/// Each file of `sql/` is the text of the step that last (re)created its routine, and the
/// migrations leave no other routine behind; `uninstall` drops each one by name.
#[test]
fn the_current_routines_are_those_the_migrations_leave_installed() {
    let mut installed = BTreeMap::new();
    for (_, step) in MIGRATIONS {
        for statement in *step {
            match routine(statement) {
                Some(("CREATE", name)) => installed.insert(name, *statement),
                Some((_, name)) => installed.remove(name),
                None => None,
            };
        }
    }
    for (name, text) in CURRENT_ROUTINES {
        assert!(installed.get(name) == Some(&text), "sql/{name}.sql is not the text the migrations last installed");
    }
    let current: Vec<&str> = CURRENT_ROUTINES.iter().map(|(name, _)| *name).collect();
    assert_eq!(installed.keys().copied().collect::<Vec<_>>(), current, "a routine without its file in sql/");
    let mut dropped = FUNCTIONS.to_vec();
    dropped.sort_unstable();
    assert_eq!(dropped, current, "uninstall drops every routine");
}

/// The claim functions' overlap check (is a run of this job running?) is a subquery per
/// request, which the planner cannot make a join that reads every running run (see
/// [`BY_KEY`]).
#[test]
fn every_claim_functions_overlap_check_is_a_subquery_per_request() {
    for (name, text) in CURRENT_ROUTINES.iter().filter(|(name, _)| ["claim", "claim_one", "claim_set"].contains(name)) {
        assert!(!text.contains("NOT EXISTS (SELECT 1 FROM {p}runs"), "{name}");
        assert_eq!(text.matches("state = 'running' LIMIT 1) IS NULL").count(), 1, "{name}");
    }
}

/// What the catalog holds of a store's prefix (columns, constraints, indexes, functions,
/// the revision counter's row), one line each, the prefix written `{p}`.
async fn catalog(store: &PgStore) -> Vec<String> {
    let lines: Vec<String> = sqlx::query_scalar(&store.sql(
        "SELECT format('column %s %s %s %s null %s default %s identity %s', table_name, ordinal_position,
                       column_name, data_type, is_nullable, column_default, is_identity)
           FROM information_schema.columns
          WHERE table_schema = current_schema() AND left(table_name, length($1)) = $1
         UNION ALL
         SELECT format('constraint %s %s %s', cl.relname, co.conname, pg_get_constraintdef(co.oid))
           FROM pg_constraint co JOIN pg_class cl ON cl.oid = co.conrelid
          WHERE cl.relnamespace = current_schema()::regnamespace AND left(cl.relname, length($1)) = $1
         UNION ALL
         SELECT format('index %s', indexdef) FROM pg_indexes
          WHERE schemaname = current_schema() AND left(tablename, length($1)) = $1
         UNION ALL
         SELECT format('function %s', pg_get_functiondef(oid)) FROM pg_proc
          WHERE pronamespace = current_schema()::regnamespace AND left(proname, length($1)) = $1
         UNION ALL
         SELECT format('managed_version %s %s', id, revision) FROM {p}managed_version
         ORDER BY 1",
    ))
    .bind(&store.tables)
    .fetch_all(&store.pool)
    .await
    .expect("the catalog");
    lines.into_iter().map(|line| line.replace(&store.tables, "{p}")).collect()
}

/// `sql/`'s files, run on an empty prefix, build the very tables, indexes and routines
/// that the migrations build on another.
#[tokio::test]
async fn the_current_sql_files_build_the_schema_the_migrations_build() {
    let Some(migrated) = Namespace::<Postgres>::new().await else { return };
    let Some(current) = Namespace::<Postgres>::new().await else { return };
    let (migrated, current) = (migrated.migrated().await, current.store().await);
    sqlx::raw_sql(&fill(CURRENT_TABLES, &current.tables)).execute(&current.pool).await.expect("sql/tables.sql");
    for (name, text) in CURRENT_ROUTINES {
        sqlx::query(&current.sql(&executed(text)))
            .execute(&current.pool)
            .await
            .unwrap_or_else(|e| panic!("sql/{name}.sql: {e}"));
    }
    let (built, migrated) = (catalog(&current).await, catalog(&migrated).await);
    assert!(migrated.len() > 50, "{migrated:#?}");
    let only_built: Vec<&String> = built.iter().filter(|line| !migrated.contains(line)).collect();
    let only_migrated: Vec<&String> = migrated.iter().filter(|line| !built.contains(line)).collect();
    assert!(
        only_built.is_empty() && only_migrated.is_empty(),
        "only sql/ builds {only_built:#?}\nonly the migrations build {only_migrated:#?}"
    );
    assert_eq!(built, migrated);
}

/// The test server as `tests/common` describes it, which unit tests cannot reach.
struct Postgres;

#[async_trait]
impl TestServer for Postgres {
    type Store = PgStore;
    const NAME: &'static str = server::POSTGRES.name;
    const URL_VAR: &'static str = server::POSTGRES.var;
    const URL_DEFAULT: &'static str = server::POSTGRES.default;

    async fn connect(url: &str, prefix: &Prefix) -> Result<PgStore, StoreError> {
        PgStore::connect(url, prefix).await
    }

    async fn names(url: &str, root: &str) -> Result<Vec<String>, Failure> {
        let pool = sqlx::PgPool::connect(url).await?;
        let names = sqlx::query_scalar(
            "SELECT tablename::text FROM pg_tables WHERE schemaname = current_schema()
               AND left(tablename, length($1)) = $1
             UNION
             SELECT proname::text FROM pg_proc WHERE pronamespace = current_schema()::regnamespace
               AND left(proname, length($1)) = $1",
        )
        .bind(root)
        .fetch_all(&pool)
        .await;
        pool.close().await;
        Ok(names?)
    }

    async fn close(store: PgStore) {
        store.close().await;
    }
}

/// A claim of `backup` at `minute` past 2026-01-01T00:00Z by node `a`, with `nonce`.
fn backup(minute: i64, nonce: u64) -> ClaimRequest {
    let at = DateTime::from_timestamp_millis(1_767_225_600_000 + minute * 60_000).expect("in range");
    ClaimRequest {
        tick: Tick::new("backup", at),
        trigger: Trigger::Schedule,
        node: "a".into(),
        lease: Duration::from_secs(60),
        mode: ClaimMode::Run { skip_if_running: false },
        nonce,
    }
}

/// The token of a claim that must be won.
async fn won(store: &PgStore, request: ClaimRequest) -> u64 {
    match store.claim(&[request]).await.expect("claim").remove(0) {
        ClaimOutcome::Won(lease) => lease.fencing_token,
        other => panic!("expected Won, got {other:?}"),
    }
}

/// A schema of version 7 holding a run claimed by a node of that version is brought to
/// version 8 in place: the run has no nonce (asked again with one, it is taken), each
/// claim function is replaced by the one taking nonces (no overload is left), and a
/// claim asked again with its nonce is won again.
#[tokio::test]
async fn a_version_7_schema_gets_nonces_and_keeps_its_runs() {
    let Some(ns) = Namespace::<Postgres>::new().await else { return };
    let store = ns.store().await;
    migrate_to(&store, 7).await.expect("migrate to version 7");
    let old_claim = "SELECT o_outcome, o_token FROM {p}claim_one('backup', $1, 'schedule', 'a', 60000, 'run', '')";
    let old: (String, i64) = sqlx::query_as(&store.sql(old_claim))
        .bind(backup(0, 0).tick.scheduled_at.timestamp_millis())
        .fetch_one(&store.pool)
        .await
        .expect("a claim of version 7");
    assert_eq!(old, ("won".to_owned(), 1));

    store.migrate().await.expect("migrate to the current version");
    let functions: Vec<(String, i16)> = sqlx::query_as(
        "SELECT proname::text, pronargs FROM pg_proc WHERE pronamespace = current_schema()::regnamespace
           AND left(proname, length($1)) = $1 ORDER BY 1",
    )
    .bind(&store.tables)
    .fetch_all(&store.pool)
    .await
    .expect("functions");
    let expected = [("claim", 8), ("claim_one", 8), ("claim_set", 8), ("claim_taken_first", 8)]
        .into_iter()
        .chain([("finish_all", 11), ("renew_all", 7)])
        .map(|(f, args)| (format!("{}{f}", store.tables), args))
        .collect::<Vec<_>>();
    assert_eq!(functions, expected);
    let without: i64 = sqlx::query_scalar(&store.sql("SELECT count(*) FROM {p}runs WHERE nonce IS NULL"))
        .fetch_one(&store.pool)
        .await
        .expect("count");
    assert_eq!(without, 1, "the run of version 7 has no nonce");

    assert_eq!(store.claim(&[backup(0, 5)]).await.expect("claim"), [ClaimOutcome::Taken]);
    assert_eq!(won(&store, backup(1, 5)).await, 3, "the taken claim left its reserved token unused");
    assert_eq!(won(&store, backup(1, 5)).await, 3, "asked again with its nonce");
    assert_eq!(store.claim(&[backup(1, 6)]).await.expect("claim"), [ClaimOutcome::Taken]);
}

/// The claim functions' names, argument counts and identities, in name order.
async fn functions(store: &PgStore) -> Vec<(String, i16, i64)> {
    sqlx::query_as(
        "SELECT proname::text, pronargs, oid::bigint FROM pg_proc
          WHERE pronamespace = current_schema()::regnamespace AND left(proname, length($1)) = $1 ORDER BY 1",
    )
    .bind(&store.tables)
    .fetch_all(&store.pool)
    .await
    .expect("functions")
}

/// A schema of version 10 is brought to version 11 in place: each claim function is
/// replaced under its one signature (the same function, no overload), so the call of a
/// build of version 10 still works, and now refuses a scheduled claim made too early,
/// which version 10 won, without touching the job's fencing counter.
#[tokio::test]
async fn a_version_10_schema_refuses_early_claims_once_migrated_in_place() {
    let Some(ns) = Namespace::<Postgres>::new().await else { return };
    let store = ns.store().await;
    migrate_to(&store, 10).await.expect("migrate to version 10");
    let before = functions(&store).await;
    let far = |job: &str, now: DateTime<chrono::Utc>| ClaimRequest {
        tick: Tick::new(job, now + chrono::Duration::seconds(60)),
        ..backup(0, 0)
    };
    let now = store.now().await.expect("now");
    assert!(matches!(store.claim(&[far("early", now)]).await.expect("claim")[..], [ClaimOutcome::Won(_)]));

    migrate_to(&store, 11).await.expect("migrate to version 11");
    assert_eq!(functions(&store).await, before, "replaced in place");
    let old_call =
        "SELECT o_outcome, o_claimed_at FROM {p}claim_one('early', $1, 'schedule', 'a', 60000, 'run', '', 0)";
    let tick = far("early", now).tick.scheduled_at.timestamp_millis() + 60_000;
    let (outcome, store_now): (String, i64) =
        sqlx::query_as(&store.sql(old_call)).bind(tick).fetch_one(&store.pool).await.expect("a call of version 10");
    assert_eq!(outcome, "too-early");
    assert!((now.timestamp_millis()..tick - 60_000).contains(&store_now), "the server's now: {store_now}");
    let outcome = store.claim(&[far("early", store.now().await.expect("now"))]).await.expect("claim").remove(0);
    assert!(matches!(outcome, ClaimOutcome::TooEarly { .. }), "{outcome:?}");
    let token: i64 = sqlx::query_scalar(&store.sql("SELECT token FROM {p}fences WHERE job = 'early'"))
        .fetch_one(&store.pool)
        .await
        .expect("the fence");
    assert_eq!(token, 1, "the refused claims left the counter alone");
}

/// A schema of version 11 is brought to version 12 in place: its claim functions stay
/// (the same functions, so builds of version 11 keep claiming) and `claim_set` is
/// added; a batch claimed by a build of version 11 and the same jobs' next batch
/// claimed by this one give each job's tokens in order, and find the other's ticks taken.
#[tokio::test]
async fn a_version_11_schema_gains_the_set_claim_beside_its_functions() {
    let Some(ns) = Namespace::<Postgres>::new().await else { return };
    let store = ns.store().await;
    migrate_to(&store, 11).await.expect("migrate to version 11");
    let before = functions(&store).await;
    let batch = |minute: i64| -> Vec<ClaimRequest> {
        (0..3)
            .map(|j| ClaimRequest {
                tick: Tick::new(format!("job-{j}"), backup(0, 0).tick.scheduled_at + chrono::Duration::minutes(minute)),
                ..backup(0, 0)
            })
            .collect()
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
    let first = batch(0);
    let row = crate::records::Batch::new(&first)
        .expect("a batch")
        .send(&store.pool, &store.sql(crate::records::claim_query!("claim")))
        .await
        .expect("a claim of version 11");
    let old = tokens(crate::records::outcomes(&first, &row).expect("outcomes"));

    migrate_to(&store, 12).await.expect("migrate to version 12");
    let after = functions(&store).await;
    assert_eq!(after.iter().filter(|f| !f.0.ends_with("claim_set")).cloned().collect::<Vec<_>>(), before);
    assert_eq!(after.len(), before.len() + 1, "claim_set added: {after:?}");
    for (j, (old, new)) in old.iter().zip(tokens(store.claim(&batch(1)).await.expect("claim"))).enumerate() {
        assert!(new > *old, "job-{j}: {old} then {new}");
    }
    let old_call = "SELECT array_agg(o_outcome) FROM {p}claim_taken_first($1, $2, $3, $4, $5, $6, $7, $8)";
    let requests = batch(1);
    let b = crate::records::Batch::new(&requests).expect("a batch");
    let row = b.send(&store.pool, &store.sql(old_call)).await.expect("a call of version 11");
    let outcomes: Vec<String> = sqlx::Row::get(&row, 0);
    assert_eq!(outcomes, ["taken"; 3]);
}
