//! How long before its instant a scheduled tick is claimed: [`CLAIM_AHEAD`], or longer, up
//! to [`CLAIM_AHEAD_MAX`], while this node's recent claim rounds took longer than that.
//!
//! A round that claims many ticks at once (1,000 jobs due every second on etcd: ~100 ms)
//! would otherwise end after the instant, and every run of it would start that late.

use std::collections::VecDeque;
use std::time::Duration;

use solocron_core::LEASE_MIN;

/// How long before its instant a scheduled tick is claimed, at least. The claim's round
/// trip (and the losers' wait on the winner's row) then happens before the instant, and the
/// run starts at the instant itself instead of one round trip after it. The store's overlap
/// check (`overlap = "skip"`) is made at claim time, so a previous run ending less than the
/// lead before the instant still counts as running.
pub const CLAIM_AHEAD: Duration = Duration::from_millis(50);

/// The longest lead: while recent claim rounds took long, ticks are claimed up to this long
/// before their instant (see [`Lead`]).
pub const CLAIM_AHEAD_MAX: Duration = Duration::from_millis(150);

// A run claimed ahead starts before its first renewal is due (lease / 3, at least 166 ms).
const _: () = assert!(CLAIM_AHEAD_MAX.as_millis() * 3 < LEASE_MIN.as_millis());
const _: () = assert!(CLAIM_AHEAD.as_millis() <= CLAIM_AHEAD_MAX.as_millis());

/// How many recent rounds the lead is taken from.
const ROUNDS_KEPT: usize = 16;

/// The lead of a node's claim rounds: one and a half times its slowest of the last
/// [`ROUNDS_KEPT`] rounds, within [`CLAIM_AHEAD`]..=[`CLAIM_AHEAD_MAX`]. Durations are
/// inputs (the caller measures them), so the rule is tested without a clock.
#[derive(Debug, Default)]
pub(crate) struct Lead {
    rounds: VecDeque<Duration>,
}

impl Lead {
    /// How long before their instants the next round claims ticks.
    pub(crate) fn get(&self) -> Duration {
        let slowest = self.rounds.iter().max().copied().unwrap_or_default();
        (slowest * 3 / 2).clamp(CLAIM_AHEAD, CLAIM_AHEAD_MAX)
    }

    /// Records how long a round's claims took (rounds that failed are not recorded: a store
    /// outage says nothing about how long claims take).
    pub(crate) fn observe(&mut self, round: Duration) {
        if self.rounds.len() == ROUNDS_KEPT {
            self.rounds.pop_front();
        }
        self.rounds.push_back(round);
        debug_assert!(self.rounds.len() <= ROUNDS_KEPT);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn fast_rounds_keep_the_shortest_lead() {
        let mut lead = Lead::default();
        assert_eq!(lead.get(), CLAIM_AHEAD);
        (0..100).for_each(|_| lead.observe(2 * MS));
        assert_eq!(lead.get(), CLAIM_AHEAD);
    }

    #[test]
    fn a_slow_round_lengthens_the_lead_within_the_bound() {
        let mut lead = Lead::default();
        lead.observe(80 * MS);
        assert_eq!(lead.get(), 120 * MS);
        lead.observe(5000 * MS);
        assert_eq!(lead.get(), CLAIM_AHEAD_MAX);
    }

    #[test]
    fn the_lead_comes_back_once_slow_rounds_are_old() {
        let mut lead = Lead::default();
        lead.observe(90 * MS);
        (0..ROUNDS_KEPT - 1).for_each(|_| lead.observe(MS));
        assert_eq!(lead.get(), 135 * MS, "the slow round is still among the last {ROUNDS_KEPT}");
        lead.observe(MS);
        assert_eq!(lead.get(), CLAIM_AHEAD);
    }
}
