//! Every engine store call is bounded in time: a hung connection counts as the store being
//! unavailable, and the caller's own retry (or the lease's deadline) takes over. A leaf, so
//! that every room may bound its calls without importing the engine.

use std::future::Future;
use std::time::Duration;

use solocron_core::StoreError;

use crate::metrics::{self, StoreOp};

/// Longest a single store call may take before the engine treats the store as unavailable.
/// Half the late tolerance, so a tick delayed by one slow call is still late, not missed.
pub(crate) const STORE_CALL_TIMEOUT: Duration = Duration::from_secs(5);
const _: () = assert!(STORE_CALL_TIMEOUT.as_millis() * 2 <= solocron_core::LATE_TOLERANCE.as_millis());

/// A store call bounded by [`STORE_CALL_TIMEOUT`]; a hung connection counts as unavailable.
pub(crate) async fn bounded<T>(call: impl Future<Output = Result<T, StoreError>>) -> Result<T, StoreError> {
    within(STORE_CALL_TIMEOUT, call).await
}

/// A store call bounded like [`bounded`], whose failure is counted under `op`.
pub(crate) async fn counted<T>(
    op: StoreOp,
    call: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    bounded(call).await.inspect_err(|_| metrics::store_error(op))
}

/// A store call bounded by `limit`, for the few calls that may rightly take longer than
/// [`STORE_CALL_TIMEOUT`] (a schema migration).
pub(crate) async fn within<T>(
    limit: Duration,
    call: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    match tokio::time::timeout(limit, call).await {
        Ok(r) => r,
        Err(_) => Err(StoreError::Unavailable(format!("no answer within {limit:?}"))),
    }
}
