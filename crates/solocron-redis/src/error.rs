//! Mapping Redis errors to [`StoreError`]: what a retry may cure is `Unavailable` (the
//! engine backs off and retries), the rest `Invalid` (see "Errors" in the crate docs).

use redis::RedisError;
use solocron_core::StoreError;

/// True for errors a retry may cure: the connection, timeouts, a server loading or busy,
/// a cluster or replication in transition, a full memory.
pub(crate) fn is_transient(e: &RedisError) -> bool {
    use redis::{ErrorKind, ServerErrorKind as Server};
    const CODES: [&str; 9] =
        ["BUSY", "LOADING", "TRYAGAIN", "CLUSTERDOWN", "MASTERDOWN", "READONLY", "NOREPLICAS", "OOM", "MISCONF"];
    e.is_io_error()
        || e.is_timeout()
        || e.is_connection_refusal()
        || e.is_connection_dropped()
        || e.is_cluster_error()
        || matches!(
            e.kind(),
            ErrorKind::Server(
                Server::BusyLoading | Server::TryAgain | Server::ClusterDown | Server::MasterDown | Server::ReadOnly
            ) | ErrorKind::ClusterConnectionNotFound
        )
        || e.code().is_some_and(|code| CODES.contains(&code))
}

/// Maps a Redis error (see "Errors" in the crate documentation), prefixed with `context`.
pub(crate) fn redis_error(e: RedisError, context: &str) -> StoreError {
    if is_transient(&e) {
        StoreError::Unavailable(format!("{context}: {e}"))
    } else {
        StoreError::Invalid(format!("{context}: {e}"))
    }
}

/// `e` with any quote of `url` in its message redacted: a driver's connection error may
/// name the URL it was given.
pub(crate) fn redacted(e: StoreError, url: &str) -> StoreError {
    match e {
        StoreError::Unavailable(m) => StoreError::Unavailable(solocron_core::redact_in(&m, url)),
        StoreError::Invalid(m) => StoreError::Invalid(solocron_core::redact_in(&m, url)),
    }
}
