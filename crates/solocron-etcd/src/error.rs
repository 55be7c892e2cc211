//! Mapping etcd client errors to [`StoreError`]: what a retry may cure (transport, an
//! unavailable member, no leader, a deadline, overload) is `Unavailable`, the engine backs
//! off and retries; the rest is `Invalid`.

use solocron_core::StoreError;

/// Maps an etcd client error: what a retry may cure (transport, unavailable member, no
/// leader, deadline, overload) is `Unavailable`; the rest is `Invalid`.
pub(crate) fn etcd_err(e: etcd_client::Error) -> StoreError {
    if transient(&e) {
        StoreError::Unavailable(format!("etcd: {e}"))
    } else {
        StoreError::Invalid(format!("etcd: {e}"))
    }
}

/// Whether a retry may cure `e` (see [`etcd_err`]).
pub(crate) fn transient(e: &etcd_client::Error) -> bool {
    use etcd_client::Error as E;
    // gRPC codes: CANCELLED 1, UNKNOWN 2 (tonic's transport failures), DEADLINE_EXCEEDED 4,
    // RESOURCE_EXHAUSTED 8 ("too many requests"), ABORTED 10, UNAVAILABLE 14.
    const TRANSIENT: [i32; 6] = [1, 2, 4, 8, 10, 14];
    match e {
        // The keep-alive stream closing unanswered is the connection dropping.
        E::TransportError(_) | E::IoError(_) | E::WatchError(_) => true,
        E::GRpcStatus(status) => TRANSIENT.contains(&(status.code() as i32)),
        _ => false,
    }
}

/// Whether a call failed before reaching any member (connection refused or unreachable).
pub(crate) fn never_sent(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::GRpcStatus(status) => status.message().contains("connect error"),
        _ => false,
    }
}

/// The same error, its message prefixed with `context`.
pub(crate) fn in_context(e: StoreError, context: &str) -> StoreError {
    match e {
        StoreError::Unavailable(m) => StoreError::Unavailable(format!("{context}: {m}")),
        StoreError::Invalid(m) => StoreError::Invalid(format!("{context}: {m}")),
    }
}
