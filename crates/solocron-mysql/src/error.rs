//! Error mapping and the bounded retry of transactions that lose a lock conflict.

use std::future::Future;
use std::time::Duration;

use solocron_core::StoreError;

/// How many times a step is tried when it keeps losing deadlocks or lock waits.
const ATTEMPTS_MAX: u32 = 5;

/// MySQL/MariaDB error codes that mean the server is gone or refuses connections: a retry
/// later may cure them. 1040 too many connections, 1053 server shutdown, 1927 connection
/// killed (MariaDB), 2002/2003 cannot connect, 2006 server gone away, 2013/2055 lost
/// connection, 4031 disconnected for inactivity (MySQL 8).
const GONE: [u16; 9] = [1040, 1053, 1927, 2002, 2003, 2006, 2013, 2055, 4031];

/// Lock conflicts that roll back the statement or the transaction: 1205 lock wait timeout,
/// 1213 deadlock. The step is retried from the start.
const CONFLICT: [u16; 2] = [1205, 1213];

/// Why a step failed, before it is reported as a [`StoreError`].
#[derive(Debug)]
pub(crate) enum Failure {
    /// The driver or the server said so.
    Db(sqlx::Error),
    /// The step itself found something wrong.
    Store(StoreError),
    /// The transaction found the data changed under it (a write that should have been
    /// serialized by our locks was not): start over.
    Conflict(String),
}

impl From<sqlx::Error> for Failure {
    fn from(e: sqlx::Error) -> Failure {
        Failure::Db(e)
    }
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Failure {
        Failure::Store(e)
    }
}

/// The MySQL error number of a database error.
fn code(e: &sqlx::Error) -> Option<u16> {
    match e {
        sqlx::Error::Database(d) => d.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>().map(|m| m.number()),
        _ => None,
    }
}

impl Failure {
    /// Whether starting the step over may succeed (a lost lock conflict).
    fn retryable(&self) -> bool {
        match self {
            Failure::Db(e) => code(e).is_some_and(|c| CONFLICT.contains(&c)),
            Failure::Conflict(_) => true,
            Failure::Store(_) => false,
        }
    }

    /// The store error, its message prefixed with `context`.
    pub(crate) fn into_store(self, context: &str) -> StoreError {
        let (unavailable, message) = match self {
            Failure::Db(e) => (transient(&e), e.to_string()),
            Failure::Store(StoreError::Unavailable(m)) => (true, m),
            Failure::Store(StoreError::Invalid(m)) => (false, m),
            Failure::Conflict(m) => (true, format!("conflict persisted after {ATTEMPTS_MAX} attempts: {m}")),
        };
        let message = format!("{context}: {message}");
        if unavailable {
            StoreError::Unavailable(message)
        } else {
            StoreError::Invalid(message)
        }
    }
}

/// Whether a driver error is one a later retry may cure: the connection (I/O, TLS,
/// protocol, pool), a server going away, or a lock conflict that outlasted our retries.
fn transient(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(_) => code(e).is_some_and(|c| GONE.contains(&c) || CONFLICT.contains(&c)),
        _ => false,
    }
}

/// Runs `step` (one statement or one transaction) until it succeeds, fails for a reason
/// other than a lock conflict, or has been tried [`ATTEMPTS_MAX`] times. `what` names the
/// step in the error.
pub(crate) async fn retrying<T, F, Fut>(what: &str, mut step: F) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, Failure>>,
{
    let mut attempt = 1;
    loop {
        match step().await {
            Ok(value) => return Ok(value),
            Err(failure) if failure.retryable() && attempt < ATTEMPTS_MAX => {
                tracing::debug!(step = what, attempt, error = ?failure, "lock conflict; retrying");
                tokio::time::sleep(backoff(attempt)).await;
                attempt += 1;
            }
            Err(failure) => return Err(failure.into_store(what)),
        }
    }
}

/// A short pause before attempt `attempt + 1`, growing and jittered so that the two losers
/// of a deadlock do not collide again in lockstep.
fn backoff(attempt: u32) -> Duration {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().subsec_nanos();
    let jitter_ms = u64::from(nanos % 10);
    Duration::from_millis(5 * u64::from(attempt) + jitter_ms)
}

/// MySQL's 1062, duplicate key.
pub(crate) fn is_duplicate(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(d) if d.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>().is_some_and(|m| m.number() == 1062))
}

/// A decoding or consistency error.
pub(crate) fn invalid(message: impl Into<String>) -> Failure {
    Failure::Store(StoreError::Invalid(message.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_failures_are_unavailable_and_the_rest_invalid() {
        let io = Failure::from(sqlx::Error::Io(std::io::Error::other("reset")));
        assert!(matches!(io.into_store("x"), StoreError::Unavailable(m) if m.starts_with("x: ")));
        assert!(matches!(Failure::from(sqlx::Error::PoolTimedOut).into_store("x"), StoreError::Unavailable(_)));
        assert!(matches!(Failure::from(sqlx::Error::RowNotFound).into_store("x"), StoreError::Invalid(_)));
        assert!(matches!(invalid("bad row").into_store("x"), StoreError::Invalid(_)));
        assert!(Failure::Conflict("moved".into()).retryable());
        assert!(!invalid("bad row").retryable());
    }
}
