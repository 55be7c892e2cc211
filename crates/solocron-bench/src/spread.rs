//! Scenario 8, the spread of a fleet's ticks over its nodes (issue 23): node processes with
//! in-process handlers, jobs due every second. Who ran each tick, how late it started and
//! what the claims cost; then the same fleet with one node killed (SIGKILL) mid-run, whose
//! share the survivors take. Every tick of the measured window must have run exactly once;
//! with the kill, a tick the killed node had claimed may instead be recorded by recovery
//! (abandoned, or lost), and is counted apart; a tick with neither a start nor a record is
//! missed, and fails the benchmark, as a duplicate does.

use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, Utc};
use solocron_core::{HistoryQuery, Prefix, RunState, HEARTBEAT_EVERY, RECORDS_PAGE_MAX};

use crate::fleet::{fresh, reports, spawn, Proc};
use crate::raw::cleanup;
use crate::scenarios::{exactly_once, node_args, starts, Ctx};
use crate::stats::{fmt, quantile, table};

/// The fleet's size.
const NODES: usize = 3;
/// The jobs' lease: recovery finds the killed node's unended runs this long after its last
/// claim or renewal, well within the minutes a run of this scenario lasts.
const LEASE_MS: u64 = 5000;
/// The engine claims a tick ranked to another node this long after its instant (its
/// `spread::BACKUP_AFTER`): a start at least this late was a backup's claim.
const BACKUP_AFTER_MS: f64 = 100.0;
/// From the nodes' spawn to the measured window: start-up, then a heartbeat period, after
/// which every node has read the others' beats (before, a node knows no fleet and claims
/// every tick first, as a lone node does).
const SETTLE: Duration = Duration::from_secs(HEARTBEAT_EVERY.as_secs() + 3);
/// Seconds a node runs past the last instant measured: its runs start and end before it stops.
const TAIL_S: i64 = 2;
/// Where in its second the kill lands, per round (ms past an instant): just after the
/// instant (runs starting, their ends not yet written), mid-second, and near the next
/// instant (its ticks being claimed ahead).
const KILL_OFFSETS_MS: [i64; 3] = [20, 350, 680];

/// (job, scheduled ms, start µs, attempt), as `scenarios::starts` reads them.
type Start = (String, i64, i64, u64);

/// The sizes of a run.
struct Sizes {
    /// Jobs, each due at every whole second.
    jobs: usize,
    /// Seconds measured without a kill.
    window_s: i64,
    /// Seconds measured before the kill, and after it.
    before_kill_s: i64,
    after_kill_s: i64,
}

impl Sizes {
    fn of(c: &Ctx) -> Sizes {
        if c.quick {
            Sizes { jobs: 100, window_s: 8, before_kill_s: 4, after_kill_s: 6 }
        } else {
            Sizes { jobs: 1000, window_s: 30, before_kill_s: 15, after_kill_s: 20 }
        }
    }
}

/// 8. Spread: rounds of an even fleet, then rounds with one node killed mid-run.
pub fn spread(c: &Ctx) -> anyhow::Result<String> {
    let sz = Sizes::of(c);
    let mut even = vec![];
    for round in 0..c.rounds {
        even.push(even_round(c, &sz, round)?);
    }
    let mut killed = vec![];
    for round in 0..c.rounds {
        killed.push(kill_round(c, &sz, round)?);
    }
    Ok(format!(
        "## 8. Spread ({NODES} nodes, {jobs} jobs due at every whole second, in-process handlers, lease {lease} s; \
         measured from {settle} s after the nodes start, once each has read the others' heartbeats; \
         exactly once verified tick by tick: every tick of every job in the window ran once)\n\n\
         ### Even fleet ({w} s measured)\n\n{}\n\
         ### One node SIGKILLed mid-run ({b} s measured before the kill, {a} s after)\n\n{}\n\
         Lateness: handler start minus the tick's instant. Per-tick costs: a node's calls over \
         every tick the fleet ran while it lived. Backups: ticks started at least {backup} ms \
         late, claimed by a node that did not rank first for them (after a kill: the killed \
         node's ticks, until the survivors see its heartbeats stop).",
        table(
            &[
                "round",
                "runs per node",
                "busiest share",
                "lateness p50 / p99 / max ms",
                "backups",
                "claim calls / tick / node",
                "claim requests / tick / node",
                "all store calls / tick / node",
                "target",
            ],
            &even
        ),
        table(
            &[
                "round",
                "killed",
                "shares before",
                "shares after",
                &format!("lateness p50 / p99 / max ms, {} s after the kill", sz.after_kill_s),
                "backups after the kill (last at)",
                "killed node's claimed ticks never started",
                "killed node's started ticks, end not recorded",
            ],
            &killed
        ),
        jobs = sz.jobs,
        lease = LEASE_MS / 1000,
        settle = SETTLE.as_secs(),
        w = sz.window_s,
        b = sz.before_kill_s,
        a = sz.after_kill_s,
        backup = BACKUP_AFTER_MS,
    ))
}

/// The fleet of one round in a fresh namespace: nodes `s0`.. running until `end_ms` (and
/// [`TAIL_S`] more); `s0` also keeps a journal of its starts when `journal` is set.
fn fleet(c: &Ctx, url: &str, prefix: &Prefix, jobs: usize, end_ms: i64, journal: bool) -> Vec<Proc> {
    let seconds = ((end_ms - Utc::now().timestamp_millis()) / 1000 + 1 + TAIL_S).max(1) as u64;
    (0..NODES)
        .map(|n| {
            let id = format!("s{n}");
            let mut a = node_args(url, prefix, &id, &c.dir);
            a.jobs = jobs;
            a.seconds = seconds;
            a.lease_ms = LEASE_MS;
            if journal && n == 0 {
                a.journal = Some(c.dir.join(format!("{id}-{prefix}.journal")).display().to_string());
            }
            spawn(&a, None)
        })
        .collect()
}

/// The first whole second at least [`SETTLE`] from now, in ms.
fn settled_instant() -> i64 {
    let t = Utc::now().timestamp_millis() + SETTLE.as_millis() as i64;
    (t / 1000 + 1) * 1000
}

/// One round without a kill: a table row.
fn even_round(c: &Ctx, sz: &Sizes, round: usize) -> anyhow::Result<Vec<String>> {
    let (url, prefix) = fresh(&c.store, &c.dir, "spread");
    let begin = settled_instant();
    let end = begin + sz.window_s * 1000;
    let procs = fleet(c, &url, &prefix, sz.jobs, end, false);
    let reps = reports(procs, Duration::from_secs((end - begin) as u64 / 1000 + 90));
    block(cleanup(&url, &prefix));
    anyhow::ensure!(reps.len() == NODES, "spread: only {} of {NODES} nodes reported", reps.len());
    let per_node: Vec<(String, Vec<Start>)> =
        reps.iter().map(|r| (r["node"].as_str().unwrap_or("?").to_owned(), starts(std::slice::from_ref(r)))).collect();
    let all: Vec<Start> = per_node.iter().flat_map(|(_, s)| s.iter().cloned()).collect();
    let ticks_run = exactly_once(&all, "spread")?;
    let missed = missing(&all, sz.jobs, begin, end);
    anyhow::ensure!(
        missed.is_empty(),
        "spread: {} ticks of the window never ran (missed), e.g. {:?}",
        missed.len(),
        &missed[..missed.len().min(5)]
    );
    let runs: Vec<(String, usize)> =
        per_node.iter().map(|(n, s)| (n.clone(), in_window(s, begin, end).count())).collect();
    let total: usize = runs.iter().map(|r| r.1).sum();
    let busiest = runs.iter().map(|r| r.1).max().unwrap_or(0) as f64 / total.max(1) as f64;
    let late: Vec<f64> = in_window(&all, begin, end).map(lateness_ms).collect();
    let per_tick = |k: &str| reps.iter().map(|r| r[k].as_f64().unwrap_or(0.0) / ticks_run as f64).fold(0.0, f64::max);
    Ok(vec![
        (round + 1).to_string(),
        runs.iter().map(|(n, k)| format!("{n} {k}")).collect::<Vec<_>>().join(", "),
        format!("{busiest:.3}"),
        lateness_cell(&late),
        late.iter().filter(|&&l| l >= BACKUP_AFTER_MS).count().to_string(),
        format!("{:.4}", per_tick("claims")),
        format!("{:.3}", per_tick("requests")),
        format!("{:.4}", per_tick("calls")),
        "busiest ≤ 0.45; p99 ≤ 1.2 × and claim calls ≤ 2 × before spreading".into(),
    ])
}

/// One round with `s0` killed (SIGKILL) mid-run: a table row.
fn kill_round(c: &Ctx, sz: &Sizes, round: usize) -> anyhow::Result<Vec<String>> {
    let (url, prefix) = fresh(&c.store, &c.dir, "spreadkill");
    let begin = settled_instant();
    let kill_at = begin + sz.before_kill_s * 1000 + KILL_OFFSETS_MS[round % KILL_OFFSETS_MS.len()];
    let end = (kill_at + sz.after_kill_s * 1000) / 1000 * 1000 + 1000;
    let mut procs = fleet(c, &url, &prefix, sz.jobs, end, true);
    let victim = procs.remove(0);
    let victim_id = victim.id.clone();
    let journal = c.dir.join(format!("{victim_id}-{prefix}.journal"));
    let killed = kill(victim, kill_at)?;
    let reps = reports(procs, Duration::from_secs((end - killed) as u64 / 1000 + 90));
    let records = block(records(&url, &prefix, begin, end));
    block(cleanup(&url, &prefix));
    let records = records?;
    anyhow::ensure!(
        reps.len() == NODES - 1,
        "spread with a kill: only {} of {} survivors reported",
        reps.len(),
        NODES - 1
    );
    let mut per_node: Vec<(String, Vec<Start>)> =
        reps.iter().map(|r| (r["node"].as_str().unwrap_or("?").to_owned(), starts(std::slice::from_ref(r)))).collect();
    per_node.insert(0, (victim_id.clone(), read_journal(&journal)?));
    let all: Vec<Start> = per_node.iter().flat_map(|(_, s)| s.iter().cloned()).collect();
    exactly_once(&all, "spread with a kill")?;
    let fate = fates(&all, (&victim_id, &per_node[0].1), &records, sz.jobs, begin, end);
    anyhow::ensure!(
        fate.missed.is_empty(),
        "spread with a kill: {} ticks of the window neither ran nor were recorded (missed), e.g. {:?}",
        fate.missed.len(),
        &fate.missed[..fate.missed.len().min(5)]
    );
    let shares = |from: i64, to: i64| {
        let runs: Vec<usize> = per_node.iter().map(|(_, s)| in_window(s, from, to).count()).collect();
        let total = runs.iter().sum::<usize>().max(1) as f64;
        per_node
            .iter()
            .zip(&runs)
            .map(|((n, _), k)| format!("{n} {:.2}", *k as f64 / total))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let after: Vec<&Start> = in_window(&all, killed, killed + sz.after_kill_s * 1000).collect();
    let late: Vec<f64> = after.iter().map(|s| lateness_ms(s)).collect();
    let backups: Vec<i64> =
        after.iter().filter(|s| lateness_ms(s) >= BACKUP_AFTER_MS).map(|s| s.1 * 1000 - killed * 1000).collect();
    let last_backup = backups.iter().max().map_or("—".to_owned(), |us| format!("{:.1} s after", *us as f64 / 1e6));
    Ok(vec![
        (round + 1).to_string(),
        format!("{victim_id}, {:.3} s into the window", (killed - begin) as f64 / 1000.0),
        shares(begin, killed),
        shares(killed, end),
        lateness_cell(&late),
        format!("{} ({last_backup})", backups.len()),
        fate.claimed_not_started.describe(killed),
        fate.started_not_ended.describe(killed),
    ])
}

/// SIGKILLs `victim` at `at_ms` (not before) and returns when it was killed, in ms.
fn kill(mut victim: Proc, at_ms: i64) -> anyhow::Result<i64> {
    let wait = at_ms - Utc::now().timestamp_millis();
    if wait > 0 {
        std::thread::sleep(Duration::from_millis(wait as u64));
    }
    anyhow::ensure!(victim.child.try_wait()?.is_none(), "node {} exited before it was to be killed", victim.id);
    // `Child::kill` is SIGKILL: no drain, no goodbye, no report; its runs' ends are lost.
    victim.child.kill()?;
    let killed = Utc::now().timestamp_millis();
    victim.child.wait()?;
    Ok(killed)
}

/// The starts of first attempts at ticks in `[from, to)` (ms).
fn in_window(all: &[Start], from: i64, to: i64) -> impl Iterator<Item = &Start> {
    all.iter().filter(move |s| s.3 == 1 && s.1 >= from && s.1 < to)
}

/// Ms from a tick's instant to its handler's start.
fn lateness_ms(s: &Start) -> f64 {
    (s.2 - s.1 * 1000) as f64 / 1000.0
}

fn lateness_cell(late: &[f64]) -> String {
    format!("{} / {} / {}", fmt(quantile(late, 0.5)), fmt(quantile(late, 0.99)), fmt(quantile(late, 1.0)))
}

/// Every (job, instant) of `jobs` jobs due each whole second in `[from, to)` ms.
fn expected(jobs: usize, from: i64, to: i64) -> impl Iterator<Item = (String, i64)> {
    let seconds = (from + 999).div_euclid(1000)..(to + 999).div_euclid(1000);
    (0..jobs).flat_map(move |j| seconds.clone().map(move |s| (format!("j{j}"), s * 1000)))
}

/// The ticks in `[from, to)` no handler started.
fn missing(all: &[Start], jobs: usize, from: i64, to: i64) -> Vec<(String, i64)> {
    let ran: std::collections::HashSet<(&str, i64)> = in_window(all, from, to).map(|s| (s.0.as_str(), s.1)).collect();
    expected(jobs, from, to).filter(|(j, t)| !ran.contains(&(j.as_str(), *t))).collect()
}

/// (state, node) of each first attempt's record, by (job, instant ms).
type Records = HashMap<(String, i64), (RunState, String)>;

/// The records of ticks in `[from, to)` ms, read a second at a time (a page holds at most
/// [`RECORDS_PAGE_MAX`]).
async fn records(url: &str, prefix: &Prefix, from: i64, to: i64) -> anyhow::Result<Records> {
    let store = solocron_stores::open(url, prefix).await?;
    let mut out = Records::new();
    for s in from / 1000..(to + 999) / 1000 {
        let at = |s: i64| DateTime::<Utc>::from_timestamp(s, 0).expect("in range");
        let q =
            HistoryQuery { since: Some(at(s)), until: Some(at(s + 1)), limit: RECORDS_PAGE_MAX, ..Default::default() };
        let page = store.history(&q).await?;
        anyhow::ensure!(page.len() < RECORDS_PAGE_MAX, "more than a page of records for one second: too many jobs");
        for r in page.into_iter().filter(|r| r.id.attempt == 1) {
            out.insert((r.id.tick.job.clone(), r.id.tick.scheduled_at.timestamp_millis()), (r.state, r.node));
        }
    }
    Ok(out)
}

/// The starts a killed node's journal kept (see `node --journal`).
fn read_journal(path: &std::path::Path) -> anyhow::Result<Vec<Start>> {
    let text = std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
    // A line cut short by the kill has fewer than four fields: that start is not counted.
    Ok(text
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            match f[..] {
                [job, at, start, attempt] => {
                    Some((job.to_owned(), at.parse().ok()?, start.parse().ok()?, attempt.parse().ok()?))
                }
                _ => None,
            }
        })
        .collect())
}

/// How recovery recorded ticks of the killed node: counts by state, and by instant.
#[derive(Default)]
struct Recovered {
    states: HashMap<RunState, usize>,
    instants: std::collections::BTreeMap<i64, usize>,
}

impl Recovered {
    fn add(&mut self, state: RunState, at_ms: i64) {
        *self.states.entry(state).or_default() += 1;
        *self.instants.entry(at_ms).or_default() += 1;
    }

    /// `N (k abandoned, ...; instants from the kill -20 ms: n, ...)`: the instants as ms from the kill, so
    /// a reader sees whether they were the ticks starting then or those claimed ahead.
    fn describe(&self, killed_ms: i64) -> String {
        let total: usize = self.states.values().sum();
        if total == 0 {
            return "0".into();
        }
        let mut states: Vec<String> = self.states.iter().map(|(s, n)| format!("{n} {s}")).collect();
        states.sort();
        let instants: Vec<String> =
            self.instants.iter().take(3).map(|(at, n)| format!("{:+} ms: {n}", at - killed_ms)).collect();
        let more = if self.instants.len() > 3 { ", …" } else { "" };
        format!("{total} ({}; instants from the kill {}{more})", states.join(", "), instants.join(", "))
    }
}

/// What became of the window's ticks that did not simply run once.
#[derive(Default)]
struct Fates {
    /// Recorded as the killed node's, never started anywhere.
    claimed_not_started: Recovered,
    /// Started by the killed node, whose end was never recorded.
    started_not_ended: Recovered,
    /// Neither started nor recorded as the killed node's (with the record's state, if any).
    missed: Vec<(String, i64, Option<RunState>)>,
}

/// Sorts every tick of the window by what happened to it, from all starts, the killed
/// node's own starts and the store's records.
fn fates(all: &[Start], victim: (&str, &[Start]), records: &Records, jobs: usize, from: i64, to: i64) -> Fates {
    let (victim, victim_starts) = victim;
    let ran: std::collections::HashSet<(&str, i64)> = in_window(all, from, to).map(|s| (s.0.as_str(), s.1)).collect();
    let by_victim: std::collections::HashSet<(&str, i64)> =
        in_window(victim_starts, from, to).map(|s| (s.0.as_str(), s.1)).collect();
    let unended = |state: RunState| matches!(state, RunState::Abandoned | RunState::Lost | RunState::Running);
    let mut f = Fates::default();
    for (job, at) in expected(jobs, from, to) {
        let key = (job.as_str(), at);
        let record = records.get(&(job.clone(), at));
        let killed_nodes = record.filter(|(state, node)| node == victim && unended(*state)).map(|r| r.0);
        match (ran.contains(&key), killed_nodes) {
            (true, Some(state)) if by_victim.contains(&key) => f.started_not_ended.add(state, at),
            (true, _) => {}
            (false, Some(state)) => f.claimed_not_started.add(state, at),
            (false, None) => f.missed.push((job, at, record.map(|r| r.0))),
        }
    }
    f
}

/// Runs `fut` to its end from this (non-async) scenario, on the runtime it entered.
fn block<T: Send>(fut: impl Future<Output = T> + Send) -> T {
    let rt = tokio::runtime::Handle::current();
    std::thread::scope(|s| s.spawn(|| rt.block_on(fut)).join()).expect("a store call of the benchmark panicked")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn start(job: &str, at_s: i64, late_ms: i64) -> Start {
        (job.to_owned(), at_s * 1000, at_s * 1_000_000 + late_ms * 1000, 1)
    }

    #[test]
    fn the_expected_ticks_are_every_job_at_every_whole_second_of_the_window() {
        let ticks: Vec<_> = expected(2, 10_000, 12_000).collect();
        assert_eq!(ticks, [("j0".into(), 10_000), ("j0".into(), 11_000), ("j1".into(), 10_000), ("j1".into(), 11_000)]);
        assert_eq!(expected(1, 10_000, 11_500).count(), 2, "a window ending mid-second holds that second's instant");
    }

    #[test]
    fn a_tick_is_missed_unless_started_or_recorded_as_the_killed_nodes() {
        let all = [start("j0", 10, 3), start("j1", 10, 120)];
        assert_eq!(missing(&all, 2, 10_000, 11_000), Vec::<(String, i64)>::new());
        assert_eq!(missing(&all[..1], 2, 10_000, 11_000), [("j1".to_owned(), 10_000)]);

        let victim = [start("j0", 10, 3)];
        let mut records = Records::new();
        records.insert(("j0".into(), 10_000), (RunState::Abandoned, "s0".into()));
        records.insert(("j1".into(), 11_000), (RunState::Abandoned, "s0".into()));
        records.insert(("j0".into(), 11_000), (RunState::Succeeded, "s1".into()));
        let f = fates(&all, ("s0", &victim), &records, 2, 10_000, 12_000);
        assert_eq!(f.started_not_ended.describe(10_020), "1 (1 abandoned; instants from the kill -20 ms: 1)");
        assert_eq!(f.claimed_not_started.describe(10_020), "1 (1 abandoned; instants from the kill +980 ms: 1)");
        assert_eq!(f.missed, [("j0".to_owned(), 11_000, Some(RunState::Succeeded))], "a record without a start");
    }

    #[test]
    fn a_journal_line_cut_by_the_kill_is_not_a_start() {
        let path = std::env::temp_dir().join(format!("solocron-bench-journal-{}", std::process::id()));
        std::fs::write(&path, "j0 10000 10000300 1\nj1 10000 100").unwrap();
        assert_eq!(read_journal(&path).unwrap(), [("j0".to_owned(), 10_000, 10_000_300, 1)]);
        std::fs::remove_file(&path).unwrap();
    }
}
