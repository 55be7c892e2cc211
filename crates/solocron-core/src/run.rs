//! Ticks, run identities, run states and run records: the vocabulary shared by the
//! engine, every store and the CLI.

use std::fmt;
use std::time::Duration;

use chrono::{DateTime, Datelike, SecondsFormat, Timelike, Utc};

/// Most bytes of a run's output kept in its record (the tail).
pub const OUTPUT_TAIL_BYTES_MAX: usize = 4096;

/// One scheduled run of one job: (job name, scheduled instant in UTC).
///
/// The instant comes from the schedule, never from the moment a node woke up, so every
/// node computes the same tick for the same run.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tick {
    /// The job's name.
    pub job: String,
    /// The scheduled instant, in UTC, at millisecond precision.
    pub scheduled_at: DateTime<Utc>,
}

impl Tick {
    /// A tick; the instant is truncated to milliseconds, the precision every store keeps.
    pub fn new(job: impl Into<String>, scheduled_at: DateTime<Utc>) -> Tick {
        let ms = scheduled_at.timestamp_millis();
        Tick { job: job.into(), scheduled_at: DateTime::from_timestamp_millis(ms).expect("in range") }
    }
}

/// One attempt at one tick. Attempt 1 is the first claim; a crash retry is attempt 2, ...
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RunId {
    /// The tick this attempt belongs to.
    pub tick: Tick,
    /// 1 for the first claim, then one more for each retry.
    pub attempt: u32,
}

impl RunId {
    /// The run's id as text ([`Display`](fmt::Display)'s), in a string allocated once at
    /// its length: what a run's context carries, written for every run.
    pub fn text(&self) -> String {
        use fmt::Write;
        // job, '@', 24 bytes of instant, '#', at most 10 digits.
        let mut text = String::with_capacity(self.tick.job.len() + 36);
        write!(text, "{self}").expect("a String takes every write");
        text
    }
}

impl fmt::Display for RunId {
    /// `job@2026-01-01T00:00:00.000Z#1`: stable, unique across the fleet, readable.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The UTC fields read once from the naive instant (a `DateTime`'s accessors each
        // convert it to its zone first).
        let at = self.tick.scheduled_at.naive_utc();
        // Written digit by digit: chrono's RFC 3339 writer builds a `String` first and
        // padded `write!` fields are slow, and a run id is written for every run (its
        // context's `run_id`). Same text for the years it covers; others (never a
        // schedule's) take chrono's.
        if !(0..=9999).contains(&at.year()) {
            let rfc = self.tick.scheduled_at.to_rfc3339_opts(SecondsFormat::Millis, true);
            return write!(f, "{}@{rfc}#{}", self.tick.job, self.attempt);
        }
        let mut text = *b"0000-00-00T00:00:00.000Z#0000000000";
        let fields = [
            (0, 4, at.year().unsigned_abs()),
            (5, 2, at.month()),
            (8, 2, at.day()),
            (11, 2, at.hour()),
            (14, 2, at.minute()),
            (17, 2, at.second()),
            (20, 3, (at.nanosecond() / 1_000_000).min(999)),
        ];
        for (start, width, mut value) in fields {
            for i in (start..start + width).rev() {
                text[i] = b'0' + (value % 10) as u8;
                value /= 10;
            }
        }
        // The attempt's digits, right-aligned after '#', then moved up to it.
        let (mut attempt, mut end) = (self.attempt, text.len());
        loop {
            end -= 1;
            text[end] = b'0' + (attempt % 10) as u8;
            attempt /= 10;
            if attempt == 0 {
                break;
            }
        }
        text.copy_within(end.., 25);
        let len = 25 + (text.len() - end);
        f.write_str(&self.tick.job)?;
        f.write_str("@")?;
        f.write_str(std::str::from_utf8(&text[..len]).expect("ASCII digits"))
    }
}

/// How a tick came to be claimed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Trigger {
    /// On time, by the schedule.
    Schedule,
    /// Late, by the misfire policy after the tick was missed.
    Catchup,
    /// A retry of an earlier attempt: one that crashed ([`crate::OnCrash`]) or failed
    /// ([`crate::RetryPolicy`]).
    Retry,
    /// By an operator (`solocron trigger`).
    Manual,
}

/// Where a run is in its life. Only `Running` and `Waiting` are not terminal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RunState {
    /// Claimed; its owner holds a lease and renews it.
    Running,
    /// The job ended successfully.
    Succeeded,
    /// The job ended with an error (non-zero exit).
    Failed,
    /// The job ran past its `timeout` and was stopped.
    TimedOut,
    /// The owner lost its lease (renewal refused or store unreachable past its deadline, or
    /// its lease expired and another node retried the tick).
    Lost,
    /// The owner vanished (lease expired) and the tick was not re-run, or an operator ended it.
    Abandoned,
    /// The tick was recorded without running (overlap, missed, paused).
    Skipped,
    /// The node shut down and stopped the job before it finished.
    Interrupted,
    /// A retry of a failed attempt, waiting for its backoff to pass: from `lease_until`
    /// (its not-before, by the store's clock) any node may start it ([`crate::RunStore::recover`]).
    /// It holds no token and no lease.
    Waiting,
}

string_enum!("The lower-case name used in stores, logs and output.", RunState {
    Running => "running",
    Succeeded => "succeeded",
    Failed => "failed",
    TimedOut => "timed_out",
    Lost => "lost",
    Abandoned => "abandoned",
    Skipped => "skipped",
    Interrupted => "interrupted",
    Waiting => "waiting",
}, |other, valid| format!("unknown RunState `{other}`; expected one of: {valid}"));

string_enum!(
    "The lower-case name used in stores, logs and output.",
    Trigger { Schedule => "schedule", Catchup => "catchup", Retry => "retry", Manual => "manual" },
    |other, valid| format!("unknown Trigger `{other}`; expected one of: {valid}")
);

impl RunState {
    /// True for every state a run can end in (all but `Running` and `Waiting`).
    pub fn is_terminal(self) -> bool {
        !matches!(self, RunState::Running | RunState::Waiting)
    }
}

/// A run as the store keeps it: the history.
#[derive(Debug, Clone, PartialEq)]
pub struct RunRecord {
    /// Which attempt at which tick.
    pub id: RunId,
    /// How the tick came to be claimed.
    pub trigger: Trigger,
    /// The node that claimed it.
    pub node: String,
    /// The fencing token handed to the job; `None` for a run recorded as skipped.
    pub fencing_token: Option<u64>,
    /// Where the run is.
    pub state: RunState,
    /// Why it is in that state, where that is worth saying (skipped, lost, abandoned).
    pub reason: Option<String>,
    /// When it was claimed (store clock).
    pub claimed_at: DateTime<Utc>,
    /// When the job started.
    pub started_at: Option<DateTime<Utc>>,
    /// When it reached its end state (store clock).
    pub finished_at: Option<DateTime<Utc>>,
    /// Until when the owner's lease runs (store clock), while running.
    pub lease_until: Option<DateTime<Utc>>,
    /// The command's exit code, where there is one.
    pub exit_code: Option<i32>,
    /// The last [`OUTPUT_TAIL_BYTES_MAX`] bytes of the job's output.
    pub output: String,
}

impl RunRecord {
    /// How long the job ran, when it has started and ended.
    pub fn duration(&self) -> Option<Duration> {
        let (s, f) = (self.started_at?, self.finished_at?);
        (f - s).to_std().ok()
    }
}

/// Keeps the last `OUTPUT_TAIL_BYTES_MAX` bytes of `s`, cut on a character boundary.
pub fn output_tail(s: &str) -> &str {
    if s.len() <= OUTPUT_TAIL_BYTES_MAX {
        return s;
    }
    let mut start = s.len() - OUTPUT_TAIL_BYTES_MAX;
    while !s.is_char_boundary(start) {
        start += 1;
    }
    &s[start..]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_id_reads_well_and_is_unique_per_attempt() {
        let tick = Tick::new("backup", "2026-01-01T00:00:00.123456Z".parse().unwrap());
        let id = RunId { tick: tick.clone(), attempt: 2 };
        assert_eq!(id.to_string(), "backup@2026-01-01T00:00:00.123Z#2");
        assert_ne!(id, RunId { tick, attempt: 1 });
        // Field by field, the same text as chrono's RFC 3339, far years included.
        for at in
            ["1970-01-01T00:00:00Z", "2026-12-31T23:59:59.999Z", "0042-03-04T05:06:07.089Z", "+12026-01-01T00:00:00Z"]
        {
            let at: DateTime<Utc> = at.parse().unwrap();
            let id = RunId { tick: Tick::new("j", at), attempt: 1 };
            assert_eq!(id.to_string(), format!("j@{}#1", at.to_rfc3339_opts(SecondsFormat::Millis, true)));
        }
        // Every attempt's digits, and the same text from `text` as from `Display`.
        let at: DateTime<Utc> = "2026-05-06T07:08:09.010Z".parse().unwrap();
        for attempt in [1, 9, 10, 99, 100, 12345, u32::MAX] {
            let id = RunId { tick: Tick::new("j", at), attempt };
            assert_eq!(id.to_string(), format!("j@2026-05-06T07:08:09.010Z#{attempt}"));
            assert_eq!(id.text(), id.to_string());
        }
    }

    #[test]
    fn states_round_trip_and_unknown_names_say_what_is_allowed() {
        for s in ["running", "succeeded", "failed", "timed_out", "lost", "abandoned", "skipped", "interrupted"] {
            assert_eq!(s.parse::<RunState>().unwrap().as_str(), s);
        }
        let e = "done".parse::<RunState>().unwrap_err();
        assert!(e.contains("succeeded"), "{e}");
        assert!(!RunState::Running.is_terminal());
        assert!(RunState::Lost.is_terminal());
    }

    #[test]
    fn output_tail_keeps_the_end_on_a_char_boundary() {
        let s = format!("{}{}", "é".repeat(3000), "end");
        let t = output_tail(&s);
        assert!(t.len() <= OUTPUT_TAIL_BYTES_MAX);
        assert!(t.ends_with("end"));
    }
}
