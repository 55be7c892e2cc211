//! The claim of a batch of ticks: one transaction of at most 6 round trips, whatever the
//! batch's size (see the crate docs for the sequence).
//!
//! Why reading first and deciding in memory is safe: every transaction that creates an
//! attempt-1 row or a `running` row of a job (a claim, a retry by recovery) first takes
//! the exclusive lock on the job's fence row and keeps it until it commits. Once a batch
//! holds the fence locks of all its jobs, nothing it reads about those jobs (existing tick
//! records, running runs, the counters) can change before it commits, except running runs
//! ending, which only makes an overlap skip conservative. The primary key stays the final
//! arbiter: the `INSERT IGNORE` must insert every row it was sent, or the transaction is
//! rolled back and retried.

use std::cmp::Ordering;
use std::collections::{HashMap, HashSet};

use chrono::{DateTime, TimeDelta, Utc};
use solocron_core::{ClaimMode, ClaimOutcome, ClaimRequest, Lease, RunId, StoreError, Tick, Trigger, CLAIM_BATCH_MAX};
use sqlx::mysql::MySqlArguments;
use sqlx::query::Query;
use sqlx::{MySql, MySqlConnection};

use crate::error::{invalid, retrying, Failure};
use crate::records::{
    attempt, check_name, check_text, get, instant, millis, opt_text, placeholders, repeated, text, token,
};
use crate::records::{token_param, TEXT_BYTES_MAX};
use crate::MySqlStore;

/// What the locked read of [`read_state`] found about the batch's jobs.
#[derive(Default)]
struct Found {
    /// Each job's fencing counter (the last token handed out).
    tokens: HashMap<String, u64>,
    /// Ticks (job, ms) that have a record (attempt 1).
    existing: HashSet<(String, i64)>,
    /// The newest running run of each job asked to not overlap.
    running: HashMap<String, RunId>,
    /// The skip reason of each paused job (of those claimed by a non-manual `Run`).
    paused: HashMap<String, String>,
    /// The server's clock (ms) at the read: the batch's `claimed_at`.
    now: Option<i64>,
}

/// Claims `requests` in one transaction, retried on lock conflicts.
pub(crate) async fn claim(store: &MySqlStore, requests: &[ClaimRequest]) -> Result<Vec<ClaimOutcome>, StoreError> {
    if requests.is_empty() {
        return Ok(Vec::new());
    }
    check(requests).map_err(|f| f.into_store("cannot claim"))?;
    retrying("cannot claim", || claim_once(store, requests)).await
}

/// Refuses what `INSERT IGNORE` would silently truncate, and oversized batches (whose
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

/// One try at the whole batch.
async fn claim_once(store: &MySqlStore, requests: &[ClaimRequest]) -> Result<Vec<ClaimOutcome>, Failure> {
    let jobs = sorted_jobs(requests);
    let mut tx = store.pool.begin().await?;
    lock_fences(store, &mut tx, &jobs).await?;
    let found = read_state(store, &mut tx, requests, &jobs).await?;
    let now = found.now.ok_or_else(|| invalid("the claim's read returned no clock"))?;
    let (decisions, tokens) = plan(requests, found)?;
    let mut rows: Vec<(&ClaimRequest, &Decision)> =
        requests.iter().zip(&decisions).filter(|(_, d)| !matches!(d, Decision::Taken)).collect();
    // Running rows first: the statement's shape then depends only on how many of each kind
    // there are, so sqlx's prepared-statement cache serves repeated batches.
    rows.sort_by_key(|(_, d)| matches!(d, Decision::Skipped(_)));
    insert_rows(store, &mut tx, &rows, now).await?;
    if !tokens.is_empty() {
        write_tokens(store, &mut tx, &tokens).await?;
    }
    tx.commit().await?;
    let claimed_at = Some(instant(now)?);
    requests.iter().zip(decisions).map(|(r, d)| outcome(r, d, claimed_at)).collect()
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
async fn lock_fences(store: &MySqlStore, conn: &mut MySqlConnection, jobs: &[&str]) -> Result<(), Failure> {
    let sql = store.sql(&format!(
        "INSERT INTO {{p}}fences (job, token) VALUES {} ON DUPLICATE KEY UPDATE token = token",
        repeated("(?, 0)", jobs.len())
    ));
    let mut query = sqlx::query(&sql);
    for job in jobs {
        query = query.bind(*job);
    }
    query.execute(conn).await?;
    Ok(())
}

/// Reads, in one round trip, the counters of `jobs`, the existing records of the batch's
/// ticks, the running runs of the jobs asked not to overlap, which jobs are paused, and
/// the server's clock (under the fence locks: every record the batch writes carries it).
async fn read_state(
    store: &MySqlStore,
    conn: &mut MySqlConnection,
    requests: &[ClaimRequest],
    jobs: &[&str],
) -> Result<Found, Failure> {
    let jobs_where = |wanted: fn(&ClaimRequest) -> bool| {
        let mut jobs: Vec<&str> = requests.iter().filter(|r| wanted(r)).map(|r| r.tick.job.as_str()).collect();
        jobs.sort_unstable();
        jobs.dedup();
        jobs
    };
    let overlapping = jobs_where(|r| matches!(r.mode, ClaimMode::Run { skip_if_running: true }));
    let pausable = jobs_where(|r| matches!(r.mode, ClaimMode::Run { .. }) && r.trigger != Trigger::Manual);
    let mut instants: Vec<i64> = requests.iter().map(|r| r.tick.scheduled_at.timestamp_millis()).collect();
    instants.sort_unstable();
    instants.dedup();
    let sql = state_sql(store, jobs.len(), instants.len(), overlapping.len(), pausable.len());
    let mut query = bind_all(bind_all(sqlx::query(&sql), jobs), jobs);
    for at in &instants {
        query = query.bind(*at);
    }
    query = bind_all(bind_all(query, &overlapping), &pausable);
    let mut found = Found::default();
    for row in query.fetch_all(conn).await? {
        note(&mut found, &row)?;
    }
    if found.tokens.len() != jobs.len() {
        return Err(invalid("a fence row the claim just locked is missing"));
    }
    Ok(found)
}

/// `query` with each of `values` bound in turn.
fn bind_all<'q>(mut query: Query<'q, MySql, MySqlArguments>, values: &[&'q str]) -> Query<'q, MySql, MySqlArguments> {
    for value in values {
        query = query.bind(*value);
    }
    query
}

/// The `UNION ALL` read of [`read_state`]; each row's `kind` says what it is.
///
/// Tick records are looked up as `job IN (...) AND scheduled_at IN (...)`, a superset of
/// the batch's ticks that the caller filters: the optimizer turns it into primary-key
/// ranges in microseconds, whereas a row-constructor `(job, scheduled_at) IN ((?, ?), ...)`
/// of 1000 pairs takes MariaDB 10.11 some 300 ms to plan.
fn state_sql(store: &MySqlStore, jobs: usize, instants: usize, overlapping: usize, pausable: usize) -> String {
    let mut sql = format!(
        "SELECT 'f' AS kind, job, token AS n, 0 AS attempt, CAST(NULL AS CHAR) AS who, CAST(NULL AS CHAR) AS why
         FROM {{p}}fences WHERE job IN {jobs}
         UNION ALL SELECT 't', job, scheduled_at, attempt, NULL, NULL
         FROM {{p}}runs WHERE attempt = 1 AND job IN {jobs} AND scheduled_at IN {}",
        placeholders(instants),
        jobs = placeholders(jobs),
    );
    if overlapping > 0 {
        sql.push_str(&format!(
            " UNION ALL SELECT 'r', job, scheduled_at, attempt, NULL, NULL
              FROM {{p}}runs WHERE state = 'running' AND job IN {}",
            placeholders(overlapping)
        ));
    }
    if pausable > 0 {
        sql.push_str(&format!(
            " UNION ALL SELECT 'p', job, 0, 0, changed_by, reason FROM {{p}}jobs WHERE paused <> 0 AND job IN {}",
            placeholders(pausable)
        ));
    }
    sql.push_str(" UNION ALL SELECT 'n', '', NOW_MS, 0, NULL, NULL");
    store.sql(&sql)
}

/// Records one row of the [`read_state`] read.
fn note(found: &mut Found, row: &sqlx::mysql::MySqlRow) -> Result<(), Failure> {
    let job = text(row, "job")?;
    let n: i64 = get(row, "n")?;
    match text(row, "kind")?.as_str() {
        "f" => {
            found.tokens.insert(job, token(n)?);
        }
        "t" => {
            found.existing.insert((job, n));
        }
        "n" => found.now = Some(n),
        "r" => {
            let run = RunId { tick: Tick::new(job.clone(), instant(n)?), attempt: attempt(get(row, "attempt")?)? };
            note_running(&mut found.running, run);
        }
        "p" => {
            let mut reason = format!("paused by {}", text(row, "who")?);
            if let Some(why) = opt_text(row, "why")? {
                reason = format!("{reason}: {why}");
            }
            found.paused.insert(job, reason);
        }
        other => return Err(invalid(format!("unexpected row kind `{other}`"))),
    }
    Ok(())
}

/// Keeps `run` as its job's running run if it is the newest (the one an overlap names).
fn note_running(running: &mut HashMap<String, RunId>, run: RunId) {
    let newer = |old: &RunId| (&run.tick.scheduled_at, run.attempt) > (&old.tick.scheduled_at, old.attempt);
    if running.get(&run.tick.job).is_none_or(newer) {
        running.insert(run.tick.job.clone(), run);
    }
}

/// What became of one request, before the commit tells a won claim's instant.
enum Decision {
    /// A record of the tick exists.
    Taken,
    /// Recorded `skipped` with this reason.
    Skipped(String),
    /// Recorded `running` for the request's node, with this token and lease length.
    Won { run: RunId, token: u64, lease_ms: i64 },
}

/// Decides every request in order, as if each were claimed after the previous ones; also
/// returns the last token of each job that won.
fn plan(requests: &[ClaimRequest], mut found: Found) -> Result<(Vec<Decision>, HashMap<String, u64>), Failure> {
    let mut decisions = Vec::with_capacity(requests.len());
    let mut won = HashMap::new();
    for request in requests {
        let tick = Tick::new(request.tick.job.clone(), request.tick.scheduled_at);
        if !found.existing.insert((tick.job.clone(), tick.scheduled_at.timestamp_millis())) {
            decisions.push(Decision::Taken);
            continue;
        }
        let decision = decide(request, tick, &mut found)?;
        if let Decision::Won { run, token, .. } = &decision {
            won.insert(run.tick.job.clone(), *token);
        }
        decisions.push(decision);
    }
    Ok((decisions, won))
}

/// The decision for a request whose tick has no record yet.
fn decide(request: &ClaimRequest, tick: Tick, found: &mut Found) -> Result<Decision, Failure> {
    let skip_if_running = match &request.mode {
        ClaimMode::Skip { reason } => return Ok(Decision::Skipped(reason.clone())),
        ClaimMode::Run { skip_if_running } => *skip_if_running,
    };
    if request.trigger != Trigger::Manual {
        if let Some(reason) = found.paused.get(&tick.job) {
            return Ok(Decision::Skipped(fit_text(reason.clone())));
        }
    }
    if skip_if_running {
        if let Some(running) = found.running.get(&tick.job) {
            return Ok(Decision::Skipped(format!("overlap: previous run {running} still running")));
        }
    }
    let counter = found.tokens.get_mut(&tick.job).ok_or_else(|| invalid("no fence row for a claimed job"))?;
    *counter += 1;
    let run = RunId { tick, attempt: 1 };
    note_running(&mut found.running, run.clone());
    Ok(Decision::Won { run, token: *counter, lease_ms: millis(request.lease)? })
}

/// `text` cut (on a character boundary) to what a `TEXT` column holds: a pause reason is
/// built from two stored texts, and `INSERT IGNORE` would cut it anyway.
fn fit_text(mut text: String) -> String {
    if text.len() > TEXT_BYTES_MAX {
        let mut end = TEXT_BYTES_MAX;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

/// Inserts every new row in one statement, claimed at `now` (the server's ms); the
/// transaction is retried unless all of them went in (a record that appeared despite our
/// locks).
async fn insert_rows(
    store: &MySqlStore,
    conn: &mut MySqlConnection,
    rows: &[(&ClaimRequest, &Decision)],
    now: i64,
) -> Result<(), Failure> {
    if rows.is_empty() {
        return Ok(());
    }
    let values: Vec<&str> = rows
        .iter()
        .map(|(_, d)| match d {
            Decision::Won { .. } => "(?, ?, 1, ?, ?, ?, 'running', NULL, ?, NULL, ?, '')",
            _ => "(?, ?, 1, ?, ?, NULL, 'skipped', ?, ?, ?, NULL, '')",
        })
        .collect();
    let sql = store.sql(&format!(
        "INSERT IGNORE INTO {{p}}runs (job, scheduled_at, attempt, `trigger`, node, token, state, reason,
         claimed_at, finished_at, lease_until, output) VALUES {}",
        values.join(", ")
    ));
    let mut query = sqlx::query(&sql);
    for (request, decision) in rows {
        query = query
            .bind(request.tick.job.as_str())
            .bind(request.tick.scheduled_at.timestamp_millis())
            .bind(request.trigger.as_str())
            .bind(request.node.as_str());
        query = match decision {
            Decision::Won { token, lease_ms, .. } => {
                query.bind(token_param(*token)?).bind(now).bind(now.saturating_add(*lease_ms))
            }
            Decision::Skipped(reason) => query.bind(reason.as_str()).bind(now).bind(now),
            Decision::Taken => unreachable!("taken ticks get no row"),
        };
    }
    let inserted = query.execute(conn).await?.rows_affected();
    if inserted != rows.len() as u64 {
        return Err(Failure::Conflict(format!("{inserted} of {} run records inserted", rows.len())));
    }
    Ok(())
}

/// Writes back each job's counter: the last token the batch handed out.
async fn write_tokens(
    store: &MySqlStore,
    conn: &mut MySqlConnection,
    tokens: &HashMap<String, u64>,
) -> Result<(), Failure> {
    let jobs: Vec<(&String, i64)> =
        tokens.iter().map(|(job, t)| Ok((job, token_param(*t)?))).collect::<Result<_, Failure>>()?;
    let sql = store.sql(&format!(
        "UPDATE {{p}}fences SET token = CASE job {} END WHERE job IN {}",
        vec!["WHEN ? THEN ?"; jobs.len()].join(" "),
        placeholders(jobs.len())
    ));
    let mut query = sqlx::query(&sql);
    for (job, token) in &jobs {
        query = query.bind(job.as_str()).bind(*token);
    }
    for (job, _) in &jobs {
        query = query.bind(job.as_str());
    }
    let updated = query.execute(conn).await?.rows_affected();
    if updated != jobs.len() as u64 {
        return Err(invalid(format!("{updated} of {} fence rows updated", jobs.len())));
    }
    Ok(())
}

/// The outcome of a decision, given the claim's instant (there is one if anything won).
fn outcome(
    request: &ClaimRequest,
    decision: Decision,
    claimed_at: Option<DateTime<Utc>>,
) -> Result<ClaimOutcome, Failure> {
    Ok(match decision {
        Decision::Taken => ClaimOutcome::Taken,
        Decision::Skipped(reason) => ClaimOutcome::Skipped { reason },
        Decision::Won { run, token, lease_ms } => {
            let claimed_at = claimed_at.ok_or_else(|| invalid("a won claim has no claim instant"))?;
            let lease_until = claimed_at + TimeDelta::milliseconds(lease_ms);
            tracing::debug!(%run, node = %request.node, token, "run claimed");
            ClaimOutcome::Won(Lease { run, owner: request.node.clone(), fencing_token: token, claimed_at, lease_until })
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jobs_lock_in_the_servers_order() {
        let request = |job: &str| ClaimRequest {
            tick: Tick::new(job, DateTime::UNIX_EPOCH),
            trigger: Trigger::Schedule,
            node: "n".into(),
            lease: std::time::Duration::from_secs(1),
            mode: ClaimMode::Run { skip_if_running: false },
        };
        let requests: Vec<_> = ["b", "a\t", "a", "B", "b"].iter().map(|j| request(j)).collect();
        // PAD SPACE: "a" is "a " to the server, after "a\t".
        assert_eq!(sorted_jobs(&requests), vec!["B", "a\t", "a", "b"]);
    }

    #[test]
    fn pause_reasons_fit_their_column() {
        let long = fit_text("é".repeat(TEXT_BYTES_MAX));
        assert!(long.len() <= TEXT_BYTES_MAX && long.len() > TEXT_BYTES_MAX - 2);
    }
}
