//! `solocron nodes`: every node heard from, its liveness by heartbeat.

use chrono::{DateTime, Utc};
use clap::Args;
use solocron_core::Liveness;
use solocron_fleet::NodeView;

use crate::output::{self, print_json, Cell};
use crate::wiring::Target;
use crate::{Failure, Format};

use super::{read_fleet, Silence};

/// `solocron nodes`'s arguments.
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
        // The API's objects (`GET /api/v1/nodes`), `liveness` by this command's --stale-after.
        Format::Json => {
            print_json(&solocron_fleet::Page::whole(nodes.into_iter().map(|n| a.silence.judged_node(n)).collect()))
        }
        Format::Table => output::emit(nodes_table(&nodes, a.silence, fleet.now())),
    }
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
