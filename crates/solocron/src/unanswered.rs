//! This node's claims that went unanswered: a timeout or a broken connection may hide a
//! claim that committed in the store while its answer was lost. Such a tick's record says
//! `running` under this node, yet nothing runs it; without more, its lease lapses and
//! recovery ends it (by default `abandoned`): a tick silently not run.
//!
//! So each tick asked for carries a nonce ([`ClaimRequest::nonce`]), new for every tick,
//! and kept here when the claim gets no answer. The next request for that tick (the
//! timer's next round, a catch-up's retry, the next look at manual requests) carries the
//! same nonce, and the store answers `Won` again if the record is still that claim's
//! running attempt. A nonce is reused only for a tick whose claim went unanswered, so a
//! tick this node knows it won is never granted to it twice; a restarted node has none of
//! its predecessor's nonces, so a run that died with it is recovered, not re-run. And it
//! is lent to one request at a time ([`UnansweredClaims::nonce`]): two requests of this
//! node for one tick in flight at once (a backup's and a catch-up's) would both be
//! granted it, and run it twice; the second gets a new nonce, and finds the tick taken.
//!
//! Bounded: at most [`UNANSWERED_MAX`] ticks, each kept at most [`UNANSWERED_KEPT`] (past
//! that, the tick is no longer on time, so nobody asks for it again to run it).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use solocron_core::{ClaimOutcome, ClaimRequest, Tick, LATE_TOLERANCE};
use tokio::time::Instant;

/// Most unanswered ticks remembered; a claim failing beyond that is not remembered (its
/// tick, if it committed, is recovered by `on_crash` after its lease).
pub(crate) const UNANSWERED_MAX: usize = 20_000;
/// How long an unanswered tick is remembered: longer than the late tolerance, after which
/// the timer no longer asks for it as a run.
pub(crate) const UNANSWERED_KEPT: Duration = Duration::from_secs(LATE_TOLERANCE.as_secs() * 2);

/// The nonce of an unanswered claim, and when its first try was sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Unanswered {
    nonce: u64,
    first_sent: Instant,
    /// Lent to a request not answered yet (see [`UnansweredClaims::nonce`]).
    lent: bool,
}

/// The ticks whose claim went unanswered, by tick.
#[derive(Debug, Default)]
pub(crate) struct UnansweredClaims {
    ticks: Mutex<HashMap<Tick, Unanswered>>,
    /// Whether `ticks` may hold anything: the common path (nothing unanswered) asks for a
    /// nonce without taking the lock.
    any: AtomicBool,
}

impl UnansweredClaims {
    /// The nonce for a request for `tick`: the unanswered claim's, lent to this request
    /// until its claim is answered ([`answered`](Self::answered)) or fails again
    /// ([`failed`](Self::failed)); else (none, or lent already) a new one.
    pub(crate) fn nonce(&self, tick: &Tick) -> u64 {
        if self.any.load(Ordering::Acquire) {
            if let Some(u) = self.lock().get_mut(tick).filter(|u| !u.lent) {
                u.lent = true;
                return u.nonce;
            }
        }
        fastrand::u64(1..)
    }

    /// Whether this node's claim of `tick` went unanswered (and is remembered): its own
    /// recovery leaves such a run alone, since the node asks for it again.
    pub(crate) fn contains(&self, tick: &Tick) -> bool {
        self.any.load(Ordering::Acquire) && self.lock().contains_key(tick)
    }

    #[cfg(test)]
    fn get(&self, tick: &Tick) -> Option<Unanswered> {
        self.lock().get(tick).copied()
    }

    /// Remembers `requests`, sent at `sent`, as unanswered (a request already remembered
    /// keeps its first try's instant, and its nonce is free to lend again). Forgets what is
    /// older than [`UNANSWERED_KEPT`].
    pub(crate) fn failed(&self, requests: &[ClaimRequest], sent: Instant) {
        let mut ticks = self.lock();
        ticks.retain(|_, u| sent.saturating_duration_since(u.first_sent) < UNANSWERED_KEPT);
        let mut not_kept = 0_usize;
        for req in requests.iter().filter(|r| r.nonce != 0) {
            if ticks.len() >= UNANSWERED_MAX && !ticks.contains_key(&req.tick) {
                not_kept += 1;
                continue;
            }
            let u =
                ticks.entry(req.tick.clone()).or_insert(Unanswered { nonce: req.nonce, first_sent: sent, lent: false });
            if u.nonce == req.nonce {
                u.lent = false;
            }
        }
        if not_kept > 0 {
            tracing::warn!(
                ticks = not_kept,
                "too many unanswered claims to remember these; if they committed, recovery ends them"
            );
        }
        self.any.store(!ticks.is_empty(), Ordering::Release);
    }

    /// Forgets the ticks of `answers` (each request with the store's answer), unless the
    /// answer says nothing of the unanswered claim: `Taken` for a request that did not carry
    /// its nonce (a second request, made while the nonce was lent, finds the very record
    /// the lost answer was about; forgotten then, this node's recovery would end the run its
    /// own request still in flight is to be granted again). Every other answer settles the
    /// tick: won or skipped by this request, or taken as seen by the nonce's own request.
    pub(crate) fn answered<'a>(&self, answers: impl IntoIterator<Item = (&'a ClaimRequest, &'a ClaimOutcome)>) {
        if !self.any.load(Ordering::Acquire) {
            return;
        }
        let mut ticks = self.lock();
        for (req, outcome) in answers {
            let unsettled = |u: &Unanswered| matches!(outcome, ClaimOutcome::Taken) && u.nonce != req.nonce;
            if ticks.get(&req.tick).is_some_and(|u| !unsettled(u)) {
                ticks.remove(&req.tick);
            }
        }
        self.any.store(!ticks.is_empty(), Ordering::Release);
    }

    /// Frees the nonces `requests` were lent (their claim was refused, not answered: the
    /// tick stays unanswered, and the next request for it carries the nonce again).
    pub(crate) fn release<'a>(&self, requests: impl IntoIterator<Item = &'a ClaimRequest>) {
        if !self.any.load(Ordering::Acquire) {
            return;
        }
        let mut ticks = self.lock();
        for req in requests {
            if let Some(u) = ticks.get_mut(&req.tick).filter(|u| u.nonce == req.nonce) {
                u.lent = false;
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Tick, Unanswered>> {
        self.ticks.lock().expect("not poisoned")
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration as StdDuration;

    use chrono::DateTime;
    use solocron_core::{ClaimMode, Trigger};

    use super::*;

    fn request(tick: &Tick, nonce: u64) -> ClaimRequest {
        ClaimRequest {
            tick: tick.clone(),
            trigger: Trigger::Schedule,
            node: "n1".into(),
            lease: StdDuration::from_secs(30),
            mode: ClaimMode::Run { skip_if_running: false },
            nonce,
        }
    }

    fn tick(secs: i64) -> Tick {
        Tick::new("job", DateTime::from_timestamp(secs, 0).expect("in range"))
    }

    #[tokio::test(start_paused = true)]
    async fn an_unanswered_ticks_nonce_is_reused_until_it_is_answered_or_too_old() {
        let claims = UnansweredClaims::default();
        let (a, b) = (tick(0), tick(1));
        let na = claims.nonce(&a);
        assert_ne!(na, 0);
        assert_ne!(claims.nonce(&a), na, "a tick never asked for unanswered gets a new nonce each time");
        let first = Instant::now();
        claims.failed(&[request(&a, na)], first);
        assert_eq!(claims.nonce(&a), na, "asked again with its nonce");
        tokio::time::advance(StdDuration::from_secs(1)).await;
        claims.failed(&[request(&a, na)], Instant::now());
        assert_eq!(
            claims.get(&a),
            Some(Unanswered { nonce: na, first_sent: first, lent: false }),
            "the first try's instant"
        );
        assert_eq!(claims.get(&b), None);
        claims.answered([(&request(&a, na), &ClaimOutcome::Taken)]);
        assert_eq!(claims.get(&a), None, "answered: forgotten");
        assert_ne!(claims.nonce(&a), na);

        claims.failed(&[request(&a, 5), request(&b, 0)], Instant::now());
        assert_eq!(claims.get(&b), None, "a request without a nonce is not remembered");
        tokio::time::advance(UNANSWERED_KEPT).await;
        claims.failed(&[request(&b, 6)], Instant::now());
        assert_eq!(claims.get(&a), None, "too old: forgotten");
        assert_eq!(claims.get(&b).map(|u| u.nonce), Some(6));
    }

    #[test]
    fn an_unanswered_nonce_is_lent_to_one_request_at_a_time() {
        let claims = UnansweredClaims::default();
        let a = tick(0);
        let na = claims.nonce(&a);
        claims.failed(&[request(&a, na)], Instant::now());
        assert_eq!(claims.nonce(&a), na, "the first request asked again carries it");
        let other = claims.nonce(&a);
        assert_ne!(other, na, "a second request while the first is in flight gets a new nonce");
        assert!(claims.contains(&a), "still remembered while lent");
        // The second request fails too: the first's nonce stays the one remembered, and stays lent.
        claims.failed(&[request(&a, other)], Instant::now());
        assert_ne!(claims.nonce(&a), na);
        // The first fails again: its nonce is free to lend again.
        claims.failed(&[request(&a, na)], Instant::now());
        assert_eq!(claims.nonce(&a), na);
        claims.answered([(&request(&a, na), &ClaimOutcome::Taken)]);
        assert!(!claims.contains(&a));
    }

    #[test]
    fn a_tick_is_forgotten_only_on_an_answer_about_its_unanswered_claim() {
        let claims = UnansweredClaims::default();
        let a = tick(0);
        let na = claims.nonce(&a);
        claims.failed(&[request(&a, na)], Instant::now());
        assert_eq!(claims.nonce(&a), na, "lent to the first request asked again");
        let other = claims.nonce(&a);
        claims.answered([(&request(&a, other), &ClaimOutcome::Taken)]);
        assert!(claims.contains(&a), "taken, seen by a request without its nonce: maybe by the lost claim itself");
        claims.failed(&[request(&a, na)], Instant::now());
        claims.answered([(&request(&a, other), &ClaimOutcome::Skipped { reason: "paused".into() })]);
        assert!(!claims.contains(&a), "recorded skipped by the second request: the lost claim never committed");
        let na = claims.nonce(&a);
        claims.failed(&[request(&a, na)], Instant::now());
        assert_eq!(claims.nonce(&a), na);
        claims.answered([(&request(&a, na), &ClaimOutcome::Taken)]);
        assert!(!claims.contains(&a), "taken, seen by the nonce's own request: another node has it");
    }

    #[test]
    fn at_most_unanswered_max_ticks_are_remembered() {
        let claims = UnansweredClaims::default();
        let requests: Vec<_> = (0..=UNANSWERED_MAX as i64).map(|s| request(&tick(s), 1)).collect();
        claims.failed(&requests, Instant::now());
        assert_eq!(claims.lock().len(), UNANSWERED_MAX);
        assert_eq!(claims.get(&tick(UNANSWERED_MAX as i64)), None);
    }
}
