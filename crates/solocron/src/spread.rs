//! Spreading a fleet's ticks over its nodes (issue 23). Without it, the first node to wake
//! claims a whole instant in one batch and wins it; the others only lose, and adding nodes
//! adds nothing but losing claims.
//!
//! Every node ranks, for each tick, the live nodes that carry the tick's job by rendezvous
//! hashing (highest random weight: a hash of the node and the tick), and claims the ticks
//! it ranks first at the claim lead, as before. The others it claims [`BACKUP_AFTER`] past
//! their instant: by then their first-ranked node has won them (the backup finds them
//! taken), unless that node is slow, stalled or gone, and then the backup wins. So the
//! store's claim still decides every tick (nothing here decides who may run one), and a
//! wrong view of the fleet costs lateness, never a duplicate or a miss.
//!
//! The view: live nodes from the heartbeats (read with each of this node's beats), and
//! which nodes carry which jobs from the registry (read whenever this node registers; a
//! node registers its whole list). A live node the registry does not know yet (it started
//! after the read) is taken to carry every job; one it knows is ranked only for the jobs
//! it registered. This node always ranks itself. Nodes agree on the ranking as far as
//! their views agree; when they do not (a node just joined, or changed its jobs), two may
//! claim a tick at the lead, as every node did before.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use solocron_core::{Registration, Tick};

/// How long after its instant this node claims a tick ranked to another node: longer than
/// a punctual node's claim takes, short enough that a tick whose first node died runs
/// nearly on time.
pub(crate) const BACKUP_AFTER: Duration = Duration::from_millis(100);
/// Most jobs whose carriers are remembered (the registry of a large fleet); jobs beyond
/// are ranked among all live nodes.
const JOBS_REMEMBERED_MAX: usize = 100_000;

/// This node's view of the fleet: live nodes by their heartbeats, and the nodes that
/// registered each job.
#[derive(Debug)]
pub(crate) struct Spread {
    node: String,
    alive: RwLock<Arc<HashSet<String>>>,
    carriers: RwLock<Arc<Carriers>>,
}

/// Who carries which jobs, by the registry.
#[derive(Debug, Default)]
struct Carriers {
    /// The nodes that registered each job.
    by_job: HashMap<String, Vec<String>>,
    /// Every node the registry lists.
    known: HashSet<String>,
}

/// The view at one instant: ranks a round's ticks without locking per tick.
#[derive(Debug)]
pub(crate) struct Ranking<'a> {
    node: &'a str,
    alive: Arc<HashSet<String>>,
    carriers: Arc<Carriers>,
}

impl Spread {
    /// A node that knows nothing of the fleet yet: every tick is its own until it does.
    pub(crate) fn new(node: &str) -> Spread {
        Spread { node: node.to_owned(), alive: RwLock::default(), carriers: RwLock::default() }
    }

    /// The view now, to rank a round's ticks with.
    pub(crate) fn ranking(&self) -> Ranking<'_> {
        Ranking {
            node: &self.node,
            alive: self.alive.read().expect("not poisoned").clone(),
            carriers: self.carriers.read().expect("not poisoned").clone(),
        }
    }

    /// Takes the live nodes, as the heartbeats say now.
    pub(crate) fn set_alive(&self, alive: impl IntoIterator<Item = String>) {
        *self.alive.write().expect("not poisoned") = Arc::new(alive.into_iter().collect());
    }

    /// Takes which nodes carry which jobs, as the registry says now.
    pub(crate) fn set_carriers(&self, registrations: &[Registration]) {
        let mut carriers = Carriers::default();
        for r in registrations {
            if carriers.by_job.len() >= JOBS_REMEMBERED_MAX && !carriers.by_job.contains_key(&r.definition.job) {
                // Beyond the bound, the node is not known either: taken to carry every job.
                continue;
            }
            carriers.by_job.entry(r.definition.job.clone()).or_default().push(r.node.clone());
            carriers.known.insert(r.node.clone());
        }
        *self.carriers.write().expect("not poisoned") = Arc::new(carriers);
    }
}

impl Ranking<'_> {
    /// Whether this node ranks first for `tick` among the live nodes carrying its job.
    pub(crate) fn is_first(&self, tick: &Tick) -> bool {
        self.alive.len() <= 1 || self.first(tick) == Some(self.node)
    }

    /// The node ranked first for `tick`: the heaviest of this node and the live nodes
    /// carrying its job (ties go to the smaller name, so every node breaks them alike).
    fn first(&self, tick: &Tick) -> Option<&str> {
        let carriers = self.carriers.by_job.get(&tick.job);
        let carries = |n: &str| !self.carriers.known.contains(n) || carriers.is_some_and(|c| c.iter().any(|m| m == n));
        let others = self.alive.iter().map(String::as_str).filter(|n| *n != self.node && carries(n));
        std::iter::once(self.node).chain(others).max_by(|a, b| weight(a, tick).cmp(&weight(b, tick)).then(b.cmp(a)))
    }
}

/// The rendezvous weight of `node` for `tick`: the same on every node.
fn weight(node: &str, tick: &Tick) -> u64 {
    let instant = tick.scheduled_at.timestamp_millis().to_le_bytes();
    solocron_core::stable_hash(node.bytes().chain([0xff]).chain(tick.job.bytes()).chain(instant))
}

#[cfg(test)]
mod tests {
    use chrono::{DateTime, Utc};
    use solocron_core::JobDefinition;

    use super::*;

    const NODES: [&str; 3] = ["n1", "n2", "n3"];

    fn tick(job: &str, secs: i64) -> Tick {
        Tick::new(job, DateTime::<Utc>::from_timestamp(1_700_000_000 + secs, 0).expect("in range"))
    }

    fn node(id: &str, alive: &[&str]) -> Spread {
        let s = Spread::new(id);
        s.set_alive(alive.iter().map(|n| (*n).to_owned()));
        s
    }

    fn registration(job: &str, node: &str) -> Registration {
        let at = DateTime::<Utc>::from_timestamp(0, 0).expect("in range");
        Registration {
            node: node.into(),
            definition: JobDefinition {
                job: job.into(),
                schedule: "* * * * * *".into(),
                timezone: "UTC".into(),
                definition_hash: "h".into(),
                summary: String::new(),
            },
            first_seen: at,
            last_seen: at,
        }
    }

    /// How many ticks each of `nodes` ranks itself first for, over `ticks`; asserts that
    /// exactly one does for each tick.
    fn firsts(nodes: &[Spread], ticks: &[Tick]) -> Vec<usize> {
        let rankings: Vec<_> = nodes.iter().map(Spread::ranking).collect();
        let mut counts = vec![0; nodes.len()];
        for t in ticks {
            let first: Vec<usize> = (0..nodes.len()).filter(|&i| rankings[i].is_first(t)).collect();
            assert_eq!(first.len(), 1, "{t:?}: nodes {first:?} rank themselves first");
            counts[first[0]] += 1;
        }
        counts
    }

    #[test]
    fn a_node_that_knows_no_fleet_claims_every_tick_first() {
        let alone = Spread::new("n1");
        assert!(alone.ranking().is_first(&tick("job", 0)));
        let only_me = node("n1", &["n1"]);
        assert!((0..100).all(|s| only_me.ranking().is_first(&tick("job", s))));
    }

    #[test]
    fn live_nodes_with_one_view_each_rank_a_third_of_the_ticks_first_and_exactly_one_per_tick() {
        let nodes: Vec<Spread> = NODES.iter().map(|id| node(id, &NODES)).collect();
        let ticks: Vec<Tick> = (0..1000).flat_map(|j| (0..3).map(move |s| tick(&format!("job-{j}"), s))).collect();
        let counts = firsts(&nodes, &ticks);
        for c in &counts {
            let share = *c as f64 / ticks.len() as f64;
            assert!((0.30..0.37).contains(&share), "shares {counts:?}");
        }
    }

    #[test]
    fn a_dead_nodes_ticks_go_to_the_live_ones_and_a_job_to_the_nodes_that_carry_it() {
        let survivors = ["n1", "n2"];
        let nodes: Vec<Spread> = survivors.iter().map(|id| node(id, &survivors)).collect();
        let ticks: Vec<Tick> = (0..600).map(|s| tick("job", s)).collect();
        let counts = firsts(&nodes, &ticks);
        assert!(counts.iter().all(|c| *c > 200), "n3 is dead: its share goes to both survivors: {counts:?}");

        // `narrow` is carried by n2 and n3 only: they never leave one of its ticks to n1,
        // though n1 is alive (n1, without the job, never asks for its ticks).
        // n4 is alive and not in the registry yet: taken to carry every job, so n2 and n3
        // share `narrow` with it.
        let regs = [registration("narrow", "n2"), registration("narrow", "n3"), registration("wide", "n1")];
        let fleet = ["n1", "n2", "n3", "n4"];
        let nodes: Vec<Spread> = fleet.iter().map(|id| node(id, &fleet)).collect();
        nodes.iter().for_each(|n| n.set_carriers(&regs));
        let narrow: Vec<Tick> = (0..900).map(|s| tick("narrow", s)).collect();
        let counts = firsts(&nodes[1..], &narrow);
        assert!(counts.iter().all(|c| *c > 250), "n2, n3 and n4 share it: {counts:?}");
    }
}
