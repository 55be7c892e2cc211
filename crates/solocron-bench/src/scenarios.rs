//! The benchmark scenarios. Each returns a markdown section and fails on a duplicate run.
//!
//! What every scenario needs is here (the context, a node's arguments, the starts its
//! reports list, the exactly-once check); each scenario, or group, is a file of
//! `scenarios/`: `claim.rs` (1, claim overhead), `herd.rs` (2, thundering herd, and 6,
//! growth), `lateness.rs` (3), `idle.rs` (4), `failover.rs` (5). The API (7) and the spread
//! (8) are `api.rs` and `spread.rs` beside this file.

mod claim;
mod failover;
mod herd;
mod idle;
mod lateness;

use std::collections::HashMap;

use serde_json::Value;
use solocron_core::Prefix;

use crate::node::NodeArgs;
use crate::raw::cleanup;

pub use claim::claim_overhead;
pub use failover::failover;
pub use herd::{growth, parse_cell, thundering_herd};
pub use idle::idle;
pub use lateness::lateness;

/// What every scenario needs.
pub struct Ctx {
    pub store: String,
    pub dir: std::path::PathBuf,
    pub quick: bool,
    pub rounds: usize,
    /// The (jobs, nodes) cells `growth` measures; empty: all of them.
    pub cells: Vec<(usize, usize)>,
    /// The jobs' overlap policy on every node.
    pub overlap: solocron_core::Overlap,
}

/// A node of one job due every second for 10 s, with the run's overlap policy, reporting
/// to a file in the run's directory.
pub fn node_args(c: &Ctx, url: &str, prefix: &Prefix, id: &str) -> NodeArgs {
    NodeArgs {
        store: url.to_owned(),
        prefix: prefix.clone(),
        node_id: id.to_owned(),
        jobs: 1,
        schedule: "* * * * * *".into(),
        side_schedule: Vec::new(),
        mode: "handler".into(),
        seconds: 10,
        lease_ms: 30_000,
        overlap: c.overlap,
        retry: false,
        announce: false,
        journal: None,
        report: c.dir.join(format!("{id}-{prefix}.json")).display().to_string(),
    }
}

/// (job, scheduled ms, start µs, attempt) of every run every node started.
pub fn starts(reports: &[Value]) -> Vec<(String, i64, i64, u64)> {
    reports
        .iter()
        .flat_map(|r| r["starts"].as_array().cloned().unwrap_or_default())
        .map(|s| {
            (
                s[0].as_str().unwrap_or("").to_owned(),
                s[1].as_i64().unwrap_or(0),
                s[2].as_i64().unwrap_or(0),
                s[3].as_u64().unwrap_or(1),
            )
        })
        .collect()
}

/// Fails the benchmark if any (job, tick) started twice (first attempts only).
pub fn exactly_once(all: &[(String, i64, i64, u64)], what: &str) -> anyhow::Result<usize> {
    let mut seen: HashMap<(&str, i64), usize> = HashMap::new();
    for (j, t, _, a) in all.iter().filter(|s| s.3 == 1) {
        let _ = a;
        *seen.entry((j.as_str(), *t)).or_default() += 1;
    }
    let dups = seen.values().filter(|&&n| n > 1).count();
    anyhow::ensure!(dups == 0, "{what}: {dups} ticks ran more than once: exactly-once violated");
    Ok(seen.len())
}

/// Removes a round's tables or keys (from a thread: this may run inside the runtime).
fn clean(url: &str, prefix: &Prefix) {
    let rt = tokio::runtime::Handle::current();
    std::thread::scope(|s| s.spawn(|| rt.block_on(cleanup(url, prefix))).join()).ok();
}
