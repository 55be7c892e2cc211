//! Error mapping and the bounded retry of transactions that lost a conflict.

use std::future::Future;
use std::time::Duration;

use solocron_core::StoreError;

/// How many times a step that lost a serialization conflict or a deadlock is tried in all.
const ATTEMPTS_MAX: u32 = 5;

/// A failure inside this crate: an sqlx error kept whole (so that a retry can look at its
/// SQLSTATE), or an already-mapped store error (bad input, undecodable row).
#[derive(Debug)]
pub(crate) enum Failure {
    Sql(sqlx::Error),
    Store(StoreError),
}

impl From<sqlx::Error> for Failure {
    fn from(e: sqlx::Error) -> Self {
        Failure::Sql(e)
    }
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Self {
        Failure::Store(e)
    }
}

/// Results inside the crate.
pub(crate) type Res<T> = Result<T, Failure>;

impl Failure {
    /// A lost race that the same step, tried again, can win: serialization_failure (40001)
    /// or deadlock_detected (40P01). PostgreSQL rolled the transaction back, so nothing of
    /// the failed attempt remains.
    fn is_conflict(&self) -> bool {
        match self {
            Failure::Sql(sqlx::Error::Database(d)) => d.code().is_some_and(|code| code == "40001" || code == "40P01"),
            _ => false,
        }
    }

    /// The store error, its message prefixed with the step that failed.
    pub(crate) fn into_store(self, step: &str) -> StoreError {
        match self {
            Failure::Store(StoreError::Unavailable(m)) => StoreError::Unavailable(format!("{step}: {m}")),
            Failure::Store(StoreError::Invalid(m)) => StoreError::Invalid(format!("{step}: {m}")),
            Failure::Sql(e) if is_unavailable(&e) => StoreError::Unavailable(format!("{step}: {e}")),
            Failure::Sql(e) => StoreError::Invalid(format!("{step}: {e}")),
        }
    }
}

/// What a later attempt may cure: the connection (I/O, TLS, protocol, a full or closed pool)
/// and the server states of a restart or failover. Everything else is `Invalid`.
fn is_unavailable(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(d) => d.code().is_some_and(|code| transient_sqlstate(&code)),
        _ => false,
    }
}

/// Class 08 (connection exception); 57P01..57P03 (admin shutdown, crash shutdown, cannot
/// connect now: a server restarting or failing over); 53300 (too many connections, which
/// frees up); 25006 (read-only transaction: connected to a standby, as happens right after a
/// failover when a name still points at the old primary).
fn transient_sqlstate(code: &str) -> bool {
    code.starts_with("08") || matches!(code, "57P01" | "57P02" | "57P03" | "53300" | "25006")
}

/// Maps a one-statement step's failure.
pub(crate) fn step(name: &str) -> impl FnOnce(sqlx::Error) -> StoreError + '_ {
    move |e| Failure::from(e).into_store(name)
}

/// Runs `attempt` until it succeeds, fails otherwise than by a conflict, or has been tried
/// [`ATTEMPTS_MAX`] times. Each attempt must be a whole transaction (or one statement).
pub(crate) async fn retrying<T, F, Fut>(step: &str, mut attempt: F) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Res<T>>,
{
    let mut tried = 0;
    loop {
        tried += 1;
        match attempt().await {
            Ok(value) => return Ok(value),
            Err(e) if e.is_conflict() && tried < ATTEMPTS_MAX => {
                tracing::debug!(step, tried, error = ?e, "store step lost a conflict; trying again");
                tokio::time::sleep(backoff(tried)).await;
            }
            Err(e) => return Err(e.into_store(step)),
        }
    }
}

/// 5, 10, 20, 40 ms, each stretched by up to half again so that two losers of the same
/// deadlock do not collide again in lockstep.
fn backoff(tried: u32) -> Duration {
    let base = 5u64 << (tried - 1).min(6);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    Duration::from_millis(base + u64::from(nanos) % (base / 2 + 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_and_failover_states_are_unavailable_and_the_rest_invalid() {
        for code in ["08006", "08001", "57P01", "57P02", "57P03", "53300", "25006"] {
            assert!(transient_sqlstate(code), "{code}");
        }
        for code in ["23505", "42P01", "40001", "22003"] {
            assert!(!transient_sqlstate(code), "{code}");
        }
        let io = Failure::Sql(sqlx::Error::Io(std::io::Error::other("reset")));
        assert!(matches!(io.into_store("claim"), StoreError::Unavailable(m) if m.starts_with("claim: ")));
        let timeout = Failure::Sql(sqlx::Error::PoolTimedOut);
        assert!(matches!(timeout.into_store("renew"), StoreError::Unavailable(_)));
        let decode = Failure::Sql(sqlx::Error::ColumnNotFound("job".into()));
        assert!(matches!(decode.into_store("history"), StoreError::Invalid(_)));
    }

    #[test]
    fn backoff_grows_and_stays_bounded() {
        assert!(backoff(1) >= Duration::from_millis(5));
        assert!(backoff(4) >= Duration::from_millis(40));
        assert!(backoff(100) < Duration::from_millis(500));
    }
}
