//! A partition between one node and its store, made with the fault proxy of the test
//! support (`solocron_conformance::proxy`), on the PostgreSQL, MariaDB, Redis and etcd test
//! servers, with real `solocron run` processes: the partitioned node's job is dead before
//! the store's lease ends (even a job that ignores SIGTERM, with the largest kill grace
//! the config allows), another node takes the tick over with a larger fencing token, the
//! old job never writes after the new one's first write, and after the heal the node
//! claims again. Also what a claim whose answer is lost does.
//!
//! What the jobs themselves wrote (with their token and the time) is the evidence, beside
//! the store's run records. Tests in this file take a lock: their margins are timing ones.
#![forbid(unsafe_code)]

mod common;

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use chrono::{DateTime, Utc};
use common::*;
use serde_json::Value;
use solocron_conformance::proxy::{FaultProxy, Mode, MAX_CONNECTIONS};
#[cfg(feature = "etcd")]
use solocron_conformance::server::ETCD;
use solocron_conformance::server::{ServerUrl, MYSQL, POSTGRES, REDIS};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// The jobs' lease: short, so that a case lasts seconds (etcd's leases are whole seconds).
const LEASE: Duration = Duration::from_secs(3);
/// The kill grace of the job that ignores SIGTERM: 40% of the lease (the config allows
/// 45%), the issue's worst case.
const STUBBORN_KILL_GRACE: &str = "1.2s";
/// Longest wait for a node to start (connect, migrate, register) and log so.
const NODE_START_WAIT: Duration = Duration::from_secs(15);
/// Longest wait, after the partition began, for both jobs to be taken over elsewhere:
/// the lease, a recovery scan, and slack for a loaded machine.
const TAKEOVER_WAIT: Duration = Duration::from_secs(12);
/// How long the test keeps watching after the takeover, for a stale write to show up.
const AFTER_TAKEOVER: Duration = Duration::from_millis(800);
/// Longest wait, after the heal, for the healed node to run a tick again.
const HEAL_WAIT: Duration = Duration::from_secs(12);
/// Between two reads of the store's records while the partition lasts.
const POLL_EVERY: Duration = Duration::from_millis(100);
/// A cut job's process is checked at its lease's end when that end is at most this far
/// ahead (more than one read of the records takes).
const DEAD_CHECK_AHEAD: Duration = Duration::from_secs(1);
/// The long jobs, in the order the test keeps them.
const LONG_JOBS: [&str; 2] = ["polite", "stubborn"];

/// A job that appends `token node epoch pid` to `DIR/NAME.txt` every 50 ms until
/// `DIR/stop` exists (at most 600 lines, ~30 s); with `ignore-term`, it and everything it
/// starts ignore SIGTERM (an ignored signal stays ignored across exec), so only SIGKILL
/// stops it.
const WRITER: &str = r#"#!/bin/sh
[ "$3" = ignore-term ] && trap '' TERM
i=0
while [ ! -e "$1/stop" ] && [ $i -lt 600 ]; do
  echo "$SOLOCRON_FENCING_TOKEN $SOLOCRON_NODE_ID $(date +%s.%N) $$" >> "$1/$2.txt"
  sleep 0.05
  i=$((i+1))
done
"#;

/// The two long jobs every node has: `polite` (default kill grace, stops on SIGTERM) and
/// `stubborn` (ignores SIGTERM, kill grace 0.4 × lease). Both fire every second, so the
/// one node running when they first fire claims both; while a run of a job is running
/// (even past its lease) its later ticks are skipped (overlap = "skip"), so the run the
/// partition cuts is the only one until the takeover.
fn long_jobs() -> String {
    let lease = format!("{}s", LEASE.as_secs());
    format!(
        r#"
[[jobs]]
name = "polite"
schedule = "* * * * * *"
lease = "{lease}"
on_crash = "retry"
command = ["/bin/sh", "$DIR/writer.sh", "$DIR", "polite"]

[[jobs]]
name = "stubborn"
schedule = "* * * * * *"
lease = "{lease}"
on_crash = "retry"
kill_grace = "{STUBBORN_KILL_GRACE}"
command = ["/bin/sh", "$DIR/writer.sh", "$DIR", "stubborn", "ignore-term"]
"#
    )
}

/// A job only the proxied node has, to see it claim and run ticks after the heal.
fn pulse_job() -> String {
    format!(
        r#"
[[jobs]]
name = "pulse"
schedule = "* * * * * *"
lease = "{}s"
overlap = "allow"
command = ["/bin/sh", "-c", "echo $SOLOCRON_SCHEDULED_AT >> $DIR/pulse.txt"]
"#,
        LEASE.as_secs()
    )
}

/// A fleet on `store` whose nodes have `jobs`, and `n1.toml` for the node behind a proxy:
/// the same configuration on the proxy's URL, plus `extra` jobs (`$DIR` replaced as in
/// `jobs`).
fn fleet_with_proxied_node(store: &str, jobs: &str, extra: &str) -> (Fleet, FaultProxy, PathBuf) {
    let f = Fleet::on(Some(store), jobs);
    std::fs::write(f.path("writer.sh"), WRITER).unwrap();
    let (proxy, via_proxy) = proxied(store);
    let shared = std::fs::read_to_string(f.config()).unwrap();
    let n1 = shared.replace(store, &via_proxy) + &extra.replace("$DIR", &f.dir.path().display().to_string());
    assert!(n1.contains(&format!(":{}", proxy.port())), "n1's store URL points at the proxy:\n{n1}");
    let path = f.path("n1.toml");
    std::fs::write(&path, n1).unwrap();
    (f, proxy, path)
}

/// Waits until node `id` logged that its scheduler started.
fn wait_started(f: &Fleet, id: &str) {
    wait_for(NODE_START_WAIT, || f.log(id).contains("scheduler starting").then_some(()))
        .unwrap_or_else(|| panic!("node {id} did not start:\n{}", f.log(id)));
}

/// One line a writer job wrote.
#[derive(Debug, Clone)]
struct Write {
    token: u64,
    node: String,
    at: DateTime<Utc>,
    pid: i32,
}

fn writes(f: &Fleet, job: &str) -> Vec<Write> {
    f.lines(&format!("{job}.txt"))
        .iter()
        .map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            let (secs, nanos) = w[2].split_once('.').expect("epoch.nanos");
            let at = DateTime::from_timestamp(secs.parse().unwrap(), nanos.parse().unwrap()).unwrap();
            Write { token: w[0].parse().unwrap(), node: w[1].to_owned(), at, pid: w[3].parse().unwrap() }
        })
        .collect()
}

fn instant(v: &Value) -> DateTime<Utc> {
    v.as_str().unwrap_or_else(|| panic!("not an instant: {v}")).parse().unwrap()
}

/// Whether process `pid` has ended (gone, or a zombie waiting to be reaped).
fn dead(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => {
            stat.rsplit_once(')').is_some_and(|(_, rest)| matches!(rest.trim_start().chars().next(), Some('Z' | 'X')))
        }
    }
}

/// What the test saw of one long job cut by the partition.
#[derive(Debug, Default)]
struct Cut {
    /// The first run's token, its job's pid, and the latest `lease_until` the store
    /// showed for it while it was running (the store's lease deadline: no renewal got
    /// through after the partition began).
    token: u64,
    pid: i32,
    lease_until: Option<DateTime<Utc>>,
    /// When the test looked at the job's process, at `lease_until` (or as soon after as it
    /// could), and whether it was dead then.
    checked_dead: Option<(DateTime<Utc>, bool)>,
}

impl Cut {
    fn new(f: &Fleet, job: &str) -> Cut {
        let first = writes(f, job).first().cloned().expect("the job wrote");
        assert_eq!(first.node, "n1", "{job}: the proxied node claimed the first run");
        Cut { token: first.token, pid: first.pid, ..Cut::default() }
    }

    /// Takes in one read of the job's records; true once the takeover wrote.
    fn observe(&mut self, f: &Fleet, job: &str, records: &[Value]) -> bool {
        let first = records.iter().find(|r| r["fencing_token"].as_u64() == Some(self.token));
        if let Some(until) = first.filter(|r| state(r) == "running").and_then(|r| r["lease_until"].as_str()) {
            let until: DateTime<Utc> = until.parse().unwrap();
            self.lease_until = Some(self.lease_until.map_or(until, |u| u.max(until)));
        }
        writes(f, job).iter().any(|w| w.token > self.token)
    }

    /// Once the lease's end is near: waits for it, then looks whether the job is dead.
    fn check_dead_at_lease_end(&mut self) {
        let Some(until) = self.lease_until.filter(|_| self.checked_dead.is_none()) else { return };
        let ahead = (until - Utc::now()).to_std().unwrap_or_default();
        if ahead <= DEAD_CHECK_AHEAD {
            std::thread::sleep(ahead);
            self.checked_dead = Some((Utc::now(), dead(self.pid)));
        }
    }
}

/// Reads the store's records every [`POLL_EVERY`] until both long jobs were taken over
/// (false: not within [`TAKEOVER_WAIT`]), checking each cut job's process at its lease's end.
fn watch_partition(f: &Fleet, cuts: &mut [Cut; 2]) -> bool {
    let taken_over = wait_for(TAKEOVER_WAIT, || {
        let all = f.cli_items(&["history", "--limit", "1000", "--format", "json"]);
        let all = all.as_array().unwrap();
        let of = |job: &str| all.iter().filter(|r| r["job"] == job).cloned().collect::<Vec<_>>();
        // Every cut observes each round (no short circuit): each needs its lease's end.
        let done: Vec<bool> = cuts.iter_mut().zip(LONG_JOBS).map(|(c, j)| c.observe(f, j, &of(j))).collect();
        for cut in cuts.iter_mut() {
            cut.check_dead_at_lease_end();
        }
        std::thread::sleep(POLL_EVERY);
        done.iter().all(|d| *d).then_some(())
    });
    taken_over.is_some()
}

/// Node n1 holds both long jobs' runs when its network to the store goes silent (the
/// proxy blackholes: nothing refused, nothing answered), with n2 and n3 beside it.
fn a_partitioned_holder_is_dead_before_its_lease_ends(server: ServerUrl) {
    let _g = serial();
    let Some(store) = server_store(server) else { return };
    let (mut f, proxy, n1_config) = fleet_with_proxied_node(&store, &long_jobs(), &pulse_job());
    f.start_with("n1", &n1_config);
    let running = |f: &Fleet| LONG_JOBS.iter().all(|j| !writes(f, j).is_empty());
    wait_for(NODE_START_WAIT, || running(&f).then_some(())).unwrap_or_else(|| panic!("n1 never ran:\n{}", f.log("n1")));
    f.start("n2");
    f.start("n3");
    wait_started(&f, "n2");
    wait_started(&f, "n3");
    let mut cuts = LONG_JOBS.map(|j| Cut::new(&f, j));

    let partition = Utc::now();
    proxy.set_mode(Mode::Blackhole);
    let taken_over = watch_partition(&f, &mut cuts);
    std::thread::sleep(AFTER_TAKEOVER);
    // Below the bound, no connection was reset: the node saw a partition, not a refusal.
    let held = proxy.open_connections();
    let heal = Utc::now();
    proxy.set_mode(Mode::Pass);
    let pulse_after =
        |f: &Fleet| f.lines("pulse.txt").iter().map(|l| l.parse::<DateTime<Utc>>().unwrap()).find(|t| *t > heal);
    let pulsed = wait_for(HEAL_WAIT, || pulse_after(&f));
    let pulsed_seen = Utc::now();
    std::fs::write(f.path("stop"), "").unwrap();
    let n1_alive = f.nodes[0].child.try_wait().unwrap().is_none();
    f.stop_all();

    let kind = server.name;
    assert!(taken_over, "{kind}: no takeover within {TAKEOVER_WAIT:?}; n2: {}\nn3: {}", f.log("n2"), f.log("n3"));
    let mut report = vec![format!("{kind}: partition at {partition}")];
    for (cut, job) in cuts.iter().zip(LONG_JOBS) {
        report.push(check_cut(&f, job, cut, partition));
    }
    assert!(held < MAX_CONNECTIONS, "{kind}: the proxy reset connections at its bound ({held} open)");
    assert!(n1_alive, "{kind}: the partitioned node exited:\n{}", f.log("n1"));
    let pulsed =
        pulsed.unwrap_or_else(|| panic!("{kind}: n1 ran no tick within {HEAL_WAIT:?} of the heal:\n{}", f.log("n1")));
    report.push(format!(
        "  healed at +{} ms ({held} connections held): n1 ran tick {pulsed} (seen +{} ms)",
        ms(heal - partition),
        ms(pulsed_seen - heal)
    ));
    let pulse = f.history("pulse");
    let after: Vec<&Value> = pulse.iter().filter(|r| instant(&r["scheduled_at"]) > heal && r["node"] == "n1").collect();
    assert!(
        after.iter().any(|r| state(r) == "succeeded"),
        "{kind}: n1's ticks after the heal are recorded: {pulse:#?}"
    );
    println!("{}", report.join("\n"));
}

fn ms(d: chrono::TimeDelta) -> i64 {
    d.num_milliseconds()
}

/// Checks (a) to (c) for one job cut by the partition; its figures, for the report.
fn check_cut(f: &Fleet, job: &str, cut: &Cut, partition: DateTime<Utc>) -> String {
    let lines = writes(f, job);
    let lease_until = cut.lease_until.unwrap_or_else(|| panic!("{job}: the store never showed the first run's lease"));
    let old: Vec<&Write> = lines.iter().filter(|w| w.token == cut.token).collect();
    let last_old = old.last().unwrap().at;
    // The job was alive when the partition began: it is the engine that stopped it.
    assert!(
        last_old > partition,
        "{job}: the job had stopped writing before the partition ({last_old} <= {partition})"
    );
    // (a) Dead before the store's lease ended, by its own writes and by its process.
    assert!(
        last_old < lease_until,
        "{job}: the partitioned node's job wrote at {last_old}, after the store's lease ended at {lease_until} (partition at {partition})"
    );
    if let Some((at, dead)) = cut.checked_dead {
        assert!(
            dead,
            "{job}: the partitioned node's job (pid {}) was alive at {at}, past the lease ({lease_until})",
            cut.pid
        );
    }
    // (b) The takeover: another node, a larger token, a retry of the same tick.
    let hist = f.history(job);
    let first = hist.iter().find(|r| r["fencing_token"].as_u64() == Some(cut.token)).expect("the first run's record");
    let retry = hist
        .iter()
        .find(|r| r["scheduled_at"] == first["scheduled_at"] && r["attempt"].as_u64() == Some(2))
        .unwrap_or_else(|| panic!("{job}: no retry of the cut run: {hist:#?}"));
    assert_eq!((first["node"].as_str(), state(first)), (Some("n1"), "lost"), "{job}: {first:#}");
    assert_eq!(retry["trigger"], "retry", "{job}: {retry:#}");
    assert_ne!(retry["node"], "n1", "{job}: the retry runs on another node");
    let new_token = retry["fencing_token"].as_u64().unwrap();
    assert!(new_token > cut.token, "{job}: the retry's token {new_token} is not above {}", cut.token);
    // (c) In the order the file got them, no write of the old token after the new one's first.
    let first_new =
        lines.iter().position(|w| w.token == new_token).unwrap_or_else(|| panic!("{job}: the retry never wrote"));
    let stale: Vec<&Write> = lines[first_new..].iter().filter(|w| w.token == cut.token).collect();
    assert!(stale.is_empty(), "{job}: the old holder wrote after the new one began: {stale:?}");
    let first_new_at = lines[first_new].at;
    assert!(
        last_old < first_new_at,
        "{job}: the old holder's last write {last_old} is not before the new one's first {first_new_at}"
    );
    let dead_check = cut
        .checked_dead
        .map_or("not checked".to_owned(), |(at, _)| format!("dead at lease end +{} ms", ms(at - lease_until)));
    format!(
        "  {job}: last write of token {} at +{} ms, store lease until +{} ms (margin {} ms, {dead_check}); retry token {new_token} on {} first wrote at +{} ms",
        cut.token,
        ms(last_old - partition),
        ms(lease_until - partition),
        ms(lease_until - last_old),
        retry["node"].as_str().unwrap_or("?"),
        ms(first_new_at - partition)
    )
}

#[test]
fn postgres_a_partitioned_holder_is_dead_before_its_lease_ends_and_claims_after_the_heal() {
    a_partitioned_holder_is_dead_before_its_lease_ends(POSTGRES);
}

#[test]
fn mariadb_a_partitioned_holder_is_dead_before_its_lease_ends_and_claims_after_the_heal() {
    a_partitioned_holder_is_dead_before_its_lease_ends(MYSQL);
}

#[test]
fn redis_a_partitioned_holder_is_dead_before_its_lease_ends_and_claims_after_the_heal() {
    a_partitioned_holder_is_dead_before_its_lease_ends(REDIS);
}

#[cfg(feature = "etcd")]
#[test]
fn etcd_a_partitioned_holder_is_dead_before_its_lease_ends_and_claims_after_the_heal() {
    a_partitioned_holder_is_dead_before_its_lease_ends(ETCD);
}

/// Before the tick's instant, how long the proxy starts dropping the node's answers: more
/// than the claim's lead (at most 150 ms), and short, so that little else of the node's
/// traffic loses its answer (and its connection) before the claim is sent.
const DROP_BEFORE: Duration = Duration::from_millis(250);
/// After the tick's instant, how long it keeps dropping them: the claim committed, its
/// answer is lost, and the next tick's claim is not yet sent.
const DROP_AFTER: Duration = Duration::from_millis(500);
/// How many ticks the test tries, one after the other, for one whose claim commits while
/// answers are dropped (the claim may wait for a connection, or for the answer to a
/// statement's preparation on a connection opened before the schema existed, and be sent
/// after the heal).
const LOST_ANSWER_TRIES: usize = 5;
/// Longest wait, after the heal, for the tick's record to show (a claim sent after the
/// heal is answered at once).
const LOST_ANSWER_RECORD_WAIT: Duration = Duration::from_secs(5);
/// Longest wait for the tick whose claim answer was lost to reach an end: the claim's
/// timeout (a third of the lease), the run itself, and, were it not granted again, the
/// lease and a recovery scan, with slack.
const LOST_ANSWER_WAIT: Duration = Duration::from_secs(15);

/// Sleeps until `at` (wall clock).
fn sleep_until(at: DateTime<Utc>) {
    std::thread::sleep((at - Utc::now()).to_std().unwrap_or_default());
}

/// The record of `job`'s tick at `tick` (first attempt), if any.
fn record_of(f: &Fleet, job: &str, tick: DateTime<Utc>) -> Option<Value> {
    f.history(job).into_iter().find(|r| instant(&r["scheduled_at"]) == tick && r["attempt"].as_u64() == Some(1))
}

/// Drops node n1's answers around the next tick but one; that tick and the window, if its
/// claim committed in the window (by the store's record), else `None`.
fn lose_a_claims_answer(f: &Fleet, proxy: &FaultProxy) -> Option<(DateTime<Utc>, DateTime<Utc>, DateTime<Utc>)> {
    let tick = DateTime::from_timestamp(Utc::now().timestamp() + 2, 0).unwrap();
    sleep_until(tick - DROP_BEFORE);
    let dropped_from = Utc::now();
    proxy.set_mode(Mode::DropReplies);
    sleep_until(tick + DROP_AFTER);
    let dropped_until = Utc::now();
    proxy.set_mode(Mode::Pass);
    let record = wait_for(LOST_ANSWER_RECORD_WAIT, || record_of(f, "every-second", tick))?;
    let claimed_at = instant(&record["claimed_at"]);
    let lost = claimed_at > dropped_from && claimed_at < dropped_until && record["node"] == "n1";
    if !lost {
        eprintln!(
            "the claim of {tick} committed outside the window ({dropped_from}..{dropped_until}): {record}; next tick"
        );
    }
    lost.then_some((tick, dropped_from, dropped_until))
}

/// Issue 20 §3: one node (behind the proxy) runs a job every second; its answers are
/// dropped from just before one tick's claim to just after the instant, so the claim
/// commits in the store and its answer never arrives. What a user relies on: that tick
/// still runs, once (the default `on_crash = "abandon"` must not turn a lost answer into a
/// silent miss).
fn a_claim_whose_answer_is_lost_still_runs_its_tick(server: ServerUrl) {
    let _g = serial();
    let Some(store) = server_store(server) else { return };
    let job = format!(
        r#"
[[jobs]]
name = "every-second"
schedule = "* * * * * *"
lease = "{}s"
command = ["/bin/sh", "-c", "echo $SOLOCRON_SCHEDULED_AT $SOLOCRON_FENCING_TOKEN >> $DIR/ticks.txt"]
"#,
        LEASE.as_secs()
    );
    let (mut f, proxy, n1_config) = fleet_with_proxied_node(&store, &job, "");
    f.start_with("n1", &n1_config);
    wait_for(NODE_START_WAIT, || f.lines("ticks.txt").first().cloned())
        .unwrap_or_else(|| panic!("n1 never ran:\n{}", f.log("n1")));
    let (tick, dropped_from, dropped_until) = (0..LOST_ANSWER_TRIES)
        .find_map(|_| lose_a_claims_answer(&f, &proxy))
        .unwrap_or_else(|| panic!("{}: no claim committed while answers were dropped", server.name));
    // (when, state) each time the test saw the tick's record change.
    let mut seen: Vec<(DateTime<Utc>, String)> = Vec::new();
    let ended = wait_for(LOST_ANSWER_WAIT, || {
        let r = record_of(&f, "every-second", tick)?;
        let st = state(&r).to_owned();
        if seen.last().is_none_or(|(_, s)| *s != st) {
            seen.push((Utc::now(), st.clone()));
        }
        (st != "running").then_some(r)
    });
    std::thread::sleep(Duration::from_secs(1));
    f.stop_all();
    let kind = server.name;
    let record = record_of(&f, "every-second", tick).expect("the record of the tick");
    let claimed_at = instant(&record["claimed_at"]);
    println!(
        "{kind}: answers dropped from tick {} ms to tick +{} ms",
        ms(dropped_from - tick),
        ms(dropped_until - tick)
    );
    let timeline: Vec<String> =
        seen.iter().map(|(at, st)| format!("{st} (seen at tick +{} ms)", ms(*at - tick))).collect();
    let at = tick.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let ran: Vec<String> = f.lines("ticks.txt").into_iter().filter(|l| l.split(' ').next() == Some(&at)).collect();
    println!(
        "{kind}: tick {tick} claimed at +{} ms while answers were dropped; its record: {}; ran {} time(s); reason: {}",
        ms(claimed_at - tick),
        timeline.join(" -> "),
        ran.len(),
        record["reason"]
    );
    assert!(
        ended.is_some(),
        "{kind}: the tick's record is still running {LOST_ANSWER_WAIT:?} after the heal: {record:#}"
    );
    assert_eq!(ran.len(), 1, "{kind}: the tick whose claim answer was lost ran {} times: {record:#}", ran.len());
    assert_eq!(state(&record), "succeeded", "{kind}: {record:#}");
}

#[test]
fn postgres_a_claim_whose_answer_is_lost_still_runs_its_tick() {
    a_claim_whose_answer_is_lost_still_runs_its_tick(POSTGRES);
}

#[test]
fn mariadb_a_claim_whose_answer_is_lost_still_runs_its_tick() {
    a_claim_whose_answer_is_lost_still_runs_its_tick(MYSQL);
}

#[test]
fn redis_a_claim_whose_answer_is_lost_still_runs_its_tick() {
    a_claim_whose_answer_is_lost_still_runs_its_tick(REDIS);
}

#[cfg(feature = "etcd")]
#[test]
fn etcd_a_claim_whose_answer_is_lost_still_runs_its_tick() {
    a_claim_whose_answer_is_lost_still_runs_its_tick(ETCD);
}
