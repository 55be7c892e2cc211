//! `solocron-bench node`: one node of a benchmark fleet, run as its own process. It runs a
//! scheduler with `--jobs` identical jobs, then writes what it saw to `--report` as JSON.

use solocron_core::SchemaStore;
use std::io::Write as _;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::Utc;
use clap::Args;
use solocron::{handler_fn, Command, Job, RunContext, Scheduler};
use solocron_core::{JobPolicy, OnCrash, Overlap, Prefix, Schedule};
use tokio_util::sync::CancellationToken;

use crate::counting::Counting;

#[derive(Args, Clone)]
pub struct NodeArgs {
    #[arg(long)]
    pub store: String,
    /// The namespace of the run's tables or keys (see `solocron_core::Prefix`).
    #[arg(long)]
    pub prefix: Prefix,
    #[arg(long)]
    pub node_id: String,
    #[arg(long)]
    pub jobs: usize,
    #[arg(long)]
    pub schedule: String,
    /// Also a job on this schedule (`s0`, `s1`, … in order; repeated), beside the
    /// `--jobs`: how late a herd of those makes the node's other ticks.
    #[arg(long)]
    pub side_schedule: Vec<String>,
    /// handler | command | sleep
    #[arg(long, default_value = "handler")]
    pub mode: String,
    #[arg(long)]
    pub seconds: u64,
    #[arg(long, default_value_t = 30_000)]
    pub lease_ms: u64,
    #[arg(long, default_value = "skip")]
    pub overlap: Overlap,
    #[arg(long)]
    pub retry: bool,
    /// Print `START job attempt node` on stdout when a run starts (failover).
    #[arg(long)]
    pub announce: bool,
    /// Also append each start to this file as it happens (`job scheduled_ms start_us
    /// attempt` per line): what a node killed with SIGKILL started survives it, where its
    /// `--report` is never written.
    #[arg(long)]
    pub journal: Option<String>,
    #[arg(long)]
    pub report: String,
}

/// (job, scheduled instant in ms, start in µs, attempt) of each run started.
type Starts = Arc<Mutex<Vec<(String, i64, i64, u32)>>>;

/// Where each start is also written at once, when the node keeps a journal.
type Journal = Option<Arc<std::fs::File>>;

fn job(name: String, schedule: &str, a: &NodeArgs, starts: &Starts, journal: &Journal) -> anyhow::Result<Job> {
    let schedule = Schedule::parse(schedule, "UTC")?;
    let lease = Duration::from_millis(a.lease_ms);
    let policy = JobPolicy {
        lease,
        kill_grace: JobPolicy::default_kill_grace(lease),
        overlap: a.overlap,
        on_crash: if a.retry { OnCrash::Retry } else { OnCrash::Abandon },
        ..JobPolicy::default()
    };
    let job = match a.mode.as_str() {
        "command" => Job::new(name, schedule, Command::new(["/bin/date", "+%s%N"]).expect("argv")),
        mode => {
            let (starts, announce, sleep) = (starts.clone(), a.announce, mode == "sleep");
            let journal = journal.clone();
            Job::new(
                name,
                schedule,
                handler_fn(move |ctx: RunContext| {
                    let now = Utc::now();
                    let start =
                        (ctx.job.clone(), ctx.scheduled_at.timestamp_millis(), now.timestamp_micros(), ctx.attempt);
                    if let Some(file) = &journal {
                        // One write per line, unbuffered: a SIGKILL loses no start already made.
                        let line = format!("{} {} {} {}\n", start.0, start.1, start.2, start.3);
                        let _ = (&**file).write_all(line.as_bytes());
                    }
                    starts.lock().unwrap().push(start);
                    if announce {
                        println!("START {} {} {} {}", ctx.job, ctx.attempt, ctx.node_id, now.timestamp_millis());
                        let _ = std::io::stdout().flush();
                    }
                    async move {
                        if sleep {
                            ctx.cancel.cancelled().await;
                        }
                        Ok(())
                    }
                }),
            )
        }
    };
    Ok(job.with_policy(policy))
}

pub async fn run(a: NodeArgs) -> anyhow::Result<()> {
    // Several nodes create a fresh store at the same moment: retry briefly (bounded).
    let mut attempt = 0;
    let counting = loop {
        attempt += 1;
        let opened = match solocron_stores::open(&a.store, &a.prefix).await {
            Ok(store) => {
                let c = Arc::new(Counting::new(store));
                c.migrate().await.map(|_| c).map_err(anyhow::Error::from)
            }
            Err(e) => Err(anyhow::Error::from(e)),
        };
        match opened {
            Ok(c) => break c,
            Err(e) if attempt >= 20 => return Err(e),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    };
    let starts: Starts = Arc::default();
    let journal: Journal = match &a.journal {
        Some(path) => Some(Arc::new(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map_err(|e| anyhow::anyhow!("cannot open the journal {path}: {e}"))?,
        )),
        None => None,
    };
    // A herd of N simultaneous ticks needs room for N runs at once on one node.
    let mut b = Scheduler::builder(counting.clone())
        .node_id(a.node_id.clone())
        .shutdown_grace(Duration::from_secs(2))
        .max_concurrent_runs(a.jobs.max(1024));
    for i in 0..a.jobs {
        b = b.job(job(format!("j{i}"), &a.schedule, &a, &starts, &journal)?);
    }
    for (i, schedule) in a.side_schedule.iter().enumerate() {
        b = b.job(job(format!("s{i}"), schedule, &a, &starts, &journal)?);
    }
    let scheduler = b.build()?;
    let shutdown = CancellationToken::new();
    let stop = shutdown.clone();
    let seconds = a.seconds;
    tokio::spawn(async move {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate()).expect("handler");
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(seconds)) => {}
            _ = term.recv() => {}
        }
        stop.cancel();
    });
    scheduler.run(shutdown).await;
    let report = serde_json::json!({
        "node": a.node_id,
        "calls": counting.calls.load(Ordering::Relaxed),
        "claims": counting.claims.load(Ordering::Relaxed),
        "requests": counting.requests.load(Ordering::Relaxed),
        "rss_hwm_kb": rss_kb(std::process::id(), "VmHWM"),
        "starts": *starts.lock().unwrap(),
    });
    std::fs::write(&a.report, serde_json::to_vec(&report)?)?;
    Ok(())
}

/// A `/proc/PID/status` memory figure in KiB (VmHWM: peak RSS; VmRSS: now).
pub fn rss_kb(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}
