//! `validate_job_name`, against the rule written out again here.
//!
//! What must hold: accepted exactly when 1 to 191 characters with no whitespace, control
//! character, `@` or `#`, and, when it has a `/`, a namespace before the first one (1 to 63
//! of `a-z 0-9 - _`, starting with a letter or digit, not `default`) and something after
//! it; an accepted name makes a run id that splits back at its only `@` and `#`, and its
//! namespace is what `namespace_of` reads; a refusal is one line (control characters
//! escaped) of bounded length.
#![no_main]

use chrono::DateTime;
use libfuzzer_sys::fuzz_target;
use solocron_core::{namespace_of, validate_job_name, RunId, Tick, JOB_NAME_CHARS_MAX};

/// Longest refusal, in bytes: 64 characters of name and 64 of its namespace part (at most
/// 10 bytes each once escaped) and the rule.
const ERROR_BYTES_MAX: usize = 2 * 64 * 10 + 512;

/// The namespace part's rule, written out again.
fn namespace_ok(ns: &str) -> bool {
    let first = ns.chars().next().is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    first
        && ns.len() <= 63
        && ns != "default"
        && ns.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_')
}

fuzz_target!(|data: &[u8]| {
    let Ok(name) = std::str::from_utf8(data) else { return };
    let chars = name.chars().count();
    let allowed = (1..=JOB_NAME_CHARS_MAX).contains(&chars)
        && !name.chars().any(|c| c.is_whitespace() || c.is_control() || c == '@' || c == '#')
        && name.split_once('/').is_none_or(|(ns, rest)| namespace_ok(ns) && !rest.is_empty());
    match validate_job_name(name) {
        Ok(()) => {
            assert!(allowed, "{name:?} accepted");
            let at = DateTime::from_timestamp_millis(1_767_225_600_000).expect("in range");
            let id = RunId { tick: Tick::new(name, at), attempt: 7 }.to_string();
            let (job, rest) = id.split_once('@').expect("an @");
            let (_, attempt) = rest.split_once('#').expect("a #");
            assert_eq!((job, attempt), (name, "7"));
            assert!(!rest.contains('@') && attempt.parse::<u32>().is_ok(), "{id:?}");
            let ns = namespace_of(name);
            assert!(ns == "default" || name.starts_with(&format!("{ns}/")), "{name:?} in {ns:?}");
        }
        Err(e) => {
            assert!(!allowed, "{name:?} refused: {e}");
            let shown = e.to_string();
            assert!(!shown.chars().any(char::is_control), "{shown:?}");
            assert!(shown.len() <= ERROR_BYTES_MAX, "{} bytes of error", shown.len());
        }
    }
});
