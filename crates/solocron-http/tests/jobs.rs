//! Managed jobs through the router alone, as a service embedding the library mounts it (no
//! CLI, no checker handed in): a job write is checked by `solocron-spec`, refused at its
//! key, and kept as the spec's JSON form; the OpenAPI document shows the body as a
//! `JobSpec` with every key of a `[[jobs]]` entry.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use serde_json::{json, Value};
use solocron_core::{Prefix, SchemaStore, Store};
use solocron_http::{router, HttpOptions, Role, Token};
use tower::ServiceExt as _;

const SECRET: &str = "jobs-test-secret-0123456789";

async fn store(dir: &tempfile::TempDir) -> Arc<dyn Store> {
    let url = format!("sqlite://{}", dir.path().join("solocron.db").display());
    let store = solocron_sqlite::SqliteStore::connect(&url, &Prefix::default()).await.expect("a SQLite store");
    store.migrate().await.expect("migrated");
    Arc::new(store)
}

fn router_of(store: Arc<dyn Store>, allow_command_jobs: bool) -> axum::Router {
    let tokens = vec![Token::new("ops", Role::Operate, SECRET).unwrap()];
    router(store, HttpOptions { tokens, allow_command_jobs, ..HttpOptions::default() })
}

/// `PUT /api/v1/jobs/{job}` with `body`: the status and the answer.
async fn put(app: &axum::Router, job: &str, body: &Value) -> (StatusCode, Value) {
    let req = Request::put(format!("/api/v1/jobs/{job}"))
        .header(header::AUTHORIZATION, format!("Bearer {SECRET}"))
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_string()))
        .unwrap();
    let res = app.clone().oneshot(req).await.unwrap();
    let status = res.status();
    let bytes = axum::body::to_bytes(res.into_body(), 1 << 20).await.unwrap();
    (status, serde_json::from_slice(&bytes).unwrap())
}

#[tokio::test]
async fn a_router_without_the_cli_writes_a_managed_job_checked_at_its_keys() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(&dir).await;
    let app = router_of(store.clone(), false);
    let body = json!({
        "schedule": "0 */15 * * * *",
        "on_crash": "retry",
        "http": {"url": "https://billing.internal/jobs/send-invoices", "headers_env": {"Authorization": "BILLING_TOKEN"}}
    });
    let (status, written) = put(&app, "billing%2Fsend-invoices", &body).await;
    assert_eq!((status, written["outcome"].as_str()), (StatusCode::OK, Some("created")), "{written}");
    let kept = store.managed_jobs().await.unwrap();
    assert_eq!(kept.len(), 1);
    assert_eq!(kept[0].spec, body.to_string(), "the definition's JSON form: its keys, sorted");
    let (status, again) = put(&app, "billing%2Fsend-invoices", &body).await;
    assert_eq!((status, again["outcome"].as_str()), (StatusCode::OK, Some("unchanged")), "{again}");

    let refused = [
        (
            json!({"schedule": "@hourly", "http": {"url": "ftp://x"}}),
            "http.url",
            "`ftp://x` must start with http:// or https://",
        ),
        (
            json!({"schedule": "@hourly", "http": {"url": "https://x"}, "lese": "10s"}),
            "lese",
            "unknown key; did you mean `lease`?",
        ),
        (
            json!({"schedule": "@hourly", "http": {"url": "https://x"}, "lease": "10ms"}),
            "lease",
            "must be between 500ms and 24h",
        ),
        (
            json!({"schedule": "@hourly", "http": {"url": "https://x"}, "retry": {"attempts": "3"}}),
            "retry.attempts",
            "must be a whole number",
        ),
        (
            json!({"schedule": "@hourly", "command": ["/bin/true"]}),
            "command",
            "command jobs are refused through the API",
        ),
        (json!({"name": "other", "schedule": "@hourly", "http": {"url": "https://x"}}), "name", "is the job's name"),
    ];
    for (body, key, words) in refused {
        let (status, problem) = put(&app, "sync", &body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {problem}");
        assert_eq!(problem["param"], key, "{body}: {problem}");
        assert!(problem["detail"].as_str().unwrap().starts_with(&format!("{key}: {words}")), "{body}: {problem}");
    }

    let commands = router_of(store.clone(), true);
    let (status, written) = put(&commands, "backup", &json!({"schedule": "@daily", "command": ["/bin/true"]})).await;
    assert_eq!((status, written["outcome"].as_str()), (StatusCode::OK, Some("created")), "{written}");
}

/// The keys `T` deserializes, from serde's own refusal of an unknown one.
fn keys_of<T: serde::de::DeserializeOwned + std::fmt::Debug>() -> Vec<String> {
    let e = serde_json::from_str::<T>(r#"{"?": 1}"#).unwrap_err().to_string();
    let mut keys: Vec<String> = e.split('`').skip(3).step_by(2).map(str::to_owned).collect();
    keys.sort();
    keys
}

#[test]
fn the_openapi_document_shows_a_job_write_as_a_job_spec_with_every_key() {
    let doc: Value = serde_json::from_str(&solocron_http::openapi_json()).unwrap();
    let body = &doc["paths"]["/api/v1/jobs/{job}"]["put"]["requestBody"]["content"]["application/json"]["schema"];
    assert_eq!(body["$ref"], "#/components/schemas/JobSpec", "{body}");
    let schemas = &doc["components"]["schemas"];
    for (name, keys) in [
        ("JobSpec", keys_of::<solocron_spec::JobSpec>()),
        ("HttpSpec", keys_of::<solocron_spec::HttpSpec>()),
        ("RetrySpec", keys_of::<solocron_spec::RetrySpec>()),
    ] {
        let properties: Vec<String> = schemas[name]["properties"].as_object().unwrap().keys().cloned().collect();
        assert_eq!(properties, keys, "{name}");
        for (key, property) in schemas[name]["properties"].as_object().unwrap() {
            assert!(property["description"].as_str().is_some_and(|d| !d.is_empty()), "{name}.{key}: {property}");
        }
    }
    assert_eq!(keys_of::<solocron_spec::JobSpec>().len(), 16);
    let put = &doc["paths"]["/api/v1/jobs/{job}"]["put"]["responses"];
    assert!(put.get("501").is_none(), "a job write is never unimplemented: {put}");
}
