//! How long before its instant a scheduled tick is claimed: [`CLAIM_AHEAD`], or longer, up
//! to [`CLAIM_AHEAD_MAX`], while this node's recent claim rounds (the last 10 to 20
//! minutes) took longer than that.
//!
//! A round that claims many ticks at once (1,000 jobs due every second on etcd: ~100 ms)
//! would otherwise end after the instant, and every run of it would start that late.

use std::time::Duration;

use tokio::time::Instant;

use solocron_core::LEASE_MIN;

/// How long before its instant a scheduled tick is claimed, at least. The claim's round
/// trip (and the losers' wait on the winner's row) then happens before the instant, and the
/// run starts at the instant itself instead of one round trip after it. The store's overlap
/// check (`overlap = "skip"`) is made at claim time, so a previous run ending less than the
/// lead before the instant still counts as running.
pub const CLAIM_AHEAD: Duration = Duration::from_millis(50);

/// The longest lead: while recent claim rounds took long, ticks are claimed up to this long
/// before their instant (the node learns its lead from its recent claim rounds).
pub const CLAIM_AHEAD_MAX: Duration = Duration::from_millis(150);

// A run claimed ahead starts before its first renewal is due (lease / 3, at least 166 ms).
const _: () = assert!(CLAIM_AHEAD_MAX.as_millis() * 3 < LEASE_MIN.as_millis());
const _: () = assert!(CLAIM_AHEAD.as_millis() <= CLAIM_AHEAD_MAX.as_millis());

/// How long a slow round is remembered: between one and two of these. Long enough to
/// cover a herd due every few minutes (each one claimed with the lead its predecessor
/// taught), short enough that a node whose rounds became fast returns to [`CLAIM_AHEAD`].
const WINDOW: Duration = Duration::from_secs(600);

/// The lead of a node's claim rounds: one and a half times the slowest round it made in
/// the last [`WINDOW`] to 2 × [`WINDOW`], within [`CLAIM_AHEAD`]..=[`CLAIM_AHEAD_MAX`].
/// Kept as the slowest of the current window and of the one before (a sliding maximum in
/// constant memory). Instants and durations are inputs, so the rule is tested without a
/// clock.
///
/// Each node learns its own lead: a node whose rounds are slow (a far or loaded store
/// connection, a starved CPU) claims earlier than the others, and so wins more of the
/// ticks they race for.
#[derive(Debug)]
pub(crate) struct Lead {
    /// When the current window began.
    since: Instant,
    current: Duration,
    previous: Duration,
}

impl Lead {
    /// A node's lead, with no round made yet (as of `now`).
    pub(crate) fn new(now: Instant) -> Lead {
        Lead { since: now, current: Duration::ZERO, previous: Duration::ZERO }
    }

    /// How long before their instants the round starting at `now` claims ticks (also set
    /// as the node's claim lead gauge).
    pub(crate) fn get(&mut self, now: Instant) -> Duration {
        self.roll(now);
        let lead = (self.current.max(self.previous) * 3 / 2).clamp(CLAIM_AHEAD, CLAIM_AHEAD_MAX);
        crate::metrics::claim_lead(lead);
        lead
    }

    /// Records that a round's claims took `round`, ending at `now` (rounds that failed are
    /// not recorded: a store outage says nothing about how long claims take).
    pub(crate) fn observe(&mut self, now: Instant, round: Duration) {
        self.roll(now);
        self.current = self.current.max(round);
    }

    /// Starts a new window once the current one is [`WINDOW`] old (forgetting both if the
    /// node made no round for a whole window).
    fn roll(&mut self, now: Instant) {
        let age = now.saturating_duration_since(self.since);
        if age >= WINDOW {
            self.previous = if age >= 2 * WINDOW { Duration::ZERO } else { self.current };
            self.current = Duration::ZERO;
            self.since = now;
        }
        debug_assert!(now.saturating_duration_since(self.since) < WINDOW);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);
    const SEC: Duration = Duration::from_secs(1);

    #[test]
    fn fast_rounds_keep_the_shortest_lead() {
        let t0 = Instant::now();
        let mut lead = Lead::new(t0);
        assert_eq!(lead.get(t0), CLAIM_AHEAD);
        (0..100).for_each(|s| lead.observe(t0 + s * SEC, 2 * MS));
        assert_eq!(lead.get(t0 + 100 * SEC), CLAIM_AHEAD);
    }

    #[test]
    fn a_slow_round_lengthens_the_lead_within_the_bound() {
        let t0 = Instant::now();
        let mut lead = Lead::new(t0);
        lead.observe(t0, 80 * MS);
        assert_eq!(lead.get(t0 + SEC), 120 * MS);
        lead.observe(t0 + SEC, 5000 * MS);
        assert_eq!(lead.get(t0 + 2 * SEC), CLAIM_AHEAD_MAX);
    }

    #[test]
    fn a_slow_round_is_remembered_for_one_to_two_windows_however_many_fast_ones_follow() {
        let t0 = Instant::now();
        let mut lead = Lead::new(t0);
        lead.observe(t0 + 30 * SEC, 90 * MS);
        // A fast round every second after it, as a job due every second makes.
        let mut at = t0 + 31 * SEC;
        while at < t0 + 2 * WINDOW {
            lead.observe(at, MS);
            assert_eq!(lead.get(at), 135 * MS, "forgotten after {:?}", at - t0);
            at += SEC;
        }
        assert_eq!(lead.get(at), CLAIM_AHEAD, "still remembered after {:?}", at - t0);
    }

    #[test]
    fn a_node_that_made_no_round_for_two_windows_forgets() {
        let t0 = Instant::now();
        let mut lead = Lead::new(t0);
        lead.observe(t0, 100 * MS);
        assert_eq!(lead.get(t0 + WINDOW + SEC), CLAIM_AHEAD_MAX);
        let mut idle = Lead::new(t0);
        idle.observe(t0, 100 * MS);
        assert_eq!(idle.get(t0 + 2 * WINDOW + SEC), CLAIM_AHEAD);
    }
}
