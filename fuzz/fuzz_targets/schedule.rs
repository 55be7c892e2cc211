//! `Schedule::parse(expr, zone)`, then the ticks of what it accepts.
//!
//! Input: `expr`, optionally followed by a newline and an IANA zone (UTC without one).
//! What must hold: parsing never panics; an accepted schedule keeps the expression and zone
//! it was given; `next_after` returns (croner stops at year 5000) an instant strictly after
//! its input; forward and backward enumeration of one window agree, strictly increasing and
//! inside the window; a refused expression says which expression it refused.
#![no_main]

use chrono::{DateTime, Duration, Utc};
use libfuzzer_sys::fuzz_target;
use solocron_core::{Schedule, ScheduleError};

/// Instants the ticks are computed after: an ordinary one, and the spring-forward and
/// fall-back hours of 2026 in most of Europe (where a bad DST rule would show).
const AFTER: [&str; 3] = ["2026-01-01T00:00:00Z", "2026-03-29T00:30:00Z", "2026-10-25T00:30:00Z"];

/// The window enumerated after each instant, and most ticks taken from it.
const WINDOW_HOURS: i64 = 3;
const TICKS_MAX: usize = 64;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let (expr, zone) = text.split_once('\n').unwrap_or((text, "UTC"));
    match Schedule::parse(expr, zone) {
        Ok(schedule) => check_ticks(&schedule, expr),
        Err(e) => check_error(&e, expr, zone),
    }
});

fn check_ticks(schedule: &Schedule, expr: &str) {
    assert_eq!(schedule.expr(), expr);
    for after in AFTER {
        let after: DateTime<Utc> = after.parse().expect("a valid instant");
        let next = schedule.next_after(after);
        if let Some(next) = next {
            assert!(next > after, "{expr:?} in {}: next_after({after}) = {next}", schedule.zone());
        }
        let until = after + Duration::hours(WINDOW_HOURS);
        let forward = schedule.ticks_between(after, until, TICKS_MAX);
        assert!(forward.windows(2).all(|w| w[0] < w[1]), "{expr:?}: forward ticks not increasing: {forward:?}");
        assert!(forward.iter().all(|t| *t > after && *t <= until), "{expr:?}: a tick outside the window");
        assert_eq!(forward.first().copied(), next.filter(|n| *n <= until), "{expr:?}: first tick is not next_after");
        let backward = schedule.newest_ticks_between(after, until, TICKS_MAX);
        assert!(backward.windows(2).all(|w| w[0] < w[1]), "{expr:?}: backward ticks not increasing");
        assert!(backward.iter().all(|t| *t > after && *t <= until), "{expr:?}: a tick outside the window");
        if forward.len() < TICKS_MAX && backward.len() < TICKS_MAX {
            assert_eq!(forward, backward, "{expr:?} in {}: forward and backward disagree", schedule.zone());
        }
    }
}

fn check_error(e: &ScheduleError, expr: &str, zone: &str) {
    let shown = e.to_string();
    match e {
        ScheduleError::TimeZone(z) => assert_eq!(z, zone),
        ScheduleError::FieldCount { expr: x, .. } | ScheduleError::Field { expr: x, .. } => {
            assert_eq!(x, expr);
            assert!(shown.contains(expr), "{shown}");
        }
        ScheduleError::Expression { expr: x, .. } => assert_eq!(x, expr.trim()),
    }
}
