//! `solocron status`: every job at a glance (and the nodes), or one job in detail.

use std::time::Duration;

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use clap::Args;
use solocron_core::{format_duration, Store};
use solocron_fleet::{
    ActionView, Fleet, JobDetail, JobFilter, JobList, JobSummary, NodeView, Page, PauseView, RegistrationView, RunView,
    JOBS_PAGE_MAX,
};

use crate::output::{self, print_json, Cell};
use crate::wiring::Target;
use crate::{Failure, Format};

use super::nodes::nodes_table;
use super::{read_fleet, Silence};

/// Actions shown in `status JOB`'s table (its JSON has every one the fleet read).
const ACTIONS_SHOWN_MAX: usize = 10;

/// `solocron status`'s arguments.
#[derive(Args)]
pub struct StatusArgs {
    #[command(flatten)]
    target: Target,
    /// Only this job, in detail (with the operators' recent actions on it).
    job: Option<String>,
    /// Only the jobs of this namespace.
    #[arg(long, value_name = "NAME", conflicts_with = "job")]
    namespace: Option<String>,
    #[command(flatten)]
    silence: Silence,
    #[arg(long, value_enum, default_value_t = Format::Table)]
    format: Format,
}

/// What `status` shows, read once.
struct Seen {
    fleet: Fleet,
    nodes: Vec<NodeView>,
    silence: Silence,
}

/// `solocron status`: every job (and the nodes), or with JOB one job in detail.
pub async fn status(a: StatusArgs) -> Result<(), Failure> {
    let cfg = a.target.config()?;
    let store = a.target.connect(cfg.as_ref()).await?;
    let fleet = read_fleet(cfg.as_ref(), store.as_ref()).await?;
    let seen = Seen { nodes: fleet.nodes(), fleet, silence: a.silence };
    if let Some(job) = &a.job {
        let mut detail = seen.fleet.job(store.as_ref(), job).await?;
        return match a.format {
            Format::Json => {
                detail.summary = seen.silence.judged_job(detail.summary, &seen.nodes);
                print_json(&detail)
            }
            Format::Table => output::emit(status_detail(&detail, &seen)),
        };
    }
    let mut list = all_jobs(&seen.fleet, store.as_ref(), a.namespace).await?;
    let jobs = std::mem::take(&mut list.page.items);
    match a.format {
        // The API's list (`GET /api/v1/jobs`), `stale` by this command's --stale-after.
        Format::Json => {
            list.page.items = jobs.into_iter().map(|j| seen.silence.judged_job(j, &seen.nodes)).collect();
            print_json(&list)
        }
        Format::Table => {
            let mut text = status_table(&jobs, &seen);
            if !seen.nodes.is_empty() {
                text += "\n";
                text += &nodes_table(&seen.nodes, seen.silence, seen.fleet.now());
            }
            output::emit(text)
        }
    }
}

/// Every job, a page at a time (each page reads only its own jobs' history).
/// Every job (of `namespace`), read a page at a time, as one page of the API's list.
async fn all_jobs(fleet: &Fleet, store: &dyn Store, namespace: Option<String>) -> Result<JobList, Failure> {
    let mut filter = JobFilter { limit: JOBS_PAGE_MAX, namespace, ..JobFilter::default() };
    let mut jobs = Vec::new();
    loop {
        let page = fleet.jobs(store, &filter).await?;
        jobs.extend(page.jobs);
        match page.next_cursor {
            Some(after) => filter.cursor = Some(after),
            None => return Ok(JobList { page: Page::whole(jobs), total: page.total, namespaces: page.namespaces }),
        }
    }
}

fn zone_of(j: &JobSummary) -> Tz {
    j.timezone.as_deref().and_then(|z| z.parse().ok()).unwrap_or(chrono_tz::UTC)
}

fn status_table(jobs: &[JobSummary], seen: &Seen) -> String {
    let now = seen.fleet.now();
    let header = ["JOB", "SCHEDULE", "ZONE", "NEXT FIRE", "PAUSED", "LAST RUN", "WHEN", "RUNNING", "NODES", "FLAGS"];
    let rows = jobs
        .iter()
        .map(|j| {
            let zone = zone_of(j);
            let mut flags = Vec::new();
            if j.drift {
                flags.push("drift");
            }
            if seen.silence.job_stale(j, &seen.nodes) {
                flags.push("stale");
            }
            let when = |r: &RunView| output::relative(r.finished_at.unwrap_or(r.claimed_at), now);
            vec![
                Cell::from(j.name.as_str()),
                j.schedule.as_deref().unwrap_or("-").into(),
                zone.name().into(),
                j.next_fire.map_or("-".into(), |t| output::local_time(t, zone)).into(),
                if j.paused.is_some() { Cell { text: "paused".into(), colour: Some("33") } } else { "-".into() },
                j.last_run.as_ref().map_or("-".into(), |r| output::state_cell(&r.state)),
                j.last_run.as_ref().map_or("-".into(), when).into(),
                j.running.first().map_or("-".into(), |r| format!("on {}", r.node)).into(),
                j.nodes.len().to_string().into(),
                if flags.is_empty() { "-".into() } else { Cell { text: flags.join(","), colour: Some("31") } },
            ]
        })
        .collect();
    output::table(&header, rows, output::colour_enabled())
}

/// `status JOB`: one labelled line per fact, values in one column.
fn status_detail(d: &JobDetail, seen: &Seen) -> String {
    let (j, now) = (&d.summary, seen.fleet.now());
    let zone = zone_of(j);
    let mut rows: Vec<(&str, String)> = vec![("job", j.name.clone())];
    if let Some(expr) = &j.schedule {
        let words = j.schedule_words.as_ref().map(|w| format!(": {w}")).unwrap_or_default();
        rows.push(("schedule", format!("{expr}  ({}){words}", zone.name())));
    }
    if let Some(n) = j.next_fire {
        rows.push(("next fire", format!("{}  ({})", output::local_time(n, zone), output::relative(n, now))));
    }
    rows.push(("paused", j.paused.as_ref().map_or("no".into(), |p| format!("yes, {}", pause_words(p, now)))));
    rows.push(("last run", j.last_run.as_ref().map_or("none".into(), |r| last_run_words(r, now))));
    for r in &j.running {
        rows.push(("running", running_words(r, zone, now)));
    }
    rows.push(("drift", if j.drift { "YES: nodes define this job differently".into() } else { "no".into() }));
    let stale = seen.silence.job_stale(j, &seen.nodes);
    rows.push(("stale", if stale { stale_words(seen.silence) } else { "no".into() }));
    if let Some(file) = &j.declared_in {
        rows.push(("declared in", file.clone()));
    }
    if !d.registrations.is_empty() {
        rows.push(("nodes", registration_lines(&d.registrations, seen)));
    }
    rows.push(("actions", action_lines(&d.actions, now)));
    output::labelled(&rows)
}

fn pause_words(p: &PauseView, now: DateTime<Utc>) -> String {
    let why = p.reason.as_ref().map(|r| format!(": {r}")).unwrap_or_default();
    format!("by {} {}{why}", p.by, output::relative(p.at, now))
}

fn last_run_words(r: &RunView, now: DateTime<Utc>) -> String {
    let took = r.duration_ms.map_or("-".into(), |ms| format_duration(Duration::from_millis(ms.unsigned_abs())));
    let when = output::relative(r.finished_at.unwrap_or(r.claimed_at), now);
    format!("{} on {}, took {took}, {when}  [{}]", r.state, r.node, r.id)
}

fn running_words(r: &RunView, zone: Tz, now: DateTime<Utc>) -> String {
    let lease =
        r.lease_until.map_or("-".into(), |l| format!("{} ({})", output::local_time(l, zone), output::relative(l, now)));
    let token = r.fencing_token.map_or("-".into(), |t| t.to_string());
    format!("{} held by {}, token {token}, lease until {lease}", r.id, r.node)
}

fn stale_words(silence: Silence) -> String {
    format!("YES: no node that registered it has sent a heartbeat within {}", format_duration(silence.stale_after))
}

/// One aligned line per registering node: its liveness by heartbeat, and its definition.
fn registration_lines(regs: &[RegistrationView], seen: &Seen) -> String {
    let now = seen.fleet.now();
    let rows = regs
        .iter()
        .map(|r| {
            let node = seen.nodes.iter().find(|n| n.node == r.node);
            let liveness = node.map_or("unknown".to_owned(), |n| seen.silence.liveness(n).to_string());
            let heard =
                node.map_or("no heartbeat".to_owned(), |n| format!("heartbeat {}", output::relative(n.last_seen, now)));
            vec![
                Cell::from(r.node.as_str()),
                liveness.into(),
                heard.into(),
                format!("definition {}", r.definition_hash).into(),
                format!("{} [{}]", r.schedule, r.timezone).into(),
                r.summary.as_str().into(),
            ]
        })
        .collect();
    output::columns(rows, false).join("\n")
}

/// The newest actions, one aligned line each: when, what, who, why, and what it did.
fn action_lines(actions: &[ActionView], now: DateTime<Utc>) -> String {
    if actions.is_empty() {
        return "none".into();
    }
    let rows = actions
        .iter()
        .take(ACTIONS_SHOWN_MAX)
        .map(|a| {
            vec![
                Cell::from(output::relative(a.at, now)),
                a.kind.as_str().into(),
                format!("by {}", a.by).into(),
                a.reason.as_ref().map_or("(no reason given)".into(), |r| format!("\"{r}\"")).into(),
                a.detail.as_str().into(),
            ]
        })
        .collect();
    let mut lines = output::columns(rows, false);
    if actions.len() > ACTIONS_SHOWN_MAX {
        lines.push(format!("… {} more with --format json", actions.len() - ACTIONS_SHOWN_MAX));
    }
    lines.join("\n")
}
