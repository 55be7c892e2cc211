//! Humane durations: `"500ms"`, `"30s"`, `"10m"`, `"1h"`, `"7d"`, and their display.

use std::time::Duration;

/// A duration string that could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{input}` is not a duration ({why}); write e.g. \"500ms\", \"30s\", \"10m\", \"1h\" or \"7d\"")]
pub struct DurationError {
    input: String,
    why: String,
}

/// Parses a humane duration such as `"500ms"`, `"30s"`, `"10m"`, `"1h"`, `"7d"` or `"1h 30m"`.
///
/// ```
/// use std::time::Duration;
/// assert_eq!(solocron_core::parse_duration("30s").unwrap(), Duration::from_secs(30));
/// assert_eq!(solocron_core::parse_duration("7d").unwrap(), Duration::from_secs(7 * 86_400));
/// assert!(solocron_core::parse_duration("soon").is_err());
/// ```
pub fn parse_duration(input: &str) -> Result<Duration, DurationError> {
    let trimmed = input.trim();
    if trimmed.is_empty() {
        return Err(DurationError { input: input.to_owned(), why: "it is empty".into() });
    }
    if trimmed.chars().all(|c| c.is_ascii_digit()) {
        // A bare number is ambiguous (seconds? milliseconds?): refuse it rather than guess.
        return Err(DurationError { input: input.to_owned(), why: "a unit is missing".into() });
    }
    humantime::parse_duration(trimmed).map_err(|e| DurationError { input: input.to_owned(), why: e.to_string() })
}

/// Formats a duration the way people read it: `"850ms"`, `"12.4s"`, `"2m 03s"`, `"1h 05m"`, `"3d 04h"`.
///
/// ```
/// use std::time::Duration;
/// assert_eq!(solocron_core::format_duration(Duration::from_secs(123)), "2m 03s");
/// assert_eq!(solocron_core::format_duration(Duration::from_millis(850)), "850ms");
/// ```
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    let s = d.as_secs();
    match s {
        0 => format!("{ms}ms"),
        1..=59 => format!("{:.1}s", d.as_secs_f64()),
        60..=3599 => format!("{}m {:02}s", s / 60, s % 60),
        3600..=86_399 => format!("{}h {:02}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d {:02}h", s / 86_400, (s % 86_400) / 3600),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn humane_durations_parse_and_bad_ones_say_why() {
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("10m").unwrap(), Duration::from_secs(600));
        assert_eq!(parse_duration("1h 30m").unwrap(), Duration::from_secs(5400));
        let e = parse_duration("30").unwrap_err().to_string();
        assert!(e.contains("unit is missing"), "{e}");
        let e = parse_duration("3 fortnights").unwrap_err().to_string();
        assert!(e.contains("`3 fortnights`"), "{e}");
    }

    #[test]
    fn durations_display_humanely() {
        assert_eq!(format_duration(Duration::from_millis(12_400)), "12.4s");
        assert_eq!(format_duration(Duration::from_secs(3900)), "1h 05m");
        assert_eq!(format_duration(Duration::from_secs(3 * 86_400 + 4 * 3600)), "3d 04h");
    }
}
