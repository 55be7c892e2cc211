//! `/metrics` through the process's real recorder: what any program records through the
//! `metrics` facade is served, with its labels, descriptions and units, as OpenMetrics text.

use solocron_core::SchemaStore;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use metrics::{counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram, Unit};
use solocron_core::{Prefix, Store};
use solocron_http::{install_prometheus, router, HttpOptions, Role, Token, OPENMETRICS_CONTENT_TYPE};
use tower::ServiceExt as _;

const SECRET: &str = "metrics-test-secret-0123456789";

async fn store(dir: &tempfile::TempDir) -> Arc<dyn Store> {
    let url = format!("sqlite://{}", dir.path().join("solocron.db").display());
    let store = solocron_sqlite::SqliteStore::connect(&url, &Prefix::default()).await.expect("a SQLite store");
    store.migrate().await.expect("migrated");
    Arc::new(store)
}

/// What one GET of `/metrics` answers: status, content type, body.
async fn get(app: axum::Router, token: Option<&str>) -> (StatusCode, String, String) {
    let mut req = Request::get("/metrics");
    if let Some(t) = token {
        req = req.header(header::AUTHORIZATION, format!("Bearer {t}"));
    }
    let res = app.oneshot(req.body(Body::empty()).unwrap()).await.unwrap();
    let status = res.status();
    let ty = res.headers().get(header::CONTENT_TYPE).map(|v| v.to_str().unwrap().to_owned()).unwrap_or_default();
    let body = axum::body::to_bytes(res.into_body(), 64 << 20).await.unwrap();
    (status, ty, String::from_utf8(body.to_vec()).unwrap())
}

fn record() {
    describe_counter!("embed_ticks_total", Unit::Count, "Ticks this node decided about, by job and outcome.");
    describe_gauge!("embed_last_success_timestamp_seconds", Unit::Seconds, "Unix time of the last success.");
    describe_histogram!("embed_claim_round_duration_seconds", Unit::Seconds, "One claim round trip to the store.");
    counter!("embed_ticks_total", "job" => "backup", "outcome" => "succeeded").increment(3);
    counter!("embed_ticks_total", "job" => "report", "outcome" => "skipped", "reason" => "overlap").increment(1);
    gauge!("embed_last_success_timestamp_seconds", "job" => "backup").set(1_700_000_000.0);
    histogram!("embed_claim_round_duration_seconds").record(0.004);
}

#[tokio::test]
async fn recorded_metrics_are_served_as_openmetrics_text_with_their_help() {
    let handle = install_prometheus().expect("no other recorder in this test process");
    assert!(install_prometheus().is_some(), "a second call returns the same handle");
    record();
    let dir = tempfile::tempdir().unwrap();
    let tokens = vec![Token::new("view", Role::Read, SECRET).unwrap()];
    let app = router(store(&dir).await, HttpOptions { tokens, prometheus: Some(handle), ..HttpOptions::default() });

    let (status, _, _) = get(app.clone(), None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, ty, text) = get(app, Some(SECRET)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert_eq!(ty, OPENMETRICS_CONTENT_TYPE);
    for expected in [
        "# HELP embed_ticks Ticks this node decided about, by job and outcome.\n# TYPE embed_ticks counter\n",
        "embed_ticks_total{job=\"backup\",outcome=\"succeeded\"} 3\n",
        "embed_ticks_total{job=\"report\",outcome=\"skipped\",reason=\"overlap\"} 1\n",
        "# HELP embed_last_success_timestamp_seconds Unix time of the last success.\n",
        "# UNIT embed_last_success_timestamp_seconds seconds\n",
        "embed_last_success_timestamp_seconds{job=\"backup\"} 1700000000.0\n",
        "# HELP embed_claim_round_duration_seconds One claim round trip to the store.\n",
        "# TYPE embed_claim_round_duration_seconds histogram\n",
        "embed_claim_round_duration_seconds_bucket{le=\"0.005\"} 1\n",
        "embed_claim_round_duration_seconds_count 1\n",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
    }
    assert!(text.ends_with("# EOF\n"), "{text}");
}

#[tokio::test]
async fn without_a_handle_metrics_answer_404() {
    let dir = tempfile::tempdir().unwrap();
    let (status, _, _) = get(router(store(&dir).await, HttpOptions::default()), None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}
