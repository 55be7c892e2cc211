//! The admin commands. They read and act through `solocron-fleet`, as the HTTP API does, so
//! the CLI and the API give the same answers and every action lands in the store's audit
//! log; they talk to the store directly, so no daemon needs to run.

use std::collections::BTreeMap;
use std::io::{IsTerminal as _, Write as _};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use clap::Args;
use serde_json::json;
use solocron_core::{
    format_duration, parse_duration, Liveness, Namespaces, RunState, Store, ALREADY_PAUSED, ALREADY_RUNNING,
    HEARTBEAT_EVERY, NODE_STALE_AFTER, RECORDS_PAGE_MAX,
};
use solocron_fleet::{
    ActionView, Actor, Fleet, JobDetail, JobFilter, JobSummary, NodeView, PauseView, RegistrationView, RunFilter,
    RunView, Triggered, JOBS_PAGE_MAX, RUNS_PAGE_MAX, TRIGGER_WAIT_MAX,
};

use crate::config::Config;
use crate::output::{self, line, print_json, Cell};
use crate::{bad_input, store_failed, Failure, Format, Target};

/// Actions shown in `status JOB`'s table (its JSON has every one the fleet read).
const ACTIONS_SHOWN_MAX: usize = 10;

/// Who an operator action is recorded as: `user@host`.
pub(crate) fn operator() -> String {
    let user = std::env::var("USER").unwrap_or_else(|_| "unknown".into());
    let host = nix::unistd::gethostname().ok().and_then(|h| h.into_string().ok()).unwrap_or_default();
    format!("{user}@{host}")
}

fn actor(reason: Option<String>) -> Actor {
    Actor { by: operator(), reason }
}

/// The fleet as the store and this command's configuration know it.
async fn read_fleet(cfg: Option<&Config>, store: &dyn Store) -> Result<Fleet, Failure> {
    Ok(Fleet::read(store, crate::http::declared(cfg)).await?)
}

fn duration_arg(s: &str) -> Result<Duration, String> {
    parse_duration(s).map_err(|e| e.to_string())
}

/// `--stale-after`: how long a node may be silent before it counts as stale.
#[derive(Args, Clone, Copy)]
pub struct Silence {
    /// A node whose last heartbeat is older than this is stale (stalled, partitioned or
    /// dead), and a job is stale when no node that registered it is alive. Nodes send a
    /// heartbeat every 5s; the default is what the HTTP API uses. At least 10s.
    #[arg(long, default_value = "15s", value_parser = stale_after_arg, value_name = "DURATION")]
    stale_after: Duration,
}

/// Below two heartbeat intervals, a healthy node would flicker stale between its beats.
fn stale_after_arg(s: &str) -> Result<Duration, String> {
    let d = duration_arg(s)?;
    let min = 2 * HEARTBEAT_EVERY;
    if d < min {
        return Err(format!(
            "{} is too short: nodes send a heartbeat every {}, so use at least {}",
            format_duration(d),
            format_duration(HEARTBEAT_EVERY),
            format_duration(min)
        ));
    }
    Ok(d)
}

impl Silence {
    /// The fleet's own judgement unless `--stale-after` asks for another threshold.
    fn liveness(&self, n: &NodeView) -> Liveness {
        let judged = n.liveness.parse().unwrap_or(Liveness::Stale);
        if self.stale_after == NODE_STALE_AFTER || judged == Liveness::Gone {
            return judged;
        }
        if Duration::from_millis(n.last_seen_ago_ms.unsigned_abs()) > self.stale_after {
            Liveness::Stale
        } else {
            Liveness::Alive
        }
    }

    /// Registered, and no registering node alive (a node never heard from is not alive).
    fn job_stale(&self, job: &JobSummary, nodes: &[NodeView]) -> bool {
        if self.stale_after == NODE_STALE_AFTER {
            return job.stale;
        }
        let alive = |id: &String| nodes.iter().any(|n| &n.node == id && self.liveness(n) == Liveness::Alive);
        !job.nodes.is_empty() && !job.nodes.iter().any(alive)
    }
}

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
        let detail = seen.fleet.job(store.as_ref(), job).await?;
        return match a.format {
            Format::Json => print_json(&json!([detail_json(&detail, &seen)])),
            Format::Table => output::emit(status_detail(&detail, &seen)),
        };
    }
    let jobs = all_jobs(&seen.fleet, store.as_ref(), a.namespace).await?;
    match a.format {
        Format::Json => print_json(&json!(jobs.iter().map(|j| job_json(j, &seen)).collect::<Vec<_>>())),
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
async fn all_jobs(fleet: &Fleet, store: &dyn Store, namespace: Option<String>) -> Result<Vec<JobSummary>, Failure> {
    let mut filter = JobFilter { limit: JOBS_PAGE_MAX, namespace, ..JobFilter::default() };
    let mut jobs = Vec::new();
    loop {
        let page = fleet.jobs(store, &filter).await?;
        jobs.extend(page.jobs);
        match page.next_cursor {
            Some(after) => filter.cursor = Some(after),
            None => return Ok(jobs),
        }
    }
}

/// A job as JSON. The field names are a stable interface: new ones are added, none renamed.
fn job_json(j: &JobSummary, seen: &Seen) -> serde_json::Value {
    json!({
        "job": j.name,
        "namespace": j.namespace,
        "schedule": j.schedule,
        "schedule_words": j.schedule_words,
        "timezone": j.timezone,
        "next_fire": j.next_fire.map(output::rfc),
        "paused": j.paused.is_some(),
        "paused_by": j.paused.as_ref().map(|p| &p.by),
        "pause_reason": j.paused.as_ref().and_then(|p| p.reason.as_ref()),
        "paused_at": j.paused.as_ref().map(|p| output::rfc(p.at)),
        "last_run": j.last_run.as_ref().map(output::run_json),
        "running": j.running.iter().map(output::run_json).collect::<Vec<_>>(),
        "drift": j.drift,
        "stale": seen.silence.job_stale(j, &seen.nodes),
        "declared_in": j.declared_in,
        "nodes": seen.fleet.registrations(&j.name).iter().map(|r| registration_json(r, seen)).collect::<Vec<_>>(),
    })
}

/// How a node registered a job, and whether that node is alive by its heartbeat.
fn registration_json(r: &RegistrationView, seen: &Seen) -> serde_json::Value {
    let now = seen.fleet.now();
    let node = seen.nodes.iter().find(|n| n.node == r.node);
    json!({
        "node": r.node,
        "definition_hash": r.definition_hash,
        "schedule": r.schedule,
        "timezone": r.timezone,
        "summary": r.summary,
        "first_seen": output::rfc(r.first_seen),
        "last_seen": output::rfc(r.last_seen),
        "last_seen_ago_ms": (now - r.last_seen).num_milliseconds().max(0),
        "liveness": node.map_or("unknown".to_owned(), |n| seen.silence.liveness(n).to_string()),
        "heartbeat_ago_ms": node.map(|n| n.last_seen_ago_ms),
    })
}

fn detail_json(d: &JobDetail, seen: &Seen) -> serde_json::Value {
    let mut v = job_json(&d.summary, seen);
    let extra = json!({
        "next_fires": d.next_fires.iter().map(|f| output::rfc(f.utc)).collect::<Vec<_>>(),
        "counts_24h": d.counts_24h,
        "actions": d.actions.iter().map(action_json).collect::<Vec<_>>(),
    });
    if let (Some(v), serde_json::Value::Object(extra)) = (v.as_object_mut(), extra) {
        v.extend(extra);
    }
    v
}

fn action_json(a: &ActionView) -> serde_json::Value {
    json!({ "kind": a.kind, "by": a.by, "reason": a.reason, "at": output::rfc(a.at), "detail": a.detail })
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

#[derive(Args)]
pub struct NodesArgs {
    #[command(flatten)]
    target: Target,
    #[command(flatten)]
    silence: Silence,
    #[arg(long, value_enum, default_value_t = Format::Table)]
    format: Format,
}

/// `solocron nodes`: every node heard from (and not yet forgotten), by id.
pub async fn nodes(a: NodesArgs) -> Result<(), Failure> {
    let cfg = a.target.config()?;
    let store = a.target.connect(cfg.as_ref()).await?;
    let fleet = read_fleet(cfg.as_ref(), store.as_ref()).await?;
    let nodes = fleet.nodes();
    match a.format {
        Format::Json => print_json(&json!(nodes.iter().map(|n| node_json(n, a.silence)).collect::<Vec<_>>())),
        Format::Table => output::emit(nodes_table(&nodes, a.silence, fleet.now())),
    }
}

fn node_json(n: &NodeView, silence: Silence) -> serde_json::Value {
    json!({
        "node": n.node,
        "liveness": silence.liveness(n).as_str(),
        "version": n.version,
        "started_at": output::rfc(n.started_at),
        "last_seen": output::rfc(n.last_seen),
        "last_seen_ago_ms": n.last_seen_ago_ms,
        "left_at": n.left_at.map(output::rfc),
        "jobs": n.jobs,
        "runs_held": n.running.len(),
        "running": n.running,
    })
}

fn nodes_table(nodes: &[NodeView], silence: Silence, now: DateTime<Utc>) -> String {
    let header = ["NODE", "LIVENESS", "LAST SEEN", "VERSION", "JOBS", "RUNS HELD"];
    let rows = nodes
        .iter()
        .map(|n| {
            let liveness = silence.liveness(n);
            let colour = match liveness {
                Liveness::Alive => "32",
                Liveness::Stale => "31",
                Liveness::Gone => "2",
            };
            vec![
                Cell::from(n.node.as_str()),
                Cell { text: liveness.to_string(), colour: Some(colour) },
                output::relative(n.last_seen, now).into(),
                n.version.as_str().into(),
                n.jobs.to_string().into(),
                n.running.len().to_string().into(),
            ]
        })
        .collect();
    output::table(&header, rows, output::colour_enabled())
}

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
        Format::Json => print_json(&json!(runs.iter().map(output::run_json).collect::<Vec<_>>())),
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
        Format::Json => {
            let mut v = output::run_json(&detail.run);
            v["output"] = json!(detail.output);
            v["attempts"] = json!(detail.attempts.iter().map(output::run_json).collect::<Vec<_>>());
            print_json(&v)
        }
        Format::Table if detail.output.is_empty() || detail.output.ends_with('\n') => output::emit(&detail.output),
        Format::Table => line(&detail.output),
    }
}

#[derive(Args)]
pub struct TriggerArgs {
    #[command(flatten)]
    target: Target,
    /// The job to run.
    job: String,
    /// Run it in this process (claimed like any tick) instead of by a running node.
    #[arg(long)]
    here: bool,
    /// Wait for the run to end; exit 0 only if it succeeded.
    #[arg(long)]
    wait: bool,
    /// With --wait: give up after this long (at most 1h).
    #[arg(long, default_value = "10m", value_parser = duration_arg)]
    timeout: Duration,
    /// Why (recorded in the audit log, shown by `status JOB`).
    #[arg(long, conflicts_with = "here")]
    reason: Option<String>,
}

/// `solocron trigger`: asks for a manual run (audited), or with `--here` runs it here.
pub async fn trigger(a: TriggerArgs) -> Result<(), Failure> {
    if a.wait && a.timeout > TRIGGER_WAIT_MAX {
        return Err(bad_input(format!("--timeout: at most {}", format_duration(TRIGGER_WAIT_MAX))));
    }
    let cfg = a.target.config()?;
    let store = a.target.connect(cfg.as_ref()).await?;
    let fleet = read_fleet(cfg.as_ref(), store.as_ref()).await?;
    fleet.require(&a.job)?;
    if a.here {
        return trigger_here(cfg.as_ref(), store, &a.job).await;
    }
    let wait = a.wait.then_some(a.timeout);
    if let Some(w) = wait {
        // Progress, not the answer: stderr, so stdout stays the one line a script reads.
        let _ = writeln!(std::io::stderr(), "requesting a run of {}; waiting at most {}", a.job, format_duration(w));
    }
    match solocron_fleet::trigger(store.as_ref(), &fleet, &a.job, &actor(a.reason), wait).await? {
        Triggered::Requested(id) => {
            line(format_args!("requested {id}; a running node will pick it up within a second"))
        }
        Triggered::Ended(run) => report(&run),
        Triggered::StillRunning(id) => Err(Failure(1, format!("{id}: not ended after {}", format_duration(a.timeout)))),
    }
}

/// Says how a run ended, once, on stdout; exits 1 unless it succeeded.
fn report(r: &RunView) -> Result<(), Failure> {
    let why = r.reason.as_ref().map(|x| format!(": {x}")).unwrap_or_default();
    line(format_args!("{} {} on {}{why}", r.id, r.state, r.node))?;
    if r.state == RunState::Succeeded.as_str() {
        Ok(())
    } else {
        Err(Failure::said(1))
    }
}

async fn trigger_here(cfg: Option<&Config>, store: Arc<dyn Store>, job: &str) -> Result<(), Failure> {
    let cfg = cfg.ok_or_else(|| bad_input("--here needs the job's definition: give --config"))?;
    if !cfg.jobs.iter().any(|j| j.name == job) {
        return Err(bad_input(format!("--here: job `{job}` is not defined in {}", cfg.file)));
    }
    let scheduler = crate::daemon::scheduler(cfg, store, None, crate::daemon::jobs(cfg)?)?;
    let interrupt = tokio_util::sync::CancellationToken::new();
    let on_ctrl_c = interrupt.clone();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            on_ctrl_c.cancel();
        }
    });
    // The store records the request in its audit log, by `user@host (--here)`.
    match scheduler.run_here(job, &format!("{} (--here)", operator()), interrupt).await.map_err(store_failed)? {
        Some(r) => {
            output::emit(&r.output)?;
            report(&RunView::from(&r))
        }
        None => line("a running node picked the request up first; it runs there"),
    }
}

#[derive(Args)]
pub struct PauseArgs {
    #[command(flatten)]
    target: Target,
    /// The job.
    job: String,
    /// Why (recorded in the audit log, shown by `status JOB`).
    #[arg(long)]
    reason: Option<String>,
}

/// `solocron pause` and `resume`: the fleet's switch, audited; says when it changed nothing.
pub async fn set_paused(a: PauseArgs, paused: bool) -> Result<(), Failure> {
    let cfg = a.target.config()?;
    let store = a.target.connect(cfg.as_ref()).await?;
    let fleet = read_fleet(cfg.as_ref(), store.as_ref()).await?;
    let before = fleet.paused(&a.job);
    let who = actor(a.reason);
    let action = if paused {
        solocron_fleet::pause(store.as_ref(), &fleet, &a.job, &who).await?
    } else {
        solocron_fleet::resume(store.as_ref(), &fleet, &a.job, &who).await?
    };
    line(pause_words_after(&a.job, &action, before.as_ref()))
}

/// What a pause or resume did, from its audit record and the switch as it was before.
fn pause_words_after(job: &str, action: &ActionView, before: Option<&PauseView>) -> String {
    match (action.detail.as_str(), before) {
        (ALREADY_PAUSED, Some(b)) => {
            let was = format!(
                "{job} was already paused by {}{}",
                b.by,
                b.reason.as_ref().map(|r| format!(": {r}")).unwrap_or_default()
            );
            match &action.reason {
                // The store keeps the switch as it was: the earlier reason stays.
                None => format!("{was}; nothing changed"),
                Some(r) => format!("{was}; now recorded as paused by {}: {r}", action.by),
            }
        }
        (ALREADY_PAUSED, None) => format!("{job} was already paused"),
        (ALREADY_RUNNING, _) => format!("{job} was not paused; nothing changed"),
        _ if action.kind == "pause" => format!("{job} paused for the whole fleet"),
        _ => format!("{job} resumed for the whole fleet"),
    }
}

#[derive(Args)]
pub struct UnlockArgs {
    #[command(flatten)]
    target: Target,
    /// The job whose running run to end.
    job: String,
    /// Why (recorded in the run's reason and the audit log).
    #[arg(long)]
    reason: Option<String>,
    /// Do not ask for confirmation (needed when stdin is not a terminal).
    #[arg(long, short)]
    yes: bool,
}

/// `solocron unlock`: ends a job's running runs as abandoned, once confirmed (audited).
pub async fn unlock(a: UnlockArgs) -> Result<(), Failure> {
    let cfg = a.target.config()?;
    let store = a.target.connect(cfg.as_ref()).await?;
    let fleet = read_fleet(cfg.as_ref(), store.as_ref()).await?;
    fleet.require(&a.job)?;
    let filter = RunFilter {
        job: Some(a.job.clone()),
        state: Some(RunState::Running),
        limit: RUNS_PAGE_MAX,
        ..RunFilter::default()
    };
    let running = solocron_fleet::runs_page(store.as_ref(), &filter).await?.runs;
    if running.is_empty() {
        return line(format_args!("{}: no running run; nothing to unlock", a.job));
    }
    for r in &running {
        line(format_args!("running: {} held by {} (token {})", r.id, r.node, r.fencing_token.unwrap_or(0)))?;
    }
    if !a.yes {
        confirm(&format!("End {} run(s) of {} as abandoned?", running.len(), a.job))?;
    }
    let ended = solocron_fleet::unlock(store.as_ref(), &fleet, &a.job, &actor(a.reason)).await?;
    for id in &ended {
        line(format_args!("abandoned {id}"))?;
    }
    Ok(())
}

/// Asks on the terminal; anything but yes, or no terminal to ask on, is exit 1 (README's
/// exit codes: an unconfirmed unlock is not bad input, the command was well formed).
fn confirm(question: &str) -> Result<(), Failure> {
    if !std::io::stdin().is_terminal() {
        return Err(Failure(
            1,
            "not confirmed, nothing changed: stdin is not a terminal to ask on; pass --yes to confirm".into(),
        ));
    }
    eprint!("{question} [y/N] ");
    let mut answer = String::new();
    std::io::stdin().read_line(&mut answer).map_err(|e| Failure(1, e.to_string()))?;
    if matches!(answer.trim(), "y" | "Y" | "yes") {
        Ok(())
    } else {
        Err(Failure(1, "not confirmed; nothing changed".into()))
    }
}

#[derive(Args)]
pub struct PruneArgs {
    #[command(flatten)]
    target: Target,
    /// Delete ended runs of ticks scheduled longer ago than this; `never` deletes nothing
    /// (as `history_retention = "never"` keeps everything).
    #[arg(long, default_value = "30d")]
    older_than: String,
    /// Prune only this namespace's jobs (repeat for several; default: the configuration's
    /// `[node] namespaces`, or `default` without a configuration).
    #[arg(long = "namespace", value_name = "NAME")]
    namespaces: Vec<String>,
}

/// `solocron prune`: deletes old ended run records in bounded batches.
pub async fn prune(a: PruneArgs) -> Result<(), Failure> {
    if a.older_than.trim() == "never" {
        return line("--older-than never: nothing pruned, every run record is kept");
    }
    let older = parse_duration(&a.older_than).map_err(|e| bad_input(format!("--older-than: {e} (or `never`)")))?;
    let cfg = a.target.config()?;
    let floor = solocron_core::retention_floor(cfg.iter().flat_map(|c| c.jobs.iter().map(|j| &j.policy)));
    if older < floor {
        return Err(bad_input(format!(
            "--older-than {} is too short: a pruned tick could be claimed again by a node whose clock lags, or by a catch-up looking back; use at least {}",
            format_duration(older),
            format_duration(floor)
        )));
    }
    let namespaces = match (a.namespaces.is_empty(), &cfg) {
        (false, _) => Namespaces::only(&a.namespaces).map_err(|e| bad_input(format!("--namespace: {e}")))?,
        (true, Some(cfg)) => cfg.namespaces.clone(),
        (true, None) => Namespaces::default(),
    };
    let store = a.target.connect(cfg.as_ref()).await?;
    let stop = tokio_util::sync::CancellationToken::new();
    let mut total = 0;
    loop {
        let n = solocron::prune_pass(store.as_ref(), older, &namespaces, &stop).await.map_err(store_failed)?;
        total += n;
        if n == 0 {
            break;
        }
    }
    line(format_args!("deleted {total} run record(s) older than {} in {namespaces}", format_duration(older)))
}
