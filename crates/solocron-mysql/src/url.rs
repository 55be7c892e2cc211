//! Connection URLs and table prefixes: parsing, validation, and descriptions safe to log.

use std::str::FromStr;

use solocron_core::StoreError;
use sqlx::mysql::MySqlConnectOptions;
use sqlx::ConnectOptions;

/// Longest table prefix: the longest table name (`{prefix}registry`) then stays far below
/// MySQL's 64-character identifier limit, as does the migration lock's name.
const PREFIX_LEN_MAX: usize = 41;

/// Prepared statements kept per connection. Each one also lives on the server, which
/// allows `max_prepared_stmt_count` (16,382 by default) in all: at 8 connections a node
/// holds at most 256, so about 60 nodes fit the default. The steps' fixed statements and
/// the claim shapes of a steady schedule fit well within 32.
const STATEMENT_CACHE: usize = 32;

/// Checks `prefix` against `^[a-z_][a-z0-9_]{0,40}$`: it is spliced into SQL as is, so it
/// must never need quoting.
pub(crate) fn validate_prefix(prefix: &str) -> Result<(), StoreError> {
    let mut bytes = prefix.bytes();
    let first_ok = bytes.next().is_some_and(|b| b.is_ascii_lowercase() || b == b'_');
    let rest_ok = bytes.all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if first_ok && rest_ok && prefix.len() <= PREFIX_LEN_MAX {
        Ok(())
    } else {
        Err(StoreError::Invalid(format!(
            "bad table prefix `{prefix}`: expected 1 to {PREFIX_LEN_MAX} characters of a-z, 0-9 and _, not starting with a digit"
        )))
    }
}

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

/// An error about `url`, with its password masked.
fn bad_url(url: &str, why: &str) -> StoreError {
    // The parser's own message may quote parts of the URL: mask it too.
    let why = match password(url) {
        Some(p) if !p.is_empty() => why.replace(p, "***"),
        _ => why.to_owned(),
    };
    StoreError::Invalid(format!("bad MySQL URL `{}`: {why}", mask(url)))
}

/// The password part of `scheme://user:password@host...`, if any.
fn password(url: &str) -> Option<&str> {
    let (_, rest) = url.split_once("://")?;
    let authority = rest.split(['/', '?']).next()?;
    let (userinfo, _) = authority.rsplit_once('@')?;
    userinfo.split_once(':').map(|(_, p)| p)
}

/// `url` with its password (if any) replaced by `***`.
pub(crate) fn mask(url: &str) -> String {
    match password(url) {
        Some(p) => {
            let (scheme, rest) = url.split_once("://").expect("password() found a scheme");
            let at = rest.find(['/', '?']).map_or(rest.len(), |i| i);
            let (authority, tail) = rest.split_at(at);
            let (userinfo, host) = authority.rsplit_once('@').expect("password() found an @");
            let user = &userinfo[..userinfo.len() - p.len() - 1];
            format!("{scheme}://{user}:***@{host}{tail}")
        }
        None => url.to_owned(),
    }
}

/// `scheme://user[:***]@host:port/database`: what the store is, with no password and no
/// query parameters.
pub(crate) fn describe(url: &str, options: &MySqlConnectOptions) -> String {
    let scheme = url.split_once("://").map_or("mysql", |(s, _)| s);
    let secret = if password(url).is_some() { ":***" } else { "" };
    format!(
        "{scheme}://{}{secret}@{}:{}/{}",
        options.get_username(),
        options.get_host(),
        options.get_port(),
        options.get_database().unwrap_or_default()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_are_checked() {
        for ok in ["solocron_", "_", "a", "app_cron2_", &"a".repeat(41)] {
            validate_prefix(ok).unwrap();
        }
        for bad in ["", "1abc", "Solocron_", "so-cron", "so cron", "a;drop", &"a".repeat(42)] {
            assert!(matches!(validate_prefix(bad), Err(StoreError::Invalid(_))), "{bad}");
        }
    }

    #[test]
    fn passwords_never_show() {
        let url = "mysql://cron:s3cr%2Ft@db:3306/app?ssl-mode=disabled";
        assert_eq!(mask(url), "mysql://cron:***@db:3306/app?ssl-mode=disabled");
        let options = parse(url).unwrap();
        assert_eq!(describe(url, &options), "mysql://cron:***@db:3306/app");
        let plain = "mariadb://root@127.0.0.1:3306/test";
        assert_eq!(describe(plain, &parse(plain).unwrap()), "mariadb://root@127.0.0.1:3306/test");
        assert_eq!(mask(plain), plain);
    }

    #[test]
    fn bad_urls_are_invalid_and_masked() {
        for url in ["postgres://u:hunter2@h/db", "mysql://u:hunter2@h:notaport/db", "mysql://u:hunter2@h:3306"] {
            let err = parse(url).unwrap_err();
            assert!(matches!(err, StoreError::Invalid(_)), "{url}: {err}");
            assert!(!err.to_string().contains("hunter2"), "{err}");
        }
    }
}
