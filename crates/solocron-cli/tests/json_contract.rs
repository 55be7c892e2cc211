//! One JSON contract: `--format json` prints the objects the HTTP API serves (the fleet's
//! views), read here from a real `solocron run --http` node and the CLI on one SQLite store.
#![forbid(unsafe_code)]

mod common;

use std::time::Duration;

use common::*;
use serde_json::Value;

const YEARLY: &str = "0 0 0 1 1 *";

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// `GET base+path` as JSON (no tokens: a loopback server lets anyone read).
fn get(base: &str, path: &str) -> Value {
    let r = reqwest::blocking::get(format!("{base}{path}")).unwrap_or_else(|e| panic!("GET {path}: {e}"));
    assert_eq!(r.status(), 200, "GET {path}");
    r.json().unwrap()
}

/// `v` without the keys named, at any depth: what changes between two reads by itself.
fn without(mut v: Value, keys: &[&str]) -> Value {
    match &mut v {
        Value::Object(map) => {
            for k in keys {
                map.remove(*k);
            }
            for inner in map.values_mut() {
                *inner = without(inner.take(), keys);
            }
        }
        Value::Array(items) => {
            for inner in items.iter_mut() {
                *inner = without(inner.take(), keys);
            }
        }
        _ => {}
    }
    v
}

#[test]
fn the_cli_prints_the_apis_objects_for_jobs_runs_and_nodes() {
    let port = free_port();
    let jobs = format!(
        "[[jobs]]\nname = \"report\"\nschedule = \"{YEARLY}\"\ncommand = [\"/bin/sh\", \"-c\", \"echo reported\"]\n\
         [[jobs]]\nname = \"backup\"\nschedule = \"{YEARLY}\"\ntimezone = \"Europe/Berlin\"\ncommand = [\"true\"]\n\
         [http]\nlisten = \"127.0.0.1:{port}\"\n"
    );
    let mut f = Fleet::new(&jobs);
    f.migrate();
    // A finished run and a pause: the views' nested objects (`last_run`, `paused`) are there.
    assert_eq!(f.cli(&["trigger", "report", "--here"]).0, 0);
    assert_eq!(f.cli(&["pause", "backup", "--reason", "disk full"]).0, 0);
    f.start("n1");
    let base = format!("http://127.0.0.1:{port}");
    let _ = rustls::crypto::ring::default_provider().install_default();
    let registered = wait_for(Duration::from_secs(30), || {
        let page = reqwest::blocking::get(format!("{base}/api/v1/jobs")).ok()?.json::<Value>().ok()?;
        page["items"].as_array()?.iter().all(|j| j["nodes"] == serde_json::json!(["n1"])).then_some(())
    });
    registered.unwrap_or_else(|| panic!("n1 never served both jobs registered:\n{}", f.log("n1")));

    // Jobs: `GET /api/v1/jobs` and `status`; one job: `GET /api/v1/jobs/{job}` and `status JOB`.
    // Nothing of a job changes between the reads (no tick is due, the node stays alive).
    let api = get(&base, "/api/v1/jobs");
    let cli = f.cli_json(&["status", "--format", "json"]);
    assert_eq!(cli, api, "status --format json prints the API's list of jobs");
    let jobs = &cli["items"];
    assert!(jobs[0]["paused"]["reason"] == "disk full" && jobs[1]["last_run"]["state"] == "succeeded", "{cli:#}");
    // A registration's `last_seen` moves when the node refreshes its registry.
    let api = without(get(&base, "/api/v1/jobs/report"), &["last_seen"]);
    let cli = without(f.cli_json(&["status", "report", "--format", "json"]), &["last_seen"]);
    assert_eq!(cli, api, "status JOB --format json prints the API's job");

    // Runs: `GET /api/v1/runs` and `history`; one run: `GET /api/v1/runs/{id}` and `history --output`.
    let api = get(&base, "/api/v1/runs");
    let cli = f.cli_json(&["history", "--format", "json"]);
    assert_eq!(cli, api, "history --format json prints the API's list of runs");
    let id = cli["items"][0]["id"].as_str().unwrap().to_owned();
    let api = get(&base, &format!("/api/v1/runs/{}", id.replace('#', "%23")));
    assert_eq!(f.cli_json(&["history", "--output", &id, "--format", "json"]), api, "one run");
    assert_eq!(api["output"], "reported\n");

    // Nodes: `GET /api/v1/nodes` and `nodes`; a heartbeat (every 5 s) moves `last_seen`,
    // and the time since it grows between the reads.
    let moving = ["last_seen", "last_seen_ago_ms"];
    let api = without(get(&base, "/api/v1/nodes"), &moving);
    let cli = without(f.cli_json(&["nodes", "--format", "json"]), &moving);
    assert_eq!(cli, api, "nodes --format json prints the API's nodes");
    assert_eq!(cli["items"][0]["liveness"], "alive", "{cli:#}");
    f.stop_all();
}
