//! Connection URLs and table prefixes: validation, and descriptions safe to log.

use std::str::FromStr;

use solocron_core::StoreError;
use sqlx::postgres::PgConnectOptions;

/// Longest table prefix: 41 characters keeps every derived name (`{p}runs_scheduled`, ...)
/// under PostgreSQL's 63-byte identifier limit, so no name is silently truncated.
const PREFIX_LEN_MAX: usize = 41;

/// Checks a table prefix against `^[a-z_][a-z0-9_]{0,40}$`. The prefix is spliced into SQL
/// unquoted, so this check is also what keeps the statements safe.
pub(crate) fn validate_prefix(prefix: &str) -> Result<(), StoreError> {
    let mut chars = prefix.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_lowercase() || c == '_');
    let rest_ok = chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if first_ok && rest_ok && prefix.len() <= PREFIX_LEN_MAX {
        return Ok(());
    }
    Err(StoreError::Invalid(format!(
        "bad table prefix `{prefix}`: it must match ^[a-z_][a-z0-9_]{{0,40}}$ (lower-case letters, digits and \
         underscores, at most {PREFIX_LEN_MAX} characters, not starting with a digit), like `solocron_`"
    )))
}

/// Parses a `postgres://` (or `postgresql://`) URL. Errors show the URL masked.
pub(crate) fn parse(url: &str) -> Result<PgConnectOptions, StoreError> {
    if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
        return Err(StoreError::Invalid(format!(
            "`{}` is not a PostgreSQL URL; expected postgres://user[:password]@host:port/database",
            mask(url)
        )));
    }
    // sqlx's parse errors come from the `url` crate and never quote the input, but say
    // which URL failed (masked) since that is what the operator has to fix.
    PgConnectOptions::from_str(url).map_err(|e| StoreError::Invalid(format!("bad PostgreSQL URL `{}`: {e}", mask(url))))
}

/// `postgres://user:***@host:port/db`: the parsed target, with the password (if any was
/// given, in the user info or as a `password=` parameter) replaced by `***`. Other query
/// parameters are left out: a description need not carry TLS file paths.
pub(crate) fn describe(url: &str, options: &PgConnectOptions) -> String {
    let password = if has_password(url) { ":***" } else { "" };
    let host = match options.get_socket() {
        Some(socket) => socket.display().to_string(),
        None => options.get_host().to_owned(),
    };
    let database = options.get_database().unwrap_or(options.get_username());
    format!("postgres://{}{password}@{host}:{}/{database}", options.get_username(), options.get_port())
}

/// Whether `url` carries a password anywhere sqlx would read one from.
fn has_password(url: &str) -> bool {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let (before_query, query) = rest.split_once('?').unwrap_or((rest, ""));
    let in_userinfo = before_query.rsplit_once('@').is_some_and(|(userinfo, _)| userinfo.contains(':'));
    in_userinfo || query.split('&').any(|pair| pair.starts_with("password="))
}

/// `url` with everything that could be a password replaced, for messages about URLs that
/// may not even parse. Errs on the side of hiding too much.
pub(crate) fn mask(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        // No authority to find a password in: show no more than what precedes the first
        // colon (a scheme, or a host name), since the rest could be anything.
        return match url.split_once(':') {
            Some((start, _)) => format!("{start}:…"),
            None => "…".to_owned(),
        };
    };
    let (before_query, query) = match rest.split_once('?') {
        Some((before, query)) => (before, Some(query)),
        None => (rest, None),
    };
    let masked = match before_query.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split(':').next().unwrap_or_default();
            let password = if userinfo.contains(':') { ":***" } else { "" };
            format!("{scheme}://{user}{password}@{host}")
        }
        None => format!("{scheme}://{before_query}"),
    };
    match query {
        Some(query) if query.contains("password") => format!("{masked}?***"),
        Some(query) => format!("{masked}?{query}"),
        None => masked,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_are_checked_against_the_documented_pattern() {
        for good in ["solocron_", "_", "a", "app1_cron_", &"a".repeat(41)] {
            assert!(validate_prefix(good).is_ok(), "{good}");
        }
        for bad in ["", "1abc", "Solocron_", "so-cron", "a b", "x;drop table y", &"a".repeat(42), "é"] {
            let err = validate_prefix(bad).unwrap_err();
            assert!(matches!(err, StoreError::Invalid(_)), "{bad}");
            assert!(err.to_string().contains("^[a-z_][a-z0-9_]{0,40}$"), "{err}");
        }
    }

    #[test]
    fn descriptions_and_masks_never_show_a_password() {
        let url = "postgres://app:s3cr%40t@db.internal:6432/cron?sslmode=disable";
        let options = parse(url).unwrap();
        assert_eq!(describe(url, &options), "postgres://app:***@db.internal:6432/cron");
        assert_eq!(mask(url), "postgres://app:***@db.internal:6432/cron?sslmode=disable");
        let url = "postgresql://app@db/cron?password=s3cret";
        assert_eq!(describe(url, &parse(url).unwrap()), "postgres://app:***@db:5432/cron");
        assert!(!mask(url).contains("s3cret"));
        assert_eq!(mask("postgres://a:b@c@h:1/d"), "postgres://a:***@h:1/d");
        assert!(!mask("mysql:pw@host").contains("pw@host"));
    }

    #[test]
    fn urls_of_other_stores_or_garbage_are_refused_without_leaking() {
        for url in ["mysql://u:s3cret@h/d", "postgres://u:s3cret@h:notaport/d", "s3cret"] {
            let err = parse(url).unwrap_err();
            assert!(matches!(err, StoreError::Invalid(_)), "{url}: {err}");
            assert!(!err.to_string().contains("s3cret"), "{err}");
        }
    }
}
