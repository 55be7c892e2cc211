//! Cron schedules in a time zone, and the ticks they produce.
//!
//! Parsing and next-fire computation are croner's (5 or 6 fields, macros, `L`/`W`/`#`,
//! POSIX weekdays, OCPS daylight-saving rules). This module adds what croner does not:
//! an error that names the offending field, and iteration in UTC instants.

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, Mutex, Weak};

use chrono::{DateTime, TimeZone, Utc};
use chrono_tz::Tz;
use croner::parser::{CronParser, Seconds, Year};
use croner::{Cron, YEAR_UPPER_LIMIT};

/// Field names, in order, of a 6-field expression (seconds first).
const FIELDS_6: [&str; 6] = ["second", "minute", "hour", "day-of-month", "month", "day-of-week"];

/// What each field allows, in the order of [`FIELDS_6`].
const ALLOWED_6: [&str; 6] =
    ["0-59", "0-59", "0-23", "1-31, L, W", "1-12 or JAN-DEC", "0-7 (0 and 7 are Sunday) or SUN-SAT, #, L"];

/// Years after which the Gregorian calendar, weekdays included, repeats (146,097 days).
const CALENDAR_CYCLE_YEARS: i32 = 400;

/// Why an expression that matches no date at all is refused.
const NEVER_FIRES: &str =
    "it matches no moment in any year (like February 30, or a field that allows nothing), so the job would never run";

/// Most ticks [`Schedule::ticks_between`] will enumerate in one call.
pub const TICKS_ENUMERATED_MAX: usize = 100_000;

/// Why a schedule was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    /// The expression has the wrong number of fields.
    #[error("cron expression `{expr}` has {count} fields; expected 5 (minute hour day-of-month month day-of-week) or 6 (second first)")]
    FieldCount {
        /// The expression as written.
        expr: String,
        /// How many whitespace-separated fields it has.
        count: usize,
    },
    /// One field is not valid.
    #[error("cron expression `{expr}`: the {field} field `{value}` is invalid: {why}")]
    Field {
        /// The expression as written.
        expr: String,
        /// The field's name (`minute`, `day-of-week`, ...).
        field: &'static str,
        /// The field's text.
        value: String,
        /// croner's explanation.
        why: String,
    },
    /// The expression is invalid as a whole (an unknown macro, say).
    #[error("cron expression `{expr}` is invalid: {why}")]
    Expression {
        /// The expression as written.
        expr: String,
        /// croner's explanation.
        why: String,
    },
    /// The time zone is not an IANA zone name.
    #[error("unknown time zone `{0}`; use an IANA name such as \"UTC\", \"Europe/Berlin\" or \"Asia/Shanghai\"")]
    TimeZone(String),
}

/// A cron expression bound to a time zone.
///
/// ```
/// use solocron_core::Schedule;
/// let s = Schedule::parse("0 30 2 * * *", "Europe/Berlin").unwrap();
/// let after = "2026-03-28T12:00:00Z".parse().unwrap();
/// // 02:30 does not exist on 2026-03-29 in Berlin (spring forward): it fires once, at 03:00 CEST.
/// assert_eq!(s.next_after(after).unwrap().to_rfc3339(), "2026-03-29T01:00:00+00:00");
/// ```
#[derive(Clone)]
pub struct Schedule {
    /// As written; shared by the clones of a schedule (a daemon keeps a job's in its list,
    /// in the API's list of declared jobs, and in a reload's).
    expr: Arc<str>,
    zone: Tz,
    /// Shared by every schedule with the same expression (see [`interned`]).
    cron: Arc<Parsed>,
}

/// A parsed expression and the fire instants it computed last.
///
/// Jobs of one expression come due at the same instants, and each tick asks the same few
/// questions (the first tick after the last round's horizon, after the tick itself): a
/// croner walk costs microseconds, a look in [`Memo`] a few dozen instructions, so the
/// fleet's per-run CPU does not grow with how many jobs share a schedule.
struct Parsed {
    cron: Cron,
    memo: Mutex<Memo>,
}

/// How many answers of `next_after` a parsed expression remembers: the questions of about
/// two rounds (the round's horizon, the previous one, the tick).
const MEMO_ENTRIES: usize = 4;

/// One answer of `next_after`: the zone and instant asked, the instant answered.
type Answer = (Tz, DateTime<Utc>, Option<DateTime<Utc>>);

/// The last answers of `next_after` for one expression: `(zone, after) → next`. Written
/// round robin; a pure function's answers, so never stale.
#[derive(Default)]
struct Memo {
    entries: [Option<Answer>; MEMO_ENTRIES],
    next_slot: usize,
}

impl Memo {
    fn get(&self, zone: Tz, after: DateTime<Utc>) -> Option<Option<DateTime<Utc>>> {
        self.entries.iter().flatten().find(|(z, a, _)| *a == after && *z == zone).map(|(_, _, next)| *next)
    }

    fn put(&mut self, zone: Tz, after: DateTime<Utc>, next: Option<DateTime<Utc>>) {
        self.entries[self.next_slot] = Some((zone, after, next));
        self.next_slot = (self.next_slot + 1) % MEMO_ENTRIES;
    }
}

impl fmt::Debug for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Schedule({:?} in {})", self.expr, self.zone)
    }
}

fn parser() -> CronParser {
    CronParser::builder().seconds(Seconds::Optional).year(Year::Disallowed).build()
}

/// Parsed expressions alive in this process, by their text. A parsed croner pattern holds a
/// bitfield of every year it can fire in (about 5 KB), so 10,000 jobs on `@hourly` would
/// otherwise carry 50 MB of identical copies; they share one.
static PARSED: Mutex<Option<HashMap<String, Weak<Parsed>>>> = Mutex::new(None);

/// The parsed form of `expr`, shared with every live schedule of the same text.
fn interned(expr: &str) -> Result<Arc<Parsed>, ScheduleError> {
    if let Some(cron) = PARSED.lock().expect("not poisoned").as_ref().and_then(|m| m.get(expr)?.upgrade()) {
        return Ok(cron);
    }
    let cron =
        parser().parse(expr).map_err(|e| ScheduleError::Expression { expr: expr.to_owned(), why: e.to_string() })?;
    // A pattern that matches nothing (`0 0 30 2 *`) parses, but then every `next_after`
    // walks to croner's year 5000 before it answers `None` (seconds per call), and the job
    // silently never runs: refuse it here, once per expression.
    if !fires_ever(&cron) {
        return Err(ScheduleError::Expression { expr: expr.to_owned(), why: NEVER_FIRES.into() });
    }
    let cron = Arc::new(Parsed { cron, memo: Mutex::default() });
    let mut parsed = PARSED.lock().expect("not poisoned");
    let map = parsed.get_or_insert_with(HashMap::new);
    // Bounded by the live expressions: dead entries go whenever the map doubles.
    if map.len() >= 64 && map.len().is_power_of_two() {
        map.retain(|_, weak| weak.strong_count() > 0);
    }
    // Another thread may have parsed the same text meanwhile: keep the one already shared.
    match map.get(expr).and_then(Weak::upgrade) {
        Some(shared) => Ok(shared),
        None => {
            map.insert(expr.to_owned(), Arc::downgrade(&cron));
            Ok(cron)
        }
    }
}

/// Whether `cron` has a tick at all. A time of day no field allows is seen at once; for the
/// date fields, the Gregorian calendar repeats every [`CALENDAR_CYCLE_YEARS`] (a whole
/// number of weeks, so weekdays repeat too): a pattern with no tick in one cycle has none
/// ever, so the walk starts one cycle (and a year) before croner's last year, not at 1970.
fn fires_ever(cron: &Cron) -> bool {
    let p = &cron.pattern;
    let any = |count: u32, matches: &dyn Fn(u32) -> Result<bool, croner::errors::CronError>| {
        (0..count).any(|v| matches(v).unwrap_or(false))
    };
    if !any(60, &|s| p.second_match(s)) || !any(60, &|m| p.minute_match(m)) || !any(24, &|h| p.hour_match(h)) {
        return false;
    }
    let cycle_start = Utc.with_ymd_and_hms(YEAR_UPPER_LIMIT - CALENDAR_CYCLE_YEARS - 1, 1, 1, 0, 0, 0).single();
    cycle_start.is_some_and(|start| cron.find_next_occurrence(&start, false).is_ok())
}

impl Schedule {
    /// Parses `expr` (5 or 6 fields, or a macro such as `@hourly`) in the IANA zone `zone`.
    pub fn parse(expr: &str, zone: &str) -> Result<Schedule, ScheduleError> {
        let zone = Tz::from_str(zone.trim()).map_err(|_| ScheduleError::TimeZone(zone.to_owned()))?;
        let trimmed = expr.trim();
        let fields: Vec<&str> = trimmed.split_whitespace().collect();
        let is_macro = trimmed.starts_with('@');
        if !is_macro && fields.len() != 5 && fields.len() != 6 {
            return Err(ScheduleError::FieldCount { expr: expr.to_owned(), count: fields.len() });
        }
        // The whole expression first (one lookup when another schedule shares it); only a
        // refused one is taken apart to name its bad field: probing each field costs six
        // parses, which made 100,000 jobs slow to build.
        match interned(trimmed) {
            Ok(cron) => Ok(Schedule { expr: expr.into(), zone, cron }),
            Err(whole) if is_macro => Err(whole),
            Err(whole) => check_fields(expr, &fields).and(Err(whole)),
        }
    }
    /// A clone whose text is allocated anew (the parsed expression is still shared): what
    /// a long-lived owner keeps of a schedule parsed on a short-lived thread, so that the
    /// memory of that thread's malloc arena can be given back whole once it is freed.
    ///
    /// ```
    /// let s = solocron_core::Schedule::parse("@hourly", "UTC").unwrap();
    /// assert_eq!(s.detached().expr(), s.expr());
    /// ```
    #[must_use]
    pub fn detached(&self) -> Schedule {
        Schedule { expr: Arc::from(&*self.expr), zone: self.zone, cron: Arc::clone(&self.cron) }
    }

    /// The expression as written.
    pub fn expr(&self) -> &str {
        &self.expr
    }

    /// The time zone the expression is read in.
    pub fn zone(&self) -> Tz {
        self.zone
    }

    /// The schedule in words (croner's English description), for people reading a console.
    ///
    /// ```
    /// let s = solocron_core::Schedule::parse("0 12 * * MON-FRI", "UTC").unwrap();
    /// assert!(s.describe().contains("12"));
    /// ```
    pub fn describe(&self) -> String {
        self.cron.cron.describe()
    }

    /// The first fire instant strictly after `after`, or `None` if there is none.
    pub fn next_after(&self, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        // Another thread asking at the same moment computes for itself rather than wait.
        if let Some(next) = self.cron.memo.try_lock().ok().and_then(|m| m.get(self.zone, after)) {
            debug_assert!(next.is_none_or(|n| n > after));
            return next;
        }
        let local = after.with_timezone(&self.zone);
        let next = self.cron.cron.find_next_occurrence(&local, false).ok().map(|t| t.with_timezone(&Utc));
        if let Ok(mut memo) = self.cron.memo.try_lock() {
            memo.put(self.zone, after, next);
        }
        next
    }

    /// The newest fire instants in `(after, until]`, oldest first, at most `limit`
    /// (and never more than [`TICKS_ENUMERATED_MAX`]). Walks backwards from `until`, so a
    /// huge window costs only `limit` steps and never drops the newest ticks.
    pub fn newest_ticks_between(&self, after: DateTime<Utc>, until: DateTime<Utc>, limit: usize) -> Vec<DateTime<Utc>> {
        let limit = limit.min(TICKS_ENUMERATED_MAX);
        if limit == 0 {
            return Vec::new();
        }
        // The common question (one round of one job): no tick or one in the window. Two
        // steps forward, usually remembered, answer it; more ticks take the walk back.
        let first = match self.next_after(after) {
            Some(first) if first <= until => first,
            _ => return Vec::new(),
        };
        if self.next_after(first).is_none_or(|second| second > until) {
            return vec![first];
        }
        let mut out = Vec::new();
        let mut cursor = until.with_timezone(&self.zone);
        let mut inclusive = true;
        while out.len() < limit {
            match self.cron.cron.find_previous_occurrence(&cursor, inclusive) {
                Ok(t) if t.with_timezone(&Utc) > after => {
                    out.push(t.with_timezone(&Utc));
                    cursor = t;
                    inclusive = false;
                }
                _ => break,
            }
        }
        out.reverse();
        debug_assert!(out.windows(2).all(|w| w[0] < w[1]));
        out
    }

    /// Fire instants in `(after, until]`, oldest first, at most `limit`
    /// (and never more than [`TICKS_ENUMERATED_MAX`]).
    pub fn ticks_between(&self, after: DateTime<Utc>, until: DateTime<Utc>, limit: usize) -> Vec<DateTime<Utc>> {
        let limit = limit.min(TICKS_ENUMERATED_MAX);
        let mut out = Vec::new();
        let mut cursor = after;
        while out.len() < limit {
            match self.next_after(cursor) {
                Some(t) if t <= until => {
                    debug_assert!(t > cursor, "a schedule must move forward");
                    out.push(t);
                    cursor = t;
                }
                _ => break,
            }
        }
        out
    }
}

/// Finds the first invalid field by parsing each one alone, so the error can name it.
fn check_fields(expr: &str, fields: &[&str]) -> Result<(), ScheduleError> {
    let skip = 6 - fields.len();
    for (i, ((value, name), allowed)) in fields.iter().zip(&FIELDS_6[skip..]).zip(&ALLOWED_6[skip..]).enumerate() {
        let probe: Vec<&str> = (0..fields.len()).map(|j| if j == i { *value } else { "*" }).collect();
        if let Err(e) = parser().parse(&probe.join(" ")) {
            let why = match e {
                croner::errors::CronError::ComponentError(m)
                | croner::errors::CronError::InvalidPattern(m)
                | croner::errors::CronError::IllegalCharacters(m) => m,
                other => other.to_string(),
            };
            let why = format!("{why} (allowed: {allowed})");
            return Err(ScheduleError::Field { expr: expr.to_owned(), field: name, value: (*value).to_owned(), why });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    #[test]
    fn schedules_of_one_expression_share_the_parsed_pattern_whatever_their_zone() {
        let a = Schedule::parse("0 17 3 * * *", "UTC").unwrap();
        let b = Schedule::parse(" 0 17 3 * * * ", "Asia/Tokyo").unwrap();
        let c = Schedule::parse("0 18 3 * * *", "UTC").unwrap();
        assert!(Arc::ptr_eq(&a.cron, &b.cron) && !Arc::ptr_eq(&a.cron, &c.cron));
        // Sharing the pattern does not share the zone.
        let after = at("2026-06-01T00:00:00Z");
        assert_eq!(a.next_after(after).unwrap(), at("2026-06-01T03:17:00Z"));
        assert_eq!(b.next_after(after).unwrap(), at("2026-06-01T18:17:00Z"));
        // Once every schedule of an expression is gone, its pattern is freed.
        let weak = Arc::downgrade(&a.cron);
        drop((a, b));
        assert!(weak.upgrade().is_none());
    }

    #[test]
    fn five_and_six_fields_and_macros_are_accepted() {
        let every_minute = Schedule::parse("* * * * *", "UTC").unwrap();
        assert_eq!(every_minute.next_after(at("2026-01-01T00:00:30Z")), Some(at("2026-01-01T00:01:00Z")));
        let every_5s = Schedule::parse("*/5 * * * * *", "UTC").unwrap();
        assert_eq!(every_5s.next_after(at("2026-01-01T00:00:01Z")), Some(at("2026-01-01T00:00:05Z")));
        let hourly = Schedule::parse("@hourly", "UTC").unwrap();
        assert_eq!(hourly.next_after(at("2026-01-01T00:10:00Z")), Some(at("2026-01-01T01:00:00Z")));
        let list_range = Schedule::parse("0 0 9-17/4 * * MON,FRI", "UTC").unwrap();
        // 2026-01-02 is a Friday.
        assert_eq!(list_range.next_after(at("2026-01-01T18:00:00Z")), Some(at("2026-01-02T09:00:00Z")));
    }

    #[test]
    fn weekdays_are_posix_zero_is_sunday() {
        let sundays = Schedule::parse("0 12 * * 0", "UTC").unwrap();
        // 2026-01-04 is a Sunday.
        assert_eq!(sundays.next_after(at("2026-01-01T00:00:00Z")), Some(at("2026-01-04T12:00:00Z")));
    }

    #[test]
    fn a_bad_field_is_named_with_the_reason() {
        let e = Schedule::parse("0 61 * * * *", "UTC").unwrap_err();
        assert!(matches!(e, ScheduleError::Field { field: "minute", .. }), "{e}");
        let e = Schedule::parse("* * 32 * *", "UTC").unwrap_err();
        assert!(matches!(e, ScheduleError::Field { field: "day-of-month", .. }), "{e}");
        let e = Schedule::parse("* * * * BLA", "UTC").unwrap_err();
        assert!(matches!(e, ScheduleError::Field { field: "day-of-week", .. }), "{e}");
        let e = Schedule::parse("* * *", "UTC").unwrap_err();
        assert!(e.to_string().contains("has 3 fields"), "{e}");
        let e = Schedule::parse("@fortnightly", "UTC").unwrap_err();
        assert!(matches!(e, ScheduleError::Expression { .. }), "{e}");
    }

    #[test]
    fn an_expression_matching_no_date_is_refused_at_once() {
        // Found by fuzzing (fuzz/ target `schedule`): each of these parsed (`,` allows no
        // minute, a lone `L` no weekday), then every next_after walked to the year 5000
        // (seconds) to return None, and the job never ran.
        for expr in ["0 0 30 2 *", "0 0 31 4 *", "0 0 0 31 JUN,SEP,NOV *", ", 0 ? * 7", "0 0 * * L"] {
            let started = std::time::Instant::now();
            let e = Schedule::parse(expr, "UTC").unwrap_err();
            assert!(matches!(e, ScheduleError::Expression { .. }), "{expr}: {e}");
            assert!(e.to_string().contains("matches no moment"), "{expr}: {e}");
            assert!(started.elapsed() < std::time::Duration::from_secs(30), "{expr}: refused too slowly");
        }
        // A date that exists only in some years is not refused.
        let leap = Schedule::parse("0 0 29 2 *", "UTC").unwrap();
        assert_eq!(leap.next_after(at("2026-01-01T00:00:00Z")), Some(at("2028-02-29T00:00:00Z")));
    }

    #[test]
    fn unknown_zone_is_refused() {
        let e = Schedule::parse("* * * * *", "Mars/Olympus").unwrap_err();
        assert_eq!(e, ScheduleError::TimeZone("Mars/Olympus".into()));
    }

    #[test]
    fn zone_moves_the_instant() {
        let s = Schedule::parse("0 0 1 * * *", "Asia/Shanghai").unwrap();
        assert_eq!(s.next_after(at("2026-06-01T00:00:00Z")), Some(at("2026-06-01T17:00:00Z")));
    }

    #[test]
    fn remembered_answers_are_the_computed_ones_and_zones_never_share_them() {
        let (shanghai, utc) =
            (Schedule::parse("0 0 1 * * *", "Asia/Shanghai").unwrap(), Schedule::parse("0 0 1 * * *", "UTC").unwrap());
        let after = at("2026-06-01T00:00:00Z");
        // Asked in turns, more often than the memo holds: each zone keeps its own answer.
        for _ in 0..2 * MEMO_ENTRIES {
            assert_eq!(shanghai.next_after(after), Some(at("2026-06-01T17:00:00Z")));
            assert_eq!(utc.next_after(after), Some(at("2026-06-01T01:00:00Z")));
        }
        // The window's short path (one tick) and the walk (several) agree with the steps.
        let every = Schedule::parse("* * * * * *", "UTC").unwrap();
        assert_eq!(every.newest_ticks_between(after, at("2026-06-01T00:00:01Z"), 5), vec![at("2026-06-01T00:00:01Z")]);
        assert_eq!(every.newest_ticks_between(after, at("2026-06-01T00:00:00.500Z"), 5), Vec::<DateTime<Utc>>::new());
        assert_eq!(
            every.newest_ticks_between(after, at("2026-06-01T00:00:03Z"), 5),
            every.ticks_between(after, at("2026-06-01T00:00:03Z"), 5)
        );
        assert_eq!(every.newest_ticks_between(after, at("2026-06-01T00:00:03Z"), 0), Vec::<DateTime<Utc>>::new());
    }

    #[test]
    fn spring_forward_gap_fires_once_not_twice() {
        // America/New_York skips 02:00-03:00 on 2026-03-08.
        let s = Schedule::parse("0 30 2 * * *", "America/New_York").unwrap();
        let ticks = s.ticks_between(at("2026-03-07T00:00:00Z"), at("2026-03-10T00:00:00Z"), 10);
        assert_eq!(ticks.len(), 3, "{ticks:?}");
        assert_eq!(ticks[0], at("2026-03-07T07:30:00Z")); // 02:30 EST
        assert_eq!(ticks[1], at("2026-03-08T07:00:00Z")); // the gap: first instant after it, 03:00 EDT
        assert_eq!(ticks[2], at("2026-03-09T06:30:00Z")); // 02:30 EDT
    }

    #[test]
    fn repeated_hour_fires_once_for_a_fixed_time_job() {
        // America/New_York repeats 01:00-02:00 on 2026-11-01.
        let s = Schedule::parse("0 30 1 * * *", "America/New_York").unwrap();
        let ticks = s.ticks_between(at("2026-11-01T00:00:00Z"), at("2026-11-02T00:00:00Z"), 10);
        assert_eq!(ticks, vec![at("2026-11-01T05:30:00Z")], "fires once, in the first 01:30");
    }

    #[test]
    fn interval_job_keeps_its_pace_through_the_repeated_hour() {
        // America/New_York falls back on 2026-11-01 at 06:00Z (02:00 EDT becomes 01:00 EST),
        // so the local hour 01:00 happens twice. An hourly job runs every real hour through
        // the change: in both 01:00s (one an hour after the other), neither skipped nor run
        // twice at one instant, 5 ticks in these 5 real hours.
        let s = Schedule::parse("0 0 * * * *", "America/New_York").unwrap();
        let (after, until) = (at("2026-11-01T03:30:00Z"), at("2026-11-01T08:30:00Z"));
        let want = vec![
            at("2026-11-01T04:00:00Z"), // 00:00 EDT
            at("2026-11-01T05:00:00Z"), // 01:00 EDT, the first 01:00
            at("2026-11-01T06:00:00Z"), // 01:00 EST, the repeated 01:00
            at("2026-11-01T07:00:00Z"), // 02:00 EST
            at("2026-11-01T08:00:00Z"), // 03:00 EST
        ];
        assert_eq!(s.ticks_between(after, until, 10), want);
        assert_eq!(s.newest_ticks_between(after, until, 10), want, "walking back agrees");
    }

    #[test]
    fn newest_ticks_walk_back_from_the_end_of_a_huge_window() {
        let s = Schedule::parse("* * * * * *", "UTC").unwrap();
        let t = s.newest_ticks_between(at("2020-01-01T00:00:00Z"), at("2026-01-01T00:00:10Z"), 3);
        assert_eq!(t, vec![at("2026-01-01T00:00:08Z"), at("2026-01-01T00:00:09Z"), at("2026-01-01T00:00:10Z")]);
        let d = Schedule::parse("0 30 2 * * *", "America/New_York").unwrap();
        let forward = d.ticks_between(at("2026-03-01T00:00:00Z"), at("2026-03-20T00:00:00Z"), 100);
        let backward = d.newest_ticks_between(at("2026-03-01T00:00:00Z"), at("2026-03-20T00:00:00Z"), 100);
        assert_eq!(forward, backward, "both directions agree across a DST change");
    }

    #[test]
    fn ticks_between_is_bounded_and_exclusive_inclusive() {
        let s = Schedule::parse("* * * * * *", "UTC").unwrap();
        let t = s.ticks_between(at("2026-01-01T00:00:00Z"), at("2026-01-01T00:00:10Z"), 100);
        assert_eq!(t.len(), 10);
        assert_eq!(t[0], at("2026-01-01T00:00:01Z"));
        assert_eq!(t[9], at("2026-01-01T00:00:10Z"));
        assert_eq!(s.ticks_between(at("2026-01-01T00:00:00Z"), at("2026-01-02T00:00:00Z"), 5).len(), 5);
    }
}
