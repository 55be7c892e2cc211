//! # solocron-sql
//!
//! SQL pieces every SQL store of solocron shares, written once over sqlx's database-generic
//! query builder. A store crate depends on this; nothing else does.
#![warn(missing_docs)]

use solocron_core::HistoryQuery;
use sqlx::{Database, Encode, QueryBuilder, Type};

/// Appends a [`HistoryQuery`]'s filters, the newest-first order and its limit to a builder
/// that holds `SELECT … FROM <runs> WHERE <something true>`.
///
/// ```
/// use solocron_core::HistoryQuery;
/// let q = HistoryQuery { job: Some("backup".into()), limit: 10, ..HistoryQuery::default() };
/// let mut sql = sqlx::QueryBuilder::<sqlx::Sqlite>::new("SELECT * FROM runs WHERE 1 = 1");
/// solocron_sql::push_history_filters(&mut sql, &q);
/// assert_eq!(sql.sql(), "SELECT * FROM runs WHERE 1 = 1 AND job = ? ORDER BY scheduled_at DESC, attempt DESC LIMIT ?");
/// ```
pub fn push_history_filters<'a, DB>(sql: &mut QueryBuilder<'a, DB>, query: &'a HistoryQuery)
where
    DB: Database,
    &'a str: Encode<'a, DB> + Type<DB>,
    i64: Encode<'a, DB> + Type<DB>,
{
    if let Some(job) = &query.job {
        sql.push(" AND job = ").push_bind(job.as_str());
    }
    if let Some(state) = query.state {
        sql.push(" AND state = ").push_bind(state.as_str());
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
