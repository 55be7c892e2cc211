//! The JSON contract every endpoint keeps, through the whole router on a real (SQLite) store:
//! a refused request is a problem that names the bad parameter once and says what it takes
//! in the user's terms, never in Rust's or serde's.

use solocron_core::SchemaStore;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use serde_json::Value;
use solocron_core::{Prefix, Store};
use solocron_http::{router, HttpOptions, Role, Token};
use tower::ServiceExt as _;

const OPS_SECRET: &str = "contract-test-ops-secret-0123";
const VIEW_SECRET: &str = "contract-test-view-secret-0123";

/// Words of Rust's and serde's that a problem meant for a person never holds.
const NOT_FOR_PEOPLE: &[&str] = &[
    "f64",
    "f32",
    "i64",
    "i32",
    "u64",
    "u32",
    "u16",
    "usize",
    "isize",
    "String",
    "Option<",
    "Vec<",
    "DateTime",
    "serde",
    "invalid type: ",
    "invalid digit",
    "invalid value: ",
    "unknown variant",
    "unknown field",
    "missing field",
    "duplicate field",
    "Failed to deserialize",
    "Invalid URL",
];

async fn store(dir: &tempfile::TempDir) -> Arc<dyn Store> {
    let url = format!("sqlite://{}", dir.path().join("solocron.db").display());
    let store = solocron_sqlite::SqliteStore::connect(&url, &Prefix::default()).await.expect("a SQLite store");
    store.migrate().await.expect("migrated");
    Arc::new(store)
}

async fn app(dir: &tempfile::TempDir) -> axum::Router {
    let tokens = vec![
        Token::new("ops", Role::Operate, OPS_SECRET).unwrap(),
        Token::new("viewer", Role::Read, VIEW_SECRET).unwrap(),
    ];
    router(store(dir).await, HttpOptions { tokens, allow_command_jobs: true, ..HttpOptions::default() })
}

/// Sends a request with the operate token: status, content type, body.
async fn send(
    app: &axum::Router,
    method: Method,
    uri: &str,
    body: Option<&str>,
    if_match: Option<&str>,
) -> (StatusCode, String, String) {
    let mut req =
        Request::builder().method(method).uri(uri).header(header::AUTHORIZATION, format!("Bearer {OPS_SECRET}"));
    if let Some(v) = if_match {
        req = req.header(header::IF_MATCH, v);
    }
    let body = body.map_or(Body::empty(), |b| Body::from(b.to_owned()));
    let res = app.clone().oneshot(req.body(body).unwrap()).await.unwrap();
    let status = res.status();
    let ty = res.headers().get(header::CONTENT_TYPE).map(|v| v.to_str().unwrap().to_owned()).unwrap_or_default();
    let bytes = axum::body::to_bytes(res.into_body(), 1 << 20).await.unwrap();
    (status, ty, String::from_utf8(bytes.to_vec()).unwrap())
}

/// How often `word` stands in `text` as a word of its own (not inside a longer name).
fn occurrences(text: &str, word: &str) -> usize {
    let is_name = |c: char| c.is_alphanumeric() || c == '_';
    text.match_indices(word)
        .filter(|(i, _)| {
            let before = text[..*i].chars().next_back();
            let after = text[i + word.len()..].chars().next();
            !before.is_some_and(is_name) && !after.is_some_and(is_name)
        })
        .count()
}

/// Asserts a 400 problem naming `param` once, at its start, in words a person reads.
fn assert_names_once(what: &str, (status, ty, text): (StatusCode, String, String), param: &str) -> String {
    assert_eq!(status, StatusCode::BAD_REQUEST, "{what}: {text}");
    assert_eq!(ty, "application/problem+json", "{what}");
    let p: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(p["param"], param, "{what}: {p}");
    let detail = p["detail"].as_str().unwrap();
    assert!(detail.starts_with(&format!("{param}: ")), "{what}: {detail}");
    assert_eq!(occurrences(detail, param), 1, "{what}: the parameter named more than once: {detail}");
    for word in NOT_FOR_PEOPLE {
        assert!(!detail.contains(word), "{what}: `{word}` in {detail}");
    }
    detail.to_owned()
}

#[tokio::test]
async fn every_bad_query_parameter_is_named_once_with_what_it_takes() {
    let dir = tempfile::tempdir().unwrap();
    let app = app(&dir).await;
    // (request, the parameter at fault, what the detail says after it)
    let cases: &[(&str, &str, &str)] = &[
        ("/api/v1/jobs?limit=abc", "limit", r#"must be a whole number from 1 to 200, got "abc""#),
        ("/api/v1/jobs?limit=0", "limit", r#"must be a whole number from 1 to 200, got "0""#),
        ("/api/v1/jobs?limit=201", "limit", r#"must be a whole number from 1 to 200, got "201""#),
        ("/api/v1/jobs?limit=-1", "limit", "must be a whole number from 1 to 200"),
        ("/api/v1/jobs?limit=1.5", "limit", "must be a whole number from 1 to 200"),
        ("/api/v1/jobs?limit=99999999999999999999999", "limit", "must be a whole number from 1 to 200"),
        ("/api/v1/jobs?state=done", "state", r#"must be one of paused, active, running, stale, drift, got "done""#),
        ("/api/v1/jobs?namespace=Bad!", "namespace", r#"must be 1 to 63 characters"#),
        ("/api/v1/jobs?limt=3", "limt", "is not a parameter of this endpoint, which takes search, state"),
        ("/api/v1/jobs?limit=1&limit=2", "limit", "is given more than once"),
        ("/api/v1/jobs/tick/revisions?limit=abc", "limit", "must be a whole number from 1 to 1000"),
        ("/api/v1/jobs/tick/revisions?limit=1001", "limit", "must be a whole number from 1 to 1000"),
        ("/api/v1/jobs/tick/revisions?job=tick", "job", "is not a parameter of this endpoint, which takes limit"),
        ("/api/v1/runs?limit=abc", "limit", "must be a whole number from 1 to 500"),
        ("/api/v1/runs?limit=501", "limit", "must be a whole number from 1 to 500"),
        ("/api/v1/runs?state=done", "state", "must be one of running, succeeded, failed, timed_out"),
        ("/api/v1/runs?namespace=-x", "namespace", "must be 1 to 63 characters"),
        (
            "/api/v1/runs?since=yesterday",
            "since",
            r#"must be an RFC 3339 instant such as 2026-01-31T09:00:00Z, got "yesterday""#,
        ),
        ("/api/v1/runs?since=2026-01-31T09:00:00+01:00", "since", "(send a `+` as %2B)"),
        ("/api/v1/runs?until=soon", "until", "must be an RFC 3339 instant"),
        ("/api/v1/runs?cursor=yesterday", "cursor", "must be an RFC 3339 instant"),
        ("/api/v1/runs?nodes=n1", "nodes", "is not a parameter of this endpoint"),
        ("/api/v1/actions?limit=abc", "limit", "must be a whole number from 1 to 500"),
        ("/api/v1/actions?limit=0", "limit", "must be a whole number from 1 to 500"),
        ("/api/v1/actions?kind=pause", "kind", "is not a parameter of this endpoint, which takes job, limit"),
    ];
    for (uri, param, says) in cases {
        let detail = assert_names_once(uri, send(&app, Method::GET, uri, None, None).await, param);
        assert!(detail.contains(says), "{uri}: {detail:?} does not say {says:?}");
    }
}

#[tokio::test]
async fn every_bad_body_field_is_named_once_with_its_json_type() {
    let dir = tempfile::tempdir().unwrap();
    let app = app(&dir).await;
    // (path, body, the field at fault, what the detail says after it)
    let cases: &[(&str, &str, &str, &str)] = &[
        ("/api/v1/jobs/tick/pause", r#"{"reason": 5}"#, "reason", "must be a string or null, got 5"),
        (
            "/api/v1/jobs/tick/pause",
            r#"{"reson": "x"}"#,
            "reson",
            "is not a field of this endpoint, which takes reason",
        ),
        ("/api/v1/jobs/tick/pause", "[null]", "body", "must be a JSON object, got an array"),
        ("/api/v1/jobs/tick/pause", "reason=x", "body", "must be JSON"),
        (
            "/api/v1/jobs/tick/resume",
            r#"{"reason": {"why": "x"}}"#,
            "reason",
            "must be a string or null, got an object",
        ),
        ("/api/v1/jobs/tick/unlock", "{}", "reason", "is missing; it must be a non-empty string"),
        ("/api/v1/jobs/tick/unlock", r#"{"reason": ""}"#, "reason", r#"must be a non-empty string, got """#),
        ("/api/v1/jobs/tick/unlock", r#"{"reason": "  "}"#, "reason", "must not be blank"),
        ("/api/v1/jobs/tick/unlock", r#"{"reason": ["a"]}"#, "reason", "must be a non-empty string, got an array"),
        (
            "/api/v1/jobs/tick/trigger",
            r#"{"wait_seconds": "soon"}"#,
            "wait_seconds",
            r#"must be a whole number from 0 to 3600 or null, got "soon""#,
        ),
        ("/api/v1/jobs/tick/trigger", r#"{"wait_seconds": 1.5}"#, "wait_seconds", "got 1.5"),
        ("/api/v1/jobs/tick/trigger", r#"{"wait_seconds": 3601}"#, "wait_seconds", "got 3601"),
        ("/api/v1/jobs/tick/trigger", r#"{"wait_seconds": -1}"#, "wait_seconds", "got -1"),
        ("/api/v1/jobs/tick/trigger", r#"{"reason": true}"#, "reason", "must be a string or null, got true"),
    ];
    for (path, body, param, says) in cases {
        let what = format!("POST {path} {body}");
        let detail = assert_names_once(&what, send(&app, Method::POST, path, Some(body), None).await, param);
        assert!(detail.contains(says), "{what}: {detail:?} does not say {says:?}");
    }
    let put = send(&app, Method::PUT, "/api/v1/jobs/hook", Some(r#""text""#), None).await;
    assert_names_once("PUT a string", put, "body");
    let put = send(&app, Method::PUT, "/api/v1/jobs/hook", Some("{}"), Some("seven")).await;
    let detail = assert_names_once("PUT If-Match: seven", put, "If-Match");
    assert!(detail.contains(r#"such as "7""#) && detail.ends_with(r#"got "seven""#), "{detail}");
    let names = [
        ("a%20b", "contains a space"),
        ("a%40b", "contains `@`"),
        ("Bad!%2Fx", "has a wrong namespace part"),
        ("default%2Fx", "the namespace `default` is written without a prefix"),
        ("x%2F", "nothing follows the `/`"),
    ];
    for (name, says) in names {
        let put = send(&app, Method::PUT, &format!("/api/v1/jobs/{name}"), Some("{}"), None).await;
        let detail = assert_names_once(&format!("PUT {name}"), put, "job");
        assert!(detail.contains(says), "{detail}");
        // No managed job has such a name: a delete answers 404, as it always did.
        let (status, _, _) = send(&app, Method::DELETE, &format!("/api/v1/jobs/{name}"), None, None).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "DELETE {name}");
    }
    let bad_segment = send(&app, Method::GET, "/api/v1/jobs/%FF", None, None).await;
    assert_names_once("a job name not UTF-8", bad_segment, "job");
}

#[test]
fn the_document_states_the_bounds_the_code_keeps() {
    let doc: Value = serde_json::from_str(&solocron_http::openapi_json()).unwrap();
    let limit_max = |path: &str| {
        let params = doc["paths"][path]["get"]["parameters"].as_array().unwrap();
        let limit = params.iter().find(|p| p["name"] == "limit").unwrap_or_else(|| panic!("{path} has no limit"));
        limit["schema"]["maximum"].as_u64().unwrap() as usize
    };
    assert_eq!(limit_max("/api/v1/jobs"), solocron_fleet::JOBS_PAGE_MAX);
    assert_eq!(limit_max("/api/v1/runs"), solocron_fleet::RUNS_PAGE_MAX);
    assert_eq!(limit_max("/api/v1/jobs/{job}/revisions"), solocron_core::REVISIONS_PAGE_MAX);
    assert_eq!(limit_max("/api/v1/actions"), solocron_http::ACTIONS_PAGE_MAX);
    let wait = &doc["components"]["schemas"]["TriggerBody"]["properties"]["wait_seconds"]["maximum"];
    assert_eq!(wait.as_u64(), Some(solocron_fleet::TRIGGER_WAIT_MAX.as_secs()));
}

/// The schema a GET answers with 200, its `$ref`s followed (`allOf`: its first part, the
/// envelope a list extends).
fn answer_schema<'a>(doc: &'a Value, path: &str) -> &'a Value {
    let mut schema = &doc["paths"][path]["get"]["responses"]["200"]["content"]["application/json"]["schema"];
    loop {
        if let Some(name) = schema["$ref"].as_str() {
            schema = &doc["components"]["schemas"][name.trim_start_matches("#/components/schemas/")];
        } else if let Some(first) = schema["allOf"].get(0) {
            schema = first;
        } else {
            return schema;
        }
    }
}

#[tokio::test]
async fn every_list_answers_one_envelope() {
    let doc: Value = serde_json::from_str(&solocron_http::openapi_json()).unwrap();
    let lists = ["/api/v1/jobs", "/api/v1/runs", "/api/v1/nodes", "/api/v1/actions", "/api/v1/jobs/{job}/revisions"];
    for (path, item) in doc["paths"].as_object().unwrap() {
        let Some(get) = item.get("get") else { continue };
        let schema = answer_schema(&doc, path);
        // A bare array is a list outside the envelope: a new list must answer a `Page`.
        assert_ne!(schema["type"], "array", "GET {path} answers a bare array");
        if !lists.contains(&path.as_str()) {
            continue;
        }
        assert_eq!(schema["required"], serde_json::json!(["items", "next_cursor"]), "GET {path}: {schema}");
        assert_eq!(schema["properties"]["items"]["type"], "array", "GET {path}");
        let item = &schema["properties"]["items"]["items"]["$ref"];
        assert!(item.as_str().is_some_and(|r| r.starts_with("#/components/schemas/")), "GET {path}: items {item}");
        assert!(get["responses"]["200"].is_object());
    }

    let dir = tempfile::tempdir().unwrap();
    let app = app(&dir).await;
    for path in ["/api/v1/jobs", "/api/v1/runs", "/api/v1/nodes", "/api/v1/actions", "/api/v1/jobs/tick/revisions"] {
        let (status, _, text) = send(&app, Method::GET, path, None, None).await;
        assert_eq!(status, StatusCode::OK, "{path}: {text}");
        let page: Value = serde_json::from_str(&text).unwrap();
        assert!(page["items"].is_array() && page["next_cursor"].is_null(), "{path}: {page}");
    }
}

/// `GET /readyz` with this `Authorization` header: status and body.
async fn readyz(app: &axum::Router, authorization: Option<&str>) -> (StatusCode, String) {
    let mut req = Request::get("/readyz");
    if let Some(a) = authorization {
        req = req.header(header::AUTHORIZATION, a);
    }
    let res = app.clone().oneshot(req.body(Body::empty()).unwrap()).await.unwrap();
    let status = res.status();
    let bytes = axum::body::to_bytes(res.into_body(), 1 << 16).await.unwrap();
    (status, String::from_utf8(bytes.to_vec()).unwrap())
}

#[tokio::test]
async fn readyz_names_the_store_only_to_a_holder_of_a_token() {
    let dir = tempfile::tempdir().unwrap();
    let where_ = dir.path().display().to_string();
    let app = app(&dir).await;
    for anonymous in [None, Some("Bearer not-a-token-of-this-server"), Some("Basic b3BzOnNlY3JldA==")] {
        let (status, body) = readyz(&app, anonymous).await;
        // A probe's question: answered (never 401), and with nothing of where the store is.
        assert_eq!((status, body.as_str()), (StatusCode::OK, r#"{"status":"ready"}"#), "{anonymous:?}");
        assert!(!body.contains("sqlite") && !body.contains(&where_), "{body}");
    }
    for secret in [VIEW_SECRET, OPS_SECRET] {
        let (status, body) = readyz(&app, Some(&format!("Bearer {secret}"))).await;
        assert_eq!(status, StatusCode::OK);
        let ready: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(ready["status"], "ready");
        assert!(ready["store"].as_str().is_some_and(|s| s.starts_with("sqlite://") && s.contains(&where_)), "{body}");
    }
    // Without tokens configured, no one holds one: ready or not, and nothing more.
    let open = router(store(&dir).await, HttpOptions::default());
    assert_eq!(readyz(&open, None).await, (StatusCode::OK, r#"{"status":"ready"}"#.to_owned()));
}

/// Whether a schema is (or is one of) a `$ref`, which the checks of values do not follow.
fn refers(schema: &Value) -> bool {
    let alternatives = schema["oneOf"].as_array().into_iter().chain(schema["anyOf"].as_array()).flatten();
    schema["$ref"].is_string() || alternatives.into_iter().any(|s| s["$ref"].is_string())
}

#[test]
fn every_checked_value_has_its_schema_inline() {
    let doc: Value = serde_json::from_str(&solocron_http::openapi_json()).unwrap();
    let component = |r: &Value| {
        doc["components"]["schemas"][r.as_str().unwrap().trim_start_matches("#/components/schemas/")].clone()
    };
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            for p in op["parameters"].as_array().into_iter().flatten().filter(|p| p["in"] == "query") {
                assert!(!refers(&p["schema"]), "{method} {path} ?{}: {}", p["name"], p["schema"]);
            }
            // A job's definition is checked by `solocron-spec` (its keys in the checker's
            // words), not by the extractor: its document schema may nest `HttpSpec`.
            if path == "/api/v1/jobs/{job}" && method == "put" {
                continue;
            }
            let body = &op["requestBody"]["content"]["application/json"]["schema"];
            let alternatives = body["oneOf"].as_array().into_iter().flatten();
            let Some(named) = [body].into_iter().chain(alternatives).find_map(|s| s.get("$ref")) else { continue };
            let schema = component(named);
            for (field, property) in schema["properties"].as_object().into_iter().flatten() {
                assert!(!refers(property), "{method} {path} body field {field}: {property}");
            }
        }
    }
}
