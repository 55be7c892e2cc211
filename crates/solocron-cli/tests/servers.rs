//! Real `solocron run` processes on the PostgreSQL, MariaDB, Redis and etcd test servers:
//! exactly once across three processes, and a restart of the server mid-run.
//! Tests in this file take a lock: a server restart must not cut a neighbour's test.
#![forbid(unsafe_code)]

mod common;

use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

use common::*;
#[cfg(feature = "etcd")]
use solocron_conformance::server::ETCD;
use solocron_conformance::server::{ServerUrl, MYSQL, POSTGRES, REDIS};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

#[test]
fn three_postgres_nodes_run_every_tick_exactly_once() {
    let _g = serial();
    let Some(store) = server_store(POSTGRES) else { return };
    three_nodes_exactly_once(Some(&store), 12);
}

#[test]
fn three_mariadb_nodes_run_every_tick_exactly_once() {
    let _g = serial();
    let Some(store) = server_store(MYSQL) else { return };
    three_nodes_exactly_once(Some(&store), 12);
}

fn sh(cmd: &str) {
    let st = Command::new("sh").args(["-c", cmd]).status().unwrap();
    assert!(st.success(), "`{cmd}` failed");
}

fn wait_port(port: u16) {
    wait_for(Duration::from_secs(60), || {
        std::net::TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_millis(500)).ok()
    })
    .unwrap_or_else(|| panic!("port {port} never came back"));
}

fn restart_postgres(down_for: Duration) {
    sh("pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql | head -1) main stop -m fast");
    std::thread::sleep(down_for);
    sh("pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql | head -1) main start");
    wait_port(5432);
}

/// Whether a `mariadbd` (or `mysqld`) process is alive.
fn mariadbd_alive() -> bool {
    Command::new("pgrep").args(["-x", "mariadbd|mysqld"]).output().is_ok_and(|o| o.status.success())
}

/// Stops MariaDB and makes sure it is down: no server process left and its port closed
/// (a shutdown that returned without stopping the server would make the test pass for the
/// wrong reason, or fail it far from the cause). A server still alive 30 s after the
/// shutdown is killed.
fn restart_mariadb(down_for: Duration) {
    sh("mariadb-admin -uroot -h127.0.0.1 shutdown");
    let gone = wait_for(Duration::from_secs(30), || (!mariadbd_alive()).then_some(()));
    if gone.is_none() {
        eprintln!("MariaDB still alive 30 s after its shutdown: killing it");
        let _ = Command::new("pkill").args(["-KILL", "-x", "mariadbd|mysqld"]).status();
        wait_for(Duration::from_secs(10), || (!mariadbd_alive()).then_some(()))
            .expect("MariaDB is still alive after SIGKILL");
    }
    assert!(
        std::net::TcpStream::connect_timeout(&([127, 0, 0, 1], 3306).into(), Duration::from_millis(500)).is_err(),
        "port 3306 still answers with no MariaDB process: another server holds it"
    );
    std::thread::sleep(down_for);
    sh("mkdir -p /run/mysqld && chown mysql /run/mysqld && start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd -- --user=mysql");
    wait_port(3306);
}

/// How long the server stays down: long enough that some of its ticks are past the late
/// tolerance (10 s) when the last claim round before the server is back was planned. A
/// node's rounds during an outage are a claim's timeout (up to 5 s) plus a backoff (up to
/// 5 s) apart, and a claim decided before the server is back may be answered a store
/// call's bound (5 s) later: a tick is surely missed, not late, only if it is older than
/// ~22 s when the server comes back (at 22 s, a run caught no tick up).
const OUTAGE: Duration = Duration::from_secs(30);

/// Two nodes; a job every second (misfire = all, overlap = allow, so every tick must run)
/// and a long one; the server goes down for longer than the late tolerance. No tick runs
/// twice; the outage's older ticks run after it by the misfire policy (catch-up) and its
/// younger ones as late ticks; every tick has exactly one record; every claimed run ends
/// with a recorded state once the server is back.
fn survives_a_restart(store: &str, restart: fn(Duration)) {
    let mut f = Fleet::on(
        Some(store),
        r#"
[[jobs]]
name = "tick"
schedule = "* * * * * *"
lease = "10s"
overlap = "allow"
misfire = "all"
catchup = "1m"
command = ["/bin/sh", "-c", "echo $SOLOCRON_SCHEDULED_AT >> $DIR/ticks.txt"]
[[jobs]]
name = "long"
schedule = "*/20 * * * * *"
lease = "3s"
on_crash = "retry"
command = ["/bin/sh", "-c", "exec sleep 6"]
"#,
    );
    f.start("n1");
    f.start("n2");
    std::thread::sleep(Duration::from_secs(5));
    let outage_start = chrono::Utc::now();
    restart(OUTAGE);
    let outage_end = chrono::Utc::now();
    std::thread::sleep(Duration::from_secs(12));
    let lines = f.lines("ticks.txt");
    let mut ticks: Vec<chrono::DateTime<chrono::Utc>> = lines.iter().map(|l| l.parse().unwrap()).collect();
    ticks.sort();
    let n = ticks.len();
    ticks.dedup();
    assert_eq!(ticks.len(), n, "a tick ran twice across the restart: {lines:?}");
    for w in ticks.windows(2) {
        if (w[1] - w[0]).num_milliseconds() != 1000 {
            let around: Vec<_> = f
                .history("tick")
                .into_iter()
                .filter(|r| {
                    let t: chrono::DateTime<chrono::Utc> = r["scheduled_at"].as_str().unwrap().parse().unwrap();
                    t >= w[0] && t <= w[1]
                })
                .collect();
            let logs: Vec<String> = ["n1", "n2"]
                .iter()
                .flat_map(|n| {
                    f.log(n)
                        .lines()
                        .filter(|l| l.contains("WARN") || l.contains("ERROR"))
                        .map(str::to_owned)
                        .collect::<Vec<_>>()
                })
                .collect();
            panic!(
                "tick missing between {} and {} (outage not caught up); records: {around:#?}\nwarnings: {logs:#?}",
                w[0], w[1]
            );
        }
    }
    // Once the server is back, every claimed run reaches an end state (recovery included).
    let settled = wait_for(Duration::from_secs(20), || {
        let running: Vec<_> =
            ["tick", "long"].iter().flat_map(|j| f.history(j)).filter(|r| state(r) == "running").collect();
        (running.len() <= 1).then_some(())
    });
    f.stop_all();
    assert!(settled.is_some(), "runs stayed running after the server came back");
    for j in ["tick", "long"] {
        let h = f.history(j);
        assert!(h.iter().all(|r| state(r) != "running"), "{j}: a claimed run has no end state: {h:#?}");
    }
    let h = f.history("tick");
    let mut recorded: Vec<&str> = h.iter().map(|r| r["scheduled_at"].as_str().unwrap()).collect();
    let n = recorded.len();
    recorded.sort();
    recorded.dedup();
    assert_eq!(recorded.len(), n, "a tick has two records");
    let caught_up = h
        .iter()
        .filter(|r| r["trigger"] == "catchup" && state(r) == "succeeded")
        .filter(|r| {
            let t: chrono::DateTime<chrono::Utc> = r["scheduled_at"].as_str().unwrap().parse().unwrap();
            t > outage_start && t < outage_end
        })
        .count();
    let on_time_in_outage = h
        .iter()
        .filter(|r| {
            let t: chrono::DateTime<chrono::Utc> = r["scheduled_at"].as_str().unwrap().parse().unwrap();
            t > outage_start + chrono::Duration::seconds(2) && t < outage_end - chrono::Duration::seconds(2)
        })
        .filter(|r| r["lateness_ms"].as_i64().is_some_and(|l| l < 1000))
        .count();
    assert!(
        caught_up >= 1,
        "the outage's older ticks go through misfire = all (outage {outage_start} to {outage_end}; \
         {on_time_in_outage} ticks inside it started on time, so the server was up then): {h:#?}"
    );
    // A tick is judged late or missed when its claim is decided (within the late tolerance,
    // 10 s; deciding may wait a store call, 5 s), then claimed within a store call's bound
    // (5 s); older ones go through misfire. So none is claimed as a scheduled tick later
    // than 20 s (2 s more for a loaded host). A claim granted again after its answer was
    // lost keeps its first `claimed_at`.
    let at = |r: &serde_json::Value, field: &str| -> chrono::DateTime<chrono::Utc> {
        r[field].as_str().unwrap().parse().unwrap()
    };
    let too_late: Vec<_> = h
        .iter()
        .filter(|r| r["trigger"] == "schedule" && (at(r, "claimed_at") - at(r, "scheduled_at")).num_seconds() >= 22)
        .collect();
    assert!(too_late.is_empty(), "ticks ran as scheduled far past the late tolerance: {too_late:#?}");
    println!("{} ticks across the restart, each once; {caught_up} caught up by misfire = all", ticks.len());
}

#[test]
fn a_postgres_restart_mid_run_loses_nothing_and_duplicates_nothing() {
    let _g = serial();
    let Some(store) = server_store(POSTGRES) else { return };
    survives_a_restart(&store, restart_postgres);
}

#[test]
fn a_mariadb_restart_mid_run_loses_nothing_and_duplicates_nothing() {
    let _g = serial();
    let Some(store) = server_store(MYSQL) else { return };
    survives_a_restart(&store, restart_mariadb);
}

#[test]
fn ten_nodes_starting_at_once_on_an_empty_postgres_all_come_up() {
    let _g = serial();
    let Some(store) = server_store(POSTGRES) else { return };
    ten_nodes_come_up(&store);
}

#[test]
fn ten_nodes_starting_at_once_on_an_empty_mariadb_all_come_up() {
    let _g = serial();
    let Some(store) = server_store(MYSQL) else { return };
    ten_nodes_come_up(&store);
}

fn ten_nodes_come_up(store: &str) {
    let mut f = Fleet::on(
        Some(store),
        "[[jobs]]\nname = \"t\"\nschedule = \"* * * * * *\"\ncommand = [\"/bin/sh\", \"-c\", \"echo $SOLOCRON_SCHEDULED_AT >> $DIR/t.txt\"]\n",
    );
    for i in 0..10 {
        f.start(&format!("n{i}"));
    }
    std::thread::sleep(Duration::from_secs(4));
    for (i, n) in f.nodes.iter_mut().enumerate() {
        assert!(n.child.try_wait().unwrap().is_none(), "node n{i} exited at start");
    }
    f.stop_all();
    let s = f.cli_json(&["status", "t", "--format", "json"]);
    assert_eq!(s["nodes"].as_array().unwrap().len(), 10, "every node registered");
    let mut lines = f.lines("t.txt");
    let n = lines.len();
    lines.sort();
    lines.dedup();
    assert!(n >= 2 && lines.len() == n, "ran {n} times, {} distinct", lines.len());
}

#[test]
fn three_redis_nodes_run_every_tick_exactly_once() {
    let _g = serial();
    let Some(store) = server_store(REDIS) else { return };
    three_nodes_exactly_once(Some(&store), 12);
}

fn restart_redis(down_for: Duration) {
    sh("redis-cli -h 127.0.0.1 shutdown nosave || true");
    std::thread::sleep(down_for);
    sh("redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save '' --appendonly no");
    wait_port(6379);
}

/// Redis keeps nothing on disk here: a restart forgets every key. What the docs promise:
/// no tick that ran before the restart runs again (not on the nodes that stayed up, nor on
/// one that starts afterwards with a catch-up window), and fencing tokens keep rising.
#[test]
fn a_redis_restart_forgets_history_but_never_reruns_a_tick_and_tokens_keep_rising() {
    let _g = serial();
    let Some(store) = server_store(REDIS) else { return };
    let mut f = Fleet::on(
        Some(&store),
        r#"
[[jobs]]
name = "tick"
schedule = "* * * * * *"
misfire = "all"
catchup = "1m"
command = ["/bin/sh", "-c", "echo $SOLOCRON_SCHEDULED_AT $SOLOCRON_FENCING_TOKEN $SOLOCRON_NODE_ID >> $DIR/ticks.txt"]
"#,
    );
    f.start("n1");
    f.start("n2");
    std::thread::sleep(Duration::from_secs(5));
    let before = f.lines("ticks.txt").len();
    restart_redis(Duration::from_secs(2));
    std::thread::sleep(Duration::from_secs(4));
    f.start("late");
    std::thread::sleep(Duration::from_secs(5));
    f.stop_all();
    let lines = f.lines("ticks.txt");
    assert!(before >= 3 && lines.len() > before + 3, "ran {before} before and {} in all", lines.len());
    let mut ticks: Vec<&str> = lines.iter().map(|l| l.split_whitespace().next().unwrap()).collect();
    ticks.sort();
    let n = ticks.len();
    ticks.dedup();
    assert_eq!(ticks.len(), n, "a tick ran twice across the Redis restart: {lines:#?}");
    let mut by_time: Vec<(String, u64)> = lines
        .iter()
        .map(|l| {
            let v: Vec<&str> = l.split_whitespace().collect();
            (v[0].to_owned(), v[1].parse().unwrap())
        })
        .collect();
    by_time.sort();
    assert!(by_time.windows(2).all(|w| w[1].1 > w[0].1), "fencing tokens went down across the restart: {by_time:?}");
    let h = f.history("tick");
    assert!(h.len() < lines.len(), "the restart forgot the history of the runs before it (documented)");
}

#[cfg(feature = "etcd")]
#[test]
fn three_etcd_nodes_run_every_tick_exactly_once() {
    let _g = serial();
    let Some(store) = server_store(ETCD) else { return };
    three_nodes_exactly_once(Some(&store), 12);
}

/// `migrate --drop --yes` on a server store empties its prefix and only its: a neighbour
/// whose prefix extends it (`p` and `p_b`: a pattern `p_%` would take both) keeps its pause.
fn drop_empties_one_prefix_and_keeps_its_neighbour(server: ServerUrl) {
    let _g = serial();
    let Some(a) = server_store(server) else { return };
    let kind = server.name;
    let b = format!("{}_b\"", a.trim_end_matches('"'));
    let job = "[[jobs]]\nname = \"j\"\nschedule = \"0 0 0 1 1 *\"\ncommand = [\"/bin/true\"]\n";
    let (fa, fb) = (Fleet::on(Some(&a), job), Fleet::on(Some(&b), job));
    for f in [&fa, &fb] {
        f.migrate();
        let (code, _, err) = f.cli(&["pause", "j", "--reason", "kept"]);
        assert_eq!(code, 0, "{kind}: {err}");
    }
    let (code, out, err) = fa.cli(&["migrate", "--drop", "--yes"]);
    assert_eq!(code, 0, "{kind}: {err}");
    assert!(out.starts_with("removed "), "{kind}: {out}");
    let paused = |f: &Fleet| f.cli_json(&["status", "j", "--format", "json"])["paused"].is_object();
    let (code, _, err) = fa.cli(&["status"]);
    assert!(code == 2 && err.contains("has no solocron schema"), "{kind}: the dropped prefix is empty: {err}");
    fa.migrate();
    assert!(!paused(&fa), "{kind}: the dropped prefix starts again empty");
    assert!(paused(&fb), "{kind}: the neighbour prefix keeps its pause");
}

#[test]
fn migrate_drop_on_postgres_empties_one_prefix_and_keeps_its_neighbour() {
    drop_empties_one_prefix_and_keeps_its_neighbour(POSTGRES);
}

#[test]
fn migrate_drop_on_mariadb_empties_one_prefix_and_keeps_its_neighbour() {
    drop_empties_one_prefix_and_keeps_its_neighbour(MYSQL);
}

#[test]
fn migrate_drop_on_redis_empties_one_prefix_and_keeps_its_neighbour() {
    drop_empties_one_prefix_and_keeps_its_neighbour(REDIS);
}

#[cfg(feature = "etcd")]
#[test]
fn migrate_drop_on_etcd_empties_one_prefix_and_keeps_its_neighbour() {
    drop_empties_one_prefix_and_keeps_its_neighbour(ETCD);
}

/// How long a server is frozen: twice the jobs' lease (issue 20 §2).
const FREEZE_LEASE: Duration = Duration::from_secs(3);

/// Thaws the frozen processes when dropped, so a failing test never leaves a server stopped.
struct Frozen(&'static str);

impl Frozen {
    /// Stops (SIGSTOP) every process `pgrep_args` lists.
    fn freeze(pgrep_args: &'static str) -> Frozen {
        sh(&format!("kill -STOP $(pgrep {pgrep_args})"));
        Frozen(pgrep_args)
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        let _ = Command::new("sh").args(["-c", &format!("kill -CONT $(pgrep {})", self.0)]).status();
    }
}

/// One line of `long.txt`: which holder (token) wrote, and when.
fn writes(f: &Fleet) -> Vec<(u64, chrono::DateTime<chrono::Utc>)> {
    f.lines("long.txt")
        .iter()
        .filter_map(|l| {
            let (token, ms) = l.split_once(' ')?;
            Some((token.parse().ok()?, chrono::DateTime::from_timestamp_millis(ms.parse().ok()?)?))
        })
        .collect()
}

/// Two nodes on `store`; every process of the server (`pgrep_args`) is frozen (SIGSTOP)
/// for twice the lease, then thawed. Nothing runs twice; the holder of the long job, which
/// cannot renew, stops it before the store's lease can end (at most a lease after the
/// freeze began, when it last renewed at the latest); no other holder writes before the
/// thaw; work resumes after it; and every claimed run ends recorded.
fn survives_a_freeze(store: &str, pgrep_args: &'static str, kind: &str) {
    let mut f = Fleet::on(
        Some(store),
        &format!(
            r#"
[[jobs]]
name = "tick"
schedule = "* * * * * *"
lease = "3s"
overlap = "allow"
command = ["/bin/sh", "-c", "echo $SOLOCRON_SCHEDULED_AT >> $DIR/ticks.txt"]
[[jobs]]
name = "long"
schedule = "* * * * * *"
lease = "{}s"
command = ["/bin/sh", "-c", "while true; do echo $SOLOCRON_FENCING_TOKEN $(date +%s%3N) >> $DIR/long.txt; sleep 0.1; done"]
"#,
            FREEZE_LEASE.as_secs()
        ),
    );
    f.start("n1");
    f.start("n2");
    wait_for(Duration::from_secs(15), || (writes(&f).len() > 10).then_some(()))
        .unwrap_or_else(|| panic!("{kind}: the long job never ran:\n{}", f.log("n1")));
    let frozen_at = chrono::Utc::now();
    let held = writes(&f).last().expect("a write").0;
    let frozen = Frozen::freeze(pgrep_args);
    std::thread::sleep(FREEZE_LEASE * 2);
    let thawed_at = chrono::Utc::now();
    drop(frozen);
    let resumed = wait_for(Duration::from_secs(10), || {
        let ticks = f.lines("ticks.txt");
        ticks.iter().filter_map(|l| l.parse::<chrono::DateTime<chrono::Utc>>().ok()).find(|t| *t > thawed_at)
    });
    let settled = wait_for(Duration::from_secs(20), || {
        let h: Vec<_> = f.history("long").into_iter().filter(|r| state(r) == "running").collect();
        (h.len() <= 1).then_some(())
    });
    std::thread::sleep(Duration::from_secs(2));
    f.stop_all();

    let ms = |d: chrono::TimeDelta| d.num_milliseconds();
    let w = writes(&f);
    let last_held = w.iter().filter(|(t, _)| *t == held).map(|(_, at)| *at).max().expect("the holder's writes");
    let lease_end_bound = frozen_at + chrono::Duration::from_std(FREEZE_LEASE).unwrap();
    assert!(
        last_held < lease_end_bound,
        "{kind}: the holder (token {held}) wrote at +{} ms after the freeze, past the latest its lease can end (+{} ms)",
        ms(last_held - frozen_at),
        ms(lease_end_bound - frozen_at)
    );
    let early: Vec<_> = w.iter().filter(|(t, at)| *t != held && *at > frozen_at && *at < thawed_at).collect();
    assert!(early.is_empty(), "{kind}: another holder wrote while the server was frozen: {early:?}");
    let mut by_time = w.clone();
    by_time.sort_by_key(|(_, at)| *at);
    for pair in by_time.windows(2) {
        assert!(pair[0].0 <= pair[1].0, "{kind}: an older holder wrote after a newer one: {pair:?}");
    }
    let ticks = f.lines("ticks.txt");
    let mut unique = ticks.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), ticks.len(), "{kind}: a tick ran twice across the freeze");
    let resumed = resumed.unwrap_or_else(|| panic!("{kind}: no tick ran after the thaw:\n{}", f.log("n1")));
    assert!(settled.is_some(), "{kind}: runs stayed running after the thaw");
    for j in ["tick", "long"] {
        let h = f.history(j);
        assert!(h.iter().all(|r| state(r) != "running"), "{kind}: {j}: a claimed run has no end state: {h:#?}");
    }
    println!(
        "{kind}: frozen {} ms; holder {held} last wrote at +{} ms (its lease ends by +{} ms at the latest); first tick after the thaw: {resumed}",
        ms(thawed_at - frozen_at),
        ms(last_held - frozen_at),
        ms(lease_end_bound - frozen_at)
    );
}

#[test]
fn a_frozen_postgres_runs_nothing_twice_and_its_holders_stop_in_time() {
    let _g = serial();
    let Some(store) = server_store(POSTGRES) else { return };
    survives_a_freeze(&store, "-u postgres", "PostgreSQL");
}

#[test]
fn a_frozen_mariadb_runs_nothing_twice_and_its_holders_stop_in_time() {
    let _g = serial();
    let Some(store) = server_store(MYSQL) else { return };
    survives_a_freeze(&store, "-x 'mariadbd|mysqld'", "MariaDB");
}

#[test]
fn a_frozen_redis_runs_nothing_twice_and_its_holders_stop_in_time() {
    let _g = serial();
    let Some(store) = server_store(REDIS) else { return };
    survives_a_freeze(&store, "-x redis-server", "Redis");
}

#[cfg(feature = "etcd")]
#[test]
fn a_frozen_etcd_runs_nothing_twice_and_its_holders_stop_in_time() {
    let _g = serial();
    let Some(store) = server_store(ETCD) else { return };
    survives_a_freeze(&store, "-x etcd", "etcd");
}
