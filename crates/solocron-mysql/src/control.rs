//! The job registry and operators' controls: registrations, pause, manual run requests.

use solocron_core::{JobControl, JobDefinition, Registration, RunRequest, StoreError, Tick, RECORDS_PAGE_MAX};
use sqlx::mysql::MySqlRow;

use crate::error::{invalid, retrying, Failure};
use crate::records::{check_name, check_text, get, instant, opt_text, text};
use crate::MySqlStore;

/// Definitions per `INSERT` of [`register`]: 6 placeholders each, far below MySQL's
/// 65,535 per statement.
const REGISTER_CHUNK: usize = 1000;

/// How many milliseconds after "now" a manual request may move to find a free instant.
const REQUEST_SLOTS_MAX: usize = 100;

/// Upserts `node`'s registration of each job (one transaction): the definition and
/// `last_seen` are replaced, `first_seen` only set on insert.
pub(crate) async fn register(store: &MySqlStore, node: &str, jobs: &[JobDefinition]) -> Result<(), StoreError> {
    if jobs.is_empty() {
        return Ok(());
    }
    let context = "cannot register jobs";
    check_name("node", node).map_err(|f| f.into_store(context))?;
    for definition in jobs {
        check_name("job", &definition.job).map_err(|f| f.into_store(context))?;
    }
    retrying(context, || async {
        let mut tx = store.pool.begin().await?;
        for chunk in jobs.chunks(REGISTER_CHUNK) {
            register_chunk(store, &mut tx, node, chunk).await?;
        }
        tx.commit().await?;
        Ok(())
    })
    .await
}

/// One multi-row upsert. The rows come from a derived table so that the update can name
/// their values (`v.schedule`) on both servers: MySQL 8 deprecates `VALUES(col)` there,
/// and MariaDB lacks MySQL's `AS new` alias.
async fn register_chunk(
    store: &MySqlStore,
    conn: &mut sqlx::MySqlConnection,
    node: &str,
    jobs: &[JobDefinition],
) -> Result<(), Failure> {
    let first = "SELECT ? AS job, ? AS node, ? AS schedule, ? AS timezone, ? AS definition_hash, ? AS summary";
    let rows = std::iter::once(first).chain(std::iter::repeat_n(" UNION ALL SELECT ?, ?, ?, ?, ?, ?", jobs.len() - 1));
    let sql = store.sql(&format!(
        "INSERT INTO {{p}}registry (job, node, schedule, timezone, definition_hash, summary, first_seen, last_seen)
         SELECT v.job, v.node, v.schedule, v.timezone, v.definition_hash, v.summary, NOW_MS, NOW_MS
         FROM ({}) AS v
         ON DUPLICATE KEY UPDATE schedule = v.schedule, timezone = v.timezone,
             definition_hash = v.definition_hash, summary = v.summary, last_seen = NOW_MS",
        rows.collect::<String>()
    ));
    let mut query = sqlx::query(&sql);
    for d in jobs {
        query = query
            .bind(d.job.as_str())
            .bind(node)
            .bind(d.schedule.as_str())
            .bind(d.timezone.as_str())
            .bind(d.definition_hash.as_str())
            .bind(d.summary.as_str());
    }
    query.execute(conn).await?;
    Ok(())
}

/// Every registration, by job then node.
pub(crate) async fn registrations(store: &MySqlStore) -> Result<Vec<Registration>, StoreError> {
    let context = "cannot list registrations";
    let rows = sqlx::query(&store.sql(
        "SELECT job, node, schedule, timezone, definition_hash, summary, first_seen, last_seen
         FROM {p}registry ORDER BY job, node",
    ))
    .fetch_all(&store.pool)
    .await
    .map_err(|e| Failure::from(e).into_store(context))?;
    rows.iter().map(|row| registration(row).map_err(|f| f.into_store(context))).collect()
}

/// A registration from a row of [`registrations`].
fn registration(row: &MySqlRow) -> Result<Registration, Failure> {
    Ok(Registration {
        definition: JobDefinition {
            job: text(row, "job")?,
            schedule: text(row, "schedule")?,
            timezone: text(row, "timezone")?,
            definition_hash: text(row, "definition_hash")?,
            summary: text(row, "summary")?,
        },
        node: text(row, "node")?,
        first_seen: instant(get(row, "first_seen")?)?,
        last_seen: instant(get(row, "last_seen")?)?,
    })
}

/// Upserts the job's switch; one statement.
pub(crate) async fn set_paused(
    store: &MySqlStore,
    job: &str,
    paused: bool,
    by: &str,
    reason: Option<&str>,
) -> Result<(), StoreError> {
    let context = if paused { "cannot pause" } else { "cannot resume" };
    check_name("job", job).map_err(|f| f.into_store(context))?;
    let sql = store.sql(
        "INSERT INTO {p}jobs (job, paused, changed_by, reason, changed_at) VALUES (?, ?, ?, ?, NOW_MS)
         ON DUPLICATE KEY UPDATE paused = ?, changed_by = ?, reason = ?, changed_at = NOW_MS",
    );
    retrying(context, || async {
        sqlx::query(&sql)
            .bind(job)
            .bind(i8::from(paused))
            .bind(by)
            .bind(reason)
            .bind(i8::from(paused))
            .bind(by)
            .bind(reason)
            .execute(&store.pool)
            .await?;
        Ok(())
    })
    .await?;
    tracing::info!(job, paused, by, reason, "job switch changed");
    Ok(())
}

/// Every job's switch, by job.
pub(crate) async fn controls(store: &MySqlStore) -> Result<Vec<JobControl>, StoreError> {
    let context = "cannot list job controls";
    let rows = sqlx::query(&store.sql("SELECT job, paused, changed_by, reason, changed_at FROM {p}jobs ORDER BY job"))
        .fetch_all(&store.pool)
        .await
        .map_err(|e| Failure::from(e).into_store(context))?;
    let control = |row: &MySqlRow| -> Result<JobControl, Failure> {
        Ok(JobControl {
            job: text(row, "job")?,
            paused: get::<i64>(row, "paused")? != 0,
            changed_by: text(row, "changed_by")?,
            reason: opt_text(row, "reason")?,
            changed_at: instant(get(row, "changed_at")?)?,
        })
    };
    rows.iter().map(|row| control(row).map_err(|f| f.into_store(context))).collect()
}

/// Records a manual run request at the server's now, moved off whole seconds and past
/// instants already requested for the job (one transaction).
pub(crate) async fn request_run(store: &MySqlStore, job: &str, by: &str) -> Result<Tick, StoreError> {
    let context = "cannot request a run";
    check_name("job", job).and_then(|()| check_text("requester", by)).map_err(|f| f.into_store(context))?;
    let insert = store.sql("INSERT IGNORE INTO {p}requests (job, requested_at, requested_by) VALUES (?, ?, ?)");
    let at = retrying(context, || async {
        let mut tx = store.pool.begin().await?;
        let now: i64 = sqlx::query_scalar(&store.sql("SELECT NOW_MS")).fetch_one(&mut *tx).await?;
        let mut at = off_second(now);
        for _ in 0..REQUEST_SLOTS_MAX {
            let query = sqlx::query(&insert).bind(job).bind(at).bind(by);
            if query.execute(&mut *tx).await?.rows_affected() == 1 {
                tx.commit().await?;
                return Ok(at);
            }
            at = off_second(at + 1);
        }
        Err(invalid(format!(
            "{REQUEST_SLOTS_MAX} manual runs of `{job}` already requested around this instant; try again"
        )))
    })
    .await?;
    let tick = Tick::new(job, instant(at).map_err(|f| f.into_store(context))?);
    tracing::info!(%job, by, at = %tick.scheduled_at, "manual run requested");
    Ok(tick)
}

/// `ms`, or the next millisecond if `ms` falls on a whole second (where scheduled ticks
/// fall: a manual tick must never be one of them).
fn off_second(ms: i64) -> i64 {
    if ms % 1000 == 0 {
        ms + 1
    } else {
        ms
    }
}

/// Requests whose tick has no record yet, oldest first.
pub(crate) async fn pending_requests(store: &MySqlStore, limit: usize) -> Result<Vec<RunRequest>, StoreError> {
    let context = "cannot list run requests";
    let rows = sqlx::query(&store.sql(
        "SELECT q.job, q.requested_at, q.requested_by FROM {p}requests q
         WHERE NOT EXISTS (SELECT 1 FROM {p}runs r
                           WHERE r.job = q.job AND r.scheduled_at = q.requested_at AND r.attempt = 1)
         ORDER BY q.requested_at, q.job LIMIT ?",
    ))
    .bind(limit.min(RECORDS_PAGE_MAX) as i64)
    .fetch_all(&store.pool)
    .await
    .map_err(|e| Failure::from(e).into_store(context))?;
    let request = |row: &MySqlRow| -> Result<RunRequest, Failure> {
        Ok(RunRequest {
            tick: Tick::new(text(row, "job")?, instant(get(row, "requested_at")?)?),
            requested_by: text(row, "requested_by")?,
        })
    };
    rows.iter().map(|row| request(row).map_err(|f| f.into_store(context))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_instants_avoid_whole_seconds() {
        assert_eq!(off_second(1_000), 1_001);
        assert_eq!(off_second(1_999), 1_999);
        assert_eq!(off_second(1_999 + 1), 2_001);
    }
}
