//! The HTTP API against a real `solocron run --http` daemon on each store: every endpoint,
//! every action and its audit record, auth (no token, a wrong one, a read token acting),
//! the bounds, and no secret in any answer or log.
#![forbid(unsafe_code)]

mod common;

use std::time::Duration;

use common::*;
use reqwest::blocking::{Client, RequestBuilder, Response};
use serde_json::{json, Value};
#[cfg(feature = "etcd")]
use solocron_conformance::server::ETCD;
use solocron_conformance::server::{MYSQL, POSTGRES, REDIS};

const OPS_SECRET: &str = "ops-secret-0123456789";
const VIEW_SECRET: &str = "viewer-secret-0123456789";

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A daemon with three jobs (every second; a long one; one that never fires by itself)
/// serving HTTP with an operate and a read token.
struct Api {
    fleet: Fleet,
    base: String,
    http: Client,
}

impl Api {
    fn start(store: Option<&str>) -> Api {
        let port = free_port();
        let jobs = format!(
            r#"[[jobs]]
name = "tick"
schedule = "* * * * * *"
command = ["/bin/sh", "-c", "echo tick"]

[[jobs]]
name = "slow"
schedule = "0 0 1 1 *"
lease = "3s"
command = ["/bin/sh", "-c", "sleep 60"]

[[jobs]]
name = "manual"
schedule = "0 0 1 1 *"
command = ["/bin/sh", "-c", "echo manual run"]

[http]
listen = "127.0.0.1:{port}"

[[http.tokens]]
name = "ops"
role = "operate"
token_env = "SOLOCRON_TEST_OPS"

[[http.tokens]]
name = "viewer"
role = "read"
token_file = "$DIR/viewer.token"
"#
        );
        let mut fleet = Fleet::on(store, &jobs);
        std::fs::write(fleet.path("viewer.token"), format!("{VIEW_SECRET}\n")).unwrap();
        std::env::set_var("SOLOCRON_TEST_OPS", OPS_SECRET);
        fleet.start("api-node");
        let _ = rustls::crypto::ring::default_provider().install_default();
        let api = Api { fleet, base: format!("http://127.0.0.1:{port}"), http: Client::new() };
        wait_for(Duration::from_secs(30), || api.http.get(api.url("/healthz")).send().ok())
            .unwrap_or_else(|| panic!("the daemon never served HTTP: {}", api.fleet.log("api-node")));
        api
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    fn get(&self, path: &str, secret: Option<&str>) -> Response {
        self.send(self.http.get(self.url(path)), secret)
    }

    fn post(&self, path: &str, secret: Option<&str>, body: Value) -> Response {
        self.send(self.http.post(self.url(path)).json(&body), secret)
    }

    fn send(&self, req: RequestBuilder, secret: Option<&str>) -> Response {
        let req = match secret {
            Some(s) => req.bearer_auth(s),
            None => req,
        };
        req.timeout(Duration::from_secs(30)).send().unwrap()
    }

    /// GETs `path` with the read token, expecting 200 and JSON.
    fn read(&self, path: &str) -> Value {
        let r = self.get(path, Some(VIEW_SECRET));
        let status = r.status();
        let text = r.text().unwrap();
        assert_eq!(status, 200, "GET {path}: {text}");
        assert!(!text.contains(OPS_SECRET) && !text.contains(VIEW_SECRET), "a secret in GET {path}");
        serde_json::from_str(&text).unwrap()
    }
}

/// Asserts an RFC 9457 problem with this status; returns it.
fn problem(r: Response, status: u16) -> Value {
    let got = r.status();
    let ct = r.headers().get("content-type").map(|v| v.to_str().unwrap().to_owned()).unwrap_or_default();
    let text = r.text().unwrap();
    assert_eq!(got, status, "{text}");
    assert_eq!(ct, "application/problem+json", "{text}");
    let p: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(p["status"], status);
    assert!(p["detail"].as_str().is_some_and(|d| !d.is_empty()), "{p}");
    p
}

fn auth_is_required_and_roles_hold(api: &Api) {
    problem(api.get("/api/v1/jobs", None), 401);
    problem(api.get("/api/v1/jobs", Some("not-a-token-at-all")), 401);
    problem(api.get("/metrics", None), 401);
    let p = problem(api.post("/api/v1/jobs/manual/trigger", Some(VIEW_SECRET), json!({})), 403);
    assert!(p["detail"].as_str().unwrap().contains("operate"), "{p}");
    assert_eq!(api.read("/api/v1/whoami"), json!({"name": "viewer", "role": "read", "can_act": false}));
    // Health and the OpenAPI document hold no data: no token needed.
    assert_eq!(api.get("/healthz", None).status(), 200);
    // Readiness to a probe (no token): ready or not, nothing of where the store is.
    let r = api.get("/readyz", None);
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().unwrap(), json!({"status": "ready"}));
    let r = api.get("/readyz", Some("not-a-token-at-all"));
    assert_eq!(r.json::<Value>().unwrap(), json!({"status": "ready"}), "a wrong token is told no more");
    let told = api.read("/readyz");
    assert_eq!(told["status"], "ready");
    assert!(told["store"].as_str().is_some_and(|s| s.contains("://")), "a token holder is told the store: {told}");
    let doc: Value = api.get("/api/v1/openapi.json", None).json().unwrap();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3.1"), "{}", doc["openapi"]);
    assert!(doc["paths"]["/api/v1/jobs/{job}/trigger"]["post"].is_object());
}

fn jobs_list_and_detail(api: &Api) {
    let page = api.read("/api/v1/jobs");
    let names: Vec<&str> = page["items"].as_array().unwrap().iter().map(|j| j["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["manual", "slow", "tick"]);
    assert_eq!(page["total"], 3);
    assert_eq!(page["namespaces"], json!(["default"]));
    assert!(page["next_cursor"].is_null(), "{page}");
    let tick = &page["items"][2];
    assert_eq!(tick["schedule"], "* * * * * *");
    assert_eq!(tick["timezone"], "UTC");
    assert!(tick["next_fire"].is_string() && tick["schedule_words"].is_string(), "{tick}");
    assert!(tick["declared_in"].as_str().unwrap().ends_with("solocron.toml"));
    // Paging by cursor, and search.
    let first = api.read("/api/v1/jobs?limit=2");
    assert_eq!(first["items"].as_array().unwrap().len(), 2);
    let next = first["next_cursor"].as_str().unwrap();
    let second = api.read(&format!("/api/v1/jobs?limit=2&cursor={next}"));
    assert_eq!(second["items"][0]["name"], "tick");
    assert!(second["next_cursor"].is_null());
    assert_eq!(api.read("/api/v1/jobs?search=SLO")["items"][0]["name"], "slow");
    // tick has run by now (every second): its detail shows runs and counts.
    let got = wait_for(Duration::from_secs(20), || {
        let d = api.read("/api/v1/jobs/tick");
        d["counts_24h"]["succeeded"].as_u64().filter(|n| *n >= 2).map(|_| d)
    });
    let detail = got.expect("tick never succeeded twice");
    assert_eq!(detail["next_fires"].as_array().unwrap().len(), 5);
    assert_eq!(detail["registrations"][0]["node"], "api-node");
    assert_eq!(detail["last_run"]["state"], "succeeded");
    assert!(!detail["recent"].as_array().unwrap().is_empty());
    problem(api.get("/api/v1/jobs/nope", Some(VIEW_SECRET)), 404);
}

fn trigger_waits_for_the_run_and_is_audited(api: &Api) {
    let r = api.post("/api/v1/jobs/manual/trigger", Some(OPS_SECRET), json!({"reason": "check", "wait_seconds": 20}));
    assert_eq!(r.status(), 200);
    let answer: Value = r.json().unwrap();
    assert_eq!(answer["state"], "succeeded", "{answer}");
    assert_eq!(answer["run"]["trigger"], "manual");
    let id = answer["run_id"].as_str().unwrap();
    let run = api.read(&format!("/api/v1/runs/{}", id.replace('#', "%23")));
    assert_eq!(run["run"]["state"], "succeeded");
    assert!(run["output"].as_str().unwrap().contains("manual run"));
    assert_eq!(run["attempts"].as_array().unwrap().len(), 1);
    // Without a wait: 202, requested.
    let r = api.post("/api/v1/jobs/manual/trigger", Some(OPS_SECRET), json!({}));
    assert_eq!(r.status(), 202);
    assert_eq!(r.json::<Value>().unwrap()["state"], "requested");
}

fn pause_and_resume_are_audited(api: &Api) {
    let a: Value =
        api.post("/api/v1/jobs/tick/pause", Some(OPS_SECRET), json!({"reason": "maintenance"})).json().unwrap();
    assert_eq!(
        (a["kind"].as_str(), a["by"].as_str(), a["reason"].as_str()),
        (Some("pause"), Some("ops"), Some("maintenance"))
    );
    let tick = api.read("/api/v1/jobs/tick");
    assert_eq!(tick["paused"]["by"], "ops");
    assert_eq!(tick["paused"]["reason"], "maintenance");
    assert_eq!(api.read("/api/v1/jobs?state=paused")["items"][0]["name"], "tick");
    let a: Value = api.post("/api/v1/jobs/tick/resume", Some(OPS_SECRET), json!({"reason": "done"})).json().unwrap();
    assert_eq!(a["kind"], "resume");
    assert!(api.read("/api/v1/jobs/tick")["paused"].is_null());
}

fn unlock_ends_a_running_run(api: &Api) {
    let r = api.post("/api/v1/jobs/slow/trigger", Some(OPS_SECRET), json!({}));
    assert_eq!(r.status(), 202);
    wait_for(Duration::from_secs(20), || {
        api.read("/api/v1/jobs/slow")["running"].as_array().filter(|r| !r.is_empty()).cloned()
    })
    .expect("slow never ran");
    problem(api.post("/api/v1/jobs/slow/unlock", Some(OPS_SECRET), json!({"reason": ""})), 400);
    let ended: Value =
        api.post("/api/v1/jobs/slow/unlock", Some(OPS_SECRET), json!({"reason": "stuck"})).json().unwrap();
    let id = ended["ended"][0].as_str().expect("one run ended").to_owned();
    let run = api.read(&format!("/api/v1/runs/{}", id.replace('#', "%23")));
    assert_eq!(run["run"]["state"], "abandoned");
    assert!(run["run"]["reason"].as_str().unwrap().contains("stuck"), "{run}");
    let actions = api.read("/api/v1/actions?job=slow");
    assert!(actions["next_cursor"].is_null(), "{actions}");
    let newest = &actions["items"][0];
    assert_eq!(newest["kind"], "unlock");
    assert_eq!(newest["by"], "ops");
    assert!(newest["detail"].as_str().unwrap().contains(&id), "{actions}");
}

fn runs_page_without_gaps_or_repeats(api: &Api) {
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..50 {
        let path = match &cursor {
            Some(c) => format!("/api/v1/runs?job=tick&limit=2&cursor={c}"),
            None => "/api/v1/runs?job=tick&limit=2".to_owned(),
        };
        let page = api.read(&path);
        seen.extend(page["items"].as_array().unwrap().iter().map(|r| r["id"].as_str().unwrap().to_owned()));
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => break,
        }
    }
    let mut unique = seen.clone();
    unique.dedup();
    assert_eq!(unique.len(), seen.len(), "a run repeated across pages: {seen:?}");
    assert!(seen.len() >= 2, "{seen:?}");
    let all = api.read("/api/v1/runs?job=tick&limit=500");
    let ids: Vec<&str> = all["items"].as_array().unwrap().iter().map(|r| r["id"].as_str().unwrap()).collect();
    assert!(seen.iter().all(|s| ids.contains(&s.as_str())));
}

/// Asserts a 400 problem naming `param` once, at its start, saying `says` after it, in no
/// words of Rust's or serde's.
fn names_once(r: Response, param: &str, says: &str) {
    let p = problem(r, 400);
    assert_eq!(p["param"], param, "{p}");
    let detail = p["detail"].as_str().unwrap();
    assert_eq!(detail, format!("{param}: {says}"));
    for word in ["f64", "i64", "u32", "u64", "usize", "String", "Option<", "serde", "invalid type: "] {
        assert!(!detail.contains(word), "`{word}` in {detail}");
    }
}

fn bad_input_names_the_parameter(api: &Api) {
    let get = |path: &str| api.get(path, Some(VIEW_SECRET));
    names_once(get("/api/v1/runs?limit=abc"), "limit", r#"must be a whole number from 1 to 500, got "abc""#);
    names_once(get("/api/v1/jobs?limit=0"), "limit", r#"must be a whole number from 1 to 200, got "0""#);
    let states = "running, succeeded, failed, timed_out, lost, abandoned, skipped, interrupted, waiting";
    names_once(get("/api/v1/runs?state=done"), "state", &format!(r#"must be one of {states}, got "done""#));
    let instant = "must be an RFC 3339 instant such as 2026-01-31T09:00:00Z";
    names_once(get("/api/v1/runs?cursor=yesterday"), "cursor", &format!(r#"{instant}, got "yesterday""#));
    names_once(get("/api/v1/runs?since=soon"), "since", &format!(r#"{instant}, got "soon""#));
    names_once(get("/api/v1/actions?limit=501"), "limit", r#"must be a whole number from 1 to 500, got "501""#);
    names_once(
        get("/api/v1/jobs/tick/revisions?limit=x"),
        "limit",
        r#"must be a whole number from 1 to 1000, got "x""#,
    );
    names_once(
        get("/api/v1/jobs?limt=3"),
        "limt",
        "is not a parameter of this endpoint, which takes search, state, namespace, cursor, limit",
    );
    // An id that is not a run id names no run.
    problem(api.get("/api/v1/runs/not-a-run-id", Some(VIEW_SECRET)), 404);
    let long = "x".repeat(5000);
    problem(api.get(&format!("/api/v1/jobs?search={long}"), Some(VIEW_SECRET)), 414);
    let big = json!({"reason": "y".repeat(10_000)});
    problem(api.post("/api/v1/jobs/tick/pause", Some(OPS_SECRET), big), 400);
    problem(api.post("/api/v1/jobs/tick/pause", Some(OPS_SECRET), json!({"reson": "typo"})), 400);
    problem(api.post("/api/v1/jobs/tick/pause", Some(OPS_SECRET), json!([null])), 400);
    let trigger = |body| api.post("/api/v1/jobs/tick/trigger", Some(OPS_SECRET), body);
    let wait = "must be a whole number from 0 to 3600 or null, got";
    names_once(trigger(json!({"wait_seconds": 1.5})), "wait_seconds", &format!("{wait} 1.5"));
    names_once(trigger(json!({"wait_seconds": 3601})), "wait_seconds", &format!("{wait} 3601"));
    names_once(trigger(json!({"wait_seconds": "soon"})), "wait_seconds", &format!(r#"{wait} "soon""#));
    names_once(trigger(json!({"reason": 5})), "reason", "must be a string or null, got 5");
    let unlock = api.post("/api/v1/jobs/slow/unlock", Some(OPS_SECRET), json!({}));
    names_once(unlock, "reason", "is missing; it must be a non-empty string");
}

fn nodes_and_metrics(api: &Api) {
    let nodes = api.read("/api/v1/nodes");
    assert!(nodes["next_cursor"].is_null(), "{nodes}");
    let me = nodes["items"].as_array().unwrap().iter().find(|n| n["node"] == "api-node").expect("the node is listed");
    assert_eq!(me["liveness"], "alive");
    assert_eq!(me["jobs"], 3);
    let m = api.get("/metrics", Some(VIEW_SECRET));
    assert_eq!(m.status(), 200);
    let text = m.text().unwrap();
    assert!(text.contains("solocron_ticks_total"), "{text}");
}

/// PUT of a managed job's definition, with an optional `If-Match` revision.
fn put(api: &Api, job: &str, secret: &str, if_match: Option<&str>, body: Value) -> Response {
    let req = api.http.put(api.url(&format!("/api/v1/jobs/{job}"))).json(&body);
    let req = match if_match {
        Some(r) => req.header("If-Match", r),
        None => req,
    };
    api.send(req, Some(secret))
}

fn managed_jobs_are_written_checked_and_picked_up(api: &Api) {
    let every_second =
        json!({"schedule": "* * * * * *", "http": {"url": "http://127.0.0.1:9/nowhere", "timeout": "1s"}});
    problem(put(api, "hook", VIEW_SECRET, None, every_second.clone()), 403);
    let created: Value = put(api, "hook", OPS_SECRET, None, every_second.clone()).json().unwrap();
    assert_eq!(created["outcome"], "created", "{created}");
    let r1 = created["revision"].as_u64().unwrap();
    let detail = api.read("/api/v1/jobs/hook");
    assert_eq!(detail["managed"]["revision"], r1, "{detail}");
    assert_eq!(detail["managed"]["changed_by"], "ops");
    assert_eq!(detail["definition"]["schedule"], "* * * * * *");
    // Picked up by the running node: a run of it is recorded within seconds.
    let ran = wait_for(Duration::from_secs(6), || {
        let runs = api.read("/api/v1/runs?job=hook");
        (!runs["items"].as_array().unwrap().is_empty()).then_some(())
    });
    assert!(ran.is_some(), "the managed job never ran; node log:\n{}", api.fleet.log("api-node"));

    let again: Value = put(api, "hook", OPS_SECRET, None, every_second.clone()).json().unwrap();
    assert_eq!((again["outcome"].as_str(), again["revision"].as_u64()), (Some("unchanged"), Some(r1)));
    let mut even = every_second.clone();
    even["schedule"] = json!("*/2 * * * * *");
    let changed: Value = put(api, "hook", OPS_SECRET, Some(&format!("\"{r1}\"")), even.clone()).json().unwrap();
    assert_eq!(changed["outcome"], "changed", "{changed}");
    let stale = problem(put(api, "hook", OPS_SECRET, Some(&r1.to_string()), every_second.clone()), 409);
    assert!(stale["detail"].as_str().unwrap().contains("changed meanwhile"), "{stale}");
    let p =
        problem(put(api, "hook", OPS_SECRET, None, json!({"schedule": "every day", "http": {"url": "http://x"}})), 400);
    assert_eq!(p["param"], "schedule", "{p}");
    let p = problem(put(api, "cmd", OPS_SECRET, None, json!({"schedule": "* * * * *", "command": ["true"]})), 400);
    assert_eq!(p["param"], "command", "command jobs need allow_command_jobs: {p}");
    let p = problem(put(api, "tick", OPS_SECRET, None, every_second), 409);
    assert!(p["detail"].as_str().unwrap().contains("declared in"), "{p}");

    problem(api.send(api.http.delete(api.url("/api/v1/jobs/hook")), Some(VIEW_SECRET)), 403);
    let deleted: Value = api.send(api.http.delete(api.url("/api/v1/jobs/hook")), Some(OPS_SECRET)).json().unwrap();
    assert_eq!(deleted["outcome"], "deleted", "{deleted}");
    problem(api.send(api.http.delete(api.url("/api/v1/jobs/hook")), Some(OPS_SECRET)), 404);
    let revisions = api.read("/api/v1/jobs/hook/revisions");
    assert!(revisions["next_cursor"].is_null(), "{revisions}");
    let revisions = revisions["items"].as_array().unwrap();
    assert_eq!(revisions.len(), 3, "{revisions:?}");
    assert_eq!(
        (revisions[0]["deleted"].as_bool(), revisions[1]["spec"]["schedule"].as_str()),
        (Some(true), Some("*/2 * * * * *"))
    );
}

fn whole_api(store: Option<&str>) {
    let api = Api::start(store);
    auth_is_required_and_roles_hold(&api);
    jobs_list_and_detail(&api);
    trigger_waits_for_the_run_and_is_audited(&api);
    pause_and_resume_are_audited(&api);
    unlock_ends_a_running_run(&api);
    runs_page_without_gaps_or_repeats(&api);
    bad_input_names_the_parameter(&api);
    nodes_and_metrics(&api);
    managed_jobs_are_written_checked_and_picked_up(&api);
    let log = api.fleet.log("api-node");
    assert!(!log.contains(OPS_SECRET) && !log.contains(VIEW_SECRET), "a secret in the log");
}

#[test]
fn the_api_on_sqlite() {
    whole_api(None);
}

#[test]
fn the_api_on_postgres() {
    let Some(store) = server_store(POSTGRES) else { return };
    whole_api(Some(&store));
}

#[test]
fn the_api_on_mariadb() {
    let Some(store) = server_store(MYSQL) else { return };
    whole_api(Some(&store));
}

#[test]
fn the_api_on_redis() {
    let Some(store) = server_store(REDIS) else { return };
    whole_api(Some(&store));
}

#[cfg(feature = "etcd")]
#[test]
fn the_api_on_etcd() {
    let Some(store) = server_store(ETCD) else { return };
    whole_api(Some(&store));
}

#[test]
fn serve_never_creates_a_store() {
    let f = Fleet::new("");
    let (code, _, err) = f.cli(&["serve", "--http", "127.0.0.1:0"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("no store at"), "{err}");
    assert!(!f.path("solocron.db").exists());
}

#[test]
fn a_public_address_without_tokens_is_refused() {
    let f = Fleet::new("");
    assert_eq!(f.cli(&["migrate"]).0, 0);
    let (code, _, err) = f.cli(&["serve", "--http", "0.0.0.0:0"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("without tokens") && err.contains("127.0.0.1"), "{err}");
}

#[test]
fn a_token_whose_secret_is_missing_is_refused_naming_the_key() {
    let f = Fleet::new(
        "[http]\n[[http.tokens]]\nname = \"ops\"\nrole = \"operate\"\ntoken_env = \"SOLOCRON_TEST_UNSET_VAR\"\n",
    );
    assert_eq!(f.cli(&["migrate"]).0, 0);
    let (code, _, err) = f.cli(&["serve", "--http", "127.0.0.1:0"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("http.tokens[0].token_env") && err.contains("SOLOCRON_TEST_UNSET_VAR"), "{err}");
}
