//! Health checks, Prometheus metrics, and the bound on request URIs.

use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use solocron_core::StoreError;

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

/// `/readyz`'s answer when the store answered.
#[derive(Serialize)]
struct Ready {
    status: &'static str,
    /// Which store was asked: only to a holder of a token, since it says where the store is.
    #[serde(skip_serializing_if = "Option::is_none")]
    store: Option<String>,
}

/// How the store took `/readyz`'s question.
enum Readiness {
    Ready,
    Failed(StoreError),
    Silent,
}

/// 200 when the store answered within [`READY_STORE_TIMEOUT`], 503 otherwise. Probes send
/// no token, and `/readyz` is open to them: without one it says ready or not and nothing
/// of the store (no URL, host or error text); with one of the server's tokens it also
/// names the store and says why it failed.
pub async fn readyz(State(state): State<AppState>, headers: HeaderMap) -> Response {
    let store = state.store();
    let readiness = match tokio::time::timeout(READY_STORE_TIMEOUT, store.now()).await {
        Ok(Ok(_)) => Readiness::Ready,
        Ok(Err(e)) => Readiness::Failed(e),
        Err(_) => Readiness::Silent,
    };
    let told = crate::auth::holds_token(state.tokens(), &headers);
    ready_answer(readiness, told.then(|| store.describe()))
}

/// The answer to `/readyz`; `store`: the store's description, for a holder of a token.
fn ready_answer(readiness: Readiness, store: Option<String>) -> Response {
    let unavailable = |detail: String| Problem::new(StatusCode::SERVICE_UNAVAILABLE, detail).into_response();
    match (readiness, store) {
        (Readiness::Ready, store) => Json(Ready { status: "ready", store }).into_response(),
        (Readiness::Failed(e), Some(_)) => unavailable(format!("the store failed: {e}")),
        (Readiness::Failed(_), None) => unavailable("not ready: the store failed; send a token to see why".to_owned()),
        (Readiness::Silent, _) => {
            unavailable(format!("the store did not answer within {} ms", READY_STORE_TIMEOUT.as_millis()))
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    async fn answer(readiness: Readiness, store: Option<&str>) -> (StatusCode, String) {
        let res = ready_answer(readiness, store.map(str::to_owned));
        let status = res.status();
        let body = axum::body::to_bytes(res.into_body(), 1 << 16).await.unwrap();
        (status, String::from_utf8(body.to_vec()).unwrap())
    }

    fn refused() -> Readiness {
        Readiness::Failed(StoreError::Unavailable(
            "cannot connect to postgres://solocron@db.internal:5432/cron: connection refused".into(),
        ))
    }

    #[tokio::test]
    async fn without_a_token_a_failed_store_is_not_ready_and_nothing_more() {
        let (status, body) = answer(refused(), None).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        for leak in ["postgres", "db.internal", "5432", "solocron@", "connection refused", "unavailable"] {
            assert!(!body.contains(leak), "`{leak}` in {body}");
        }
        assert!(body.contains("not ready"), "{body}");
        let (status, body) = answer(Readiness::Silent, None).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(body.contains("did not answer within 2000 ms"), "{body}");
    }

    #[tokio::test]
    async fn with_a_token_a_failed_store_says_why() {
        let (status, body) = answer(refused(), Some("postgres://solocron:***@db.internal:5432/cron")).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(body.contains("the store failed: store unavailable: cannot connect to postgres://"), "{body}");
    }

    #[tokio::test]
    async fn ready_names_the_store_only_to_a_token() {
        let (status, body) = answer(Readiness::Ready, None).await;
        assert_eq!((status, body.as_str()), (StatusCode::OK, r#"{"status":"ready"}"#));
        let (_, body) = answer(Readiness::Ready, Some("sqlite:///var/lib/solocron.db")).await;
        assert_eq!(body, r#"{"status":"ready","store":"sqlite:///var/lib/solocron.db"}"#);
    }
}
