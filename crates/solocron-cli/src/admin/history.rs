//! `solocron history`: run records, newest first, filtered; or one run's output.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use clap::Args;
use solocron_core::{parse_duration, RunState, Store, RECORDS_PAGE_MAX};
use solocron_fleet::{Fleet, RunFilter, RunView, RUNS_PAGE_MAX};

use crate::output::{self, line, print_json};
use crate::wiring::Target;
use crate::{bad_input, store_failed, Failure, Format};

use super::read_fleet;

/// `solocron history`'s arguments.
#[derive(Args)]
pub struct HistoryArgs {
    #[command(flatten)]
    target: Target,
    /// Only this job.
    #[arg(long)]
    job: Option<String>,
    /// Only the runs of this namespace's jobs.
    #[arg(long, value_name = "NAME")]
    namespace: Option<String>,
    /// Only runs in this state (running, succeeded, failed, timed_out, lost, abandoned, skipped, interrupted).
    #[arg(long)]
    state: Option<String>,
    /// Only runs claimed by this node.
    #[arg(long)]
    node: Option<String>,
    /// Only ticks scheduled at or after this: an RFC 3339 instant, or a duration ago ("2h").
    #[arg(long)]
    since: Option<String>,
    /// Only ticks scheduled before this: an RFC 3339 instant, or a duration ago.
    #[arg(long)]
    until: Option<String>,
    /// At most this many records (1 to 10000).
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=RECORDS_PAGE_MAX as i64))]
    limit: u32,
    /// The table's time zone (an IANA name such as Europe/Berlin). Default: the jobs' zone
    /// when every row's job has the same one, else UTC. The header names it; JSON is UTC.
    #[arg(long, value_name = "ZONE")]
    zone: Option<String>,
    /// Show the captured output tail of this run (`job@instant#attempt`, the RUN ID column).
    #[arg(long, value_name = "RUN_ID")]
    output: Option<String>,
    #[arg(long, value_enum, default_value_t = Format::Table)]
    format: Format,
}

/// An instant given as RFC 3339, or as a duration before `now`.
fn instant_arg(flag: &str, s: &str, now: DateTime<Utc>) -> Result<DateTime<Utc>, Failure> {
    if let Ok(t) = DateTime::parse_from_rfc3339(s) {
        return Ok(t.with_timezone(&Utc));
    }
    let ago = parse_duration(s).map_err(|e| bad_input(format!("{flag}: not an RFC 3339 instant, and {e}")))?;
    Ok(now - chrono::Duration::from_std(ago).map_err(|_| bad_input(format!("{flag}: too long ago")))?)
}

fn zone_arg(s: &str) -> Result<Tz, Failure> {
    s.parse()
        .map_err(|_| bad_input(format!("--zone: unknown time zone `{s}` (an IANA name such as Europe/Berlin, or UTC)")))
}

/// `solocron history`: run records, newest first, or with `--output` one run's output.
pub async fn history(a: HistoryArgs) -> Result<(), Failure> {
    let zone = a.zone.as_deref().map(zone_arg).transpose()?;
    let cfg = a.target.config()?;
    let store = a.target.connect(cfg.as_ref()).await?;
    if let Some(id) = &a.output {
        return show_run(store.as_ref(), id, a.format).await;
    }
    let fleet = read_fleet(cfg.as_ref(), store.as_ref()).await?;
    if let Some(j) = &a.job {
        fleet.require_known_or_recorded(store.as_ref(), j).await?;
    }
    let state =
        a.state.as_deref().map(str::parse::<RunState>).transpose().map_err(|e| bad_input(format!("--state: {e}")))?;
    let since = a.since.as_deref().map(|s| instant_arg("--since", s, fleet.now())).transpose()?;
    let until = a.until.as_deref().map(|s| instant_arg("--until", s, fleet.now())).transpose()?;
    let filter = RunFilter {
        job: a.job.clone(),
        namespace: a.namespace.clone(),
        state,
        node: a.node.clone(),
        since,
        until,
        ..RunFilter::default()
    };
    let runs = read_runs(store.as_ref(), filter, a.limit as usize).await?;
    match a.format {
        // The API's list (`GET /api/v1/runs`): the runs asked for, as one page.
        Format::Json => print_json(&solocron_fleet::Page::whole(runs)),
        Format::Table => {
            let zone = zone.unwrap_or_else(|| shared_zone(&fleet, &runs, a.job.as_deref()));
            let rows = runs.iter().map(|r| output::run_row(r, zone)).collect();
            output::emit(output::table(&output::run_header(zone), rows, output::colour_enabled()))
        }
    }
}

/// The newest `limit` runs, read in the fleet's pages (which never split an instant's runs).
async fn read_runs(store: &dyn Store, mut filter: RunFilter, limit: usize) -> Result<Vec<RunView>, Failure> {
    let mut runs = Vec::new();
    // Each page holds at least one run, so this ends within `limit` pages.
    while runs.len() < limit {
        filter.limit = (limit - runs.len()).min(RUNS_PAGE_MAX);
        let page = solocron_fleet::runs_page(store, &filter).await?;
        runs.extend(page.runs);
        match page.next_cursor {
            Some(older) => filter.cursor = Some(older),
            None => break,
        }
    }
    runs.truncate(limit);
    Ok(runs)
}

/// One zone for a whole table, so its rows compare at a glance: the jobs' zone when every
/// row's job (or the one job asked for) has the same, else UTC.
fn shared_zone(fleet: &Fleet, runs: &[RunView], job: Option<&str>) -> Tz {
    let mut per_job: BTreeMap<&str, Tz> = BTreeMap::new();
    for name in runs.iter().map(|r| r.job.as_str()).chain(job) {
        per_job.entry(name).or_insert_with(|| fleet.zone(name));
    }
    let mut zones = per_job.into_values();
    match zones.next() {
        Some(first) if zones.all(|z| z == first) => first,
        _ => chrono_tz::UTC,
    }
}

async fn show_run(store: &dyn Store, id: &str, format: Format) -> Result<(), Failure> {
    let detail = solocron_fleet::run_detail(store, id).await.map_err(|e| match e {
        solocron_fleet::FleetError::Store(e) => store_failed(e),
        other => bad_input(format!("--output: {other}")),
    })?;
    match format {
        // The API's object (`GET /api/v1/runs/{id}`).
        Format::Json => print_json(&detail),
        Format::Table if detail.output.is_empty() || detail.output.ends_with('\n') => output::emit(&detail.output),
        Format::Table => line(&detail.output),
    }
}
