//! Connection URLs: a `mysql://` URL into sqlx's connection options. Every message that
//! names the URL shows it through [`redact_url`], the one password masker.

use std::str::FromStr;

use solocron_core::{redact_in, redact_url, StoreError};
use sqlx::mysql::MySqlConnectOptions;
use sqlx::ConnectOptions;

/// Prepared statements kept per connection. Each one also lives on the server, which
/// allows `max_prepared_stmt_count` (16,382 by default) in all: at 8 connections a node
/// holds at most 256, so about 60 nodes fit the default. The steps' fixed statements and
/// the claim shapes of a steady schedule fit well within 32.
const STATEMENT_CACHE: usize = 32;

/// Parses a `mysql://` or `mariadb://` URL into connection options whose session time zone
/// is UTC whatever the URL says (every instant is computed in SQL in that zone).
pub(crate) fn parse(url: &str) -> Result<MySqlConnectOptions, StoreError> {
    let rest = url
        .strip_prefix("mysql://")
        .or_else(|| url.strip_prefix("mariadb://"))
        .ok_or_else(|| bad_url(url, "expected mysql://user[:password]@host:port/database"))?;
    let options =
        MySqlConnectOptions::from_str(&format!("mysql://{rest}")).map_err(|e| bad_url(url, &e.to_string()))?;
    if options.get_database().is_none_or(str::is_empty) {
        return Err(bad_url(url, "no database named; expected mysql://user[:password]@host:port/database"));
    }
    // A multi-statement claim or batch of ends carries its values (job output included)
    // written into the SQL: sqlx's slow-statement warning would log megabytes of it.
    let options = options
        .timezone(Some(String::from("+00:00")))
        .log_slow_statements(log::LevelFilter::Debug, std::time::Duration::from_secs(1));
    // Unless the URL says otherwise (`statement-cache-capacity=`).
    Ok(if url.contains("statement-cache-capacity=") {
        options
    } else {
        options.statement_cache_capacity(STATEMENT_CACHE)
    })
}

/// An error about `url`, redacted. Text without `://` is not quoted at all: `redact_url`
/// shows it as it is, and it may be a password pasted into the wrong field.
fn bad_url(url: &str, why: &str) -> StoreError {
    // The parser's own messages do not quote the URL; should one ever, it is redacted.
    let why = redact_in(why, url);
    if !url.contains("://") {
        return StoreError::Invalid(format!("bad MySQL URL (text without `://`): {why}"));
    }
    StoreError::Invalid(format!("bad MySQL URL `{}`: {why}", redact_url(url)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_urls_are_invalid_and_masked() {
        for url in [
            "postgres://u:hunter2@h/db",
            "mysql://u:hunter2@h:notaport/db",
            "mysql://u:hunter2@h:3306",
            "mariadb://u:hunter2@h:3306",
            "hunter2",
        ] {
            let err = parse(url).unwrap_err();
            assert!(matches!(err, StoreError::Invalid(_)), "{url}: {err}");
            assert!(!err.to_string().contains("hunter2"), "{err}");
        }
    }
}
