//! # solocron-sql
//!
//! SQL pieces every SQL store of solocron shares, written once over sqlx's database-generic
//! query builder. A store crate depends on this; nothing else does.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod plan;

use solocron_core::{output_tail, HistoryQuery, Lease, RunEnd, StoreError};
use sqlx::query::Query;
use sqlx::{Database, Encode, QueryBuilder, Type};

/// A fencing token as the signed 64-bit integer column every SQL store keeps it in.
///
/// ```
/// assert_eq!(solocron_sql::token_param(7).unwrap(), 7);
/// assert!(solocron_sql::token_param(u64::MAX).is_err());
/// ```
pub fn token_param(token: u64) -> Result<i64, StoreError> {
    i64::try_from(token).map_err(|_| StoreError::Invalid(format!("fencing token {token} is out of range")))
}

/// The namespaces a scan keeps to, as the one text parameter every SQL store's namespace
/// filter binds: `None` for every namespace, else the names between commas
/// (`,billing,default,`), which no namespace name contains. A store's filter reads a job's
/// namespace from its full name ([`solocron_core::namespace_of`]: the part before the first
/// `/`, `default` without one) and looks for `,{namespace},` in the list, in one SQL
/// expression (PostgreSQL `strpos`/`split_part`, MySQL `LOCATE`/`SUBSTRING_INDEX`, SQLite
/// `instr`/`substr`), so other namespaces' rows never count against a `LIMIT`.
///
/// ```
/// use solocron_core::Namespaces;
/// assert_eq!(solocron_sql::namespace_list(&Namespaces::ALL), None);
/// let two = Namespaces::only(["default", "billing"]).unwrap();
/// assert_eq!(solocron_sql::namespace_list(&two).as_deref(), Some(",billing,default,"));
/// ```
pub fn namespace_list(namespaces: &solocron_core::Namespaces) -> Option<String> {
    namespaces.names().map(|names| format!(",{},", names.join(",")))
}

/// Binds a held lease's identity — job, instant (ms), `attempt` (in the store's column
/// type), owner and token — in the order of the `WHERE job = ? AND scheduled_at = ? AND
/// attempt = ? AND node = ? AND token = ?` of `renew` and `finish`.
///
/// ```
/// use chrono::DateTime;
/// use solocron_core::{Lease, RunId, Tick};
/// let at = DateTime::UNIX_EPOCH;
/// let run = RunId { tick: Tick::new("backup", at), attempt: 1 };
/// let lease = Lease { run, owner: "n1".into(), fencing_token: 7, claimed_at: at, lease_until: at };
/// let query = sqlx::query::<sqlx::Sqlite>("UPDATE runs SET state = 'lost' WHERE job = ? AND scheduled_at = ? AND attempt = ? AND node = ? AND token = ?");
/// let query = solocron_sql::bind_lease(query, &lease, i64::from(lease.run.attempt)).unwrap();
/// # let _ = query;
/// ```
pub fn bind_lease<'q, DB, A>(
    query: Query<'q, DB, <DB as Database>::Arguments<'q>>,
    lease: &'q Lease,
    attempt: A,
) -> Result<Query<'q, DB, <DB as Database>::Arguments<'q>>, StoreError>
where
    DB: Database,
    &'q str: Encode<'q, DB> + Type<DB>,
    i64: Encode<'q, DB> + Type<DB>,
    A: 'q + Encode<'q, DB> + Type<DB>,
{
    Ok(query
        .bind(lease.run.tick.job.as_str())
        .bind(lease.run.tick.scheduled_at.timestamp_millis())
        .bind(attempt)
        .bind(lease.owner.as_str())
        .bind(token_param(lease.fencing_token)?))
}

/// Binds a run's end — state, reason, exit code, output tail, and `started_after` (ms after
/// the claim, in the store's integer type) — in the order of the `SET` of every store's
/// `finish`; [`bind_lease`] then binds its `WHERE`.
///
/// ```
/// use solocron_core::{RunEnd, RunState};
/// let end = RunEnd { state: RunState::Succeeded, reason: None, exit_code: Some(0), output: "ok".into(), started_after: None };
/// let query = sqlx::query::<sqlx::Sqlite>("UPDATE runs SET state = ?, reason = ?, exit_code = ?, output = ?, started_at = claimed_at + ?");
/// let query = solocron_sql::bind_end(query, &end, None::<i64>);
/// # let _ = query;
/// ```
pub fn bind_end<'q, DB, S>(
    query: Query<'q, DB, <DB as Database>::Arguments<'q>>,
    end: &'q RunEnd,
    started_after: Option<S>,
) -> Query<'q, DB, <DB as Database>::Arguments<'q>>
where
    DB: Database,
    &'q str: Encode<'q, DB> + Type<DB>,
    Option<&'q str>: Encode<'q, DB> + Type<DB>,
    Option<i32>: Encode<'q, DB> + Type<DB>,
    Option<S>: 'q + Encode<'q, DB> + Type<DB>,
{
    query
        .bind(end.state.as_str())
        .bind(end.reason.as_deref())
        .bind(end.exit_code)
        .bind(output_tail(&end.output))
        .bind(started_after)
}

/// Appends a [`HistoryQuery`]'s filters, the newest-first order and its limit to a builder
/// that holds `SELECT … FROM <runs> WHERE <something true>`.
///
/// ```
/// use solocron_core::HistoryQuery;
/// let q = HistoryQuery { job: Some("backup".into()), limit: 10, ..HistoryQuery::default() };
/// let mut sql = sqlx::QueryBuilder::<sqlx::Sqlite>::new("SELECT * FROM runs WHERE 1 = 1");
/// solocron_sql::push_history_filters(&mut sql, &q);
/// assert_eq!(sql.sql(), "SELECT * FROM runs WHERE 1 = 1 AND job = ? ORDER BY scheduled_at DESC, attempt DESC LIMIT ?");
/// let q = HistoryQuery { namespace: Some("billing".into()), ..HistoryQuery::default() };
/// let mut sql = sqlx::QueryBuilder::<sqlx::Sqlite>::new("SELECT * FROM runs WHERE 1 = 1");
/// solocron_sql::push_history_filters(&mut sql, &q);
/// assert!(sql.sql().contains(" AND job LIKE ? ESCAPE '!'"));
/// ```
pub fn push_history_filters<'a, DB>(sql: &mut QueryBuilder<'a, DB>, query: &'a HistoryQuery)
where
    DB: Database,
    &'a str: Encode<'a, DB> + Type<DB>,
    String: Encode<'a, DB> + Type<DB>,
    i64: Encode<'a, DB> + Type<DB>,
{
    if let Some(job) = &query.job {
        sql.push(" AND job = ").push_bind(job.as_str());
    }
    match query.namespace.as_deref() {
        None => {}
        // A full name in `default` has no `/`; in any other, its namespace and a `/` begin
        // it. `/` is no LIKE wildcard; `_` (which a namespace may hold) is, hence `!`.
        Some(solocron_core::DEFAULT_NAMESPACE) => {
            sql.push(" AND job NOT LIKE '%/%'");
        }
        Some(ns) => {
            let pattern = format!("{}/%", ns.replace('!', "!!").replace('_', "!_").replace('%', "!%"));
            sql.push(" AND job LIKE ").push_bind(pattern).push(" ESCAPE '!'");
        }
    }
    if let Some(state) = query.state {
        // A literal, not a parameter: the state is one of a fixed set of plain words, and
        // a planner can use a partial index (`WHERE state = 'running'`) only when it sees
        // the value.
        sql.push(format_args!(" AND state = '{}'", state.as_str()));
    }
    if let Some(node) = &query.node {
        sql.push(" AND node = ").push_bind(node.as_str());
    }
    if let Some(since) = query.since {
        sql.push(" AND scheduled_at >= ").push_bind(since.timestamp_millis());
    }
    if let Some(until) = query.until {
        sql.push(" AND scheduled_at < ").push_bind(until.timestamp_millis());
    }
    sql.push(" ORDER BY scheduled_at DESC, attempt DESC LIMIT ").push_bind(query.effective_limit() as i64);
}

/// The query of [`solocron_core::ClaimStore::taken_ticks`] on the runs table `runs`: the job and
/// instant (ms) of each attempt 1 of the ticks' jobs from their earliest instant to their
/// latest (a range of the primary key per job; a round's ticks share an instant or a few).
/// [`taken_of`] keeps the rows of the ticks asked for. `None` for no ticks.
///
/// ```
/// use chrono::DateTime;
/// use solocron_core::Tick;
/// let at = DateTime::from_timestamp(1_700_000_000, 0).unwrap();
/// let ticks = [Tick::new("a", at), Tick::new("b", at), Tick::new("a", at)];
/// let sql = solocron_sql::taken_ticks_query::<sqlx::Sqlite>("runs", &ticks).unwrap();
/// assert_eq!(
///     sql.sql(),
///     "SELECT job, scheduled_at FROM runs WHERE attempt = 1 AND scheduled_at >= ? AND scheduled_at <= ? \
///      AND job IN (?, ?)"
/// );
/// ```
pub fn taken_ticks_query<'a, DB>(runs: &str, ticks: &'a [solocron_core::Tick]) -> Option<QueryBuilder<'a, DB>>
where
    DB: Database,
    i64: Encode<'a, DB> + Type<DB>,
    &'a str: Encode<'a, DB> + Type<DB>,
{
    let from = ticks.iter().map(|t| t.scheduled_at).min()?.timestamp_millis();
    let to = ticks.iter().map(|t| t.scheduled_at).max()?.timestamp_millis();
    let jobs: std::collections::BTreeSet<&str> = ticks.iter().map(|t| t.job.as_str()).collect();
    let mut sql =
        QueryBuilder::new(format!("SELECT job, scheduled_at FROM {runs} WHERE attempt = 1 AND scheduled_at >= "));
    sql.push_bind(from).push(" AND scheduled_at <= ").push_bind(to).push(" AND job IN (");
    let mut list = sql.separated(", ");
    for job in jobs {
        list.push_bind(job);
    }
    sql.push(")");
    Some(sql)
}

/// Those of `ticks` among the `rows` (`(job, instant in ms)`) that [`taken_ticks_query`]
/// read for them.
///
/// ```
/// use chrono::DateTime;
/// use solocron_core::Tick;
/// let at = DateTime::from_timestamp(1_700_000_000, 0).unwrap();
/// let ticks = [Tick::new("a", at), Tick::new("b", at)];
/// let rows = vec![("a".to_owned(), at.timestamp_millis()), ("b".to_owned(), at.timestamp_millis() + 1000)];
/// assert_eq!(solocron_sql::taken_of(&ticks, rows), vec![Tick::new("a", at)]);
/// ```
pub fn taken_of(ticks: &[solocron_core::Tick], rows: Vec<(String, i64)>) -> Vec<solocron_core::Tick> {
    let mut read: std::collections::HashMap<i64, std::collections::HashSet<String>> = Default::default();
    for (job, ms) in rows {
        read.entry(ms).or_default().insert(job);
    }
    let taken = |t: &&solocron_core::Tick| {
        read.get(&t.scheduled_at.timestamp_millis()).is_some_and(|jobs| jobs.contains(t.job.as_str()))
    };
    ticks.iter().filter(taken).cloned().collect()
}
