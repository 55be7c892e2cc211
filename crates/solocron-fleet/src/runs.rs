//! The run history, in pages: the CLI's filters, and a cursor that never skips or repeats a
//! run although many runs share one instant.

use chrono::{DateTime, Utc};
use solocron_core::{HistoryQuery, OperatorStore, RunState, RECORDS_PAGE_MAX};

use crate::views::{rfc3339, RunDetail, RunPage, RunView};
use crate::FleetError;

/// Most runs on one page.
pub const RUNS_PAGE_MAX: usize = 500;
/// Runs on a page when the caller does not say.
const RUNS_PAGE_DEFAULT: usize = 50;

/// Which runs to list, newest first.
#[derive(Debug, Clone, Default)]
pub struct RunFilter {
    /// Only this job's.
    pub job: Option<String>,
    /// Only jobs of this namespace.
    pub namespace: Option<String>,
    /// Only runs in this state.
    pub state: Option<RunState>,
    /// Only runs claimed by this node.
    pub node: Option<String>,
    /// Only ticks scheduled at or after this instant.
    pub since: Option<DateTime<Utc>>,
    /// Only ticks scheduled before this instant.
    pub until: Option<DateTime<Utc>>,
    /// The previous page's `next_cursor`.
    pub cursor: Option<String>,
    /// At most this many (1..=[`RUNS_PAGE_MAX`]; 0 means the default, 50). A page holds
    /// every run of the instants it shows, so it may hold more when more than this many
    /// runs share its oldest instant.
    pub limit: usize,
}

/// One page of runs. The cursor is the oldest instant the page showed completely: the next
/// page is the runs scheduled before it. A page never ends in the middle of an instant's
/// runs (the store orders runs of one instant in no stable way), so when the runs of the
/// page's last instant go past the limit, they move to the next page whole; when one instant
/// alone has more runs than the limit, the page is that instant's runs, up to
/// [`RECORDS_PAGE_MAX`].
pub async fn runs_page(store: &dyn OperatorStore, filter: &RunFilter) -> Result<RunPage, FleetError> {
    let limit = match filter.limit {
        0 => RUNS_PAGE_DEFAULT,
        n if n > RUNS_PAGE_MAX => return Err(FleetError::bad("limit", format!("at most {RUNS_PAGE_MAX}"))),
        n => n,
    };
    if let Some(ns) = &filter.namespace {
        solocron_core::validate_namespace(ns).map_err(|e| FleetError::bad("namespace", e.to_string()))?;
    }
    let cursor = filter.cursor.as_deref().map(parse_cursor).transpose()?;
    let until = match (filter.until, cursor) {
        (Some(u), Some(c)) => Some(u.min(c)),
        (u, c) => u.or(c),
    };
    let query = |since, until, limit| HistoryQuery {
        job: filter.job.clone(),
        namespace: filter.namespace.clone(),
        state: filter.state,
        node: filter.node.clone(),
        since,
        until,
        limit,
    };
    let mut runs = store.history(&query(filter.since, until, limit + 1)).await?;
    if runs.len() <= limit {
        return Ok(page(runs, None));
    }
    let boundary = runs[limit].id.tick.scheduled_at;
    runs.truncate(limit);
    runs.retain(|r| r.id.tick.scheduled_at != boundary);
    if runs.is_empty() {
        // One instant holds more than a page: show it whole.
        let at = Some(boundary + chrono::Duration::milliseconds(1));
        runs = store.history(&query(Some(boundary), at, RECORDS_PAGE_MAX)).await?;
        return Ok(page(runs, Some(boundary)));
    }
    let oldest = runs.last().expect("not empty").id.tick.scheduled_at;
    Ok(page(runs, Some(oldest)))
}

fn page(mut runs: Vec<solocron_core::RunRecord>, next: Option<DateTime<Utc>>) -> RunPage {
    // Within one instant, a stable order: by job, then newest attempt first.
    runs.sort_by(|a, b| {
        b.id.tick
            .scheduled_at
            .cmp(&a.id.tick.scheduled_at)
            .then(a.id.tick.job.cmp(&b.id.tick.job))
            .then(b.id.attempt.cmp(&a.id.attempt))
    });
    RunPage { runs: runs.iter().map(RunView::from).collect(), next_cursor: next.map(rfc3339) }
}

fn parse_cursor(s: &str) -> Result<DateTime<Utc>, FleetError> {
    DateTime::parse_from_rfc3339(s).map(|t| t.with_timezone(&Utc)).map_err(|_| {
        FleetError::bad("cursor", format!("`{s}` is not a cursor this API returned (an RFC 3339 instant)"))
    })
}

/// Parses a run id, `job@2026-01-01T00:00:00.000Z#1`, into (job, instant, attempt).
///
/// ```
/// let (job, at, attempt) = solocron_fleet::parse_run_id("backup@2026-01-01T00:00:00.000Z#2").unwrap();
/// assert_eq!((job.as_str(), attempt), ("backup", 2));
/// assert_eq!(at.timestamp(), 1_767_225_600);
/// assert!(solocron_fleet::parse_run_id("backup#2").is_err());
/// ```
pub fn parse_run_id(s: &str) -> Result<(String, DateTime<Utc>, u32), FleetError> {
    let bad = || FleetError::bad("run id", format!("`{s}` is not a run id (job@RFC3339-instant#attempt)"));
    let (rest, attempt) = s.rsplit_once('#').ok_or_else(bad)?;
    let (job, at) = rest.rsplit_once('@').ok_or_else(bad)?;
    let at = DateTime::parse_from_rfc3339(at).map_err(|_| bad())?.with_timezone(&Utc);
    let attempt = attempt.parse::<u32>().ok().filter(|a| *a >= 1).ok_or_else(bad)?;
    if job.is_empty() {
        return Err(bad());
    }
    Ok((job.to_owned(), at, attempt))
}

/// One run, with its output and every attempt at its tick.
/// An id that is not a run id names no run: [`FleetError::NotFound`], saying the form.
pub async fn run_detail(store: &dyn OperatorStore, id: &str) -> Result<RunDetail, FleetError> {
    let (job, at, attempt) = parse_run_id(id).map_err(|e| FleetError::NotFound(format!("no run `{id}`: {e}")))?;
    let q = HistoryQuery {
        job: Some(job),
        since: Some(at),
        until: Some(at + chrono::Duration::milliseconds(1)),
        limit: RECORDS_PAGE_MAX,
        ..HistoryQuery::default()
    };
    let mut attempts = store.history(&q).await?;
    attempts.sort_by_key(|r| std::cmp::Reverse(r.id.attempt));
    let run = attempts
        .iter()
        .find(|r| r.id.attempt == attempt)
        .ok_or_else(|| FleetError::NotFound(format!("no run `{id}`")))?;
    Ok(RunDetail {
        run: RunView::from(run),
        output: run.output.clone(),
        attempts: attempts.iter().map(RunView::from).collect(),
    })
}
