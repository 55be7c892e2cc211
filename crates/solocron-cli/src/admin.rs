//! The admin commands. They read and act through `solocron-fleet`, as the HTTP API does, so
//! the CLI and the API give the same answers (`--format json` prints the fleet's views, the
//! very objects the API serves) and every action lands in the store's audit log; they talk
//! to the store directly, so no daemon needs to run.

mod act;
mod history;
mod nodes;
mod prune;
mod status;

use std::time::Duration;

use clap::Args;
use solocron_core::{format_duration, parse_duration, Liveness, Store, HEARTBEAT_EVERY, NODE_STALE_AFTER};
use solocron_fleet::{Actor, Fleet, JobSummary, NodeView};

pub use act::{set_paused, trigger, unlock, PauseArgs, TriggerArgs, UnlockArgs};
pub use history::{history, HistoryArgs};
pub use nodes::{nodes, NodesArgs};
pub use prune::{prune, PruneArgs};
pub use status::{status, StatusArgs};

use crate::config::Config;
use crate::wiring::operator;
use crate::Failure;

fn actor(reason: Option<String>) -> Actor {
    Actor { by: operator(), reason }
}

/// The fleet as the store and this command's configuration know it.
async fn read_fleet(cfg: Option<&Config>, store: &dyn Store) -> Result<Fleet, Failure> {
    Ok(Fleet::read(store, crate::wiring::declared(cfg)).await?)
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

    /// `job` as the fleet shows it, its `stale` by this threshold.
    fn judged_job(&self, mut job: JobSummary, nodes: &[NodeView]) -> JobSummary {
        job.stale = self.job_stale(&job, nodes);
        job
    }

    /// `node` as the fleet shows it, its `liveness` by this threshold.
    fn judged_node(&self, mut node: NodeView) -> NodeView {
        node.liveness = self.liveness(&node).to_string();
        node
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
