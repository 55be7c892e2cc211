//! The claim of a batch of ticks: one transaction of 2 round trips, whatever the batch's
//! size, 3 when it grants a run again (see the crate docs for the sequence).
//!
//! Why reading first and deciding in memory is safe: every transaction that creates an
//! attempt-1 row or a `running` row of a job (a claim, a retry by recovery) first takes
//! the exclusive lock on the job's fence row and keeps it until it commits. Once a batch
//! holds the fence locks of all its jobs, nothing it reads about those jobs (existing tick
//! records, running runs, the counters) can change before it commits, except running runs
//! ending, which only makes an overlap skip conservative, and which the update of the leases
//! of runs granted again checks for. The primary key stays the final arbiter: the `INSERT`
//! fails on a record that exists, and the transaction is rolled back and retried.

use async_trait::async_trait;
use solocron_core::{ClaimStore, Tick};
use std::cmp::Ordering;
use std::collections::HashMap;

use futures_util::TryStreamExt;
use sqlx::mysql::{MySqlQueryResult, MySqlRow};
use sqlx::{Executor, MySql};

use solocron_core::{ClaimMode, ClaimOutcome, ClaimRequest, StoreError, CLAIM_BATCH_MAX};
use solocron_sql::plan::{self, Decision, Found, StateRow, Wanted};

use crate::claim_one::claim_one;
use crate::error::{invalid, is_duplicate, retrying, Failure};
use crate::records::{
    check_name, check_text, early_max_ms, get, instant, millis, opt_text, placeholders, repeated, text,
};
use crate::records::{token_param, TEXT_BYTES_MAX};
use crate::text::{execute, inline, read_rows, Literal, OpenTransaction};
use crate::MySqlStore;

/// Whether `request` is refused as too early at `now` (the server's ms): a scheduled tick
/// more than [`CLAIM_EARLY_MAX`](solocron_core::CLAIM_EARLY_MAX) after it.
fn too_early(request: &ClaimRequest, now: i64) -> bool {
    early_max_ms(request).is_some_and(|max| request.tick.scheduled_at.timestamp_millis() > now.saturating_add(max))
}

#[async_trait]
impl ClaimStore for MySqlStore {
    /// Claims `requests` in one transaction, retried on lock conflicts.
    async fn claim(&self, requests: &[ClaimRequest]) -> Result<Vec<ClaimOutcome>, StoreError> {
        let store = self;
        if requests.is_empty() {
            return Ok(Vec::new());
        }
        check(requests).map_err(|f| f.into_store("cannot claim"))?;
        if let [one] = requests {
            return retrying("cannot claim", || async { Ok(vec![claim_one(store, one).await?]) }).await;
        }
        retrying("cannot claim", || claim_once(store, requests)).await
    }

    /// Those of `ticks` that are taken (see [`solocron_core::ClaimStore::taken_ticks`]): their
    /// jobs' attempt 1 rows over the ticks' span of instants, in one statement.
    async fn taken_ticks(&self, ticks: &[Tick]) -> Result<Option<Vec<Tick>>, StoreError> {
        let runs = self.sql("{p}runs");
        let Some(mut sql) = solocron_sql::taken_ticks_query::<MySql>(&runs, ticks) else { return Ok(Some(Vec::new())) };
        let context = "cannot read taken ticks";
        let rows = sql.build().fetch_all(&self.pool).await.map_err(|e| Failure::from(e).into_store(context))?;
        let read = |row: &MySqlRow| Ok((text(row, "job")?, get(row, "scheduled_at")?));
        let rows = rows.iter().map(read).collect::<Result<Vec<_>, Failure>>().map_err(|e| e.into_store(context))?;
        Ok(Some(solocron_sql::taken_of(ticks, rows)))
    }
}

/// Refuses what a non-strict server would silently truncate, and oversized batches (whose
/// statements would pass MySQL's 65,535-placeholder limit).
fn check(requests: &[ClaimRequest]) -> Result<(), Failure> {
    if requests.len() > CLAIM_BATCH_MAX {
        return Err(invalid(format!("{} requests in one claim; at most {CLAIM_BATCH_MAX}", requests.len())));
    }
    for request in requests {
        check_name("job", &request.tick.job)?;
        check_name("node", &request.node)?;
        millis(request.lease)?;
        if let ClaimMode::Skip { reason } = &request.mode {
            check_text("skip reason", reason)?;
        }
    }
    Ok(())
}

/// One try at the whole batch, in two round trips: `START TRANSACTION`, the fence locks
/// and the state read; then the inserts, the counters and `COMMIT`. Each round trip is one
/// multi-statement text query, its values written into the SQL as literals (strings as
/// hex, which no input can break out of): prepared statements would cost a round trip
/// each. A statement that fails stops the rest of its round trip, so nothing after a
/// failed insert commits. A batch that grants runs again ([`Decision::Regranted`]) also
/// updates their leases, and commits in a third round trip (see [`write_regranting`]).
///
/// The scheduled ticks more than [`CLAIM_EARLY_MAX`](solocron_core::CLAIM_EARLY_MAX) ahead of
/// the server's clock at the read are refused first ([`ClaimOutcome::TooEarly`]) and left
/// out of the plan: they write nothing, and the others are decided as if they were not in
/// the batch.
async fn claim_once(store: &MySqlStore, requests: &[ClaimRequest]) -> Result<Vec<ClaimOutcome>, Failure> {
    let jobs = sorted_jobs(requests);
    let mut tx = OpenTransaction { conn: store.pool.acquire().await?, open: true };
    let first = format!("START TRANSACTION; {}; {}", lock_fences_sql(store, &jobs), state_read(store, requests, &jobs));
    let read = read_rows(&mut tx.conn, &first).await;
    let rows = match read {
        Ok(rows) => rows,
        Err(e) => return Err(tx.roll_back(e.into()).await),
    };
    let found = found(&rows, jobs.len())?;
    let now = found.now.ok_or_else(|| invalid("the claim's read returned no clock"))?;
    let early: Vec<bool> = requests.iter().map(|r| too_early(r, now)).collect();
    if !early.contains(&true) {
        return claim_read(store, tx, requests, found, now).await;
    }
    let store_now = instant(now)?;
    let timely: Vec<ClaimRequest> =
        requests.iter().zip(&early).filter(|(_, early)| !**early).map(|(r, _)| r.clone()).collect();
    let decided = claim_read(store, tx, &timely, found, now).await?;
    // Committed: checked in debug builds only, as a panic now would leave won runs unrun.
    debug_assert_eq!(decided.len(), timely.len(), "one outcome per timely request");
    let mut decided = decided.into_iter();
    let too_early = || ClaimOutcome::TooEarly { store_now };
    Ok(early.iter().map(|&early| if early { too_early() } else { decided.next().unwrap_or_else(too_early) }).collect())
}

/// The rest of [`claim_once`] once its first round trip has `found` the state of
/// `requests` (every one of them timely) at `now`: the plan, the writes and the commit.
async fn claim_read(
    store: &MySqlStore,
    tx: OpenTransaction,
    requests: &[ClaimRequest],
    found: Found,
    now: i64,
) -> Result<Vec<ClaimOutcome>, Failure> {
    let (mut decisions, tokens) = plan::plan(requests, found);
    for decision in &mut decisions {
        if let Decision::Skipped(reason) = decision {
            fit_text(reason);
        }
    }
    let mut rows: Vec<(&ClaimRequest, &Decision)> = requests
        .iter()
        .zip(&decisions)
        .filter(|(_, d)| matches!(d, Decision::Won { .. } | Decision::Skipped(_)))
        .collect();
    rows.sort_by_key(|(_, d)| matches!(d, Decision::Skipped(_)));
    let mut writes = Vec::new();
    if !rows.is_empty() {
        writes.push(insert_sql(store, &rows, now)?);
    }
    if !tokens.is_empty() {
        writes.push(tokens_sql(store, &tokens)?);
    }
    // Checked before the commit: once committed, the won runs must be run.
    let now_instant = instant(now)?;
    let expected = (rows.len() + tokens.len()) as u64;
    let written = match regrant_sql(store, requests, &decisions, now)? {
        None => write(tx, writes).await?,
        Some((regrant, granted)) => write_regranting(tx, regrant, granted, writes).await?,
    };
    // Committed: the outcomes stand whatever the count says (an error now would leave won
    // runs unrun). The count (inserted plus matched rows) can only be off if the locks failed.
    if written != expected {
        tracing::error!(written, expected, "a claim wrote an unexpected number of rows; its locks did not hold");
        debug_assert_eq!(written, expected, "rows written by a claim");
    }
    Ok(requests.iter().zip(decisions).map(|(r, d)| outcome(r, d, now_instant)).collect())
}

/// The second round trip of a batch: its `writes` and `COMMIT`; the rows they wrote. A
/// batch with nothing to write (every tick taken or too early) rolls back instead: the
/// fence rows its first round trip created for new jobs (counter 0, as good as none) go.
async fn write(mut tx: OpenTransaction, mut writes: Vec<String>) -> Result<u64, Failure> {
    writes.push(if writes.is_empty() { "ROLLBACK" } else { "COMMIT" }.into());
    let written = execute(&mut tx.conn, &writes.join("; ")).await;
    let written = match written {
        Ok(done) => done.rows_affected(),
        Err(e) => return Err(tx.roll_back(write_failure(e)).await),
    };
    tx.open = false;
    Ok(written)
}

/// The second round trip of a batch that grants `granted` runs again: the leases' update
/// first, then its `writes`; and `COMMIT` in a third, once the update's count shows that
/// every one of those runs was still running. Neither a finish nor an abandon takes the
/// fence locks, so one of them may end such a run after the read: the update then misses
/// it, and the batch is rolled back and tried again (and finds the tick taken). The rows
/// `writes` wrote.
async fn write_regranting(
    mut tx: OpenTransaction,
    regrant: String,
    granted: u64,
    writes: Vec<String>,
) -> Result<u64, Failure> {
    let sql = std::iter::once(regrant).chain(writes).collect::<Vec<_>>().join("; ");
    let results: Result<Vec<MySqlQueryResult>, sqlx::Error> = tx.conn.execute_many(sql.as_str()).try_collect().await;
    let results = match results {
        Ok(results) => results,
        Err(e) => return Err(tx.roll_back(write_failure(e)).await),
    };
    let updated = results.first().map_or(0, |r| r.rows_affected());
    if updated != granted {
        let ended = granted.saturating_sub(updated);
        return Err(tx.roll_back(Failure::Conflict(format!("{ended} run(s) granted again ended meanwhile"))).await);
    }
    if let Err(e) = execute(&mut tx.conn, "COMMIT").await {
        return Err(tx.roll_back(e.into()).await);
    }
    tx.open = false;
    Ok(results[1..].iter().map(|r| r.rows_affected()).sum())
}

/// Why the writes of a batch failed: a record that appeared despite the locks is a
/// conflict (tried again), anything else as it is.
fn write_failure(e: sqlx::Error) -> Failure {
    if is_duplicate(&e) {
        Failure::Conflict(format!("a record appeared despite the locks: {e}"))
    } else {
        e.into()
    }
}

/// The `UPDATE` that gives each run of a [`Decision::Regranted`] a fresh lease from `now`
/// (the server's ms at the read), joined to a derived table of the runs and their new
/// `lease_until`; and how many runs it must match. `None` when the batch grants none
/// again (the usual batch).
fn regrant_sql(
    store: &MySqlStore,
    requests: &[ClaimRequest],
    decisions: &[Decision],
    now: i64,
) -> Result<Option<(String, u64)>, Failure> {
    let mut values = Vec::new();
    for (request, decision) in requests.iter().zip(decisions) {
        if let Decision::Regranted { lease, .. } = decision {
            values.extend([
                Literal::Text(&request.tick.job),
                Literal::Int(request.tick.scheduled_at.timestamp_millis()),
                Literal::Int(now.saturating_add(millis(*lease)?)),
            ]);
        }
    }
    let granted = values.len() / 3;
    if granted == 0 {
        return Ok(None);
    }
    // The first row names the columns, and its collation (that of the runs' key) is the
    // derived table's: the literals' own would not compare with the key.
    let mut rows = vec!["SELECT ? COLLATE utf8mb4_bin AS job, ? AS at, ? AS lease_until"];
    rows.resize(granted, "SELECT ?, ?, ?");
    let sql = store.sql(&format!(
        "UPDATE {{p}}runs r JOIN ({}) g ON r.job = g.job AND r.scheduled_at = g.at AND r.attempt = 1
         SET r.lease_until = g.lease_until WHERE r.state = 'running'",
        rows.join(" UNION ALL ")
    ));
    Ok(Some((inline(&sql, &values), granted as u64)))
}

/// The batch's distinct jobs, in the order the server sorts them in the fences' primary
/// key, so that every batch locks them in the same order.
fn sorted_jobs(requests: &[ClaimRequest]) -> Vec<&str> {
    let mut jobs: Vec<&str> = requests.iter().map(|r| r.tick.job.as_str()).collect();
    jobs.sort_by(|a, b| collation_order(a, b));
    jobs.dedup();
    jobs
}

/// `utf8mb4_bin` order: by code point, the shorter string padded with spaces.
fn collation_order(a: &str, b: &str) -> Ordering {
    let (mut a, mut b) = (a.chars(), b.chars());
    loop {
        match (a.next(), b.next()) {
            (None, None) => return Ordering::Equal,
            (x, y) => match x.unwrap_or(' ').cmp(&y.unwrap_or(' ')) {
                Ordering::Equal => continue,
                unequal => return unequal,
            },
        }
    }
}

/// Creates the missing fence rows and X-locks all of them, in `jobs`' (sorted) order.
/// `ON DUPLICATE KEY UPDATE` takes the exclusive lock at once; `INSERT IGNORE` then
/// `SELECT ... FOR UPDATE` would take a shared lock first, and two batches upgrading their
/// shared locks on one row deadlock.
fn lock_fences_sql(store: &MySqlStore, jobs: &[&str]) -> String {
    let sql = store.sql(&format!(
        "INSERT INTO {{p}}fences (job, token) VALUES {} ON DUPLICATE KEY UPDATE token = token",
        repeated("(?, 0)", jobs.len())
    ));
    inline(&sql, &jobs.iter().map(|j| Literal::Text(j)).collect::<Vec<_>>())
}

/// The read, under the fence locks, of the counters of `jobs`, the existing records of the
/// batch's ticks, the running runs of the jobs asked not to overlap, which jobs are paused,
/// and the server's clock (every record the batch writes carries it).
fn state_read(store: &MySqlStore, requests: &[ClaimRequest], jobs: &[&str]) -> String {
    let wanted = Wanted::of(requests);
    let sql = state_sql(store, jobs.len(), wanted.instants.len(), wanted.overlapping.len(), wanted.pausable.len());
    fn text<'a>(list: &[&'a str]) -> Vec<Literal<'a>> {
        list.iter().map(|j| Literal::Text(j)).collect()
    }
    let mut values = text(jobs);
    values.extend(text(jobs));
    values.extend(wanted.instants.iter().map(|&at| Literal::Int(at)));
    values.extend(text(&wanted.overlapping));
    values.extend(text(&wanted.pausable));
    inline(&sql, &values)
}

/// What the rows of [`state_read`] say (the server's clock at the read included).
fn found(rows: &[MySqlRow], jobs: usize) -> Result<Found, Failure> {
    let mut found = Found::default();
    for row in rows {
        let who = opt_text(row, "who")?;
        let kind = text(row, "kind")?;
        let row = StateRow {
            kind,
            job: text(row, "job")?,
            n: get(row, "n")?,
            attempt: get(row, "attempt")?,
            who,
            why: opt_text(row, "why")?,
            state: opt_text(row, "state")?,
            node: opt_text(row, "node")?,
            nonce: get(row, "nonce")?,
            token: get(row, "token")?,
            claimed_at: get(row, "claimed_at")?,
        };
        found.note_row(row)?;
    }
    if found.tokens.len() != jobs {
        return Err(invalid("a fence row the claim just locked is missing"));
    }
    Ok(found)
}

/// The `UNION ALL` read of [`state_read`]; each row's `kind` says what it is. An existing
/// tick's row (`t`) carries what a request asking again for its own claim is granted again
/// from: the record's state, node, nonce, token and claim instant.
///
/// Tick records are looked up as `job IN (...) AND scheduled_at IN (...)`, a superset of
/// the batch's ticks that the caller filters: the optimizer turns it into primary-key
/// ranges in microseconds, whereas a row-constructor `(job, scheduled_at) IN ((?, ?), ...)`
/// of 1000 pairs takes MariaDB 10.11 some 300 ms to plan.
fn state_sql(store: &MySqlStore, jobs: usize, instants: usize, overlapping: usize, pausable: usize) -> String {
    let mut sql = format!(
        "SELECT 'f' AS kind, job, token AS n, 0 AS attempt, CAST(NULL AS CHAR) AS who, CAST(NULL AS CHAR) AS why,
             CAST(NULL AS CHAR) AS state, CAST(NULL AS CHAR) AS node, CAST(NULL AS SIGNED) AS nonce,
             CAST(NULL AS SIGNED) AS token, CAST(NULL AS SIGNED) AS claimed_at
         FROM {{p}}fences WHERE job IN {jobs}
         UNION ALL SELECT 't', job, scheduled_at, attempt, NULL, NULL, state, node, nonce, token, claimed_at
         FROM {{p}}runs WHERE attempt = 1 AND job IN {jobs} AND scheduled_at IN {}",
        placeholders(instants),
        jobs = placeholders(jobs),
    );
    if overlapping > 0 {
        sql.push_str(&format!(
            " UNION ALL SELECT 'r', job, scheduled_at, attempt, NULL, NULL, NULL, NULL, NULL, NULL, NULL
              FROM {{p}}runs WHERE state = 'running' AND job IN {}",
            placeholders(overlapping)
        ));
    }
    if pausable > 0 {
        sql.push_str(&format!(
            " UNION ALL SELECT 'p', job, 0, 0, changed_by, reason, NULL, NULL, NULL, NULL, NULL
              FROM {{p}}jobs WHERE paused <> 0 AND job IN {}",
            placeholders(pausable)
        ));
    }
    sql.push_str(" UNION ALL SELECT 'n', '', NOW_MS, 0, NULL, NULL, NULL, NULL, NULL, NULL, NULL");
    store.sql(&sql)
}

/// `text` cut (on a character boundary) to what a `TEXT` column holds: a pause reason is
/// built from two stored texts, and the column would refuse (or cut) it.
fn fit_text(text: &mut String) {
    if text.len() > TEXT_BYTES_MAX {
        let mut end = TEXT_BYTES_MAX;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
}

/// Inserts every new row in one statement, claimed at `now` (the server's ms). A plain
/// `INSERT`: a record that appeared despite the locks fails it, and the try starts over.
fn insert_sql(store: &MySqlStore, rows: &[(&ClaimRequest, &Decision)], now: i64) -> Result<String, Failure> {
    let shapes: Vec<&str> = rows
        .iter()
        .map(|(_, d)| match d {
            Decision::Won { .. } => "(?, ?, 1, ?, ?, ?, 'running', NULL, ?, NULL, ?, '', ?)",
            _ => "(?, ?, 1, ?, ?, NULL, 'skipped', ?, ?, ?, NULL, '', ?)",
        })
        .collect();
    let sql = store.sql(&format!(
        "INSERT INTO {{p}}runs (job, scheduled_at, attempt, `trigger`, node, token, state, reason,
         claimed_at, finished_at, lease_until, output, nonce) VALUES {}",
        shapes.join(", ")
    ));
    let mut values = Vec::with_capacity(rows.len() * 8);
    for (request, decision) in rows {
        values.extend([
            Literal::Text(&request.tick.job),
            Literal::Int(request.tick.scheduled_at.timestamp_millis()),
            Literal::Text(request.trigger.as_str()),
            Literal::Text(&request.node),
        ]);
        match decision {
            Decision::Won { token, lease, .. } => values.extend([
                Literal::Int(token_param(*token)?),
                Literal::Int(now),
                Literal::Int(now.saturating_add(millis(*lease)?)),
            ]),
            Decision::Skipped(reason) => values.extend([Literal::Text(reason), Literal::Int(now), Literal::Int(now)]),
            Decision::Taken | Decision::Regranted { .. } => unreachable!("only new records are inserted"),
        }
        values.push(Literal::int_or_null(plan::nonce_param(request.nonce)));
    }
    Ok(inline(&sql, &values))
}

/// Writes back each job's counter: the last token the batch handed out.
fn tokens_sql(store: &MySqlStore, tokens: &HashMap<String, u64>) -> Result<String, Failure> {
    let sql = store.sql(&format!(
        "UPDATE {{p}}fences SET token = CASE job {} END WHERE job IN {}",
        vec!["WHEN ? THEN ?"; tokens.len()].join(" "),
        placeholders(tokens.len())
    ));
    let mut values = Vec::with_capacity(tokens.len() * 3);
    for (job, token) in tokens {
        values.extend([Literal::Text(job), Literal::Int(token_param(*token)?)]);
    }
    values.extend(tokens.keys().map(|job| Literal::Text(job)));
    Ok(inline(&sql, &values))
}

/// The outcome of a decision, claimed at `claimed_at`.
fn outcome(request: &ClaimRequest, decision: Decision, claimed_at: chrono::DateTime<chrono::Utc>) -> ClaimOutcome {
    let outcome = plan::outcome(request, decision, claimed_at);
    if let ClaimOutcome::Won(lease) = &outcome {
        tracing::debug!(run = %lease.run, node = %request.node, token = lease.fencing_token, "run claimed");
    }
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::DateTime;
    use solocron_core::{Tick, Trigger};

    #[test]
    fn jobs_lock_in_the_servers_order() {
        let request = |job: &str| ClaimRequest {
            tick: Tick::new(job, DateTime::UNIX_EPOCH),
            trigger: Trigger::Schedule,
            node: "n".into(),
            lease: std::time::Duration::from_secs(1),
            mode: ClaimMode::Run { skip_if_running: false },
            nonce: 0,
        };
        let requests: Vec<_> = ["b", "a\t", "a", "B", "b"].iter().map(|j| request(j)).collect();
        // PAD SPACE: "a" is "a " to the server, after "a\t".
        assert_eq!(sorted_jobs(&requests), vec!["B", "a\t", "a", "b"]);
    }

    #[test]
    fn pause_reasons_fit_their_column() {
        let mut long = "é".repeat(TEXT_BYTES_MAX);
        fit_text(&mut long);
        assert!(long.len() <= TEXT_BYTES_MAX && long.len() > TEXT_BYTES_MAX - 2);
    }
}
