//! Connection URLs: a `postgres://` URL into sqlx's connection options. Every message that
//! names the URL shows it through [`redact_url`], the one password masker.

use std::str::FromStr;

use solocron_core::{redact_in, redact_url, StoreError};
use sqlx::postgres::PgConnectOptions;

/// Parses a `postgres://` (or `postgresql://`) URL. Errors show the URL redacted.
pub(crate) fn parse(url: &str) -> Result<PgConnectOptions, StoreError> {
    if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
        // Text without `://` is not quoted at all: `redact_url` shows it as it is, and it
        // may be a password pasted into the wrong field.
        let shown = if url.contains("://") { format!("`{}`", redact_url(url)) } else { "text without `://`".into() };
        return Err(StoreError::Invalid(format!(
            "{shown} is not a PostgreSQL URL; expected postgres://user[:password]@host:port/database"
        )));
    }
    // sqlx's parse errors come from the `url` crate and do not quote the input; still
    // redacted, should one ever quote it. The URL is named (redacted) since that is what
    // the operator has to fix.
    PgConnectOptions::from_str(url).map_err(|e| {
        StoreError::Invalid(format!("bad PostgreSQL URL `{}`: {}", redact_url(url), redact_in(&e.to_string(), url)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_of_other_stores_or_garbage_are_refused_without_leaking() {
        for url in ["mysql://u:s3cret@h/d", "postgres://u:s3cret@h:notaport/d", "s3cret"] {
            let err = parse(url).unwrap_err();
            assert!(matches!(err, StoreError::Invalid(_)), "{url}: {err}");
            assert!(!err.to_string().contains("s3cret"), "{err}");
        }
    }
}
