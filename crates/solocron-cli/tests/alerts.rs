//! Alerts through real daemons on every store, to a real local webhook receiver (std
//! sockets, started here) and to a command: each event alerted exactly once across the
//! fleet, again after the receiver failed once (same idempotency key, larger token), rate
//! limited with a record of what was not sent, and back to success alerted once.
#![forbid(unsafe_code)]

mod common;

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{at, read_http_request, server_store, state, wait_for, Fleet};
use nix::sys::signal::Signal;
use serde_json::Value;
use solocron_conformance::server::{ServerUrl, MYSQL, POSTGRES, REDIS};

/// One request the receiver got: its headers (names in lower case), its JSON body, when it
/// came, and the status it was answered.
#[derive(Debug, Clone)]
struct Received {
    headers: HashMap<String, String>,
    body: Value,
    at: Instant,
    status: u16,
}

impl Received {
    fn header(&self, name: &str) -> &str {
        self.headers.get(name).unwrap_or_else(|| panic!("no {name} in {self:?}"))
    }
}

/// A webhook receiver that answers its very first request 500 and every other 200.
#[derive(Clone, Default)]
struct Receiver {
    url: String,
    got: Arc<Mutex<Vec<Received>>>,
}

impl Receiver {
    fn start() -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let receiver =
            Receiver { url: format!("http://{}/hook", listener.local_addr().unwrap()), ..Receiver::default() };
        let r = receiver.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().map_while(Result::ok) {
                let r = r.clone();
                std::thread::spawn(move || r.answer(stream));
            }
        });
        receiver
    }

    fn answer(&self, stream: TcpStream) {
        let (_, headers, body) = read_http_request(&stream);
        let body = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let status = {
            let mut got = self.got.lock().unwrap();
            let status = if got.is_empty() { 500 } else { 200 };
            got.push(Received { headers, body, at: Instant::now(), status });
            status
        };
        let text = if status == 500 { "receiver down" } else { "ok" };
        let response =
            format!("HTTP/1.1 {status} X\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}", text.len());
        let _ = (&stream).write_all(response.as_bytes());
    }

    fn got(&self) -> Vec<Received> {
        self.got.lock().unwrap().clone()
    }

    /// The requests answered 200, about `job`'s `event`.
    fn delivered(&self, job: &str, event: &str) -> Vec<Received> {
        self.got().into_iter().filter(|r| r.status == 200 && r.body["job"] == job && r.body["event"] == event).collect()
    }
}

fn config(url: &str, dir_marker: &str) -> String {
    format!(
        r#"
[[jobs]]
name = "fails"
schedule = "* * * * * *"
lease = "3s"
command = ["/bin/sh", "-c", "echo disk full; exit 3"]

[[jobs]]
name = "flaps"
schedule = "* * * * * *"
lease = "3s"
command = ["/bin/sh", "-c", "test ! -e {dir_marker}/broken"]

[[alerts]]
on = ["failed"]
webhook = "{url}"
jobs = ["fails"]
max_per_hour = 3

[[alerts]]
on = ["failed", "recovered"]
webhook = "{url}"
headers_env = {{ Authorization = "HOOK_TOKEN" }}
jobs = ["flaps"]
max_per_hour = 100
"#
    )
}

const HOOK_TOKEN: &str = "Bearer hook-secret-51aa";

/// Three nodes; `fails` fails every second, `flaps` fails until the test mends it.
fn each_event_is_alerted_once_across_the_fleet(store: Option<&str>, kind: &str) {
    let receiver = Receiver::start();
    let mut f = Fleet::on(store, &config(&receiver.url, "$DIR"));
    std::fs::write(f.path("broken"), "").unwrap();
    for id in ["n1", "n2", "n3"] {
        f.start_with_env(id, &[("HOOK_TOKEN", HOOK_TOKEN)]);
    }
    let first_flap = wait_for(Duration::from_secs(20), || receiver.delivered("flaps", "failed").first().cloned());
    assert!(first_flap.is_some(), "{kind}: no failure of flaps alerted: {:?}\n{}", receiver.got(), f.log("n1"));
    std::fs::remove_file(f.path("broken")).unwrap();
    let recovered = wait_for(Duration::from_secs(10), || receiver.delivered("flaps", "recovered").first().cloned());
    let recovered = recovered.unwrap_or_else(|| panic!("{kind}: no recovered alert: {:?}", receiver.got()));
    // Long enough for `fails` to spend its 3 alerts of the hour and be rate limited.
    let limited = wait_for(Duration::from_secs(15), || {
        let alerts = f.history("#alert0:fails");
        alerts.iter().any(|r| state(r) == "skipped").then_some(alerts)
    });
    assert!(limited.is_some(), "{kind}: no rate-limited alert recorded: {:?}", f.history("#alert0:fails"));
    std::thread::sleep(Duration::from_secs(3));
    f.stop_all();

    let got = receiver.got();
    // The receiver's first answer was 500: the same alert came again, as attempt 2 with a
    // larger token, after the delivery's backoff (2 s, jittered between 1 and 2 s).
    let (first, again) =
        (&got[0], got.iter().skip(1).find(|r| r.header("idempotency-key") == got[0].header("idempotency-key")));
    let again = again.unwrap_or_else(|| panic!("{kind}: the alert answered 500 was not sent again: {got:?}"));
    assert_eq!((first.header("solocron-attempt"), again.header("solocron-attempt")), ("1", "2"), "{kind}");
    let token = |r: &Received| r.header("solocron-fencing-token").parse::<u64>().unwrap();
    assert!(token(again) > token(first), "{kind}: the retry's token must be larger");
    let waited = again.at - first.at;
    assert!(
        waited >= Duration::from_millis(900) && waited < Duration::from_secs(5),
        "{kind}: retried after {waited:?}"
    );
    let event = |r: &Received| (r.body["event"].clone(), r.body["run"].clone(), r.body["text"].clone());
    assert_eq!(event(again), event(first), "{kind}: the same alert, read back from the store");
    assert_eq!(again.body["alert"]["attempt"], 2, "{kind}: the body says which delivery attempt it is");

    // Exactly once across the fleet: no alert was answered 200 twice.
    let mut keys = HashSet::new();
    for r in got.iter().filter(|r| r.status == 200) {
        assert!(keys.insert(r.header("idempotency-key").to_owned()), "{kind}: delivered twice: {r:?}");
    }

    // `fails`: 3 alerts for its first 3 failed ticks, the others recorded rate limited.
    let delivered = receiver.delivered("fails", "failed");
    assert_eq!(delivered.len(), 3, "{kind}: {delivered:?}");
    let runs = f.history("fails");
    for alert in &delivered {
        let run = &alert.body["run"];
        let record = runs.iter().find(|r| r["id"] == run["id"]).unwrap_or_else(|| panic!("{kind}: no run {run}"));
        assert_eq!((state(record), run["state"].as_str()), ("failed", Some("failed")), "{kind}");
        assert_eq!(run["exit_code"], 3);
        assert!(run["output_tail"].as_str().unwrap().contains("disk full"), "{run}");
        let text = alert.body["text"].as_str().unwrap();
        assert!(text.contains("job fails failed") && text.contains("exit code 3"), "{kind}: {text}");
        assert!(!alert.headers.contains_key("authorization"), "rule 0 has no token");
    }
    let alerts = f.history("#alert0:fails");
    let skipped: Vec<&Value> = alerts.iter().filter(|r| state(r) == "skipped").collect();
    assert!(skipped.iter().all(|r| r["reason"].as_str().unwrap().starts_with("rate limited: 3 alerts")), "{skipped:?}");
    // Every failed tick of `fails` that ended a second before the stop has its alert: sent
    // or recorded skipped; none was lost, and none has two.
    let alerted: Vec<&str> =
        alerts.iter().filter(|r| r["attempt"] == 1).map(|r| r["scheduled_at"].as_str().unwrap()).collect();
    assert_eq!(alerted.len(), alerted.iter().collect::<HashSet<_>>().len(), "{kind}: an event alerted twice");
    let failed_ticks: Vec<&str> =
        runs.iter().filter(|r| state(r) == "failed").map(|r| r["scheduled_at"].as_str().unwrap()).collect();
    let settled = &failed_ticks[failed_ticks.len().min(2)..]; // newest first: the last two may be in flight at the stop
    for tick in settled {
        assert!(alerted.contains(tick), "{kind}: the failure at {tick} has no alert record: {alerts:?}");
    }

    // `flaps`: back to success alerted once, about a succeeded run, with the rule's secret.
    assert_eq!(receiver.delivered("flaps", "recovered").len(), 1, "{kind}");
    assert_eq!(recovered.body["run"]["state"], "succeeded");
    assert_eq!(recovered.header("authorization"), HOOK_TOKEN);
    let mut seen = String::new();
    for n in ["n1", "n2", "n3"] {
        seen.push_str(&f.log(n));
    }
    let (_, out, _) = f.cli(&["history", "--job", "#alert1:flaps"]);
    seen.push_str(&out);
    assert!(!seen.contains("hook-secret-51aa"), "{kind}: the webhook's token leaked into a log or the history");
}

#[test]
fn sqlite_each_event_is_alerted_once_across_the_fleet() {
    each_event_is_alerted_once_across_the_fleet(None, "SQLite");
}

fn on_server(server: ServerUrl, test: fn(Option<&str>, &str)) {
    let Some(store) = server_store(server) else { return };
    test(Some(&store), server.name);
}

#[test]
fn postgres_each_event_is_alerted_once_across_the_fleet() {
    on_server(POSTGRES, each_event_is_alerted_once_across_the_fleet);
}

#[test]
fn mariadb_each_event_is_alerted_once_across_the_fleet() {
    on_server(MYSQL, each_event_is_alerted_once_across_the_fleet);
}

#[test]
fn redis_each_event_is_alerted_once_across_the_fleet() {
    on_server(REDIS, each_event_is_alerted_once_across_the_fleet);
}

#[cfg(feature = "etcd")]
#[test]
fn etcd_each_event_is_alerted_once_across_the_fleet() {
    on_server(solocron_conformance::server::ETCD, each_event_is_alerted_once_across_the_fleet);
}

/// The alerts a command target wrote, one JSON object a line, to `alerts.jsonl`.
fn alerts(f: &Fleet) -> Vec<Value> {
    f.lines("alerts.jsonl").iter().filter_map(|l| serde_json::from_str(l).ok()).collect()
}

/// A command gets the alert in its environment; a job killed with its node is abandoned by
/// another node and alerted; a job silent past `stale_after` is alerted stale once.
#[test]
fn abandoned_and_stale_jobs_are_alerted_to_a_command() {
    let jobs = r#"
[[jobs]]
name = "dies"
schedule = "*/2 * * * * *"
lease = "2s"
on_crash = "abandon"
command = ["/bin/sh", "-c", "echo $SOLOCRON_NODE_ID > $DIR/dies-$SOLOCRON_FENCING_TOKEN; sleep 30"]

[[jobs]]
name = "quiet"
schedule = "* * * * * *"
command = ["/bin/sh", "-c", "test ! -e $DIR/silenced"]

[[alerts]]
on = ["abandoned", "stale"]
command = ["/bin/sh", "-c", "printf '%s\n' \"$SOLOCRON_ALERT\" >> $DIR/alerts.jsonl"]
stale_after = "2s"
"#;
    let mut f = Fleet::new(jobs);
    let nodes = [f.start("n1"), f.start("n2")];
    wait_for(Duration::from_secs(10), || f.history_if_ready("quiet").map(drop)).expect("no store created");
    // `quiet` succeeds, then falls silent.
    wait_for(Duration::from_secs(10), || f.history("quiet").iter().any(|r| state(r) == "succeeded").then_some(()))
        .expect("quiet never succeeded");
    std::fs::write(f.path("silenced"), "").unwrap();
    // Kill the node that runs `dies`: the other abandons it when its lease expires.
    let holder = wait_for(Duration::from_secs(10), || {
        std::fs::read_dir(f.dir.path()).unwrap().filter_map(Result::ok).find_map(|e| {
            let name = e.file_name().into_string().ok()?;
            name.starts_with("dies-").then(|| std::fs::read_to_string(e.path()).ok()).flatten()
        })
    })
    .expect("dies never started");
    let victim = nodes.into_iter().find(|&i| f.nodes[i].id == holder.trim()).expect("a node of ours");
    f.signal(victim, Signal::SIGKILL);
    let both = wait_for(Duration::from_secs(30), || {
        let a = alerts(&f);
        (a.iter().any(|v| v["event"] == "abandoned") && a.iter().any(|v| v["event"] == "stale")).then_some(a)
    });
    let got =
        both.unwrap_or_else(|| panic!("alerts: {:?}\n{}", alerts(&f), f.log(if victim == 0 { "n2" } else { "n1" })));
    std::thread::sleep(Duration::from_secs(12));
    f.stop_all();

    let got_now = alerts(&f);
    let abandoned: Vec<&Value> = got_now.iter().filter(|v| v["event"] == "abandoned").collect();
    let killed: Vec<&Value> = abandoned.iter().copied().filter(|v| v["run"]["node"] == holder.trim()).collect();
    assert!(!killed.is_empty(), "{got:?}");
    assert_eq!(killed[0]["run"]["state"], "abandoned");
    assert!(killed[0]["run"]["reason"].as_str().unwrap().contains("on_crash = abandon"), "{:?}", killed[0]);
    let stale: Vec<&Value> = got_now.iter().filter(|v| v["event"] == "stale").collect();
    assert_eq!(stale.len(), 1, "one silence, one alert (the checks go on every 10 s): {stale:?}");
    assert_eq!(stale[0]["job"], "quiet");
    assert!(stale[0]["text"].as_str().unwrap().contains("no success for 2.0s"), "{:?}", stale[0]);
}

/// A run stopped at its timeout is alerted `timed_out`, once, with the reason, from the
/// node that ran it; a failure the rule does not name is not.
#[test]
fn a_timed_out_run_is_alerted_once() {
    let jobs = r#"
[[jobs]]
name = "slow"
schedule = "*/4 * * * * *"
timeout = "1s"
kill_grace = "200ms"
lease = "2s"
command = ["/bin/sleep", "10"]

[[jobs]]
name = "fails"
schedule = "*/4 * * * * *"
command = ["/bin/false"]

[[alerts]]
on = ["timed_out"]
command = ["/bin/sh", "-c", "printf '%s\n' \"$SOLOCRON_ALERT\" >> $DIR/alerts.jsonl"]
"#;
    let mut f = Fleet::new(jobs);
    f.start("n1");
    f.start("n2");
    let got = wait_for(Duration::from_secs(20), || Some(alerts(&f)).filter(|a| !a.is_empty()));
    let got = got.unwrap_or_else(|| panic!("no alert; n1's log:\n{}", f.log("n1")));
    std::thread::sleep(Duration::from_secs(2));
    f.stop_all();
    let got_now = alerts(&f);
    assert!(
        got_now.iter().all(|v| v["event"] == "timed_out" && v["job"] == "slow"),
        "only slow's timeouts: {got_now:?}"
    );
    let first = &got[0];
    assert_eq!(first["run"]["state"], "timed_out", "{first}");
    assert!(first["text"].as_str().unwrap().contains("timed out"), "{first}");
    let mut ids: Vec<&str> = got_now.iter().map(|v| v["run"]["id"].as_str().unwrap()).collect();
    let all = ids.len();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), all, "each timeout alerted once across the two nodes: {got_now:?}");
}

/// Ticks missed while no node ran are recorded skipped by the misfire policy when a node
/// comes back, and each is alerted `missed` once, within the rule's rate.
#[test]
fn missed_ticks_are_alerted_once_each_within_the_rate() {
    let jobs = r#"
[[jobs]]
name = "tick"
schedule = "* * * * * *"
catchup = "30s"
misfire = "skip"
command = ["/bin/true"]

[[alerts]]
on = ["missed"]
command = ["/bin/sh", "-c", "printf '%s\n' \"$SOLOCRON_ALERT\" >> $DIR/alerts.jsonl"]
max_per_hour = 2
"#;
    let mut f = Fleet::new(jobs);
    f.start("n1");
    wait_for(Duration::from_secs(10), || {
        f.history_if_ready("tick")?.iter().any(|r| state(r) == "succeeded").then_some(())
    })
    .expect("tick never ran");
    f.signal(0, Signal::SIGKILL);
    // Past LATE_TOLERANCE (10 s): the oldest ticks of the gap are missed, not late.
    std::thread::sleep(Duration::from_secs(14));
    f.start("n2");
    f.start("n3");
    let missed = wait_for(Duration::from_secs(15), || {
        let skipped: Vec<Value> = f
            .history("tick")
            .into_iter()
            .filter(|r| state(r) == "skipped" && r["reason"].as_str().unwrap_or("").starts_with("missed"))
            .collect();
        let alerts = f.lines("alerts.jsonl");
        (skipped.len() >= 3 && alerts.len() >= 2).then_some(skipped)
    });
    let missed = missed.unwrap_or_else(|| panic!("{:?}\n{}", f.history("tick"), f.log("n2")));
    std::thread::sleep(Duration::from_secs(3));
    f.stop_all();

    let alerts: Vec<Value> = f.lines("alerts.jsonl").iter().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(alerts.len(), 2, "2 alerts an hour, whichever node saw the misses: {alerts:?}");
    let ticks: HashSet<&str> = alerts.iter().map(|a| a["run"]["scheduled_at"].as_str().unwrap()).collect();
    assert_eq!(ticks.len(), 2, "each missed tick alerted once: {alerts:?}");
    for a in &alerts {
        assert_eq!((a["event"].as_str(), a["run"]["state"].as_str()), (Some("missed"), Some("skipped")), "{a}");
        assert!(missed.iter().any(|r| at(r, "scheduled_at") == at(&a["run"], "scheduled_at")), "{a}");
    }
    let records = f.history("#alert0:tick");
    let limited = records.iter().filter(|r| state(r) == "skipped").count();
    assert_eq!(limited + 2, records.iter().filter(|r| r["attempt"] == 1).count(), "{records:?}");
    assert!(limited >= 1, "the misses past the rate are recorded, not dropped: {records:?}");
}

/// A node without the rule (its configuration differs, or it died before it claimed the
/// alert) records failures; the other node's sweep of the recent history alerts each of
/// them, once.
#[test]
fn a_failure_recorded_by_a_node_without_the_rule_is_alerted_by_another_nodes_sweep() {
    let job = r#"
[[jobs]]
name = "fails"
schedule = "* * * * * *"
command = ["/bin/sh", "-c", "exit 1"]
"#;
    let alert = r#"
[[alerts]]
on = ["failed"]
command = ["/bin/sh", "-c", "printf '%s\n' \"$SOLOCRON_ALERT\" >> $DIR/alerts.jsonl"]
max_per_hour = 1000
"#;
    let mut f = Fleet::new(&format!("{job}{alert}"));
    let without = f.path("without-alerts.toml");
    let text = std::fs::read_to_string(f.config()).unwrap();
    std::fs::write(&without, &text[..text.find("[[alerts]]").unwrap()]).unwrap();
    // Alone first, so that it records failures whatever the spread gives it later.
    f.start_with("without", &without);
    std::thread::sleep(Duration::from_secs(8));
    f.start("with");
    std::thread::sleep(Duration::from_secs(22));
    f.stop_all();

    let alerts: Vec<Value> = f.lines("alerts.jsonl").iter().map(|l| serde_json::from_str(l).unwrap()).collect();
    let runs = f.history("fails");
    let newest = runs.iter().map(|r| r["scheduled_at"].as_str().unwrap().to_owned()).max().unwrap();
    let newest: chrono::DateTime<chrono::Utc> = newest.parse().unwrap();
    // Failures old enough for a sweep (every 10 s, 5 s after the event) to have seen them.
    let settled: Vec<&Value> = runs
        .iter()
        .filter(|r| state(r) == "failed")
        .filter(|r| {
            r["scheduled_at"].as_str().unwrap().parse::<chrono::DateTime<chrono::Utc>>().unwrap()
                < newest - chrono::Duration::seconds(16)
        })
        .collect();
    let by_without = settled.iter().filter(|r| r["node"] == "without").count();
    assert!(by_without >= 2, "the node without the rule ran some of them: {runs:?}");
    for r in &settled {
        let n = alerts.iter().filter(|a| a["run"]["id"] == r["id"]).count();
        assert_eq!(n, 1, "failure {} (on {}) alerted {n} times", r["id"], r["node"]);
    }
    assert!(alerts.iter().all(|a| a["alert"]["node"] == "with"), "only the node with the rule delivers");
}
