//! The store's clock as this node sees it: schedules follow the store's clock, not the
//! node's, so a node whose clock runs ahead neither claims nor starts ticks early (issue
//! 20 §1), and one whose clock lags does not start them late.
//!
//! The estimate is NTP's simplest: read the node's clock, ask the store its time, and take
//! the store's answer as the time at the middle of the round trip; the error is at most
//! half the round trip (plus the store's clock resolution). Of the recent samples, the one
//! with the smallest error wins, since a slow round trip says little. The node's "now" is
//! then its own clock plus the offset, minus the error: the earliest the store's clock can
//! read, so a run never starts before its instant by the store's clock.
//!
//! Stores whose clock is the node's (SQLite: the host's; etcd has none, so its "now" is the
//! client's) measure an offset of about zero.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use chrono::{DateTime, Utc};
use solocron_core::Clock;

use crate::metrics;

/// Samples kept; the one with the smallest error is used. At one sample per heartbeat,
/// this spans well under a minute, over which clocks drift by microseconds.
const SAMPLES_KEPT: usize = 8;
/// Samples taken back to back when the node starts, before its first claim.
pub(crate) const SAMPLES_AT_START: usize = 3;
/// Added to every sample's error: the coarsest clock a store reports (milliseconds).
const STORE_CLOCK_RESOLUTION: Duration = Duration::from_millis(1);
/// Samples whose errors differ by no more than this are equally good: the newest counts.
const ERROR_TIE: Duration = Duration::from_micros(100);
/// An offset past this is logged once as a warning: the node's clock wants fixing.
const OFFSET_WARN: Duration = Duration::from_secs(1);

/// One reading of the store's clock against this node's.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Sample {
    /// The store's clock minus the node's.
    offset: chrono::Duration,
    /// How far `offset` may be off, either way.
    error: Duration,
}

impl Sample {
    /// The store said `store_now` to a question sent when the node's clock read `before`,
    /// answered `round_trip` later: taken as the store's time at the middle of the trip.
    fn of(before: DateTime<Utc>, round_trip: Duration, store_now: DateTime<Utc>) -> Sample {
        let middle = before + chrono::Duration::from_std(round_trip / 2).unwrap_or(chrono::Duration::MAX);
        Sample { offset: store_now - middle, error: round_trip / 2 + STORE_CLOCK_RESOLUTION }
    }
}

/// This node's estimate of the store's clock.
#[derive(Debug, Default)]
pub(crate) struct StoreClock {
    samples: Mutex<VecDeque<Sample>>,
    /// The best sample's offset minus its error, in µs: what [`StoreClock::now`] adds.
    correction_us: AtomicI64,
    warned: AtomicBool,
}

impl StoreClock {
    /// The earliest the store's clock can read now, by `clock` and the estimate (`clock`
    /// as it is until the first sample).
    pub(crate) fn now(&self, clock: &dyn Clock) -> DateTime<Utc> {
        clock.now() + chrono::Duration::microseconds(self.correction_us.load(Ordering::Acquire))
    }

    /// Takes one reading: the store said `store_now` to a question sent when the node's
    /// clock read `before`, answered `round_trip` later (by the monotonic clock, since the
    /// wall clock may be set meanwhile).
    pub(crate) fn observe(&self, before: DateTime<Utc>, round_trip: Duration, store_now: DateTime<Utc>) {
        self.add(Sample::of(before, round_trip, store_now));
    }

    /// Takes a reading that contradicts the estimate (the store refused a claim as made too
    /// early): the node's clock stepped since the older samples were taken, so those that
    /// disagree with this one by more than both their errors are dropped first, or the best
    /// of them would keep the stale offset.
    pub(crate) fn observe_step(&self, before: DateTime<Utc>, round_trip: Duration, store_now: DateTime<Utc>) {
        let sample = Sample::of(before, round_trip, store_now);
        {
            let mut samples = self.samples.lock().expect("not poisoned");
            samples.retain(|s| (s.offset - sample.offset).abs().to_std().is_ok_and(|d| d <= s.error + sample.error));
        }
        self.add(sample);
    }

    /// Takes `sample` and keeps the best of the recent ones.
    fn add(&self, sample: Sample) {
        let best = {
            let mut samples = self.samples.lock().expect("not poisoned");
            samples.push_back(sample);
            if samples.len() > SAMPLES_KEPT {
                samples.pop_front();
            }
            let least = samples.iter().map(|s| s.error).min().expect("one was just added");
            // The newest of the (nearly) best: a store whose clock is the fleet's median
            // (etcd) answers every sample with the same small error, and its median moves.
            *samples.iter().rev().find(|s| s.error <= least + ERROR_TIE).expect("the least is there")
        };
        let error = chrono::Duration::from_std(best.error).unwrap_or(chrono::Duration::MAX);
        let correction = (best.offset - error).num_microseconds().unwrap_or(i64::MAX);
        self.correction_us.store(correction, Ordering::Release);
        metrics::store_clock_offset(best.offset);
        let far = best.offset.abs().to_std().is_ok_and(|o| o > OFFSET_WARN);
        if far && !self.warned.swap(true, Ordering::AcqRel) {
            tracing::warn!(
                offset_ms = best.offset.num_milliseconds(),
                error_ms = best.error.as_millis() as u64,
                "this node's clock is off from the store's; schedules follow the store's clock (fix the node's clock: NTP)"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct At(DateTime<Utc>);

    impl Clock for At {
        fn now(&self) -> DateTime<Utc> {
            self.0
        }
    }

    fn sample(offset_ms: i64, error_ms: u64) -> Sample {
        Sample { offset: chrono::Duration::milliseconds(offset_ms), error: Duration::from_millis(error_ms) }
    }

    #[test]
    fn now_is_the_nodes_clock_until_a_sample_then_the_earliest_the_store_can_read() {
        let at = DateTime::from_timestamp(1_000_000, 0).expect("in range");
        let clock = StoreClock::default();
        assert_eq!(clock.now(&At(at)), at);
        clock.add(sample(-2000, 3));
        assert_eq!(clock.now(&At(at)), at - chrono::Duration::milliseconds(2003));
        clock.add(sample(-1990, 40));
        assert_eq!(clock.now(&At(at)), at - chrono::Duration::milliseconds(2003), "a worse sample changes nothing");
        clock.add(sample(-1999, 1));
        assert_eq!(clock.now(&At(at)), at - chrono::Duration::milliseconds(2000), "a better one wins");
    }

    #[test]
    fn of_equally_good_samples_the_newest_counts() {
        let clock = StoreClock::default();
        clock.add(sample(0, 1));
        clock.add(sample(-2000, 1));
        let at = DateTime::from_timestamp(1_000_000, 0).expect("in range");
        assert_eq!(clock.now(&At(at)), at - chrono::Duration::milliseconds(2001), "the median moved: followed");
    }

    #[test]
    fn only_the_recent_samples_count() {
        let clock = StoreClock::default();
        clock.add(sample(500, 1));
        for _ in 0..SAMPLES_KEPT {
            clock.add(sample(100, 5));
        }
        let at = DateTime::from_timestamp(0, 0).expect("in range");
        assert_eq!(clock.now(&At(at)), at + chrono::Duration::milliseconds(95), "the old best aged out");
    }
}
