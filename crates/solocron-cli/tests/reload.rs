//! SIGHUP reloads a running daemon's `[[jobs]]`: two real `solocron run` nodes on one store,
//! a schedule changed, a job added and one removed while it runs, then a configuration with
//! an error refused whole. What the jobs wrote is the evidence, with the store's history.
#![forbid(unsafe_code)]

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use common::*;
use nix::sys::signal::Signal;
use solocron_core::Schedule;

/// What each run writes: its instant, node and token.
const RECORD: &str = r#"echo \"$SOLOCRON_SCHEDULED_AT $SOLOCRON_NODE_ID $SOLOCRON_FENCING_TOKEN\" >> $DIR/"#;
/// The changed job's schedules: even seconds, then every third second from 1.
const OLD: &str = "*/2 * * * * *";
const NEW: &str = "1-59/3 * * * * *";
/// How long a run of the removed job lasts: it is in progress when the reload comes.
const LONG_SECS: u64 = 3;

fn job(name: &str, schedule: &str, command: &str) -> String {
    format!(
        "[[jobs]]\nname = \"{name}\"\nschedule = \"{schedule}\"\nlease = \"4s\"\ncommand = [\"/bin/sh\", \"-c\", \"{command}\"]\n"
    )
}

fn recording(name: &str, schedule: &str) -> String {
    job(name, schedule, &format!("{RECORD}{name}.txt"))
}

fn long(name: &str) -> String {
    job(name, "* * * * * *", &format!("{RECORD}{name}.txt; sleep {LONG_SECS}; echo done >> $DIR/{name}.done"))
}

/// Rewrites the configuration with `jobs` (and the store as it was), keeping the header.
fn rewrite(f: &Fleet, jobs: &str) {
    let text = std::fs::read_to_string(f.config()).unwrap();
    let header = &text[..text.find("[[jobs]]").unwrap()];
    std::fs::write(f.config(), format!("{header}{}", jobs.replace("$DIR", &f.dir.path().display().to_string())))
        .unwrap();
}

/// The instants each node wrote to `file`, and who ran each.
fn runs(f: &Fleet, file: &str) -> BTreeMap<DateTime<Utc>, Vec<String>> {
    let mut per_tick: BTreeMap<DateTime<Utc>, Vec<String>> = BTreeMap::new();
    for line in f.lines(file) {
        let mut it = line.split_whitespace();
        let at = it.next().unwrap().parse().unwrap();
        per_tick.entry(at).or_default().push(it.next().unwrap().to_owned());
    }
    per_tick
}

fn hup_all(f: &Fleet) {
    for i in 0..f.nodes.len() {
        f.signal(i, Signal::SIGHUP);
    }
}

/// Waits until every node logged `what` at least `times` times.
fn logged(f: &Fleet, what: &str, times: usize) -> bool {
    let ids: Vec<String> = f.nodes.iter().map(|n| n.id.clone()).collect();
    wait_for(Duration::from_secs(10), || ids.iter().all(|id| f.log(id).matches(what).count() >= times).then_some(()))
        .is_some()
}

fn reload_keeps_every_tick_once(store: Option<&str>) {
    let mut f = Fleet::on(store, &format!("{}{}", recording("changes", OLD), long("removed")));
    f.start("n1");
    f.start("n2");
    assert!(
        wait_for(Duration::from_secs(15), || f.path("removed.txt").exists().then_some(())).is_some(),
        "no run of `removed` started; n1:\n{}",
        f.log("n1")
    );
    std::thread::sleep(Duration::from_millis(2500));

    // Changed, added, removed while a run of it is in progress.
    rewrite(&f, &format!("{}{}", recording("changes", NEW), recording("added", "* * * * * *")));
    let reloaded_at = Utc::now();
    hup_all(&f);
    assert!(logged(&f, "configuration reloaded", 1), "n1:\n{}", f.log("n1"));
    std::thread::sleep(Duration::from_millis(4500));

    // An error: refused whole, named, and the jobs run on as they were.
    rewrite(&f, &format!("{}{}", recording("changes", "every tuesday"), recording("later", "* * * * * *")));
    hup_all(&f);
    assert!(logged(&f, "configuration not reloaded", 1), "n1:\n{}", f.log("n1"));
    let refused = f.log("n1");
    assert!(refused.contains("solocron.toml") && refused.contains("schedule"), "the file and key are named: {refused}");
    let added_before = runs(&f, "added.txt").len();
    std::thread::sleep(Duration::from_millis(2500));
    f.stop_all();
    // The CLI reads the store through the configuration: a valid one again.
    rewrite(&f, &recording("changes", NEW));

    let (old, new) = (Schedule::parse(OLD, "UTC").unwrap(), Schedule::parse(NEW, "UTC").unwrap());
    let changes = runs(&f, "changes.txt");
    let twice: Vec<_> = changes.iter().filter(|(_, nodes)| nodes.len() > 1).collect();
    assert!(twice.is_empty(), "ticks run twice: {twice:?}");
    let ticks: Vec<_> = changes.keys().copied().collect();
    let follows = |a: DateTime<Utc>, b: DateTime<Utc>| old.next_after(a) == Some(b) || new.next_after(a) == Some(b);
    assert!(ticks.windows(2).all(|w| follows(w[0], w[1])), "a tick dropped between the schedules: {ticks:?}");
    let new_only = |t: &DateTime<Utc>| t.timestamp() % 3 == 1 && t.timestamp() % 2 == 1;
    // The new schedule continues from the last instant the old one handled (its last
    // round, at most one old period before the reload): a new tick may run late, never
    // one from before that.
    let old_period = chrono::Duration::seconds(2);
    assert!(ticks.iter().filter(|t| new_only(t)).all(|t| *t > reloaded_at - old_period), "{ticks:?}");
    assert!(ticks.iter().any(new_only), "the new schedule ran: {ticks:?}");

    let added = runs(&f, "added.txt");
    assert!(added.keys().all(|t| *t > reloaded_at), "the added job is born at the reload: {added:?}");
    assert!(added.values().all(|nodes| nodes.len() == 1), "{added:?}");
    assert!(added.len() > added_before, "jobs ran on after the refused reload: {added:?}");
    assert!(!f.path("later.txt").exists(), "nothing of the refused configuration ran");

    // The removed job's run in progress finished and was recorded; no later tick ran.
    let removed = runs(&f, "removed.txt");
    let lead = chrono::Duration::seconds(1);
    assert!(removed.keys().all(|t| *t <= reloaded_at + lead), "{removed:?}");
    assert_eq!(f.lines("removed.done").len(), removed.len(), "every run of it finished");
    let history = f.history("removed");
    assert!(history.iter().all(|r| state(r) == "succeeded" || state(r) == "skipped"), "{history:#?}");
    assert_eq!(history.iter().filter(|r| state(r) == "succeeded").count(), removed.len(), "{history:#?}");
}

#[test]
fn sighup_reloads_jobs_on_sqlite() {
    reload_keeps_every_tick_once(None);
}

#[test]
fn sighup_reloads_jobs_on_postgres() {
    let Some(store) = server_store(solocron_conformance::server::POSTGRES) else { return };
    reload_keeps_every_tick_once(Some(&store));
}

/// `solocron reload` with the daemon's pid file: a configuration with an error is refused
/// before anything is sent (exit 2, naming the field), and the daemon keeps its jobs; a good
/// one is sent as SIGHUP, and the job it adds runs. Without a pid file it says how to name
/// the daemon; a stale pid file is refused.
#[test]
fn the_reload_command_checks_the_file_then_signals_the_daemon_of_its_pid_file() {
    let mut f = Fleet::new(&recording("kept", "* * * * * *"));
    let pid_file = f.path("solocron.pid");
    let text = std::fs::read_to_string(f.config()).unwrap();
    let with_pid = text.replacen("[node]\n", &format!("[node]\npid_file = \"{}\"\n", pid_file.display()), 1);
    std::fs::write(f.config(), with_pid).unwrap();
    f.start("n1");
    wait_for(Duration::from_secs(10), || exists(&pid_file).then_some(())).expect("the daemon wrote its pid file");
    let pid: u32 = std::fs::read_to_string(&pid_file).unwrap().trim().parse().unwrap();
    assert_eq!(pid, f.nodes[0].child.id(), "the pid file holds the daemon's pid");

    rewrite(&f, &format!("{}{}", recording("kept", "* * * * * *"), recording("added", "nonsense")));
    let (code, _, err) = f.cli(&["reload"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("not reloaded") && err.contains("(added).schedule"), "{err}");
    assert!(!f.log("n1").contains("reloaded"), "nothing was sent: {}", f.log("n1"));

    rewrite(&f, &format!("{}{}", recording("kept", "* * * * * *"), recording("added", "* * * * * *")));
    let (code, out, err) = f.cli(&["reload"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains(&format!("pid {pid}")), "{out}");
    wait_for(Duration::from_secs(5), || f.lines("added.txt").first().cloned())
        .expect("the added job ran after the reload");

    std::fs::write(&pid_file, "1\n").unwrap();
    let (code, _, err) = f.cli(&["reload"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("not a pid") || err.contains("not a running"), "{err}");
    std::fs::write(&pid_file, format!("{pid}\n")).unwrap();
    f.stop_all();
    assert!(!exists(&pid_file), "the daemon removed its pid file at exit");
    let (code, _, err) = f.cli(&["reload", "--pid-file", "/nonexistent/solocron.pid"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("cannot read the pid file"), "{err}");
}
