//! Scenarios 2 and 6, herds: many jobs due at one instant, nodes racing for them; once
//! (the thundering herd), then as jobs and nodes grow (growth, or only `--cells`).

use std::time::Duration;

use solocron_core::Prefix;

use super::{exactly_once, node_args, starts, Ctx};
use crate::fleet::{fresh, instant_in, once_at, reports, spawn};
use crate::raw::cleanup;
use crate::stats::{fmt, mmm, table};

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
