//! Spreading a fleet's ticks over its nodes (issue 23). Without it, the first node to wake
//! claims a whole instant in one batch and wins it; the others only lose, and adding nodes
//! adds nothing but losing claims.
//!
//! Every node ranks, for each tick, the live nodes that carry the tick's job by rendezvous
//! hashing (highest random weight: a hash of the node and the tick), and claims the ticks
//! it ranks first at the claim lead, as before. The others it claims [`BACKUP_AFTER`] past
//! their instant (after a herd, once its own claims are done and half as long again:
//! [`backup_wait`]), off the timer loop (`backups.rs`): by then their first-ranked node has won them (the backup finds them
//! taken; it asks the store which are taken first and claims only the others), unless that
//! node is slow, stalled or gone, and then the backup wins. So the
//! store's claim still decides every tick (nothing here decides who may run one), and a
//! wrong view of the fleet costs lateness, never a duplicate or a miss.
//!
//! The view: live nodes from the heartbeats (read with each of this node's beats), and
//! which nodes carry which jobs from the registry (read whenever this node registers; a
//! node registers its whole list). A live node the registry does not know yet (it started
//! after the read) is taken to carry every job, and so is one seen with fewer
//! registrations than its heartbeat says it carries (the read, a page at a time, crossed
//! its registration; or it added jobs since); one it knows is ranked only for the jobs it
//! registered. This node always ranks itself. Nodes agree on the ranking as far as
//! their views agree; when they do not (a node just joined, or changed its jobs), two may
//! claim a tick at the lead, as every node did before.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use solocron_core::Tick;

/// How long after its instant this node claims a tick ranked to another node: longer than
/// a punctual node's claim takes, short enough that a tick whose first node died runs
/// nearly on time.
pub(crate) const BACKUP_AFTER: Duration = Duration::from_millis(100);
/// Most a node waits, past [`BACKUP_AFTER`], for the others to finish claiming a herd
/// (see [`backup_wait`]).
const BACKUP_HERD_WAIT_MAX: Duration = Duration::from_secs(2);

/// How long this node waits, from the end of its own claims of a round, before it claims
/// that round's backups whose earliest instant is `until_after` away (zero if past): at
/// least [`BACKUP_AFTER`] past that instant, and at least half as long as its own claims
/// took (`own_claim`), up to [`BACKUP_HERD_WAIT_MAX`]. Every node claims its share of a
/// herd at the same lead and the shares are alike, so the others' claims take about as
/// long as this node's: asking the store which ticks are taken while they are still being
/// claimed (100,000 at once take seconds) finds most of them free, and the backups then
/// contend with their owners for the same ticks, slowing the herd they back up.
pub(crate) fn backup_wait(until_after: Duration, own_claim: Duration) -> Duration {
    until_after.max((own_claim / 2).min(BACKUP_HERD_WAIT_MAX))
}
/// Most jobs whose carriers are remembered (the registry of a large fleet); jobs beyond
/// are ranked among the live nodes the registry does not know.
const JOBS_REMEMBERED_MAX: usize = 100_000;
/// Most nodes that carry this node's jobs whose carried jobs are remembered: a job's
/// carriers are a bit set over them. A node beyond is taken to carry every job, like a node
/// the registry does not list yet.
const CARRIERS_REMEMBERED_MAX: usize = 64;

/// This node's view of the fleet: live nodes by their heartbeats, and the nodes that
/// registered each job.
#[derive(Debug)]
pub(crate) struct Spread {
    node: String,
    /// Live nodes, and how many jobs each carries by its heartbeat.
    alive: RwLock<Arc<HashMap<String, u32>>>,
    carriers: RwLock<Arc<Carriers>>,
}

/// Who carries which of this node's jobs, by the registry: built a page of the registry at
/// a time ([`Carriers::add`]), then handed to [`Spread::set_carriers`].
///
/// Only this node's jobs are ever ranked here, so only theirs are remembered, each as a
/// stable hash of its name and a bit set of its carriers (16 bytes a job, where names and
/// lists of node names were over a hundred). Two of 100,000 names share a hash with a
/// chance under 10^-9; they would then share carriers, which costs lateness, never a
/// duplicate run (the store's claim decides).
#[derive(Debug, Default)]
pub(crate) struct Carriers {
    /// Every node the registry lists: its place in the bit sets, and how many
    /// registrations of it were read.
    nodes: HashMap<String, (Place, u32)>,
    /// Places given so far.
    places: usize,
    /// The carriers of each of this node's jobs, by the hash of its name ([`job_key`]).
    by_job: HashMap<u64, u64>,
}

/// What the registry says of a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    /// It carries none of this node's jobs.
    Listed,
    /// It carries some: this bit of a job's set says whether it carries that one.
    Bit(u8),
    /// It carries some, but past [`CARRIERS_REMEMBERED_MAX`]: taken to carry every job.
    Unranked,
}

impl Carriers {
    /// Notes that the registry lists `node`'s registration of `job`; `mine`: this node
    /// carries the job too.
    pub(crate) fn add(&mut self, job: &str, node: &str, mine: bool) {
        let key = job_key(job);
        if mine && self.by_job.len() >= JOBS_REMEMBERED_MAX && !self.by_job.contains_key(&key) {
            // Beyond the bound, the node is not known by this registration either.
            return;
        }
        if !self.nodes.contains_key(node) {
            self.nodes.insert(node.to_owned(), (Place::Listed, 0));
        }
        let (place, read) = self.nodes.get_mut(node).expect("inserted above");
        *read = read.saturating_add(1);
        if !mine {
            return;
        }
        let bit = match *place {
            Place::Bit(bit) => bit,
            Place::Unranked => return,
            Place::Listed if self.places < CARRIERS_REMEMBERED_MAX => {
                let bit = u8::try_from(self.places).expect("below 64");
                self.places += 1;
                *place = Place::Bit(bit);
                bit
            }
            Place::Listed => {
                *place = Place::Unranked;
                return;
            }
        };
        *self.by_job.entry(key).or_default() |= 1 << bit;
    }

    /// Whether `node`, which carries `jobs` jobs by its heartbeat, carries the job whose
    /// carriers are `carried` (its `by_job` bits).
    fn carries(&self, node: &str, jobs: u32, carried: u64) -> bool {
        match self.nodes.get(node) {
            None | Some((Place::Unranked, _)) => true,
            Some((_, read)) if *read < jobs => true,
            Some((Place::Listed, _)) => false,
            Some((Place::Bit(bit), _)) => carried & (1 << bit) != 0,
        }
    }
}

/// The key of a job's carriers: a hash of its name.
fn job_key(job: &str) -> u64 {
    solocron_core::stable_hash(job.bytes())
}

/// The view at one instant: ranks a round's ticks without locking per tick.
#[derive(Debug)]
pub(crate) struct Ranking<'a> {
    node: &'a str,
    alive: Arc<HashMap<String, u32>>,
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

    /// Takes the live nodes and how many jobs each carries, as the heartbeats say now.
    pub(crate) fn set_alive(&self, alive: impl IntoIterator<Item = (String, u32)>) {
        *self.alive.write().expect("not poisoned") = Arc::new(alive.into_iter().collect());
    }

    /// Takes which nodes carry which jobs, as the registry says now.
    pub(crate) fn set_carriers(&self, mut carriers: Carriers) {
        carriers.by_job.shrink_to_fit();
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
        let carried = self.carriers.by_job.get(&job_key(&tick.job)).copied().unwrap_or(0);
        let others = self
            .alive
            .iter()
            .filter(|(n, jobs)| *n != self.node && self.carriers.carries(n, **jobs, carried))
            .map(|(n, _)| n.as_str());
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

    use super::*;

    const NODES: [&str; 3] = ["n1", "n2", "n3"];

    fn tick(job: &str, secs: i64) -> Tick {
        Tick::new(job, DateTime::<Utc>::from_timestamp(1_700_000_000 + secs, 0).expect("in range"))
    }

    fn node(id: &str, alive: &[&str]) -> Spread {
        let s = Spread::new(id);
        s.set_alive(alive.iter().map(|n| ((*n).to_owned(), 0)));
        s
    }

    /// What a node that carries `mine` learns from a registry of `(job, node)` pairs.
    fn carriers(registry: &[(&str, &str)], mine: &[&str]) -> Carriers {
        let mut c = Carriers::default();
        for (job, node) in registry {
            c.add(job, node, mine.contains(job));
        }
        c
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
        let registry = [("narrow", "n2"), ("narrow", "n3"), ("wide", "n1")];
        let fleet = ["n1", "n2", "n3", "n4"];
        let mine: [&[&str]; 4] = [&["wide"], &["narrow"], &["narrow"], &["narrow", "wide"]];
        let nodes: Vec<Spread> = fleet.iter().map(|id| node(id, &fleet)).collect();
        nodes.iter().zip(mine).for_each(|(n, mine)| n.set_carriers(carriers(&registry, mine)));
        let narrow: Vec<Tick> = (0..900).map(|s| tick("narrow", s)).collect();
        let counts = firsts(&nodes[1..], &narrow);
        assert!(counts.iter().all(|c| *c > 250), "n2, n3 and n4 share it: {counts:?}");
    }

    #[test]
    fn a_node_read_with_fewer_registrations_than_its_heartbeat_says_is_ranked_for_every_job() {
        // n1 read the registry while n2 registered: it saw n2's "a" only, though n2's
        // heartbeat says it carries 2 jobs. n3 read it whole. Both rank n2 alike.
        let jobs = |n1: u32, n2: u32, n3: u32| [("n1".to_owned(), n1), ("n2".to_owned(), n2), ("n3".to_owned(), n3)];
        let whole = [("a", "n1"), ("a", "n2"), ("a", "n3"), ("b", "n1"), ("b", "n2"), ("b", "n3")];
        let partial = [("a", "n1"), ("a", "n2"), ("a", "n3"), ("b", "n1"), ("b", "n3")];
        let (n1, n3) = (Spread::new("n1"), Spread::new("n3"));
        n1.set_carriers(carriers(&partial, &["a", "b"]));
        n3.set_carriers(carriers(&whole, &["a", "b"]));
        for n in [&n1, &n3] {
            n.set_alive(jobs(2, 2, 2));
        }
        let (r1, r3) = (n1.ranking(), n3.ranking());
        let ticks: Vec<Tick> = (0..300).map(|s| tick("b", s)).collect();
        assert!(ticks.iter().all(|t| r1.first(t) == r3.first(t)), "one ranking of b's ticks");
        assert!(ticks.iter().any(|t| r1.first(t) == Some("n2")), "n2 ranks first for some of b's ticks");
        // Had n2's heartbeat said 1 job, n1 would leave n2 out of b's ranking.
        n1.set_alive(jobs(2, 1, 2));
        assert!(ticks.iter().all(|t| n1.ranking().first(t) != Some("n2")));
    }

    #[test]
    fn the_ranking_does_not_depend_on_the_order_the_registry_was_read_in() {
        // Redis pages come in no order, SQL ones by job, etcd ones by node.
        let registry: Vec<(String, String)> = (0..50)
            .flat_map(|j| NODES.iter().skip(j % 2).map(move |n| (format!("job-{j}"), (*n).to_owned())))
            .collect();
        let pairs: Vec<(&str, &str)> = registry.iter().map(|(j, n)| (j.as_str(), n.as_str())).collect();
        let reversed: Vec<(&str, &str)> = pairs.iter().rev().copied().collect();
        let mine: Vec<&str> = pairs.iter().map(|(j, _)| *j).collect();
        let (a, b) = (node("n2", &NODES), node("n2", &NODES));
        a.set_carriers(carriers(&pairs, &mine));
        b.set_carriers(carriers(&reversed, &mine));
        let (a, b) = (a.ranking(), b.ranking());
        let ticks: Vec<Tick> = (0..50).flat_map(|j| (0..20).map(move |s| tick(&format!("job-{j}"), s))).collect();
        assert!(ticks.iter().all(|t| a.is_first(t) == b.is_first(t)));
        // n1 carries only the even jobs: never first for an odd one.
        let odd: Vec<Tick> = ticks
            .iter()
            .filter(|t| t.job.trim_start_matches("job-").parse::<u32>().unwrap() % 2 == 1)
            .cloned()
            .collect();
        assert!(odd.iter().all(|t| a.first(t) != Some("n1")));
    }

    #[test]
    fn a_carrier_past_the_remembered_bound_is_taken_to_carry_every_job() {
        let names: Vec<String> = (0..CARRIERS_REMEMBERED_MAX + 2).map(|i| format!("m{i:03}")).collect();
        let mut registry: Vec<(&str, &str)> = names.iter().map(|n| ("a", n.as_str())).collect();
        registry.push(("other", "listed-only"));
        let c = carriers(&registry, &["a", "b"]);
        let (a, b) = (c.by_job[&job_key("a")], c.by_job.get(&job_key("b")).copied().unwrap_or(0));
        // The first carriers are remembered: they carry `a`, not `b`.
        assert!(names[..CARRIERS_REMEMBERED_MAX].iter().all(|n| c.carries(n, 1, a) && !c.carries(n, 1, b)));
        // Those past the bound carry every job, like a node the registry does not list.
        assert!(names[CARRIERS_REMEMBERED_MAX..].iter().all(|n| c.carries(n, 1, a) && c.carries(n, 1, b)));
        assert!(c.carries("not-listed", 1, b));
        // A node listed only for jobs this node does not carry carries none of its jobs.
        assert!(!c.carries("listed-only", 1, a) && !c.carries("listed-only", 1, b));
        // Unless its heartbeat says it carries more than the registry showed of it.
        assert!(c.carries("listed-only", 2, a) && c.carries(&names[0], 2, b));
    }

    #[test]
    fn backups_wait_past_their_instant_and_for_half_of_a_long_own_claim_within_a_bound() {
        let ms = Duration::from_millis;
        // A punctual round: a few ms of own claims leave the wait past the instant as it is.
        assert_eq!(backup_wait(ms(95), ms(4)), ms(95));
        // A herd whose own claims took 3 s: the others get half as long again.
        assert_eq!(backup_wait(ms(0), ms(3_000)), ms(1_500));
        assert_eq!(backup_wait(ms(1_600), ms(3_000)), ms(1_600));
        // Never more than the bound, however long the own claims took.
        assert_eq!(backup_wait(ms(0), Duration::from_secs(60)), BACKUP_HERD_WAIT_MAX);
    }
}
