//! `solocron-bench`: what solocron costs — claim overhead against the raw store, start
//! lateness, thundering herds, idle cost, failover, growth, the HTTP API and the spread of
//! ticks over a fleet — for one store per run.
//!
//! ```text
//! cargo run --release -p solocron-bench -- --store postgres://postgres@127.0.0.1:5432/test all
//! cargo run -p solocron-bench -- --store sqlite:///tmp/b.db --quick all   # CI smoke: < 1 min
//! ```
//! Prints markdown tables and (unless `--quick`) writes them, with the machine's description,
//! to a new file `benchmarks/<UTC date>-<store>-<commit>.md`, whose path it prints.
//! BENCHMARKS.md summarizes those files. Every scenario verifies exactly-once and fails on a
//! duplicate.
#![forbid(unsafe_code)]

mod api;
mod counting;
mod cpu;
mod fleet;
mod floor;
mod node;
mod raw;
mod report;
mod scenarios;
mod spread;
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
    /// Smoke mode (CI): small sizes, short runs; results go to stdout only, no file is written.
    #[arg(long)]
    quick: bool,
    /// Rounds per scenario (figures are medians with min and max).
    #[arg(long)]
    rounds: Option<usize>,
    /// Only these cells of `growth`, as JOBSxNODES, comma-separated (e.g. `100000x3,10000x10`)
    /// [default: every cell].
    #[arg(long, value_delimiter = ',', value_parser = scenarios::parse_cell)]
    cells: Vec<(usize, usize)>,
    /// The directory each run's new file goes to [default: `benchmarks/` of this workspace].
    #[arg(long)]
    out_dir: Option<std::path::PathBuf>,
    /// The jobs' overlap policy on the benchmark's nodes: `skip`, the product's default
    /// (each claim also looks for a running run of its job), or `allow` (no such look).
    #[arg(long, default_value = "skip")]
    overlap: solocron_core::Overlap,
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
    Api,
    Spread,
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
        cells: cli.cells.clone(),
        overlap: cli.overlap,
    };
    let wanted =
        |s: Scenario| cli.scenarios.is_empty() || cli.scenarios.contains(&Scenario::All) || cli.scenarios.contains(&s);
    let began = chrono::Utc::now();
    let started = std::time::Instant::now();
    let mut sections = vec![];
    if wanted(Scenario::Claim) {
        sections.push(rt.block_on(scenarios::claim_overhead(&c))?);
        println!("{}\n", sections.last().unwrap());
    }
    type Run = fn(&scenarios::Ctx) -> anyhow::Result<String>;
    let rest: [(Scenario, Run); 7] = [
        (Scenario::Herd, scenarios::thundering_herd),
        (Scenario::Lateness, scenarios::lateness),
        (Scenario::Idle, scenarios::idle),
        (Scenario::Failover, scenarios::failover),
        (Scenario::Growth, scenarios::growth),
        (Scenario::Api, api::api),
        (Scenario::Spread, spread::spread),
    ];
    for (s, run) in rest {
        if wanted(s) {
            sections.push(run(&c)?);
            println!("{}\n", sections.last().unwrap());
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    println!("benchmark finished in {:.0} s; exactly once held in every scenario", started.elapsed().as_secs_f64());
    if cli.quick {
        println!("quick run: no file written (the figures of a smoke run are not measurements)");
        return Ok(());
    }
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    let run = report::Run { store: &cli.store, command: &command, began, sections: &sections };
    let path = report::write(&cli.out_dir.unwrap_or_else(report::default_dir), &run)?;
    println!("results written to {}", path.display());
    Ok(())
}

fn tempfile_dir() -> anyhow::Result<std::path::PathBuf> {
    let d = std::env::temp_dir().join(format!("solocron-bench-{}", std::process::id()));
    std::fs::create_dir_all(&d)?;
    Ok(d)
}
