//! `solocron-bench`: what solocron costs — claim overhead against the raw store, start
//! lateness, thundering herds, idle cost, failover and growth — for one store per run.
//!
//! ```text
//! cargo run --release -p solocron-bench -- --store postgres://postgres@127.0.0.1:5432/test all
//! cargo run -p solocron-bench -- --store sqlite:///tmp/b.db --quick all   # CI smoke: < 1 min
//! ```
//! Prints markdown tables and (unless `--quick`) appends a dated section with the machine's
//! description to BENCHMARKS.md. Every scenario verifies exactly-once and fails on a duplicate.

mod counting;
mod fleet;
mod floor;
mod node;
mod raw;
mod scenarios;
mod stats;

use clap::{Parser, Subcommand, ValueEnum};

#[derive(Parser)]
#[command(name = "solocron-bench")]
struct Cli {
    #[command(subcommand)]
    cmd: Option<Cmd>,
    /// The store to measure (a SQLite URL's file is made fresh per scenario, beside it).
    #[arg(long, default_value = "sqlite:///tmp/solocron-bench.db")]
    store: String,
    /// Smoke mode: small sizes, short runs, nothing written to BENCHMARKS.md.
    #[arg(long)]
    quick: bool,
    /// Rounds per scenario (figures are medians with min and max).
    #[arg(long)]
    rounds: Option<usize>,
    /// Where to append results.
    #[arg(long, default_value = "BENCHMARKS.md")]
    out: String,
    /// Scenarios to run.
    #[arg(value_enum)]
    scenarios: Vec<Scenario>,
}

#[derive(Subcommand)]
enum Cmd {
    /// (internal) one benchmark node.
    Node(node::NodeArgs),
}

#[derive(Clone, Copy, ValueEnum, PartialEq)]
enum Scenario {
    All,
    Claim,
    Herd,
    Lateness,
    Idle,
    Failover,
    Growth,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let rt = tokio::runtime::Runtime::new()?;
    if let Some(Cmd::Node(a)) = cli.cmd {
        return rt.block_on(node::run(a));
    }
    let _guard = rt.enter();
    let dir = tempfile_dir()?;
    let c = scenarios::Ctx {
        store: cli.store.clone(),
        dir: dir.clone(),
        quick: cli.quick,
        rounds: cli.rounds.unwrap_or(if cli.quick { 1 } else { 3 }),
    };
    let wanted =
        |s: Scenario| cli.scenarios.is_empty() || cli.scenarios.contains(&Scenario::All) || cli.scenarios.contains(&s);
    let started = std::time::Instant::now();
    let mut sections = vec![];
    if wanted(Scenario::Claim) {
        sections.push(rt.block_on(scenarios::claim_overhead(&c))?);
        println!("{}\n", sections.last().unwrap());
    }
    type Run = fn(&scenarios::Ctx) -> anyhow::Result<String>;
    let rest: [(Scenario, Run); 5] = [
        (Scenario::Herd, scenarios::thundering_herd),
        (Scenario::Lateness, scenarios::lateness),
        (Scenario::Idle, scenarios::idle),
        (Scenario::Failover, scenarios::failover),
        (Scenario::Growth, scenarios::growth),
    ];
    for (s, run) in rest {
        if wanted(s) {
            sections.push(run(&c)?);
            println!("{}\n", sections.last().unwrap());
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    println!("benchmark finished in {:.0} s; exactly once held in every scenario", started.elapsed().as_secs_f64());
    if !cli.quick {
        append(&cli.out, &cli.store, &std::env::args().collect::<Vec<_>>().join(" "), &sections)?;
    }
    Ok(())
}

fn tempfile_dir() -> anyhow::Result<std::path::PathBuf> {
    let d = std::env::temp_dir().join(format!("solocron-bench-{}", std::process::id()));
    std::fs::create_dir_all(&d)?;
    Ok(d)
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("model name")).map(|l| l.split(':').nth(1).unwrap_or("").trim().to_owned())
        })
        .unwrap_or_default();
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .next()
                .map(|l| l.split_whitespace().nth(1).unwrap_or("0").parse::<u64>().unwrap_or(0) / 1024 / 1024)
        })
        .unwrap_or(0);
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    format!("{cores} cores ({cpu}), {mem} GiB, store on the same host (loopback)")
}

fn append(out: &str, store: &str, command: &str, sections: &[String]) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut f = std::fs::OpenOptions::new().create(true).append(true).open(out)?;
    let store = solocron_stores::mask_url(store);
    writeln!(f, "\n## {} — {store}\n", chrono::Utc::now().format("%Y-%m-%d %H:%M UTC"))?;
    writeln!(f, "Machine: {}. Command: `{command}`\n", machine())?;
    for s in sections {
        writeln!(f, "{s}\n")?;
    }
    Ok(())
}
