//! Notice of the system's wall clock being set (stepped by NTP or an operator, or after a
//! resume from suspend), so the timer can sleep until the next fire instead of waking every
//! second to look whether the clock jumped.
//!
//! A `timerfd` on `CLOCK_REALTIME`, armed for a far-future absolute instant with
//! `TFD_TIMER_CANCEL_ON_SET`: the kernel cancels it (a read fails with `ECANCELED`)
//! whenever the clock changes discontinuously. Slewing (NTP's gradual correction) moves
//! the monotonic clock that tokio sleeps on by the same rate, so only steps need notice.
//! No crate offers this; nix wraps the system calls.

use std::io;
use std::os::fd::{AsFd, AsRawFd, RawFd};

use nix::errno::Errno;
use nix::sys::time::TimeSpec;
use nix::sys::timerfd::{ClockId, Expiration, TimerFd, TimerFlags, TimerSetTimeFlags};
use tokio::io::unix::AsyncFd;

/// How far ahead of the wall clock the timer is armed: it is re-armed at every step, so it
/// expires (one spurious wake) only after a year without one. Relative to now, so a clock
/// set beyond any fixed date cannot make it fire at once, again and again.
const ARMED_AHEAD_SECS: i64 = 365 * 86_400;

/// Wakes when the wall clock was set.
///
/// ```no_run
/// # async fn f() -> std::io::Result<()> {
/// let mut steps = solocron_os::wallclock::ClockSteps::new()?;
/// steps.stepped().await?; // the clock was set: look at it again
/// # Ok(()) }
/// ```
pub struct ClockSteps {
    fd: AsyncFd<Timer>,
}

/// nix's `TimerFd` as tokio wants it (`AsRawFd`).
struct Timer(TimerFd);

impl AsRawFd for Timer {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

impl ClockSteps {
    /// Watches the wall clock from now on. Needs a tokio runtime (the fd is registered
    /// with its reactor).
    ///
    /// # Errors
    /// The `timerfd_create`/`timerfd_settime` error (a kernel or sandbox without
    /// `TFD_TIMER_CANCEL_ON_SET`), or the reactor's.
    pub fn new() -> io::Result<ClockSteps> {
        let timer = TimerFd::new(ClockId::CLOCK_REALTIME, TimerFlags::TFD_NONBLOCK | TimerFlags::TFD_CLOEXEC)?;
        arm(&timer)?;
        // SAFETY: the ClockSteps owns the timer until it is dropped, and never swaps it.
        let fd = unsafe { AsyncFd::register_with_interest(Timer(timer), tokio::io::Interest::READABLE) }?;
        Ok(ClockSteps { fd })
    }

    /// Returns once the wall clock was set since the previous return (or since `new`).
    /// Cancel-safe: a step seen by a dropped call is seen by the next one.
    ///
    /// # Errors
    /// A read of the timer that fails otherwise than by the step, or a failure to arm it
    /// again.
    pub async fn stepped(&mut self) -> io::Result<()> {
        loop {
            let mut ready = self.fd.readable().await?;
            match ready.get_inner().0.wait() {
                // Canceled by a step (or expired, after a year): arm again for the next.
                Ok(()) => {
                    arm(&ready.get_inner().0)?;
                    return Ok(());
                }
                Err(Errno::EAGAIN) => ready.clear_ready(),
                Err(e) => return Err(e.into()),
            }
        }
    }
}

fn arm(timer: &TimerFd) -> io::Result<()> {
    let now = nix::time::clock_gettime(nix::time::ClockId::CLOCK_REALTIME)?;
    let at = Expiration::OneShot(TimeSpec::new(now.tv_sec().saturating_add(ARMED_AHEAD_SECS), 0));
    timer.set(at, TimerSetTimeFlags::TFD_TIMER_ABSTIME | TimerSetTimeFlags::TFD_TIMER_CANCEL_ON_SET)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use nix::time::{clock_gettime, clock_settime, ClockId};

    use super::*;

    /// Quiet while nobody sets the clock; wakes when it is set (to the value it has, a
    /// step of a few microseconds at most), once per step.
    #[tokio::test]
    async fn wakes_when_the_wall_clock_is_set_and_only_then() {
        let mut steps = ClockSteps::new().expect("timerfd");
        let quiet = tokio::time::timeout(Duration::from_millis(300), steps.stepped()).await;
        assert!(quiet.is_err(), "woke without a step: {quiet:?}");
        let now = clock_gettime(ClockId::CLOCK_REALTIME).expect("clock");
        match clock_settime(ClockId::CLOCK_REALTIME, now) {
            Err(Errno::EPERM) => {
                eprintln!("not allowed to set the clock here (no CAP_SYS_TIME): only quietness checked");
                return;
            }
            other => other.expect("clock_settime"),
        }
        let woke = tokio::time::timeout(Duration::from_secs(2), steps.stepped()).await;
        assert!(matches!(woke, Ok(Ok(()))), "a step did not wake it: {woke:?}");
        let again = tokio::time::timeout(Duration::from_millis(300), steps.stepped()).await;
        assert!(again.is_err(), "one step woke it twice");
    }
}
