//! `redact_url`: what it shows never depends on a password.
//!
//! Input: newline-separated parts (scheme, user, password, host, path, query key, query
//! value), each stripped of the characters that would end it in a URL. What must hold:
//! - for `scheme://user:password@host/path?key=value&ssl=1`, `scheme://password@host...`
//!   and `user:password@host` (no scheme), the output is the same whatever the password,
//!   and whatever the value when the key names a password (`pass` in any case): nothing of
//!   a secret can be read from it;
//! - for the whole input read as a URL by the `url` crate (what the drivers use), its
//!   serialized form shows the same whatever its password, and the password the crate
//!   finds in the raw input is not in what the raw input redacts to.
#![no_main]

use libfuzzer_sys::fuzz_target;
use solocron_core::redact_url;
use url::{Position, Url};

/// A password known not to be in any input, put in place of the real one.
const STAND_IN: &str = "STAND_IN";

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let _ = redact_url(text);
    check_built_urls(text);
    check_as_the_url_crate_reads_it(text);
});

/// The parts of a URL taken from the input, each keeping only what can stand in its place.
struct Parts {
    scheme: String,
    user: String,
    password: String,
    host: String,
    path: String,
    key: String,
    value: String,
}

impl Parts {
    fn from(text: &str) -> Parts {
        let mut it = text.split('\n');
        let mut part = |drop: &[char]| it.next().unwrap_or("").replace(drop, "");
        let scheme: String = part(&[]).chars().filter(|c| c.is_ascii_alphanumeric() || "+.-".contains(*c)).collect();
        let user = part(&[':', '@', '/', '?', '#']);
        // A password may hold `:` and `@`: the last `@` ends the user information.
        let password = part(&['/', '?', '#']);
        let host = part(&['@', '/', '?', '#']);
        let path = part(&['?', '#']);
        let key = part(&['=', '&', '#']);
        let value = part(&['&', '#']);
        let scheme = if scheme.is_empty() { "redis".to_owned() } else { scheme };
        let path = if path.is_empty() || path.starts_with('/') { path } else { format!("/{path}") };
        Parts { scheme, user, password, host, path, key, value }
    }

    /// Every URL shape built with `password` and query `value`.
    fn urls(&self, password: &str, value: &str) -> [String; 3] {
        let Parts { scheme, user, host, path, key, .. } = self;
        // Alone before the `@`, a `:` would make what precedes it a user name.
        let lone = password.replace(':', "");
        [
            format!("{scheme}://{user}:{password}@{host}{path}?{key}={value}&ssl=1"),
            format!("{scheme}://{lone}@{host}{path}"),
            format!("{user}:{password}@{host}"),
        ]
    }
}

fn check_built_urls(text: &str) {
    let parts = Parts::from(text);
    let value_is_secret = parts.key.to_ascii_lowercase().contains("pass");
    let stand_in_value = if value_is_secret { STAND_IN } else { &parts.value };
    let real = parts.urls(&parts.password, &parts.value);
    let stand_in = parts.urls(STAND_IN, stand_in_value);
    for (real, stand_in) in real.iter().zip(&stand_in) {
        assert_eq!(redact_url(real), redact_url(stand_in), "the redaction of {real:?} depends on its secret");
    }
}

fn check_as_the_url_crate_reads_it(text: &str) {
    let Ok(url) = Url::parse(text) else { return };
    let Some(password) = url.password() else { return };
    let serialized = url.as_str();
    let swapped = format!(
        "{}{STAND_IN}{}",
        &serialized[..url[..Position::BeforePassword].len()],
        &serialized[url[..Position::AfterPassword].len()..]
    );
    assert_eq!(redact_url(serialized), redact_url(&swapped), "the redaction of {serialized:?} shows its password");
    // In the raw text, only a password that is there once, as written, can be looked for:
    // the crate drops tabs and newlines first (`pw\n2` is the password `pw2`), and shows
    // what it percent-encodes (a NUL as `%00`) other than it was written.
    let read = text.replace(['\t', '\n', '\r'], "");
    let as_written = !password.contains(['*', '%']);
    if password.len() >= 3 && as_written && read.matches(password).count() == 1 {
        let shown = redact_url(text);
        assert!(!shown.contains(password), "{text:?} -> {shown:?} shows the password {password:?}");
    }
}
