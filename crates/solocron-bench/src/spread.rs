//! Scenario 8, the spread of a fleet's ticks over its nodes (issue 23): node processes with
//! in-process handlers, jobs due every second. Who ran each tick, how late it started and
//! what the claims cost; then the same fleet with one node killed (SIGKILL) mid-run, whose
//! share the survivors take. Every tick of the measured window must have run exactly once;
//! with the kill, a tick the killed node had claimed may instead be recorded by recovery
//! (abandoned, or lost), and is counted apart; a tick with neither a start nor a record is
//! missed, and fails the benchmark, as a duplicate does.
//!
//! The even rounds also read CPU from /proc: each node process's over the window per run
//! it started, and the store's server processes' per tick run, beside the server's CPU per
//! raw insert-if-absent measured right before the fleet starts (see [`crate::cpu`]).

use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, Utc};
use solocron_core::{HistoryQuery, Prefix, RunState, HEARTBEAT_EVERY, RECORDS_PAGE_MAX};

use crate::cpu::{raw_cpu, server_names, wal_position, RawCpu, Sample, Usage, RAW_BATCH};
use crate::fleet::{cpu_ms, fresh, reports, spawn, Proc};
use crate::raw::cleanup;
use crate::scenarios::{exactly_once, node_args, starts, Ctx};
use crate::stats::{fmt, mmm, quantile, table};

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
    /// Each phase of the raw baseline (one at a time, batched) lasts at most this long.
    raw_phase: Duration,
}

impl Sizes {
    fn of(c: &Ctx) -> Sizes {
        if c.quick {
            Sizes { jobs: 100, window_s: 8, before_kill_s: 4, after_kill_s: 6, raw_phase: Duration::from_millis(500) }
        } else {
            Sizes { jobs: 1000, window_s: 30, before_kill_s: 15, after_kill_s: 20, raw_phase: Duration::from_secs(4) }
        }
    }
}

/// 8. Spread: rounds of an even fleet, then rounds with one node killed mid-run.
pub fn spread(c: &Ctx) -> anyhow::Result<String> {
    let sz = Sizes::of(c);
    let mut even = vec![];
    let mut cpu = vec![];
    for round in 0..c.rounds {
        let (row, figures) = even_round(c, &sz, round)?;
        even.push(row);
        cpu.push(figures);
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
         ### CPU of the even fleet ({w} s measured)\n\n{}\n{cpu_note}\n\n\
         ### One node SIGKILLed mid-run ({b} s measured before the kill, {a} s after)\n\n{}\n\
         Lateness: handler start minus the tick's instant. Per-tick costs: a node's calls over \
         every tick the fleet ran while it lived. Backups: ticks started at least {backup} ms \
         late, claimed by a node that did not rank first for them (after a kill: the killed \
         node's ticks, until the survivors see its heartbeats stop). Recorded skipped: with \
         `overlap = skip`, a job whose run the killed node held skips its ticks until that \
         run's lease expires.",
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
        cpu_table(&cpu),
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
                "ticks recorded skipped",
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
        cpu_note = cpu_note(sz.raw_phase),
    ))
}

/// The fleet of one round in a fresh namespace: nodes `s0`.. running until `end_ms` (and
/// [`TAIL_S`] more); `s0` also keeps a journal of its starts when `journal` is set.
fn fleet(c: &Ctx, url: &str, prefix: &Prefix, jobs: usize, end_ms: i64, journal: bool) -> Vec<Proc> {
    let seconds = ((end_ms - Utc::now().timestamp_millis()) / 1000 + 1 + TAIL_S).max(1) as u64;
    (0..NODES)
        .map(|n| {
            let id = format!("s{n}");
            let mut a = node_args(c, url, prefix, &id);
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

/// One round without a kill: a table row, and the CPU figures.
fn even_round(c: &Ctx, sz: &Sizes, round: usize) -> anyhow::Result<(Vec<String>, Cpu)> {
    let (url, prefix) = fresh(&c.store, &c.dir, "spread");
    let servers = server_names(&url);
    // The raw baseline goes first, on a server no node uses yet; its table or keys are
    // gone before the window (no autovacuum of it, no expiries there).
    let raw = if servers.is_empty() { None } else { Some(block(raw_cpu(&url, &prefix, servers, sz.raw_phase))?) };
    let begin = settled_instant();
    let end = begin + sz.window_s * 1000;
    let wal = if url.starts_with("postgres") { Some(block(sqlx::PgPool::connect(&url))?) } else { None };
    let procs = fleet(c, &url, &prefix, sz.jobs, end, false);
    let used = window_cpu(&procs, servers, wal.as_ref(), begin, end);
    if let Some(pool) = wal {
        block(pool.close());
    }
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
    let cpu = Cpu::of(&runs, &used, total, raw);
    let row = vec![
        (round + 1).to_string(),
        runs.iter().map(|(n, k)| format!("{n} {k}")).collect::<Vec<_>>().join(", "),
        format!("{busiest:.3}"),
        lateness_cell(&late),
        late.iter().filter(|&&l| l >= BACKUP_AFTER_MS).count().to_string(),
        format!("{:.4}", per_tick("claims")),
        format!("{:.3}", per_tick("requests")),
        format!("{:.4}", per_tick("calls")),
        "busiest ≤ 0.45; p99 ≤ 1.2 × and claim calls ≤ 2 × before spreading".into(),
    ];
    Ok((row, cpu))
}

/// The CPU the nodes and the store's server used from `begin` to `end` (ms).
struct WindowCpu {
    /// Each node's CPU ms, by node id.
    nodes: HashMap<String, u64>,
    /// The server's; none without a server (SQLite).
    store: Option<Usage>,
    /// PostgreSQL's write-ahead log written, bytes; none on other stores.
    wal: Option<u64>,
}

/// Reads the nodes' and the server's CPU at `begin` and at `end` (ms, waiting for each),
/// and where PostgreSQL's log stands, over `wal` (a pool to it; none on other stores).
fn window_cpu(procs: &[Proc], servers: &[&str], wal: Option<&sqlx::PgPool>, begin: i64, end: i64) -> WindowCpu {
    let nodes_ms = || -> HashMap<String, u64> { procs.iter().map(|p| (p.id.clone(), cpu_ms(p.child.id()))).collect() };
    // A failed reading leaves the figure out rather than the round.
    let wal_at = || wal.and_then(|pool| block(wal_position(pool)).ok());
    sleep_until(begin);
    let (nodes0, store0, wal0) = (nodes_ms(), Sample::take(servers), wal_at());
    sleep_until(end);
    let (nodes1, store1, wal1) = (nodes_ms(), Sample::take(servers), wal_at());
    let nodes = nodes1.iter().map(|(id, ms)| (id.clone(), ms.saturating_sub(nodes0[id]))).collect();
    let wal = wal0.zip(wal1).map(|(from, to)| to.saturating_sub(from));
    WindowCpu { nodes, store: (!servers.is_empty()).then(|| store1.since(&store0)), wal }
}

/// Sleeps until `at_ms` (wall clock), if it is ahead.
fn sleep_until(at_ms: i64) {
    let wait = at_ms - Utc::now().timestamp_millis();
    if wait > 0 {
        std::thread::sleep(Duration::from_millis(wait as u64));
    }
}

/// The CPU figures of one even round, in µs.
struct Cpu {
    /// Per node: its process's CPU over the runs it started in the window.
    per_run: Vec<(String, f64)>,
    /// All nodes' CPU over all their runs in the window.
    fleet: f64,
    /// The server's CPU per tick run in the window, and its processes; none on SQLite.
    store: Option<(f64, Usage)>,
    /// The raw baseline; none on SQLite.
    raw: Option<RawCpu>,
    /// PostgreSQL's log written per tick run in the window, bytes; none on other stores.
    wal: Option<f64>,
}

impl Cpu {
    /// From the runs each node started in the window, the window's CPU and its ticks run.
    fn of(runs: &[(String, usize)], used: &WindowCpu, ticks: usize, raw: Option<RawCpu>) -> Cpu {
        let us = |ms: u64, n: usize| ms as f64 * 1000.0 / n.max(1) as f64;
        let node_ms = |n: &str| used.nodes.get(n).copied().unwrap_or(0);
        Cpu {
            per_run: runs.iter().map(|(n, k)| (n.clone(), us(node_ms(n), *k))).collect(),
            fleet: us(runs.iter().map(|(n, _)| node_ms(n)).sum(), runs.iter().map(|r| r.1).sum()),
            store: used.store.map(|u| (us(u.ms, ticks), u)),
            raw,
            wal: used.wal.map(|bytes| bytes as f64 / ticks.max(1) as f64),
        }
    }

    /// Store CPU per tick over the raw batched insert's per op.
    fn ratio(&self) -> Option<f64> {
        Some(self.store?.0 / self.raw?.batched_us)
    }

    /// PostgreSQL's log per tick over the raw batched insert's per op.
    fn wal_ratio(&self) -> Option<f64> {
        Some(self.wal? / self.raw?.batched_wal?)
    }
}

/// The CPU table: a row per round, then (with several) the medians.
fn cpu_table(rounds: &[Cpu]) -> String {
    let mut rows: Vec<Vec<String>> = rounds.iter().enumerate().map(|(i, c)| cpu_row(i + 1, c)).collect();
    if rounds.len() > 1 {
        rows.push(cpu_medians(rounds));
    }
    table(
        &[
            "round",
            "process CPU per run, per node (µs)",
            "fleet's process CPU per run",
            "store CPU per tick",
            "server processes kept / born / ended (missed)",
            "raw one at a time: store CPU per op",
            &format!("raw batched ×{RAW_BATCH}: store CPU per op"),
            "store per tick / raw batched",
            "PostgreSQL's WAL per tick / raw batched",
            "target",
        ],
        &rows,
    )
}

const CPU_TARGET: &str = "process ≤ 5 µs per run (Redis, PostgreSQL); store per tick ≤ 3 × raw";

fn cpu_row(round: usize, c: &Cpu) -> Vec<String> {
    let na = || "n/a (in process)".to_owned();
    vec![
        round.to_string(),
        c.per_run.iter().map(|(n, us)| format!("{n} {}", fmt(*us))).collect::<Vec<_>>().join(", "),
        format!("{} µs", fmt(c.fleet)),
        c.store.map_or_else(na, |(us, _)| format!("{} µs", fmt(us))),
        c.store.map_or_else(na, |(_, u)| format!("{} / {} / {}", u.kept, u.born, u.ended)),
        c.raw.map_or_else(na, |r| format!("{} µs ({} ops)", fmt(r.single_us), r.single_ops)),
        c.raw.map_or_else(na, |r| format!("{} µs ({} ops)", fmt(r.batched_us), r.batched_ops)),
        c.ratio().map_or_else(|| "n/a".to_owned(), |x| format!("{x:.2}")),
        match (c.wal, c.raw.and_then(|r| r.batched_wal), c.wal_ratio()) {
            (Some(tick), Some(raw), Some(x)) => format!("{} B / {} B = {x:.2}", fmt(tick), fmt(raw)),
            _ => "n/a".to_owned(),
        },
        CPU_TARGET.into(),
    ]
}

/// Medians (min..max) of the rounds.
fn cpu_medians(rounds: &[Cpu]) -> Vec<String> {
    let col = |f: fn(&Cpu) -> Option<f64>, unit: &str| {
        let v: Vec<f64> = rounds.iter().filter_map(f).collect();
        if v.is_empty() {
            "n/a".to_owned()
        } else {
            mmm(&v, unit)
        }
    };
    let nodes: Vec<String> = rounds[0]
        .per_run
        .iter()
        .map(|(n, _)| {
            let v: Vec<f64> = rounds.iter().filter_map(|c| c.per_run.iter().find(|p| &p.0 == n).map(|p| p.1)).collect();
            format!("{n} {}", fmt(quantile(&v, 0.5)))
        })
        .collect();
    vec![
        "median (min..max)".into(),
        nodes.join(", "),
        col(|c| Some(c.fleet), " µs"),
        col(|c| c.store.map(|s| s.0), " µs"),
        "—".into(),
        col(|c| c.raw.map(|r| r.single_us), " µs"),
        col(|c| c.raw.map(|r| r.batched_us), " µs"),
        col(Cpu::ratio, ""),
        col(Cpu::wal_ratio, ""),
        CPU_TARGET.into(),
    ]
}

/// How the CPU table was measured.
fn cpu_note(raw_phase: Duration) -> String {
    format!(
        "Process CPU per run: a node process's utime + stime (every thread's; /proc/PID/stat, read by \
         the parent at the window's first and last instant, 10 ms resolution) over the runs it started \
         in the window; the fleet's: all nodes' CPU over all their runs. Store CPU per tick: the same for \
         the store's server processes, found by command name (`postgres`, `mariadbd` or `mysqld`, \
         `redis-server`, `etcd`; SQLite runs in the node: n/a), over the ticks run in the window. \
         Processes born in the window count whole; those that ended in it are missed (counted in the \
         table); whatever else the server did then (other clients, its background work) is counted. \
         Raw: the store's insert-if-absent into a fresh table or keys right before the fleet starts, \
         the server's CPU read the same way: for at most {phase} s one at a time (a round trip each), \
         then for at most {phase} s in batches of {RAW_BATCH} (PostgreSQL one `INSERT … SELECT \
         unnest($1) ON CONFLICT DO NOTHING`, MariaDB one multi-row `INSERT IGNORE`, Redis one pipeline \
         of `SET NX PX`, etcd `Txn`s of 128 create-if-absent, 4 in flight, as its claim's chunks). The \
         ratio is to the batched raw insert, as a node claims a second's ticks in one call. \
         PostgreSQL's WAL: the bytes its write-ahead log grew by over the window (`pg_current_wal_lsn`, \
         its background work included) per tick run, and over the raw batched phase per insert: \
         what the server wrote, which, unlike CPU time on a shared machine, does not depend on \
         what else runs there.",
        phase = raw_phase.as_secs_f64(),
    )
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
        fate.skipped.to_string(),
    ])
}

/// SIGKILLs `victim` at `at_ms` (not before) and returns when it was killed, in ms.
fn kill(mut victim: Proc, at_ms: i64) -> anyhow::Result<i64> {
    sleep_until(at_ms);
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
    /// Recorded skipped, never started: with overlap = skip, the ticks of a job whose run
    /// the killed node held, until that run's lease expired (the policy's answer).
    skipped: usize,
    /// Neither started nor recorded (with the record's state, if any).
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
            (false, None) if record.is_some_and(|r| r.0 == RunState::Skipped) => f.skipped += 1,
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
