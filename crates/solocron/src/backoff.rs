//! Bounded exponential backoff for store retries.

use std::time::Duration;

/// Doubling delays from `min` to `max`; never longer than `max`.
#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    next: Duration,
    min: Duration,
    max: Duration,
}

/// Backoff while the store is unavailable: from this ...
const STORE_BACKOFF_MIN: Duration = Duration::from_millis(100);
/// ... up to this.
const STORE_BACKOFF_MAX: Duration = Duration::from_secs(5);

impl Backoff {
    /// The engine's wait between tries while the store is unavailable.
    pub(crate) fn store() -> Backoff {
        Backoff::new(STORE_BACKOFF_MIN, STORE_BACKOFF_MAX)
    }

    pub(crate) fn new(min: Duration, max: Duration) -> Backoff {
        assert!(min <= max && !min.is_zero());
        Backoff { next: min, min, max }
    }

    /// The delay the next `wait` will take.
    pub(crate) fn peek(&self) -> Duration {
        self.next
    }

    /// Sleeps for the current delay and doubles it (up to `max`).
    pub(crate) async fn wait(&mut self) {
        tokio::time::sleep(self.next).await;
        self.next = (self.next * 2).min(self.max);
    }

    /// Back to `min` after a success.
    pub(crate) fn reset(&mut self) {
        self.next = self.min;
    }
}
