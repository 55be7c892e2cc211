//! Statements sent as SQL text rather than prepared: one round trip for several statements
//! (a claim, a batch of ends), their values written in as literals; and a transaction
//! begun and ended by hand in such text, which must never go back to the pool still open.

use std::fmt::Write as _;

use sqlx::mysql::{MySqlQueryResult, MySqlRow};
use sqlx::pool::PoolConnection;
use sqlx::{Executor, MySql, MySqlConnection};

use crate::error::Failure;

/// A connection inside a transaction begun by hand. Dropped while still open (the claim's
/// future cancelled, or a rollback that failed), the connection is closed rather than
/// returned to the pool, and the server rolls the transaction back.
pub(crate) struct OpenTransaction {
    pub(crate) conn: PoolConnection<MySql>,
    pub(crate) open: bool,
}

impl OpenTransaction {
    /// Rolls back after `failure`, which it returns.
    pub(crate) async fn roll_back(mut self, failure: Failure) -> Failure {
        if execute(&mut self.conn, "ROLLBACK").await.is_ok() {
            self.open = false;
        }
        failure
    }
}

impl Drop for OpenTransaction {
    fn drop(&mut self) {
        if self.open {
            self.conn.close_on_drop();
        }
    }
}

/// The rows of a multi-statement text query (a `&str` query has no arguments, so sqlx
/// sends it as text, unprepared).
pub(crate) async fn read_rows(conn: &mut MySqlConnection, sql: &str) -> Result<Vec<MySqlRow>, sqlx::Error> {
    conn.fetch_all(sql).await
}

/// Runs a multi-statement text query; its rows affected, summed.
pub(crate) async fn execute(conn: &mut MySqlConnection, sql: &str) -> Result<MySqlQueryResult, sqlx::Error> {
    conn.execute(sql).await
}

/// A value written into SQL text.
#[derive(Clone)]
pub(crate) enum Literal<'a> {
    Text(&'a str),
    Int(i64),
    Null,
}

impl<'a> Literal<'a> {
    /// `NULL` for `None`.
    pub(crate) fn text_or_null(text: Option<&'a str>) -> Literal<'a> {
        text.map_or(Literal::Null, Literal::Text)
    }

    /// `NULL` for `None`.
    pub(crate) fn int_or_null(n: Option<i64>) -> Literal<'a> {
        n.map_or(Literal::Null, Literal::Int)
    }
}

/// `sql` with each `?` replaced by the next of `values`, in order (the templates here have
/// no `?` anywhere else). Text becomes `_utf8mb4 X'…'`: hex digits cannot end the literal
/// or escape it, whatever the text holds and whatever the server's SQL mode.
pub(crate) fn inline(sql: &str, values: &[Literal]) -> String {
    let mut out = String::with_capacity(sql.len() + values.len() * 24);
    let mut values = values.iter();
    for c in sql.chars() {
        if c != '?' {
            out.push(c);
            continue;
        }
        // Written straight into `out` (no allocation per value or byte: a herd's batches
        // hold thousands of them).
        match values.next().expect("a value for every placeholder") {
            Literal::Int(n) => write!(out, "{n}").expect("writing to a String"),
            Literal::Null => out.push_str("NULL"),
            Literal::Text(t) => {
                const HEX: &[u8; 16] = b"0123456789ABCDEF";
                out.push_str("_utf8mb4 X'");
                for b in t.bytes() {
                    out.push(char::from(HEX[usize::from(b >> 4)]));
                    out.push(char::from(HEX[usize::from(b & 0xF)]));
                }
                out.push('\'');
            }
        }
    }
    assert!(values.next().is_none(), "more values than placeholders");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_written_in_as_numbers_and_hex_text() {
        let sql =
            inline("INSERT INTO t VALUES (?, ?, '', ?)", &[Literal::Text("a'\\?é"), Literal::Int(-42), Literal::Null]);
        assert_eq!(sql, "INSERT INTO t VALUES (_utf8mb4 X'61275C3FC3A9', -42, '', NULL)");
    }
}
