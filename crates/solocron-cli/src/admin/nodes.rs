//! `solocron nodes`: every node heard from, its liveness by heartbeat.

use chrono::{DateTime, Utc};
use clap::Args;
use serde_json::json;
use solocron_core::Liveness;
use solocron_fleet::NodeView;

use crate::output::{self, print_json, Cell};
use crate::wiring::Target;
use crate::{Failure, Format};

use super::{read_fleet, Silence};

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

pub(super) fn nodes_table(nodes: &[NodeView], silence: Silence, now: DateTime<Utc>) -> String {
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
