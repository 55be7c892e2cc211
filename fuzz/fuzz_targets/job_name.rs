//! `validate_job_name`, against the rule written out again here.
//!
//! What must hold: accepted exactly when 1 to 191 characters with no whitespace, control
//! character, `@` or `#`; an accepted name makes a run id that splits back at its only `@`
//! and `#`; a refusal is one line (control characters escaped) of bounded length.
#![no_main]

use chrono::DateTime;
use libfuzzer_sys::fuzz_target;
use solocron_core::{validate_job_name, RunId, Tick, JOB_NAME_CHARS_MAX};

/// Longest refusal, in bytes: 64 characters of name (at most 10 bytes each once escaped)
/// and the rule.
const ERROR_BYTES_MAX: usize = 64 * 10 + 512;

fuzz_target!(|data: &[u8]| {
    let Ok(name) = std::str::from_utf8(data) else { return };
    let chars = name.chars().count();
    let allowed = (1..=JOB_NAME_CHARS_MAX).contains(&chars)
        && !name.chars().any(|c| c.is_whitespace() || c.is_control() || c == '@' || c == '#');
    match validate_job_name(name) {
        Ok(()) => {
            assert!(allowed, "{name:?} accepted");
            let at = DateTime::from_timestamp_millis(1_767_225_600_000).expect("in range");
            let id = RunId { tick: Tick::new(name, at), attempt: 7 }.to_string();
            let (job, rest) = id.split_once('@').expect("an @");
            let (_, attempt) = rest.split_once('#').expect("a #");
            assert_eq!((job, attempt), (name, "7"));
            assert!(!rest.contains('@') && attempt.parse::<u32>().is_ok(), "{id:?}");
        }
        Err(e) => {
            assert!(!allowed, "{name:?} refused: {e}");
            let shown = e.to_string();
            assert!(!shown.chars().any(char::is_control), "{shown:?}");
            assert!(shown.len() <= ERROR_BYTES_MAX, "{} bytes of error", shown.len());
        }
    }
});
