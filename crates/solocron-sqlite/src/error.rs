//! SQLite's errors as [`StoreError`]s: what a retry may cure is `Unavailable`, the rest
//! `Invalid`.

use solocron_core::StoreError;

/// SQLite's primary result code of a database error (the low byte of an extended code).
fn primary_code(e: &sqlx::Error) -> Option<i64> {
    let sqlx::Error::Database(d) = e else { return None };
    d.code()?.parse::<i64>().ok().map(|c| c & 0xff)
}

/// Whether `e` is SQLite's BUSY or LOCKED: another connection holds a lock we need.
pub(crate) fn is_busy(e: &sqlx::Error) -> bool {
    matches!(primary_code(e), Some(5 | 6))
}

/// Maps an sqlx error: what a retry may cure (I/O, locks held past the busy timeout, a full
/// pool or disk, a file that cannot be opened) is `Unavailable`; the rest is `Invalid`.
pub(crate) fn db_err(e: sqlx::Error) -> StoreError {
    // Primary SQLite result codes: BUSY, LOCKED, READONLY, IOERR, FULL, CANTOPEN.
    const TRANSIENT: [i64; 6] = [5, 6, 8, 10, 13, 14];
    let transient = match &e {
        sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::WorkerCrashed => true,
        _ => primary_code(&e).is_some_and(|c| TRANSIENT.contains(&c)),
    };
    if transient {
        StoreError::Unavailable(e.to_string())
    } else {
        StoreError::Invalid(e.to_string())
    }
}

/// The same error, its message prefixed with `context`.
pub(crate) fn in_context(e: StoreError, context: &str) -> StoreError {
    match e {
        StoreError::Unavailable(m) => StoreError::Unavailable(format!("{context}: {m}")),
        StoreError::Invalid(m) => StoreError::Invalid(format!("{context}: {m}")),
    }
}
