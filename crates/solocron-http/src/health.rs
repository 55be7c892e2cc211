//! Health checks, Prometheus metrics, and the bound on request URIs.

use std::sync::OnceLock;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use serde::Serialize;

use crate::auth::Caller;
use crate::problem::Problem;
use crate::AppState;

/// The store must answer `/readyz`'s question within this.
pub const READY_STORE_TIMEOUT: Duration = Duration::from_secs(2);
/// Most bytes of a request's path and query together.
pub const URI_BYTES_MAX: usize = 4 * 1024;
/// Histogram buckets for every `_seconds` metric: from a millisecond to a minute.
const SECONDS_BUCKETS: &[f64] =
    &[0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0];

/// Installs the process's Prometheus recorder (once; later calls return the same handle).
/// `None` when another recorder was installed first (an embedding service's own): then
/// solocron's metrics go to that recorder, and `/metrics` answers 404.
pub fn install_prometheus() -> Option<PrometheusHandle> {
    static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let builder = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), SECONDS_BUCKETS)
                .expect("buckets are not empty");
            match builder.install_recorder() {
                Ok(h) => Some(h),
                Err(e) => {
                    tracing::warn!(error = %e, "another metrics recorder is installed; /metrics will answer 404");
                    None
                }
            }
        })
        .clone()
}

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

/// The Prometheus text exposition (needs a token when tokens are configured).
pub async fn metrics(_: Caller, State(state): State<AppState>) -> Response {
    let Some(handle) = state.prometheus() else {
        return Problem::new(StatusCode::NOT_FOUND, "metrics are not recorded by this server").into_response();
    };
    handle.run_upkeep();
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], handle.render()).into_response()
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
