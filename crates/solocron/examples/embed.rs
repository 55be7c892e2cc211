//! Embedding solocron in a service: start this program in two or three terminals (they
//! share `embed.db`); every 2 seconds exactly one of them prints the tick.
//!
//! ```sh
//! cargo run -p solocron --example embed -- node-1
//! ```
//!
//! It needs nothing beyond `solocron`, a store crate and tokio.

#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use solocron::{handler_with_state, CancellationToken, Job, Prefix, RunContext, Schedule, Scheduler};
use solocron_sqlite::SqliteStore;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let node = std::env::args().nth(1).unwrap_or_else(|| "node-1".to_owned());
    let store = Arc::new(SqliteStore::connect("sqlite://embed.db", &Prefix::default()).await?);
    let runs_here = Arc::new(AtomicU64::new(0));
    let report = handler_with_state(runs_here, |runs: Arc<AtomicU64>, ctx: RunContext| async move {
        let n = runs.fetch_add(1, Ordering::Relaxed) + 1;
        println!("{} ran {} (token {}), {n} here so far", ctx.node_id, ctx.scheduled_at, ctx.fencing_token);
        Ok(())
    });
    let scheduler = Scheduler::builder(store)
        .node_id(node)
        .job(Job::new("report", Schedule::parse("*/2 * * * * *", "UTC")?, report))
        .build()?;
    let shutdown = CancellationToken::new();
    let stop = shutdown.clone();
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        stop.cancel();
    });
    scheduler.run(shutdown).await;
    Ok(())
}
