//! Health checks, Prometheus metrics, and the bound on request URIs.

use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;

use crate::auth::Caller;
use crate::problem::Problem;
use crate::prometheus::OPENMETRICS_CONTENT_TYPE;
use crate::AppState;

/// The store must answer `/readyz`'s question within this.
pub const READY_STORE_TIMEOUT: Duration = Duration::from_secs(2);
/// Most bytes of a request's path and query together.
pub const URI_BYTES_MAX: usize = 4 * 1024;
/// 200 while the process serves.
pub async fn healthz() -> &'static str {
    "ok\n"
}

#[derive(Serialize)]
struct Ready {
    status: &'static str,
    store: String,
}

/// 200 when the store answered within [`READY_STORE_TIMEOUT`], 503 otherwise.
pub async fn readyz(State(state): State<AppState>) -> Response {
    let store = state.store();
    match tokio::time::timeout(READY_STORE_TIMEOUT, store.now()).await {
        Ok(Ok(_)) => Json(Ready { status: "ready", store: store.describe() }).into_response(),
        Ok(Err(e)) => Problem::new(StatusCode::SERVICE_UNAVAILABLE, format!("the store failed: {e}")).into_response(),
        Err(_) => Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("the store did not answer within {} ms", READY_STORE_TIMEOUT.as_millis()),
        )
        .into_response(),
    }
}

/// The metrics in the OpenMetrics text format, which Prometheus reads (needs a token when
/// tokens are configured).
pub async fn metrics(_: Caller, State(state): State<AppState>) -> Response {
    let Some(handle) = state.prometheus() else {
        return Problem::new(StatusCode::NOT_FOUND, "metrics are not recorded by this server").into_response();
    };
    ([(header::CONTENT_TYPE, OPENMETRICS_CONTENT_TYPE)], handle.render()).into_response()
}

/// Answers 414 to a request whose path and query exceed [`URI_BYTES_MAX`].
pub async fn bound_uri(req: Request, next: Next) -> Response {
    let len = req.uri().path_and_query().map_or(0, |p| p.as_str().len());
    if len > URI_BYTES_MAX {
        return Problem::new(StatusCode::URI_TOO_LONG, format!("the path and query exceed {URI_BYTES_MAX} bytes"))
            .into_response();
    }
    next.run(req).await
}
