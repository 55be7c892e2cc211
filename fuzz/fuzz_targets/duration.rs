//! `parse_duration`, and `format_duration` of what it accepts.
//!
//! What must hold: no panic; a bare number or blank text is refused (a unit is required);
//! a refusal quotes the input; whatever is accepted can be displayed.
#![no_main]

use libfuzzer_sys::fuzz_target;
use solocron_core::{format_duration, parse_duration};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let trimmed = text.trim();
    match parse_duration(text) {
        Ok(d) => {
            assert!(!trimmed.is_empty() && !trimmed.chars().all(|c| c.is_ascii_digit()), "{text:?} accepted");
            assert!(!format_duration(d).is_empty());
        }
        Err(e) => assert!(e.to_string().contains(&format!("`{text}`")), "{e}"),
    }
});
