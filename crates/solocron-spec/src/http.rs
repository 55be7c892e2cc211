//! The rules of an HTTP job's parts, without the HTTP client: a URL the job can call, a
//! method and header names that are HTTP tokens, header values a request can carry, and the
//! `expect_status` grammar. They are the rules `solocron::HttpJob`'s builder applies (the
//! same checks, the same words; `solocron`'s `spec` tests hold the two to each other), so
//! the fleet and the API refuse what a node would refuse, without linking the engine.

use solocron_core::redact_url;

/// Most items in an `expect_status` list.
pub const EXPECT_STATUS_ITEMS_MAX: usize = 16;
/// Longest header name, in bytes (HTTP's own bound on a name it will send).
const HEADER_NAME_BYTES_MAX: usize = (1 << 16) - 1;

/// The headers every request carries, set from the run's facts; a job cannot set them.
const FACT_HEADERS: [&str; 7] = [
    "solocron-job",
    "solocron-scheduled-at",
    "solocron-fencing-token",
    "solocron-node-id",
    "solocron-run-id",
    "solocron-attempt",
    "idempotency-key",
];

/// A bad part: which (`url`, `method`, `headers`, `expect_status`) and why.
pub(crate) type PartError = (&'static str, String);

fn bad(field: &'static str, why: impl Into<String>) -> PartError {
    (field, why.into())
}

/// A URL the job can call: one that parses, `http://` or `https://`, with a host. Errors
/// show it without its password.
pub(crate) fn check_url(url: &str) -> Result<(), PartError> {
    let shown = redact_url(url);
    let parsed = url::Url::parse(url).map_err(|e| bad("url", format!("`{shown}` is not a URL: {e}")))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(bad("url", format!("`{shown}` must start with http:// or https://")));
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err(bad("url", format!("`{shown}` has no host")));
    }
    Ok(())
}

/// An HTTP token character (RFC 9110's `tchar`), which method and header names are made of.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// A method, sent in upper case: a non-empty token.
pub(crate) fn check_method(method: &str) -> Result<(), PartError> {
    if !method.is_empty() && method.bytes().all(is_tchar) {
        return Ok(());
    }
    let shown: String = method.chars().take(40).collect();
    Err(bad("method", format!("`{shown}` is not an HTTP method, such as GET or POST")))
}

/// A header name a job may set, in lower case (as it is sent, and as errors about its value
/// name it).
pub(crate) fn header_name(name: &str) -> Result<String, PartError> {
    let shown: String = name.chars().take(60).collect();
    if name.is_empty() || name.len() > HEADER_NAME_BYTES_MAX || !name.bytes().all(is_tchar) {
        return Err(bad("headers", format!("`{shown}` is not a header name (letters, digits and -)")));
    }
    let lower = name.to_ascii_lowercase();
    // All of `Solocron-*`, so a fact added later cannot meet a job's header of its name.
    if lower.starts_with("solocron-") || FACT_HEADERS.contains(&lower.as_str()) {
        return Err(bad("headers", format!("`{shown}` is set by solocron on every request, from the run")));
    }
    if matches!(lower.as_str(), "content-length" | "transfer-encoding") {
        return Err(bad("headers", format!("`{shown}` is set from the body")));
    }
    Ok(lower)
}

/// A header value a request can carry: no control character but a tab (other UTF-8 is sent
/// as its bytes).
pub(crate) fn header_value_ok(value: &str) -> bool {
    value.bytes().all(|b| (b >= 32 && b != 127) || b == b'\t')
}

/// A plain header: its name, then its value.
pub(crate) fn check_header(name: &str, value: &str) -> Result<(), PartError> {
    let name = header_name(name)?;
    if !header_value_ok(value) {
        return Err(bad("headers", format!("the value of `{name}` holds a line break or a control character")));
    }
    Ok(())
}

/// The statuses that count as success: `2xx`, `200`, `200-299`, or a comma-separated list
/// of these (`2xx,304`), at most [`EXPECT_STATUS_ITEMS_MAX`] items.
pub(crate) fn check_expect_status(s: &str) -> Result<(), PartError> {
    let how = "write 200, 2xx, 200-299, or a comma-separated list of these such as 2xx,304";
    let parts: Vec<&str> = s.split(',').map(str::trim).collect();
    if parts.len() > EXPECT_STATUS_ITEMS_MAX {
        return Err(bad("expect_status", format!("has {} items; at most {EXPECT_STATUS_ITEMS_MAX}", parts.len())));
    }
    for part in parts {
        let Some((lo, hi)) = status_item(part) else {
            let shown: String = part.chars().take(40).collect();
            return Err(bad(
                "expect_status",
                format!("`{shown}` is not a status (100 to 599) or a range of them: {how}"),
            ));
        };
        if lo > hi {
            return Err(bad("expect_status", format!("`{part}` runs from high to low: write {hi}-{lo}")));
        }
    }
    Ok(())
}

/// One item of an `expect_status` list as an inclusive range: `2xx`, `200`, `200-299`.
fn status_item(item: &str) -> Option<(u16, u16)> {
    let code = |s: &str| -> Option<u16> {
        let n: u16 = s.parse().ok().filter(|_| s.len() == 3 && s.bytes().all(|b| b.is_ascii_digit()))?;
        (100..=599).contains(&n).then_some(n)
    };
    if let Some(class) = item.strip_suffix("xx").or_else(|| item.strip_suffix("XX")) {
        let c = code(&format!("{class}00"))?;
        return Some((c, c + 99));
    }
    match item.split_once('-') {
        Some((lo, hi)) => Some((code(lo.trim())?, code(hi.trim())?)),
        None => code(item).map(|c| (c, c)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_must_be_http_with_a_host_and_is_shown_without_its_password() {
        assert!(check_url("https://billing.internal/jobs/sync").is_ok());
        assert_eq!(check_url("ftp://x").unwrap_err().1, "`ftp://x` must start with http:// or https://");
        let (field, why) = check_url("https://ops:pw@").unwrap_err();
        assert!(field == "url" && why.starts_with("`https://ops:***@` ") && !why.contains("pw@"), "{why}");
        assert!(check_url("localhost:8080/x").unwrap_err().1.contains("must start with http://"));
    }

    #[test]
    fn methods_and_header_names_are_tokens_and_the_runs_facts_are_not_a_jobs() {
        assert!(check_method("PUT").is_ok() && check_method("purge").is_ok());
        assert!(check_method("P T").is_err() && check_method("").is_err() && check_method("GÉT").is_err());
        assert_eq!(header_name("X-Api-Key").unwrap(), "x-api-key");
        assert!(header_name("Bad Name").unwrap_err().1.contains("is not a header name"));
        assert!(header_name("Idempotency-Key").unwrap_err().1.contains("is set by solocron"));
        assert!(header_name("Solocron-Anything").unwrap_err().1.contains("is set by solocron"));
        assert!(header_name("Content-Length").unwrap_err().1.contains("is set from the body"));
        let (_, why) = check_header("X-Note", "a\nb").unwrap_err();
        assert_eq!(why, "the value of `x-note` holds a line break or a control character");
        assert!(check_header("X-Note", "tab\tand é").is_ok());
    }

    #[test]
    fn expect_status_is_statuses_classes_and_ranges() {
        for ok in ["200", "2xx", "2XX", "200-299", "2xx, 304", "100-599"] {
            assert!(check_expect_status(ok).is_ok(), "{ok}");
        }
        assert!(check_expect_status("2xx,abc").unwrap_err().1.starts_with("`abc` is not a status"));
        assert!(check_expect_status("299-200").unwrap_err().1.contains("write 200-299"));
        assert!(check_expect_status(&vec!["200"; 17].join(",")).unwrap_err().1.contains("at most 16"));
        assert!(check_expect_status("600").is_err() && check_expect_status("20").is_err());
    }
}
