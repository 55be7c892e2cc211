//! The Redis URL: parsed into a client by the driver; what is shown of it (the store's
//! description, every error) goes through [`solocron_core::redact_url`], the one masker.

use solocron_core::{redact_url, StoreError};

/// A client for `url` (`redis://[[user]:password@]host:port[/db]`, `rediss://`,
/// `redis+unix://`); nothing is connected yet.
pub(crate) fn client(url: &str) -> Result<redis::Client, StoreError> {
    redis::Client::open(url).map_err(|e| {
        crate::error::redacted(StoreError::Invalid(format!("bad Redis URL {}: {e}", redact_url(url))), url)
    })
}

/// What the store shows of itself: the URL without its password, and its keys.
pub(crate) fn description(url: &str, key_prefix: &str) -> String {
    format!("{} (keys {key_prefix}*)", redact_url(url))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every form of Redis URL the driver takes keeps its password out of what is shown.
    #[test]
    fn passwords_are_masked() {
        assert_eq!(redact_url("redis://:s3cret@host:6379/0"), "redis://:***@host:6379/0");
        assert_eq!(redact_url("redis://alice:s3cret@host"), "redis://alice:***@host");
        assert_eq!(redact_url("redis://s3cret@host"), "redis://***@host");
        assert_eq!(redact_url("redis://host:6379"), "redis://host:6379");
        assert_eq!(
            redact_url("redis+unix:///run/redis.sock?db=1&pass=s3cret"),
            "redis+unix:///run/redis.sock?db=1&pass=***"
        );
        assert!(!redact_url("s3cret@host").contains("s3cret"));
        assert!(!description("redis://:s3cret@host", "{x}:").contains("s3cret"));
        for bad in ["redis://:s3cret@", "http://u:s3cret@x", "s3cret@host"] {
            let err = client(bad).map(drop).unwrap_err();
            assert!(matches!(&err, StoreError::Invalid(m) if !m.contains("s3cret")), "{bad}: {err}");
        }
    }
}
