//! The schema: `migrate`, which applies the released steps a database lacks, `schema`,
//! which reads where it stands, and `uninstall`, which drops it all.
//!
//! Its SQL lives beside this file, in two folders a reader tells apart by name:
//!
//! - `schema/sql/`: CURRENT. What a database at [`SCHEMA_VERSION`] holds, to read what
//!   runs: `tables.sql` (the tables and indexes) and one file per stored routine
//!   (`claim_set.sql`, `claim.sql`, `claim_one.sql`, `claim_taken_first.sql`,
//!   `finish_all.sql`, `renew_all.sql`). Nothing executes them as such (a database gets
//!   them through the migrations); the tests prove that the migrations leave exactly them
//!   installed.
//! - `schema/migrations.rs` and `schema/migrations/`: FROZEN. Each version's step as it was
//!   released (`migrations/v04_claim.sql`: `{p}claim` as version 4 created it), never
//!   edited: databases were upgraded through those very texts, and a test fingerprints
//!   them. A change is a new version appended there, and the same change in `sql/`.
//!
//! Every statement is a template: `{p}` stands for the table prefix (from a
//! [`Prefix`](solocron_core::Prefix): letters, digits and `_` only, so safe to splice),
//! `{now}` for the server clock in milliseconds and, in a migration step, `{by_key}` for
//! [`BY_KEY`]. A `.sql` file opens with a header of `--` lines, which is not part of its
//! statement (see [`statement`]).

mod migrations;
#[cfg(test)]
mod tests;

use async_trait::async_trait;
use solocron_core::{SchemaState, SchemaStore, StoreError, CLAIM_EARLY_MAX};
use sqlx::PgConnection;

use crate::error::{retrying, Res};
use crate::PgStore;
use migrations::MIGRATIONS;

/// The schema version this crate writes and understands.
pub(crate) const SCHEMA_VERSION: i32 = 13;

/// The store's "now" in SQL: the server clock, in integer milliseconds since the epoch.
/// `now()` is the start of the current transaction, so one statement (or one transaction)
/// sees a single instant however long it runs.
pub(crate) const NOW_MS: &str = "floor(extract(epoch FROM now()) * 1000)::bigint";

/// [`CLAIM_EARLY_MAX`] as the claim functions since version 11 spell it, `500` (ms), in
/// their text. Another bound needs another version of the functions (a migration), not an
/// edit.
const _: () = assert!(
    CLAIM_EARLY_MAX.as_millis() == 500,
    "CLAIM_EARLY_MAX changed: the claim functions of schema version 11 spell 500 ms; add a migration"
);

/// The one plan a batch's `UPDATE` of runs by their key may take, whatever the statistics
/// say: for each item of the batch, its run looked up by the primary key (a nested loop).
/// Left to itself the planner often preferred to read every running run, from the partial
/// index on running leases (`{p}runs_expiry`), which its statistics tend to believe nearly
/// empty (analyzed at a quiet moment), and to join them to the batch: by hash, every run
/// running at the time per batch; by nested loop (the prepared statement's generic plan,
/// after five calls on a connection), every running run per item: a batch of 1,000 ends
/// took 1 s with 1,000 runs running, 30 s with 30,000, against 25 ms by key. So the
/// functions (planned at each call) turn hash and merge joins off, and their check of the
/// state is written `IS NOT DISTINCT FROM`, which no partial index's predicate is proved
/// from: a nested loop by key is left as the only cheap plan.
///
/// A claim's overlap check (is a run of this job running?) had the same fault: as a join
/// (`NOT EXISTS`) the planner read every running run and hashed it per claim, or per
/// request once generic (4.4 s for 1,000 requests beside 30,000 running runs of other
/// jobs); as a subquery per request it still scanned `{p}runs_expiry` whole for each. It
/// is a subquery per request (never made a join), and `{p}runs_expiry`'s predicate names
/// the lease, so only statements that bound the lease can use it: each check is then one
/// probe of `{p}runs_running` by job (3.7 ms for those 1,000 requests).
///
/// Written where a migration step says `{by_key}` (only at migrate time: the store's own
/// statements never carry it). Today: `sql/finish_all.sql` and `sql/renew_all.sql`; the
/// overlap checks are spelled as subqueries in `sql/claim_set.sql`, `sql/claim.sql` and
/// `sql/claim_one.sql`.
const BY_KEY: &str = "SET enable_hashjoin = off SET enable_mergejoin = off";

/// The statement of a `.sql` file of this module: the file without its header (its first
/// lines, those that start with `--`) and without its last newline, so that what runs is
/// the statement exactly as released. Const, so that the text a step executes is fixed
/// when the crate is built.
const fn statement(file: &'static str) -> &'static str {
    let bytes = file.as_bytes();
    let mut start = 0;
    while start + 1 < bytes.len() && bytes[start] == b'-' && bytes[start + 1] == b'-' {
        while start < bytes.len() && bytes[start] != b'\n' {
            start += 1;
        }
        if start < bytes.len() {
            start += 1;
        }
    }
    let end = if bytes.len() > start && bytes[bytes.len() - 1] == b'\n' { bytes.len() - 1 } else { bytes.len() };
    assert!(end > start, "a .sql file holds a statement after its header");
    let (_, text) = bytes.split_at(start);
    let (text, _) = text.split_at(end - start);
    // Split at ASCII bytes (a newline, the end) of a `str`: still UTF-8.
    match std::str::from_utf8(text) {
        Ok(text) => text,
        Err(_) => panic!("a .sql file is UTF-8"),
    }
}

/// A migration step's statement as executed, before the prefix and the clock are filled
/// in: `{by_key}` written out.
fn executed(template: &str) -> String {
    template.replace("{by_key}", BY_KEY)
}

/// A statement template with the prefix and the clock filled in.
pub(crate) fn fill(template: &str, prefix: &str) -> String {
    template.replace("{p}", prefix).replace("{now}", NOW_MS)
}

/// The tables every version creates (each with its indexes), dropped by [`SchemaStore::uninstall`](solocron_core::SchemaStore::uninstall).
const TABLES: [&str; 11] = [
    "runs",
    "fences",
    "jobs",
    "registry",
    "requests",
    "nodes",
    "actions",
    "managed",
    "job_revisions",
    "managed_version",
    "schema",
];

/// The functions the migrations create, dropped by [`SchemaStore::uninstall`](solocron_core::SchemaStore::uninstall).
const FUNCTIONS: [&str; 6] = ["renew_all", "finish_all", "claim_set", "claim_taken_first", "claim_one", "claim"];

#[async_trait]
impl SchemaStore for PgStore {
    /// Creates or upgrades the schema, in one transaction.
    async fn migrate(&self) -> Result<(), StoreError> {
        let store = self;
        migrate_to(store, SCHEMA_VERSION).await
    }

    /// Where the schema stands against this build, read only: no `{p}schema` table in the
    /// current schema (where `migrate` creates it), or an empty one, is Missing.
    async fn schema(&self) -> Result<SchemaState, StoreError> {
        let store = self;
        let found = retrying("schema", || async {
            let mut conn = store.pool.acquire().await?;
            let exists: bool = sqlx::query_scalar(
                "SELECT EXISTS (SELECT FROM pg_tables WHERE schemaname = current_schema() AND tablename = $1)",
            )
            .bind(store.sql("{p}schema"))
            .fetch_one(&mut *conn)
            .await?;
            if !exists {
                return Ok(None);
            }
            let version: Option<i32> =
                sqlx::query_scalar(&store.sql("SELECT max(version) FROM {p}schema")).fetch_one(&mut *conn).await?;
            Ok(version)
        })
        .await?;
        let found = found
            .map(|v| {
                u32::try_from(v)
                    .map_err(|_| StoreError::Invalid(format!("{} has schema version {v}", store.description)))
            })
            .transpose()?;
        Ok(SchemaState::of(found, SCHEMA_VERSION as u32))
    }

    /// Drops every table (with its indexes) and function of the prefix, in one transaction
    /// under the migration lock; what is already gone is skipped. Names are listed, never
    /// matched by pattern: the tables of prefix `a` (`a_runs`) share their first letters with
    /// those of prefix `a_b` (`a_b_runs`). No `CASCADE`: an object of the application's own
    /// that depends on a table (a view, say) makes the uninstall fail and say so, rather than
    /// vanish with it.
    async fn uninstall(&self) -> Result<(), StoreError> {
        let store = self;
        let tables = TABLES.map(|t| format!("{}{t}", store.tables)).join(", ");
        let mut statements = vec![format!("DROP TABLE IF EXISTS {tables}")];
        statements.extend(FUNCTIONS.map(|f| format!("DROP FUNCTION IF EXISTS {}{f}", store.tables)));
        retrying("uninstall", || async {
            let mut tx = store.pool.begin().await?;
            lock_schema(store, &mut tx).await?;
            // "does not exist, skipping" notices are noise here.
            sqlx::query("SET LOCAL client_min_messages = warning").execute(&mut *tx).await?;
            for statement in &statements {
                sqlx::query(statement).execute(&mut *tx).await?;
            }
            tx.commit().await?;
            Ok(())
        })
        .await?;
        tracing::info!(store = %store.description, "schema uninstalled");
        Ok(())
    }
}

/// Creates or upgrades the schema up to version `target` (the tests build a schema of an
/// earlier version with it), in one transaction.
async fn migrate_to(store: &PgStore, target: i32) -> Result<(), StoreError> {
    retrying("migrate", || async {
        // Nodes migrating at once take turns, each later one finds everything in place, and
        // a failure leaves nothing half-applied (PostgreSQL's DDL is transactional).
        let mut tx = store.pool.begin().await?;
        lock_schema(store, &mut tx).await?;
        migrate_locked(store, &mut tx, target).await?;
        tx.commit().await?;
        Ok(())
    })
    .await
}

/// Takes, until the end of the transaction on `conn`, the lock that migrations and
/// uninstalls of this schema and prefix hold: they take turns.
async fn lock_schema(store: &PgStore, conn: &mut PgConnection) -> Res<()> {
    sqlx::query(concat!(
        "SELECT pg_advisory_xact_lock(hashtextextended(",
        "'solocron migrate ' || coalesce(current_schema(), '') || '.' || $1, 0))"
    ))
    .bind(&store.tables)
    .execute(conn)
    .await?;
    Ok(())
}

/// Applies the migrations the schema lacks, up to version `target`; `conn` is in a
/// transaction holding the migration lock.
async fn migrate_locked(store: &PgStore, conn: &mut PgConnection, target: i32) -> Res<()> {
    // "relation already exists, skipping" notices are noise here.
    sqlx::query("SET LOCAL client_min_messages = warning").execute(&mut *conn).await?;
    sqlx::query(&store.sql("CREATE TABLE IF NOT EXISTS {p}schema (version INTEGER NOT NULL)"))
        .execute(&mut *conn)
        .await?;
    let version: Option<i32> =
        sqlx::query_scalar(&store.sql("SELECT max(version) FROM {p}schema")).fetch_one(&mut *conn).await?;
    let version = version.unwrap_or(0);
    if version > SCHEMA_VERSION {
        return Err(StoreError::Invalid(format!(
            "{} has schema version {version}; this solocron understands version {SCHEMA_VERSION}: upgrade it",
            store.description
        ))
        .into());
    }
    for (step, statements) in MIGRATIONS.iter().filter(|(step, _)| (version + 1..=target).contains(step)) {
        for statement in *statements {
            sqlx::query(&store.sql(&executed(statement))).execute(&mut *conn).await?;
        }
        sqlx::query(&store.sql("DELETE FROM {p}schema")).execute(&mut *conn).await?;
        sqlx::query(&store.sql("INSERT INTO {p}schema (version) VALUES ($1)")).bind(step).execute(&mut *conn).await?;
        tracing::info!(store = %store.description, version = step, "schema migrated");
    }
    Ok(())
}
