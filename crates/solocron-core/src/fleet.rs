//! What the store keeps about the fleet besides runs: each node's heartbeat, and the
//! operators' actions (the audit log).

use chrono::{DateTime, Utc};

use crate::run::RunId;

/// How often a running node sends its heartbeat ([`crate::FleetStore::heartbeat`]).
pub const HEARTBEAT_EVERY: std::time::Duration = std::time::Duration::from_secs(5);
/// A node whose last heartbeat is older than this (three missed beats) is stale: it may be
/// stalled, partitioned or dead.
pub const NODE_STALE_AFTER: std::time::Duration = std::time::Duration::from_secs(15);
/// A node that said goodbye, or has sent no heartbeat for this long, is forgotten by
/// [`crate::HistoryStore::prune`].
pub const NODE_FORGET_AFTER: std::time::Duration = std::time::Duration::from_secs(24 * 3600);
/// Most nodes [`crate::FleetStore::nodes`] returns.
pub const NODES_MAX: usize = 10_000;

/// What a node tells the fleet about itself in each heartbeat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeBeat {
    /// The node's id.
    pub node: String,
    /// The solocron version it runs.
    pub version: String,
    /// How many jobs it carries.
    pub jobs: u32,
    /// How many runs it holds right now.
    pub running: u32,
}

/// A node as the store last heard of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRecord {
    /// What it said in its last heartbeat.
    pub beat: NodeBeat,
    /// Its first heartbeat since it last started (store clock).
    pub started_at: DateTime<Utc>,
    /// Its last heartbeat (store clock).
    pub last_seen: DateTime<Utc>,
    /// When it said goodbye (a clean shutdown), if it did since its last start.
    pub left_at: Option<DateTime<Utc>>,
}

/// Whether a node is there, judged at `now` (store clock).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Liveness {
    /// Heard from within [`NODE_STALE_AFTER`].
    Alive,
    /// Silent for longer, without a goodbye: stalled, partitioned or dead.
    Stale,
    /// Said goodbye.
    Gone,
}

string_enum!(
    "The lower-case name used in output and the API.",
    Liveness { Alive => "alive", Stale => "stale", Gone => "gone" },
    |other, valid| format!("unknown liveness `{other}`; expected one of: {valid}")
);

impl NodeRecord {
    /// Alive, stale or gone at `now` (store clock).
    pub fn liveness(&self, now: DateTime<Utc>) -> Liveness {
        if self.left_at.is_some() {
            return Liveness::Gone;
        }
        let silent = (now - self.last_seen).to_std().unwrap_or_default();
        if silent > NODE_STALE_AFTER {
            Liveness::Stale
        } else {
            Liveness::Alive
        }
    }
}

/// What an operator did to a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ActionKind {
    /// Paused it fleet-wide.
    Pause,
    /// Resumed it.
    Resume,
    /// Asked for a manual run.
    Trigger,
    /// Ended its running runs as abandoned.
    Unlock,
}

string_enum!(
    "The lower-case name used in stores, output and the API.",
    ActionKind { Pause => "pause", Resume => "resume", Trigger => "trigger", Unlock => "unlock" },
    |other, valid| format!("unknown action `{other}`; expected one of: {valid}")
);

/// One operator action, as the audit log keeps it. Written by the store in the same atomic
/// step as the action itself, so an action is never done unrecorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActionRecord {
    /// The job acted on.
    pub job: String,
    /// What was done.
    pub kind: ActionKind,
    /// Who did it (`user@host` from the CLI, the token's name from the HTTP API).
    pub by: String,
    /// Why, as they said.
    pub reason: Option<String>,
    /// When (store clock).
    pub at: DateTime<Utc>,
    /// What it did, where worth saying: the manual run's id (`job@instant#1`), the runs an
    /// unlock ended ([`ActionRecord::unlock_detail`]), [`ALREADY_PAUSED`],
    /// [`ALREADY_RUNNING`]; empty for a pause or resume that changed the switch.
    pub detail: String,
}

/// Most run ids the detail of an unlock names; the rest are counted (`… and 3 more`), so
/// that one action's record stays small whatever an unlock ended.
pub const UNLOCK_DETAIL_RUNS_MAX: usize = 100;

/// The detail of a pause of a job that was paused already (its switch is left as it was
/// when no new reason is given).
pub const ALREADY_PAUSED: &str = "already paused";
/// The detail of a resume of a job that was not paused.
pub const ALREADY_RUNNING: &str = "already running";
/// The detail of an unlock that found no running run.
pub const NOTHING_RUNNING: &str = "nothing running";

impl ActionRecord {
    /// The reason a run ended by an unlock is recorded with: `unlocked by {by}: {reason}`
    /// (`unlocked by {by}` for an empty reason).
    ///
    /// ```
    /// use solocron_core::ActionRecord;
    /// assert_eq!(ActionRecord::unlock_reason("alice@h", "stuck"), "unlocked by alice@h: stuck");
    /// assert_eq!(ActionRecord::unlock_reason("alice@h", ""), "unlocked by alice@h");
    /// ```
    pub fn unlock_reason(by: &str, reason: &str) -> String {
        if reason.is_empty() {
            format!("unlocked by {by}")
        } else {
            format!("unlocked by {by}: {reason}")
        }
    }

    /// The detail of an unlock that ended `runs` (in the order given): their ids joined by
    /// `, `, at most [`UNLOCK_DETAIL_RUNS_MAX`] of them, or [`NOTHING_RUNNING`].
    pub fn unlock_detail(runs: &[RunId]) -> String {
        if runs.is_empty() {
            return NOTHING_RUNNING.to_owned();
        }
        let named: Vec<String> = runs.iter().take(UNLOCK_DETAIL_RUNS_MAX).map(RunId::to_string).collect();
        match runs.len() - named.len() {
            0 => named.join(", "),
            more => format!("{} and {more} more", named.join(", ")),
        }
    }

    /// The detail of a pause (`paused`) or resume of a job that `was_paused`:
    /// [`ALREADY_PAUSED`], [`ALREADY_RUNNING`], or empty when the switch changed.
    pub fn pause_detail(paused: bool, was_paused: bool) -> &'static str {
        match (paused, was_paused) {
            (true, true) => ALREADY_PAUSED,
            (false, false) => ALREADY_RUNNING,
            _ => "",
        }
    }
}

/// Which actions to read, newest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ActionQuery {
    /// Only this job's.
    pub job: Option<String>,
    /// At most this many (capped at [`crate::RECORDS_PAGE_MAX`]; 0 means the cap).
    pub limit: usize,
}

impl ActionQuery {
    /// The number of actions to return: `limit`, capped at [`crate::RECORDS_PAGE_MAX`]; 0
    /// means the cap.
    pub fn effective_limit(&self) -> usize {
        match self.limit {
            0 => crate::RECORDS_PAGE_MAX,
            n => n.min(crate::RECORDS_PAGE_MAX),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(last_seen: &str, left: bool) -> NodeRecord {
        let t: DateTime<Utc> = last_seen.parse().unwrap();
        NodeRecord {
            beat: NodeBeat { node: "n1".into(), version: "0.1.0".into(), jobs: 3, running: 0 },
            started_at: t,
            last_seen: t,
            left_at: left.then_some(t),
        }
    }

    #[test]
    fn a_node_is_alive_until_three_beats_are_missed_and_gone_once_it_says_goodbye() {
        let now: DateTime<Utc> = "2026-01-01T00:00:20Z".parse().unwrap();
        assert_eq!(record("2026-01-01T00:00:05Z", false).liveness(now), Liveness::Alive);
        assert_eq!(record("2026-01-01T00:00:04.999Z", false).liveness(now), Liveness::Stale);
        assert_eq!(record("2026-01-01T00:00:19Z", true).liveness(now), Liveness::Gone);
        // A last_seen after now (another reader's clock) is alive, not an error.
        assert_eq!(record("2026-01-01T00:00:21Z", false).liveness(now), Liveness::Alive);
    }

    #[test]
    fn action_kinds_round_trip_and_unknown_ones_say_what_is_allowed() {
        for k in ["pause", "resume", "trigger", "unlock"] {
            assert_eq!(k.parse::<ActionKind>().unwrap().as_str(), k);
        }
        assert!("delete".parse::<ActionKind>().unwrap_err().contains("unlock"));
    }

    #[test]
    fn an_unlock_detail_names_the_ended_runs_up_to_its_bound_and_counts_the_rest() {
        let run = |minute: i64| RunId {
            tick: crate::Tick::new("backup", DateTime::from_timestamp(minute * 60, 0).unwrap()),
            attempt: 1,
        };
        assert_eq!(ActionRecord::unlock_detail(&[]), NOTHING_RUNNING);
        assert_eq!(
            ActionRecord::unlock_detail(&[run(0), run(1)]),
            "backup@1970-01-01T00:00:00.000Z#1, backup@1970-01-01T00:01:00.000Z#1"
        );
        let many: Vec<RunId> = (0..UNLOCK_DETAIL_RUNS_MAX as i64 + 3).map(run).collect();
        let detail = ActionRecord::unlock_detail(&many);
        assert!(detail.ends_with("#1 and 3 more"), "{detail}");
        assert_eq!(detail.matches('@').count(), UNLOCK_DETAIL_RUNS_MAX);
    }

    #[test]
    fn a_pause_or_resume_that_changes_nothing_says_so() {
        assert_eq!(ActionRecord::pause_detail(true, true), ALREADY_PAUSED);
        assert_eq!(ActionRecord::pause_detail(false, false), ALREADY_RUNNING);
        assert_eq!(ActionRecord::pause_detail(true, false), "");
        assert_eq!(ActionRecord::pause_detail(false, true), "");
        let q = ActionQuery { limit: 0, ..Default::default() };
        assert_eq!(q.effective_limit(), crate::RECORDS_PAGE_MAX);
        assert_eq!(ActionQuery { limit: 5, ..q }.effective_limit(), 5);
    }
}
