//! The admin commands: they talk to the store directly; no daemon needs to run.

use std::collections::BTreeSet;
use std::io::IsTerminal as _;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use chrono_tz::Tz;
use clap::Args;
use serde_json::json;
use solocron_core::{
    format_duration, parse_duration, HistoryQuery, JobControl, Registration, RunRecord, RunState, Schedule, Store,
};

use crate::config::Config;
use crate::output::{self, Cell};
use crate::{bad_input, store_failed, Failure, Format, Target};

/// Who an operator action is recorded as: `user@host`.
fn operator() -> String {
    let user = std::env::var("USER").unwrap_or_else(|_| "unknown".into());
    let host = nix::unistd::gethostname().ok().and_then(|h| h.into_string().ok()).unwrap_or_default();
    format!("{user}@{host}")
}

fn print_json(v: &serde_json::Value) {
    println!("{}", serde_json::to_string_pretty(v).expect("json"));
}

/// What the fleet knows about job names: the configuration's, the registry's, the controls'.
struct Fleet {
    cfg: Option<Config>,
    registrations: Vec<Registration>,
    controls: Vec<JobControl>,
}

impl Fleet {
    async fn read(cfg: Option<Config>, store: &dyn Store) -> Result<Fleet, Failure> {
        let registrations = store.registrations().await.map_err(store_failed)?;
        let controls = store.controls().await.map_err(store_failed)?;
        Ok(Fleet { cfg, registrations, controls })
    }

    fn names(&self) -> BTreeSet<String> {
        let mut n: BTreeSet<String> = self.registrations.iter().map(|r| r.definition.job.clone()).collect();
        n.extend(self.controls.iter().map(|c| c.job.clone()));
        if let Some(c) = &self.cfg {
            n.extend(c.jobs.iter().map(|j| j.name.clone()));
        }
        n
    }

    /// Refuses a job name nobody knows, listing the known ones.
    fn require(&self, job: &str) -> Result<(), Failure> {
        let names = self.names();
        if names.contains(job) {
            return Ok(());
        }
        let known: Vec<_> = names.into_iter().collect();
        Err(bad_input(format!(
            "unknown job `{job}`: not in the configuration nor registered by any node (known: {})",
            if known.is_empty() { "none".to_owned() } else { known.join(", ") }
        )))
    }

    /// The job's schedule and zone: the configuration's, else the newest registration's.
    fn schedule(&self, job: &str) -> Option<Schedule> {
        if let Some(j) = self.cfg.as_ref().and_then(|c| c.jobs.iter().find(|j| j.name == job)) {
            return Some(j.schedule.clone());
        }
        let r = self.registrations.iter().filter(|r| r.definition.job == job).max_by_key(|r| r.last_seen)?;
        Schedule::parse(&r.definition.schedule, &r.definition.timezone).ok()
    }

    fn zone(&self, job: &str) -> Tz {
        self.schedule(job).map_or(chrono_tz::UTC, |s| s.zone())
    }
}

#[derive(Args)]
pub struct StatusArgs {
    #[command(flatten)]
    target: Target,
    /// Only this job (shown in detail).
    job: Option<String>,
    /// A registration not confirmed for this long is stale.
    #[arg(long, default_value = "15m", value_parser = duration_arg)]
    stale_after: Duration,
    #[arg(long, value_enum, default_value_t = Format::Table)]
    format: Format,
}

fn duration_arg(s: &str) -> Result<Duration, String> {
    parse_duration(s).map_err(|e| e.to_string())
}

/// Everything `status` says about one job.
struct JobView {
    name: String,
    schedule: Option<Schedule>,
    next: Option<DateTime<Utc>>,
    control: Option<JobControl>,
    last: Option<RunRecord>,
    running: Vec<RunRecord>,
    nodes: Vec<Registration>,
    drift: bool,
    stale: bool,
}

async fn view(
    fleet: &Fleet,
    store: &dyn Store,
    job: &str,
    now: DateTime<Utc>,
    stale_after: Duration,
) -> Result<JobView, Failure> {
    let q = |state| HistoryQuery { job: Some(job.to_owned()), state, limit: 50, ..HistoryQuery::default() };
    let recent = store.history(&q(None)).await.map_err(store_failed)?;
    let running = store.history(&q(Some(RunState::Running))).await.map_err(store_failed)?;
    let last = recent.into_iter().find(|r| r.state.is_terminal() && r.state != RunState::Skipped);
    let nodes: Vec<Registration> = fleet.registrations.iter().filter(|r| r.definition.job == job).cloned().collect();
    let fresh_after = now - chrono::Duration::from_std(stale_after).unwrap_or_default();
    let live: Vec<&Registration> = nodes.iter().filter(|r| r.last_seen >= fresh_after).collect();
    let hashes: BTreeSet<&str> = live.iter().map(|r| r.definition.definition_hash.as_str()).collect();
    let schedule = fleet.schedule(job);
    Ok(JobView {
        name: job.to_owned(),
        next: schedule.as_ref().and_then(|s| s.next_after(now)),
        schedule,
        control: fleet.controls.iter().find(|c| c.job == job).cloned(),
        last,
        running,
        drift: hashes.len() > 1,
        stale: !nodes.is_empty() && live.is_empty(),
        nodes,
    })
}

pub async fn status(a: StatusArgs) -> Result<(), Failure> {
    let cfg = a.target.config()?;
    let store = a.target.connect_existing(cfg.as_ref()).await?;
    let fleet = Fleet::read(cfg, store.as_ref()).await?;
    let names: Vec<String> = match &a.job {
        Some(j) => {
            fleet.require(j)?;
            vec![j.clone()]
        }
        None => fleet.names().into_iter().collect(),
    };
    let now = store.now().await.map_err(store_failed)?;
    let mut views = Vec::new();
    for n in &names {
        views.push(view(&fleet, store.as_ref(), n, now, a.stale_after).await?);
    }
    match (a.format, a.job.is_some()) {
        (Format::Json, _) => print_json(&json!(views.iter().map(|v| view_json(v, now)).collect::<Vec<_>>())),
        (Format::Table, false) => print!("{}", status_table(&views, now)),
        (Format::Table, true) => print!("{}", status_detail(&views[0], now)),
    }
    Ok(())
}

fn view_json(v: &JobView, now: DateTime<Utc>) -> serde_json::Value {
    let t = |d: DateTime<Utc>| d.to_rfc3339_opts(SecondsFormat::Millis, true);
    json!({
        "job": v.name,
        "schedule": v.schedule.as_ref().map(|s| s.expr()),
        "timezone": v.schedule.as_ref().map(|s| s.zone().name()),
        "next_fire": v.next.map(t),
        "paused": v.control.as_ref().is_some_and(|c| c.paused),
        "paused_by": v.control.as_ref().filter(|c| c.paused).map(|c| c.changed_by.clone()),
        "pause_reason": v.control.as_ref().filter(|c| c.paused).and_then(|c| c.reason.clone()),
        "last_run": v.last.as_ref().map(output::run_json),
        "running": v.running.iter().map(output::run_json).collect::<Vec<_>>(),
        "drift": v.drift,
        "stale": v.stale,
        "nodes": v.nodes.iter().map(|r| json!({
            "node": r.node,
            "definition_hash": r.definition.definition_hash,
            "schedule": r.definition.schedule,
            "timezone": r.definition.timezone,
            "summary": r.definition.summary,
            "first_seen": t(r.first_seen),
            "last_seen": t(r.last_seen),
            "last_seen_ago_ms": (now - r.last_seen).num_milliseconds().max(0),
        })).collect::<Vec<_>>(),
    })
}

fn status_table(views: &[JobView], now: DateTime<Utc>) -> String {
    let header = ["JOB", "SCHEDULE", "ZONE", "NEXT FIRE", "PAUSED", "LAST RUN", "WHEN", "RUNNING", "NODES", "FLAGS"];
    let rows = views
        .iter()
        .map(|v| {
            let zone = v.schedule.as_ref().map_or(chrono_tz::UTC, |s| s.zone());
            let mut flags = Vec::new();
            if v.drift {
                flags.push("drift");
            }
            if v.stale {
                flags.push("stale");
            }
            vec![
                Cell::from(v.name.as_str()),
                v.schedule.as_ref().map_or("-".into(), |s| s.expr().to_owned()).into(),
                zone.name().into(),
                v.next.map_or("-".into(), |t| output::local_time(t, zone)).into(),
                if v.control.as_ref().is_some_and(|c| c.paused) {
                    Cell { text: "paused".into(), colour: Some("33") }
                } else {
                    "-".into()
                },
                v.last.as_ref().map_or("-".into(), |r| output::state_cell(r.state)),
                v.last
                    .as_ref()
                    .map_or("-".into(), |r| output::relative(r.finished_at.unwrap_or(r.claimed_at), now))
                    .into(),
                v.running.first().map_or("-".into(), |r| format!("on {}", r.node)).into(),
                v.nodes.len().to_string().into(),
                if flags.is_empty() { "-".into() } else { Cell { text: flags.join(","), colour: Some("31") } },
            ]
        })
        .collect();
    output::table(&header, rows, output::colour_enabled())
}

fn status_detail(v: &JobView, now: DateTime<Utc>) -> String {
    let zone = v.schedule.as_ref().map_or(chrono_tz::UTC, |s| s.zone());
    let mut out = format!("job        {}\n", v.name);
    if let Some(s) = &v.schedule {
        out += &format!("schedule   {}  ({})\n", s.expr(), s.zone());
    }
    if let Some(n) = v.next {
        out += &format!("next fire  {}  ({})\n", output::local_time(n, zone), output::relative(n, now));
    }
    match v.control.as_ref().filter(|c| c.paused) {
        Some(c) => {
            out += &format!(
                "paused     yes, by {} {}{}\n",
                c.changed_by,
                output::relative(c.changed_at, now),
                c.reason.as_ref().map(|r| format!(": {r}")).unwrap_or_default()
            )
        }
        None => out += "paused     no\n",
    }
    match &v.last {
        Some(r) => {
            out += &format!(
                "last run   {} on {}, took {}, {}  [{}]\n",
                r.state,
                r.node,
                r.duration().map_or("-".into(), format_duration),
                output::relative(r.finished_at.unwrap_or(r.claimed_at), now),
                r.id
            )
        }
        None => out += "last run   none\n",
    }
    for r in &v.running {
        let lease = r
            .lease_until
            .map_or("-".into(), |l| format!("{} ({})", output::local_time(l, zone), output::relative(l, now)));
        out += &format!(
            "running    {} held by {}, token {}, lease until {}\n",
            r.id,
            r.node,
            r.fencing_token.map_or("-".into(), |t| t.to_string()),
            lease
        );
    }
    out += &format!("drift      {}\n", if v.drift { "YES: nodes define this job differently" } else { "no" });
    if v.stale {
        out += "stale      yes: no node has confirmed this job recently\n";
    }
    for r in &v.nodes {
        out += &format!(
            "node       {}  seen {}  definition {}  {} [{}] {}\n",
            r.node,
            output::relative(r.last_seen, now),
            r.definition.definition_hash,
            r.definition.schedule,
            r.definition.timezone,
            r.definition.summary
        );
    }
    out
}

#[derive(Args)]
pub struct HistoryArgs {
    #[command(flatten)]
    target: Target,
    /// Only this job.
    #[arg(long)]
    job: Option<String>,
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
    /// At most this many records.
    #[arg(long, default_value_t = 50)]
    limit: usize,
    /// Show the captured output tail of this run (`job@instant#attempt`).
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

pub async fn history(a: HistoryArgs) -> Result<(), Failure> {
    let cfg = a.target.config()?;
    let store = a.target.connect_existing(cfg.as_ref()).await?;
    let fleet = Fleet::read(cfg, store.as_ref()).await?;
    if let Some(id) = &a.output {
        return show_output(store.as_ref(), id, a.format).await;
    }
    if let Some(j) = &a.job {
        fleet.require(j)?;
    }
    let state =
        a.state.as_deref().map(str::parse::<RunState>).transpose().map_err(|e| bad_input(format!("--state: {e}")))?;
    let now = store.now().await.map_err(store_failed)?;
    let since = a.since.as_deref().map(|s| instant_arg("--since", s, now)).transpose()?;
    let until = a.until.as_deref().map(|s| instant_arg("--until", s, now)).transpose()?;
    let query = HistoryQuery { job: a.job.clone(), state, node: a.node.clone(), since, until, limit: a.limit.max(1) };
    let runs = store.history(&query).await.map_err(store_failed)?;
    match a.format {
        Format::Json => print_json(&json!(runs.iter().map(output::run_json).collect::<Vec<_>>())),
        Format::Table => {
            let rows = runs.iter().map(|r| output::run_row(r, fleet.zone(&r.id.tick.job))).collect();
            print!("{}", output::table(&output::RUN_HEADER, rows, output::colour_enabled()));
        }
    }
    Ok(())
}

/// Parses `job@2026-01-01T00:00:00.000Z#1`.
fn parse_run_id(s: &str) -> Option<(String, DateTime<Utc>, u32)> {
    let (rest, attempt) = s.rsplit_once('#')?;
    let (job, at) = rest.split_once('@')?;
    Some((job.to_owned(), DateTime::parse_from_rfc3339(at).ok()?.with_timezone(&Utc), attempt.parse().ok()?))
}

async fn show_output(store: &dyn Store, id: &str, format: Format) -> Result<(), Failure> {
    let (job, at, attempt) = parse_run_id(id)
        .ok_or_else(|| bad_input(format!("--output: `{id}` is not a run id (job@RFC3339-instant#attempt)")))?;
    let q = HistoryQuery {
        job: Some(job),
        since: Some(at),
        until: Some(at + chrono::Duration::milliseconds(1)),
        limit: 1000,
        ..HistoryQuery::default()
    };
    let runs = store.history(&q).await.map_err(store_failed)?;
    let run = runs.into_iter().find(|r| r.id.attempt == attempt).ok_or_else(|| bad_input(format!("no run `{id}`")))?;
    match format {
        Format::Json => print_json(&output::run_json(&run)),
        Format::Table => {
            print!("{}{}", run.output, if run.output.ends_with('\n') || run.output.is_empty() { "" } else { "\n" })
        }
    }
    Ok(())
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
    /// With --wait: give up after this long.
    #[arg(long, default_value = "10m", value_parser = duration_arg)]
    timeout: Duration,
}

pub async fn trigger(a: TriggerArgs) -> Result<(), Failure> {
    let cfg = a.target.config()?;
    let store = a.target.connect(cfg.as_ref()).await?;
    let fleet = Fleet::read(cfg, store.as_ref()).await?;
    fleet.require(&a.job)?;
    if a.here {
        return trigger_here(&fleet, store, &a.job).await;
    }
    let tick = store.request_run(&a.job, &operator()).await.map_err(store_failed)?;
    let id = solocron_core::RunId { tick: tick.clone(), attempt: 1 };
    println!("requested {id}; a running node will pick it up within a second");
    if !a.wait {
        return Ok(());
    }
    let until = tokio::time::Instant::now() + a.timeout;
    loop {
        let q = HistoryQuery {
            job: Some(a.job.clone()),
            since: Some(tick.scheduled_at),
            until: Some(tick.scheduled_at + chrono::Duration::milliseconds(1)),
            limit: 100,
            ..HistoryQuery::default()
        };
        let runs = store.history(&q).await.map_err(store_failed)?;
        if let Some(r) = runs.iter().max_by_key(|r| r.id.attempt).filter(|r| r.state.is_terminal()) {
            return report(r);
        }
        if tokio::time::Instant::now() >= until {
            return Err(Failure(1, format!("{id}: not ended after {}", format_duration(a.timeout))));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn report(r: &RunRecord) -> Result<(), Failure> {
    println!("{} {} on {}{}", r.id, r.state, r.node, r.reason.as_ref().map(|x| format!(": {x}")).unwrap_or_default());
    if r.state == RunState::Succeeded {
        Ok(())
    } else {
        Err(Failure(1, format!("{} ended {}", r.id, r.state)))
    }
}

async fn trigger_here(fleet: &Fleet, store: Arc<dyn Store>, job: &str) -> Result<(), Failure> {
    let cfg = fleet.cfg.as_ref().ok_or_else(|| bad_input("--here needs the job's definition: give --config"))?;
    if !cfg.jobs.iter().any(|j| j.name == job) {
        return Err(bad_input(format!("--here: job `{job}` is not defined in {}", cfg.file)));
    }
    let scheduler = crate::daemon::scheduler(cfg, store, None)?;
    let interrupt = tokio_util::sync::CancellationToken::new();
    let on_ctrl_c = interrupt.clone();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            on_ctrl_c.cancel();
        }
    });
    match scheduler.run_here(job, &format!("{} (--here)", operator()), interrupt).await.map_err(store_failed)? {
        Some(r) => {
            print!("{}", r.output);
            report(&r)
        }
        None => {
            println!("a running node picked the request up first; it runs there");
            Ok(())
        }
    }
}

#[derive(Args)]
pub struct PauseArgs {
    #[command(flatten)]
    target: Target,
    /// The job.
    job: String,
    /// Why (recorded, and shown by status).
    #[arg(long)]
    reason: Option<String>,
}

pub async fn set_paused(a: PauseArgs, paused: bool) -> Result<(), Failure> {
    let cfg = a.target.config()?;
    let store = a.target.connect(cfg.as_ref()).await?;
    Fleet::read(cfg, store.as_ref()).await?.require(&a.job)?;
    store.set_paused(&a.job, paused, &operator(), a.reason.as_deref()).await.map_err(store_failed)?;
    println!("{} {} for the whole fleet", a.job, if paused { "paused" } else { "resumed" });
    Ok(())
}

#[derive(Args)]
pub struct UnlockArgs {
    #[command(flatten)]
    target: Target,
    /// The job whose running run to end.
    job: String,
    /// Why (recorded in the run's reason).
    #[arg(long, default_value = "no reason given")]
    reason: String,
    /// Do not ask for confirmation.
    #[arg(long, short)]
    yes: bool,
}

pub async fn unlock(a: UnlockArgs) -> Result<(), Failure> {
    let cfg = a.target.config()?;
    let store = a.target.connect(cfg.as_ref()).await?;
    Fleet::read(cfg, store.as_ref()).await?.require(&a.job)?;
    let q = HistoryQuery {
        job: Some(a.job.clone()),
        state: Some(RunState::Running),
        limit: 100,
        ..HistoryQuery::default()
    };
    let running = store.history(&q).await.map_err(store_failed)?;
    if running.is_empty() {
        println!("{}: no running run; nothing to unlock", a.job);
        return Ok(());
    }
    for r in &running {
        println!("running: {} held by {} (token {})", r.id, r.node, r.fencing_token.unwrap_or(0));
    }
    if !a.yes && !confirm(&format!("End {} run(s) of {} as abandoned?", running.len(), a.job))? {
        return Err(Failure(1, "not confirmed; nothing changed".into()));
    }
    let reason = format!("unlocked by {}: {}", operator(), a.reason);
    let ended = store.unlock(&a.job, &reason).await.map_err(store_failed)?;
    for id in &ended {
        println!("abandoned {id}");
    }
    Ok(())
}

fn confirm(question: &str) -> Result<bool, Failure> {
    if !std::io::stdin().is_terminal() {
        return Err(bad_input("refusing to unlock without confirmation: stdin is not a terminal; pass --yes"));
    }
    eprint!("{question} [y/N] ");
    let mut answer = String::new();
    std::io::stdin().read_line(&mut answer).map_err(|e| Failure(1, e.to_string()))?;
    Ok(matches!(answer.trim(), "y" | "Y" | "yes"))
}

#[derive(Args)]
pub struct PruneArgs {
    #[command(flatten)]
    target: Target,
    /// Delete ended runs of ticks scheduled longer ago than this.
    #[arg(long, default_value = "30d")]
    older_than: String,
}

pub async fn prune(a: PruneArgs) -> Result<(), Failure> {
    let older = parse_duration(&a.older_than).map_err(|e| bad_input(format!("--older-than: {e}")))?;
    let cfg = a.target.config()?;
    let floor = solocron_core::retention_floor(cfg.iter().flat_map(|c| c.jobs.iter().map(|j| &j.policy)));
    if older < floor {
        return Err(bad_input(format!(
            "--older-than {} is too short: a pruned tick could be claimed again by a node whose clock lags, or by a catch-up looking back; use at least {}",
            format_duration(older),
            format_duration(floor)
        )));
    }
    let store = a.target.connect(cfg.as_ref()).await?;
    let stop = tokio_util::sync::CancellationToken::new();
    let mut total = 0;
    loop {
        let n = solocron::prune_pass(store.as_ref(), older, &stop).await.map_err(store_failed)?;
        total += n;
        if n == 0 {
            break;
        }
    }
    println!("deleted {total} run record(s) older than {}", format_duration(older));
    Ok(())
}
