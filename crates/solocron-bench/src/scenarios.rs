//! The benchmark scenarios. Each returns a markdown section and fails on a duplicate run.

use std::collections::HashMap;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use chrono::Utc;
use serde_json::Value;
use solocron_core::{ClaimMode, ClaimRequest, HistoryQuery, Prefix, Tick, Trigger};

use crate::fleet::{cpu_ms, fresh, instant_in, once_at, reports, spawn, Proc};
use crate::floor::{exec_floor, spawn_floor};
use crate::node::{rss_kb, NodeArgs};
use crate::raw::{cleanup, Raw};
use crate::stats::{fmt, mmm, quantile, table};

/// What every scenario needs.
pub struct Ctx {
    pub store: String,
    pub dir: std::path::PathBuf,
    pub quick: bool,
    pub rounds: usize,
    /// The (jobs, nodes) cells `growth` measures; empty: all of them.
    pub cells: Vec<(usize, usize)>,
    /// The jobs' overlap policy on every node.
    pub overlap: solocron_core::Overlap,
}

/// The most jobs of a `--cells` cell: a node holds every job in memory (about 2–4 KiB each).
const CELL_JOBS_MAX: usize = 1_000_000;

/// The most nodes of a `--cells` cell: each is a process of this machine.
const CELL_NODES_MAX: usize = 32;

/// A growth cell written `JOBSxNODES` (`100000x3`; `_` allowed between digits).
pub fn parse_cell(s: &str) -> Result<(usize, usize), String> {
    let (j, n) =
        s.trim().split_once(['x', 'X']).ok_or_else(|| format!("`{s}`: a cell is JOBSxNODES, e.g. 100000x3"))?;
    let num = |v: &str| v.replace('_', "").parse::<usize>().map_err(|e| format!("`{s}`: {e}"));
    let (j, n) = (num(j)?, num(n)?);
    if !(1..=CELL_JOBS_MAX).contains(&j) || !(1..=CELL_NODES_MAX).contains(&n) {
        return Err(format!("`{s}`: 1 to {CELL_JOBS_MAX} jobs and 1 to {CELL_NODES_MAX} nodes"));
    }
    Ok((j, n))
}

/// A node of one job due every second for 10 s, with the run's overlap policy, reporting
/// to a file in the run's directory.
pub fn node_args(c: &Ctx, url: &str, prefix: &Prefix, id: &str) -> NodeArgs {
    NodeArgs {
        store: url.to_owned(),
        prefix: prefix.clone(),
        node_id: id.to_owned(),
        jobs: 1,
        schedule: "* * * * * *".into(),
        side_schedule: Vec::new(),
        mode: "handler".into(),
        seconds: 10,
        lease_ms: 30_000,
        overlap: c.overlap,
        retry: false,
        announce: false,
        journal: None,
        report: c.dir.join(format!("{id}-{prefix}.json")).display().to_string(),
    }
}

/// (job, scheduled ms, start µs, attempt) of every run every node started.
pub fn starts(reports: &[Value]) -> Vec<(String, i64, i64, u64)> {
    reports
        .iter()
        .flat_map(|r| r["starts"].as_array().cloned().unwrap_or_default())
        .map(|s| {
            (
                s[0].as_str().unwrap_or("").to_owned(),
                s[1].as_i64().unwrap_or(0),
                s[2].as_i64().unwrap_or(0),
                s[3].as_u64().unwrap_or(1),
            )
        })
        .collect()
}

/// Fails the benchmark if any (job, tick) started twice (first attempts only).
pub fn exactly_once(all: &[(String, i64, i64, u64)], what: &str) -> anyhow::Result<usize> {
    let mut seen: HashMap<(&str, i64), usize> = HashMap::new();
    for (j, t, _, a) in all.iter().filter(|s| s.3 == 1) {
        let _ = a;
        *seen.entry((j.as_str(), *t)).or_default() += 1;
    }
    let dups = seen.values().filter(|&&n| n > 1).count();
    anyhow::ensure!(dups == 0, "{what}: {dups} ticks ran more than once: exactly-once violated");
    Ok(seen.len())
}

/// 1. Time per claim through solocron vs the store's raw insert-if-absent, interleaved.
///
/// Two kinds of claim, each of one of 10 jobs whose earlier runs have ended (every run won
/// is finished right after its claim, outside the timing): what a job with the default
/// policy sends (`overlap = skip`: the store also looks for a running run of the job), and
/// one with `overlap = allow` (no such look).
pub async fn claim_overhead(c: &Ctx) -> anyhow::Result<String> {
    let (url, prefix) = fresh(&c.store, &c.dir, "claim");
    let store = solocron_stores::open(&url, &prefix).await?;
    store.migrate().await?;
    let raw = Raw::connect(&url, &prefix).await?;
    let ops = if c.quick { 50 } else { 1000 };
    assert!(
        solocron_core::JobPolicy::default().overlap == solocron_core::Overlap::Skip,
        "the default is measured first"
    );
    let end = solocron_core::RunEnd {
        state: solocron_core::RunState::Succeeded,
        reason: None,
        exit_code: Some(0),
        output: String::new(),
        started_after: Some(Duration::ZERO),
    };
    // Per round: the medians of the raw insert, the default claim and the allow claim.
    let mut medians: [Vec<f64>; 3] = Default::default();
    // Every tick in the past: a scheduled claim of a future one is refused as too early.
    let base = Utc::now() - chrono::Duration::seconds((c.rounds * ops) as i64 + 3600);
    for r in 0..c.rounds {
        let mut times: [Vec<f64>; 3] = Default::default();
        for i in 0..ops {
            let t0 = Instant::now();
            raw.insert(&format!("r{r}-{i}")).await?;
            times[0].push(t0.elapsed().as_secs_f64() * 1e6);
            for (k, skip_if_running) in [(1, true), (2, false)] {
                let req = ClaimRequest {
                    tick: Tick::new(
                        format!("job{k}-{}", i % 10),
                        base + chrono::Duration::seconds((r * ops + i) as i64),
                    ),
                    trigger: Trigger::Schedule,
                    node: "bench".into(),
                    lease: Duration::from_secs(30),
                    mode: ClaimMode::Run { skip_if_running },
                    // As the engine asks: every request carries a nonce.
                    nonce: (r * ops + i) as u64 + 1,
                };
                let t0 = Instant::now();
                let outcome = store.claim(&[req]).await?.remove(0);
                times[k].push(t0.elapsed().as_secs_f64() * 1e6);
                let solocron_core::ClaimOutcome::Won(lease) = outcome else {
                    anyhow::bail!(
                        "claim {i} of round {r} was not won: {outcome:?} (each claims a new tick of an idle job)"
                    );
                };
                anyhow::ensure!(store.finish(&lease, &end).await?, "the run just won could not be finished");
            }
        }
        for (m, t) in medians.iter_mut().zip(&times) {
            m.push(quantile(t, 0.5));
        }
    }
    raw.remove().await?;
    cleanup(&url, &prefix).await;
    Ok(claim_section(c.rounds, ops, &medians))
}

/// Scenario 1's table from the per-round medians of the raw insert, the default claim and
/// the `overlap = allow` claim.
fn claim_section(rounds: usize, ops: usize, medians: &[Vec<f64>; 3]) -> String {
    let ratio = |k: usize| -> Vec<f64> { medians[k].iter().zip(&medians[0]).map(|(s, r)| s / r).collect() };
    let rows = vec![vec![
        mmm(&medians[0], " µs"),
        mmm(&medians[1], " µs"),
        mmm(&ratio(1), ""),
        mmm(&medians[2], " µs"),
        mmm(&ratio(2), ""),
        "≤ 1.25".into(),
    ]];
    format!(
        "## 1. Claim overhead ({rounds} rounds × {ops} of each, interleaved; per-round medians; runs finished between claims)\n\n{}",
        table(
            &[
                "raw insert-if-absent",
                "claim, default policy (overlap = skip)",
                "default / raw",
                "claim, overlap = allow",
                "allow / raw",
                "target",
            ],
            &rows
        )
    )
}

/// A herd round whose nodes were not ready in time (not an exactly-once failure).
#[derive(Debug)]
pub struct Missed(pub String);

impl std::fmt::Display for Missed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Missed {}

/// Jobs due each second after a big herd's instant on each node ([`herd`]'s
/// `side_jobs`), for [`SIDE_WINDOW_S`] seconds.
const SIDE_JOBS: usize = 10;
/// The seconds after the herd's instant with side jobs due (1 … this).
const SIDE_WINDOW_S: i64 = 5;

/// What one herd measured.
pub struct Herd {
    /// From the instant until every tick started, ms.
    pub last: f64,
    /// Claim calls per tick per node (the busiest node).
    pub claims: f64,
    /// All store calls per tick per node (the busiest node).
    pub calls: f64,
    /// Peak RSS of the largest node, MiB.
    pub rss: f64,
    /// The latest start of the side jobs' ticks, ms after their own instant (none without
    /// side jobs).
    pub side_late: Option<f64>,
}

/// One thundering herd: `jobs` jobs due at one instant, `nodes` processes racing; with
/// `side_jobs`, each node also carries [`SIDE_JOBS`] jobs due at each of the
/// [`SIDE_WINDOW_S`] seconds after it, whose ticks should start on time however long the
/// herd takes (their few calls count in the calls per tick).
pub fn herd(c: &Ctx, jobs: usize, nodes: usize, side_jobs: bool) -> anyhow::Result<Herd> {
    let (url, prefix) = fresh(&c.store, &c.dir, "herd");
    let lead = 4 + (jobs * nodes.max(1) / 3000) as i64;
    let seconds = (lead + 3 + (jobs / 3000) as i64) as u64;
    let at = instant_in(lead);
    let procs: Vec<_> = (0..nodes)
        .map(|n| {
            let mut a = node_args(c, &url, &prefix, &format!("h{n}"));
            a.jobs = jobs;
            a.schedule = once_at(at);
            if side_jobs {
                a.side_schedule = (1..=SIDE_WINDOW_S)
                    .flat_map(|s| std::iter::repeat_n(once_at(at + chrono::Duration::seconds(s)), SIDE_JOBS))
                    .collect();
            }
            a.seconds = seconds;
            spawn(&a, None)
        })
        .collect();
    // The nodes' own run time and a minute to drain and write their reports: a big herd's
    // lead (100,000 jobs × 3 nodes: 104 s) outlasts any fixed bound.
    let reps = reports(procs, Duration::from_secs(seconds + 60));
    let rt = tokio::runtime::Handle::current();
    let unended = std::thread::scope(|s| s.spawn(|| rt.block_on(left_running(&url, &prefix))).join())
        .map_err(|_| anyhow::anyhow!("reading the herd's records panicked"))??;
    std::thread::scope(|s| s.spawn(|| rt.block_on(cleanup(&url, &prefix))).join()).ok();
    if reps.len() != nodes {
        return Err(Missed(format!("only {} of {nodes} nodes reported", reps.len())).into());
    }
    let (all, side): (Vec<_>, Vec<_>) = starts(&reps).into_iter().partition(|s| s.0.starts_with('j'));
    let ran = exactly_once(&all, &format!("herd {jobs} jobs × {nodes} nodes"))?;
    exactly_once(&side, &format!("the jobs due every second beside a herd of {jobs} × {nodes}"))?;
    if ran != jobs {
        // Not a duplicate: nodes that were not ready by the instant (start-up of many big
        // nodes on 2 cores) do not run a tick that is already past with catchup = 0.
        return Err(Missed(format!("{ran} of {jobs} ran: nodes not ready before the instant")).into());
    }
    // Every node drained before it reported: each run it started must have recorded its end.
    anyhow::ensure!(
        unended == 0,
        "herd {jobs} jobs × {nodes} nodes: {unended} runs still `running` after their nodes drained (ends not recorded)"
    );
    let at_ms = at.timestamp_millis();
    let last = all.iter().map(|s| s.2).max().unwrap_or(0) as f64 / 1000.0 - at_ms as f64;
    if side_jobs {
        let want = SIDE_JOBS * SIDE_WINDOW_S as usize;
        anyhow::ensure!(
            side.len() == want,
            "beside a herd of {jobs} × {nodes}: {} of {want} side ticks ran",
            side.len()
        );
    }
    let side_late = side_jobs.then(|| side.iter().map(|s| s.2 as f64 / 1000.0 - s.1 as f64).fold(0.0, f64::max));
    let per = |k: &str| reps.iter().map(|r| r[k].as_f64().unwrap_or(0.0) / jobs as f64).fold(0.0, f64::max);
    let rss = reps.iter().map(|r| r["rss_hwm_kb"].as_f64().unwrap_or(0.0)).fold(0.0, f64::max) / 1024.0;
    Ok(Herd { last, claims: per("claims"), calls: per("calls"), rss, side_late })
}

/// How many runs of the namespace are still `running`.
async fn left_running(url: &str, prefix: &Prefix) -> anyhow::Result<usize> {
    let store = solocron_stores::open(url, prefix).await?;
    let q = solocron_core::HistoryQuery {
        state: Some(solocron_core::RunState::Running),
        limit: solocron_core::RECORDS_PAGE_MAX,
        ..Default::default()
    };
    Ok(store.history(&q).await?.len())
}

/// 2. Thundering herd: J jobs due at once, N nodes.
pub fn thundering_herd(c: &Ctx) -> anyhow::Result<String> {
    let (jobs, nodes) = if c.quick { (500, 2) } else { (10_000, 3) };
    let mut rows = vec![];
    let (mut t, mut cl, mut ca) = (vec![], vec![], vec![]);
    for _ in 0..c.rounds {
        match herd(c, jobs, nodes, false) {
            Ok(h) => {
                t.push(h.last);
                cl.push(h.claims);
                ca.push(h.calls);
            }
            Err(e) if e.is::<Missed>() => println!("herd round not measured: {e}"),
            Err(e) => return Err(e),
        }
    }
    rows.push(vec![
        jobs.to_string(),
        nodes.to_string(),
        mmm(&t, " ms"),
        mmm(&cl, ""),
        mmm(&ca, ""),
        "all in ≤ 1000 ms; < 0.05 round trips/tick/node".into(),
    ]);
    Ok(format!(
        "## 2. Thundering herd (exactly once verified from the handlers' own records)\n\n{}",
        table(
            &[
                "jobs",
                "nodes",
                "instant → all started",
                "claim calls / tick / node",
                "all store calls / tick / node",
                "target"
            ],
            &rows
        )
    ))
}

/// Scenario 3, start lateness: 3 nodes, jobs due every second; ms from each scheduled
/// instant to the start of its run. Handlers and commands at 100 jobs a second (the
/// targets), handlers also at 1,000 a second (the field notes' setup, where BullMQ's p99 is
/// 731 ms and a minimal correct Rust claimer's 12–56 ms), beside the machine's own floor
/// for starting 100 processes at once.
pub fn lateness(c: &Ctx) -> anyhow::Result<String> {
    // (job kind, jobs due every second, seconds measured, target)
    let cases: [(&str, usize, u64, &str); 3] = if c.quick {
        [("handler", 20, 2, "p99 ≤ 10 ms"), ("command", 20, 2, "p99 ≤ 25 ms"), ("handler", 200, 2, "p99 ≤ 73 ms")]
    } else {
        [
            ("handler", 100, 60, "p99 ≤ 10 ms"),
            ("command", 100, 60, "p99 ≤ 25 ms"),
            ("handler", 1000, 30, "p99 ≤ 73 ms (BullMQ's 731 ms ÷ 10)"),
        ]
    };
    let mut rows = vec![];
    for (mode, jobs, secs, target) in cases {
        let (url, prefix) = fresh(&c.store, &c.dir, "late");
        let begin = Utc::now().timestamp_millis() + 2500;
        let procs: Vec<_> = (0..3)
            .map(|n| {
                let mut a = node_args(c, &url, &prefix, &format!("l{n}"));
                a.jobs = jobs;
                a.mode = mode.into();
                a.seconds = secs + 3;
                spawn(&a, None)
            })
            .collect();
        let reps = reports(procs, Duration::from_secs(secs + 60));
        let late: Vec<f64> = if mode == "handler" {
            let all = starts(&reps);
            exactly_once(&all, "lateness (handlers)")?;
            all.iter().filter(|s| s.1 >= begin).map(|s| (s.2 - s.1 * 1000) as f64 / 1000.0).collect()
        } else {
            command_lateness(&url, &prefix, begin)?
        };
        let rt = tokio::runtime::Handle::current();
        std::thread::scope(|s| s.spawn(|| rt.block_on(cleanup(&url, &prefix))).join()).ok();
        rows.push(vec![
            format!("{mode} (solocron), {jobs} jobs/s, {secs} s"),
            late.len().to_string(),
            fmt(quantile(&late, 0.5)),
            fmt(quantile(&late, 0.99)),
            fmt(quantile(&late, 1.0)),
            target.into(),
        ]);
    }
    rows.extend(floor_rows(cases[1].1, if c.quick { 2 } else { 10 })?);
    Ok(format!(
        "## 3. Start lateness (3 nodes, jobs due at every whole second; ms from scheduled instant to start)\n\n{}",
        table(&["job kind", "runs", "p50 ms", "p99 ms", "max ms", "target"], &rows)
    ))
}

/// The machine's own cost of starting `jobs` processes at once, without solocron: a bare
/// process spawns them at a whole second, `rounds` times, measured as the command jobs are.
fn floor_rows(jobs: usize, rounds: usize) -> anyhow::Result<Vec<Vec<String>>> {
    let floors = [
        (
            format!("{jobs} × /bin/date spawned at once by a bare process (the machine's floor)"),
            spawn_floor(jobs, rounds)?,
        ),
        (
            format!("{jobs} × /bin/date forked ahead, exec'd at once (exec alone: no spawner goes below)"),
            exec_floor(jobs, rounds)?,
        ),
    ];
    Ok(floors
        .into_iter()
        .map(|(what, floor)| {
            vec![
                what,
                floor.len().to_string(),
                fmt(quantile(&floor, 0.5)),
                fmt(quantile(&floor, 0.99)),
                fmt(quantile(&floor, 1.0)),
                "—".into(),
            ]
        })
        .collect())
}

/// Command jobs run `/bin/date +%s%N`: their output is the process's start time.
fn command_lateness(url: &str, prefix: &Prefix, begin: i64) -> anyhow::Result<Vec<f64>> {
    let rt = tokio::runtime::Handle::current();
    let (url, prefix) = (url.to_owned(), prefix.clone());
    let records = std::thread::scope(|s| {
        s.spawn(|| {
            rt.block_on(async {
                let store = solocron_stores::open(&url, &prefix).await?;
                Ok::<_, anyhow::Error>(store.history(&HistoryQuery { limit: 0, ..HistoryQuery::default() }).await?)
            })
        })
        .join()
        .expect("thread")
    })?;
    let mut seen = std::collections::HashSet::new();
    for r in &records {
        anyhow::ensure!(
            r.id.attempt > 1 || seen.insert((r.id.tick.job.clone(), r.id.tick.scheduled_at)),
            "a command tick has two records"
        );
    }
    Ok(records
        .iter()
        .filter(|r| r.id.tick.scheduled_at.timestamp_millis() >= begin)
        .filter_map(|r| {
            r.output
                .trim()
                .parse::<i64>()
                .ok()
                .map(|ns| (ns / 1000 - r.id.tick.scheduled_at.timestamp_millis() * 1000) as f64 / 1000.0)
        })
        .collect())
}

/// Idle cost (scenario 4): one node with J jobs whose next fire is far away (the library
/// embedded), then `solocron run` itself with J command jobs in its configuration, when
/// the `solocron` binary was built beside this one.
pub fn idle(c: &Ctx) -> anyhow::Result<String> {
    let counts: &[usize] = if c.quick { &[1000] } else { &[10_000, 100_000] };
    let measure = if c.quick { 3 } else { 60 };
    let mut rows = vec![];
    for &jobs in counts {
        let (url, prefix) = fresh(&c.store, &c.dir, "idle");
        let mut a = node_args(c, &url, &prefix, "idle");
        a.jobs = jobs;
        a.schedule = FAR.into();
        a.seconds = settle_max(jobs) + measure + 5;
        let p = spawn(&a, None);
        let m = idle_of(p.child.id(), jobs, measure);
        p.stop();
        let _ = reports(vec![p], Duration::from_secs(30));
        clean(&url, &prefix);
        rows.push(m.row("node (library)", jobs));
    }
    let daemon = std::env::current_exe()?.with_file_name("solocron");
    let jobs = counts[0];
    if daemon.exists() {
        let (url, prefix) = fresh(&c.store, &c.dir, "idle-daemon");
        let config = c.dir.join(format!("idle-daemon-{}.toml", prefix.as_str()));
        std::fs::write(&config, daemon_config(&url, &prefix, jobs))?;
        let mut child = std::process::Command::new(&daemon)
            .args(["run", "--config"])
            .arg(&config)
            .env("RUST_LOG", "error")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()?;
        let m = idle_of(child.id(), jobs, measure);
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let status = child.wait()?;
        clean(&url, &prefix);
        anyhow::ensure!(status.success(), "`solocron run` with {jobs} idle jobs exited with {status}");
        rows.push(m.row("`solocron run`, command jobs in its configuration", jobs));
    } else {
        let mut row = vec![format!("`solocron run`: not measured ({} not built)", daemon.display()), jobs.to_string()];
        row.resize(7, "—".into());
        rows.push(row);
    }
    Ok(format!(
        "## 4. Idle cost (after start-up settles; CPU over {measure} s scaled to a minute, 10 ms resolution; RSS then, and peak including start-up)\n\n{}",
        table(&["process", "jobs", "start-up settled after", "CPU per minute", "RSS", "peak RSS", "target"], &rows)
    ))
}

/// A schedule whose next fire is far away: idle jobs.
const FAR: &str = "0 0 0 1 1 *";

/// How long start-up (migration, registering every definition) may take before idle is
/// measured anyway.
fn settle_max(jobs: usize) -> u64 {
    10 + (jobs / 1000) as u64
}

/// What an idle process cost.
struct Idle {
    settled: Duration,
    cpu_per_min_ms: f64,
    rss_mib: f64,
    peak_mib: f64,
}

impl Idle {
    fn row(&self, process: &str, jobs: usize) -> Vec<String> {
        vec![
            process.to_owned(),
            jobs.to_string(),
            format!("{:.1} s", self.settled.as_secs_f64()),
            format!("{} ms", fmt(self.cpu_per_min_ms)),
            format!("{} MiB", fmt(self.rss_mib)),
            format!("{} MiB", fmt(self.peak_mib)),
            "≤ 50 ms CPU/min; ≤ 20 MiB (10,000 jobs)".into(),
        ]
    }
}

/// Watches process `pid` of `jobs` idle jobs: start-up is not idle, so the measurement
/// begins once a whole second passed with under 2% of a core used (within a bound), then
/// lasts `measure` seconds.
fn idle_of(pid: u32, jobs: usize, measure: u64) -> Idle {
    let launched = Instant::now();
    let mut last = cpu_ms(pid);
    loop {
        std::thread::sleep(Duration::from_secs(1));
        let now = cpu_ms(pid);
        if now - last < 20 || launched.elapsed() >= Duration::from_secs(settle_max(jobs)) {
            break;
        }
        last = now;
    }
    let settled = launched.elapsed();
    let cpu0 = cpu_ms(pid);
    std::thread::sleep(Duration::from_secs(measure));
    let cpu1 = cpu_ms(pid);
    Idle {
        settled,
        cpu_per_min_ms: (cpu1 - cpu0) as f64 * 60.0 / measure as f64,
        rss_mib: rss_kb(pid, "VmRSS") as f64 / 1024.0,
        peak_mib: rss_kb(pid, "VmHWM") as f64 / 1024.0,
    }
}

/// A daemon's configuration with `jobs` idle command jobs on `url` under `prefix`.
fn daemon_config(url: &str, prefix: &Prefix, jobs: usize) -> String {
    let mut s = format!("[store]\nurl = {url:?}\nprefix = {:?}\n[node]\nid = \"idle-daemon\"\n", prefix.as_str());
    for i in 0..jobs {
        s += &format!("[[jobs]]\nname = \"job-{i:06}\"\nschedule = {FAR:?}\ncommand = [\"/bin/true\"]\n");
    }
    s
}

/// Removes a round's tables or keys (from a thread: this may run inside the runtime).
fn clean(url: &str, prefix: &Prefix) {
    let rt = tokio::runtime::Handle::current();
    std::thread::scope(|s| s.spawn(|| rt.block_on(cleanup(url, prefix))).join()).ok();
}

/// 5. Failover: SIGKILL the node running a job (retry, lease 3 s); time until the retry starts.
pub fn failover(c: &Ctx) -> anyhow::Result<String> {
    let mut took = vec![];
    for round in 0..c.rounds.min(3) {
        let (url, prefix) = fresh(&c.store, &c.dir, "failover");
        let at = instant_in(3);
        let (tx, rx) = mpsc::channel();
        let mut procs: Vec<_> = (0..3)
            .map(|n| {
                let mut a = node_args(c, &url, &prefix, &format!("f{round}n{n}"));
                a.mode = "sleep".into();
                a.schedule = once_at(at);
                a.lease_ms = 3000;
                a.retry = true;
                a.announce = true;
                a.seconds = 15;
                spawn(&a, Some(tx.clone()))
            })
            .collect();
        let first = rx.recv_timeout(Duration::from_secs(15))?;
        let holder = first.split_whitespace().nth(3).unwrap_or("").to_owned();
        let victim = procs.iter_mut().find(|p| p.id == holder).ok_or_else(|| anyhow::anyhow!("no node {holder}"))?;
        let killed = Utc::now().timestamp_millis();
        victim.child.kill()?;
        let second = rx.recv_timeout(Duration::from_secs(15))?;
        let f: Vec<&str> = second.split_whitespace().collect();
        anyhow::ensure!(f.get(2) == Some(&"2") && f.get(3) != Some(&holder.as_str()), "unexpected start: {second}");
        took.push((f[4].parse::<i64>()? - killed) as f64);
        procs.iter().for_each(Proc::stop);
        let _ = reports(procs, Duration::from_secs(20));
        let rt = tokio::runtime::Handle::current();
        std::thread::scope(|s| s.spawn(|| rt.block_on(cleanup(&url, &prefix))).join()).ok();
    }
    let rows = vec![vec![mmm(&took, " ms"), "≤ 4200 ms (lease + lease/3 + 200 ms)".into()]];
    Ok(format!(
        "## 5. Failover (3 nodes, lease 3 s, SIGKILL the holder)\n\n{}",
        table(&["SIGKILL → retry started", "target"], &rows)
    ))
}

/// 6. Growth: the herd as jobs and nodes grow (or only `--cells`).
pub fn growth(c: &Ctx) -> anyhow::Result<String> {
    let cells = if c.cells.is_empty() { growth_cells(c.quick) } else { c.cells.clone() };
    let mut rows = vec![];
    for (j, n) in cells {
        // Only beside the big herds: a small one's calls per tick would count the side jobs'.
        let side = j >= GROWTH_SIDE_JOBS_FROM;
        let mut row = match herd(c, j, n, side) {
            Ok(h) => vec![
                fmt(h.last),
                h.side_late.map_or("—".into(), fmt),
                format!("{:.4}", h.claims),
                format!("{:.4}", h.calls),
                fmt(h.rss),
            ],
            Err(e) if e.is::<Missed>() => {
                vec![format!("not measured: {e}"), "-".into(), "-".into(), "-".into(), "-".into()]
            }
            Err(e) => return Err(e),
        };
        row.splice(0..0, [j.to_string(), n.to_string()]);
        row.push(growth_target(j, n).into());
        rows.push(row);
    }
    Ok(format!(
        "## 6. Growth (one herd per row; exactly once verified)\n\n{}",
        table(
            &[
                "jobs",
                "nodes",
                "instant → all started (ms)",
                "side jobs (10 due each of the 5 s after): latest start (ms late)",
                "claim calls/tick/node",
                "all calls/tick/node",
                "peak RSS per node (MiB)",
                "target",
            ],
            &rows
        )
    ))
}

/// The smallest herd of `growth` beside which each node carries side jobs (see [`herd`]):
/// a herd whose claims take long enough to delay them, and whose calls outnumber theirs.
const GROWTH_SIDE_JOBS_FROM: usize = 100_000;

/// Every growth cell: 100 … 100,000 jobs × 1, 3, 10 nodes, but for 100,000 × 10.
fn growth_cells(quick: bool) -> Vec<(usize, usize)> {
    let jobs: &[usize] = if quick { &[100] } else { &[100, 1000, 10_000, 100_000] };
    let nodes: &[usize] = if quick { &[2] } else { &[1, 3, 10] };
    // Ten processes × 100,000 jobs each exceed this 2-core machine's useful size.
    jobs.iter().flat_map(|&j| nodes.iter().map(move |&n| (j, n))).filter(|&(j, n)| !(j == 100_000 && n > 3)).collect()
}

/// The target of a growth cell (issue 23), if it has one.
fn growth_target(jobs: usize, nodes: usize) -> &'static str {
    match (jobs, nodes) {
        (100_000, 3) => "all started ≤ 2000 ms (PostgreSQL, Redis)",
        (10_000, 10) => "all started ≤ 1000 ms (etcd ≤ 2000 ms)",
        _ => "—",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cell_is_jobs_x_nodes_within_bounds() {
        assert_eq!(parse_cell("100000x3"), Ok((100_000, 3)));
        assert_eq!(parse_cell(" 10_000X10"), Ok((10_000, 10)));
        assert!(parse_cell("100000").is_err(), "no nodes");
        assert!(parse_cell("0x3").is_err(), "no jobs");
        assert!(parse_cell("100x33").is_err(), "more nodes than the bound");
        assert!(parse_cell("ax3").is_err());
    }

    #[test]
    fn the_default_growth_grid_has_100000_jobs_on_3_nodes_but_not_on_10() {
        let cells = growth_cells(false);
        assert!(cells.contains(&(100_000, 3)) && cells.contains(&(10_000, 10)));
        assert!(!cells.contains(&(100_000, 10)));
        assert_eq!(cells.len(), 11);
        assert_eq!(growth_cells(true), [(100, 2)]);
    }
}
