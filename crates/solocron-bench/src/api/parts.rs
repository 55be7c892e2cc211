//! Where a jobs page's time goes: the store calls behind it, made directly (no HTTP).

use std::time::Instant;

use solocron_core::{HistoryQuery, RunState, Store, RECORDS_PAGE_MAX};
use solocron_fleet::{Fleet, JobFilter};

use super::SAMPLING_PER_ROUND_MAX;
use crate::stats::{fmt, quantile};

/// What `Fleet::jobs` reads per job view (`solocron_fleet`'s `RECENT_RUNS_MAX` and
/// `READS_IN_FLIGHT_MAX`, private there), to time its reads apart from its own work.
const RECENT_RUNS: usize = 20;
const PAGE_READS_IN_FLIGHT: usize = 8;

/// The parts of a jobs page, as [`Parts`] names them.
const PARTS: [&str; 11] = [
    "`registrations()` (the whole registry: `Fleet::read`, the CLI's)",
    "`registered_jobs()` (the names: `Fleet::read_names`, the server's)",
    "`registrations_of(the page's 50 jobs)`",
    "`controls()`",
    "`nodes()`",
    "`history(state = running)`",
    "`now()`",
    "`Fleet::read_names` (names, controls, nodes, running, now, in sequence)",
    "`Fleet::jobs`: the page's 50 views (their registrations, 50 `history` reads, 8 in flight)",
    "of which: the 50 `history` reads alone, 8 in flight (the rest is `Fleet`'s own work)",
    "the page's JSON (`serde_json::to_vec`)",
];

/// Where a jobs page's time goes: each store call of `Fleet::read_names`, then the page's views
/// (one history read per job, a few in flight) and its JSON, made directly (no HTTP),
/// sampled in the same rounds as the requests so that both meet the store in one state.
#[derive(Default)]
pub(super) struct Parts {
    /// Per part, every sample (ms).
    ms: Vec<Vec<f64>>,
    /// Per part, what its last sample returned (records, or bytes of JSON).
    rows: Vec<usize>,
}

impl Parts {
    pub(super) async fn sample(&mut self, store: &dyn Store, n: usize) -> anyhow::Result<()> {
        let running =
            HistoryQuery { state: Some(RunState::Running), limit: RECORDS_PAGE_MAX, ..HistoryQuery::default() };
        let fleet = Fleet::read_names(store, Vec::new()).await?;
        let page = fleet.jobs(store, &JobFilter::default()).await?;
        let page_jobs: Vec<String> = page.jobs.iter().map(|j| j.name.clone()).collect();
        self.ms.resize(PARTS.len(), Vec::new());
        self.rows.resize(PARTS.len(), 0);
        let began = Instant::now();
        for _ in 0..n {
            if began.elapsed() > SAMPLING_PER_ROUND_MAX {
                break;
            }
            let mut part = 0;
            macro_rules! timed {
                ($e:expr) => {{
                    let t0 = Instant::now();
                    let rows: usize = $e;
                    self.ms[part].push(t0.elapsed().as_secs_f64() * 1e3);
                    self.rows[part] = rows;
                    part += 1;
                }};
            }
            timed!(store.registrations().await?.len());
            timed!(store.registered_jobs().await?.len());
            timed!(store.registrations_of(&page_jobs).await?.len());
            timed!(store.controls().await?.len());
            timed!(store.nodes().await?.len());
            timed!(store.history(&running).await?.len());
            timed!(store.now().await.map(|_| 1)?);
            timed!(Fleet::read_names(store, Vec::new()).await.map(|_| 1)?);
            timed!(fleet.jobs(store, &JobFilter::default()).await?.jobs.len());
            timed!(recent_runs(store, &page).await?);
            timed!(serde_json::to_vec(&page)?.len());
            debug_assert_eq!(part, PARTS.len());
        }
        Ok(())
    }

    pub(super) fn table_rows(&self) -> Vec<Vec<String>> {
        (0..self.ms.len())
            .map(|i| {
                let ms = &self.ms[i];
                let (p50, p95) = (fmt(quantile(ms, 0.5)), fmt(quantile(ms, 0.95)));
                vec![PARTS[i].to_owned(), ms.len().to_string(), self.rows[i].to_string(), p50, p95]
            })
            .collect()
    }
}

/// The history reads of a jobs page's views, made as `Fleet::jobs` makes them (each job's
/// newest runs, [`PAGE_READS_IN_FLIGHT`] at once); returns the records read.
async fn recent_runs(store: &dyn Store, page: &solocron_fleet::JobPage) -> anyhow::Result<usize> {
    use futures_util::{StreamExt as _, TryStreamExt as _};
    let reads = futures_util::stream::iter(&page.jobs)
        .map(|j| {
            let q = HistoryQuery { job: Some(j.name.clone()), limit: RECENT_RUNS, ..HistoryQuery::default() };
            async move { store.history(&q).await.map(|r| r.len()) }
        })
        .buffered(PAGE_READS_IN_FLIGHT);
    let counts: Vec<usize> = reads.try_collect().await?;
    Ok(counts.iter().sum())
}
