//! A `sqlite:` URL into the driver's options and the database file's absolute path.
//! Every error that quotes the URL quotes it masked ([`redact_url`]).

use std::path::PathBuf;
use std::str::FromStr;

use solocron_core::{redact_url, StoreError};
use sqlx::sqlite::SqliteConnectOptions;

/// Parses `url` into connection options and the absolute path of its file (relative paths
/// are relative to the current directory), refusing what cannot be a shared file.
pub(crate) fn parse(url: &str) -> Result<(SqliteConnectOptions, PathBuf), StoreError> {
    let options = parse_url(url)?;
    let path = std::path::absolute(options.get_filename())
        .map_err(|e| StoreError::Unavailable(format!("cannot resolve SQLite path in `{}`: {e}", redact_url(url))))?;
    Ok((options, path))
}

/// Parses a `sqlite:` URL into connection options, refusing what cannot be a shared file.
fn parse_url(url: &str) -> Result<SqliteConnectOptions, StoreError> {
    let shown = redact_url(url);
    let rest = url.strip_prefix("sqlite:").ok_or_else(|| {
        StoreError::Invalid(format!("`{shown}` is not a SQLite URL; expected sqlite://path/to/file.db"))
    })?;
    // A file URL needs no credentials; what looks like one would otherwise become part of
    // the file's path, and so of `describe()` and of every error naming the file.
    if shown != url {
        return Err(StoreError::Invalid(format!(
            "`{shown}` carries a user or password, which a SQLite file takes none of; \
             name the file by its absolute path, like sqlite:///var/lib/solocron.db"
        )));
    }
    let file = rest.trim_start_matches("//").split('?').next().unwrap_or_default();
    if file.is_empty() || file == ":memory:" || rest.contains("mode=memory") {
        return Err(StoreError::Invalid(format!(
            "`{url}` names no database file; solocron needs a file every node can open, like sqlite://path/to/file.db"
        )));
    }
    SqliteConnectOptions::from_str(url).map_err(|e| StoreError::Invalid(format!("bad SQLite URL `{url}`: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_without_a_file_are_refused_with_a_hint() {
        for url in ["sqlite::memory:", "sqlite://", "sqlite://?mode=memory", "postgres://x/y"] {
            let err = parse_url(url).unwrap_err();
            assert!(matches!(err, StoreError::Invalid(_)), "{url}: {err}");
            assert!(err.to_string().contains(url), "{url}: {err}");
        }
        assert!(parse_url("sqlite:data/solocron.db").is_ok());
        assert!(parse_url("sqlite:///var/lib/solocron.db").is_ok());
        assert!(parse_url("sqlite:///var/lib/a@b.db").is_ok(), "an @ in an absolute path is no password");
    }

    #[test]
    fn urls_with_a_password_are_refused_without_showing_it() {
        for url in [
            "sqlite://app:s3cret@host/solocron.db",
            "sqlite:///var/lib/solocron.db?password=s3cret",
            "postgres://app:s3cret@db/x",
        ] {
            let err = parse(url).unwrap_err();
            assert!(matches!(err, StoreError::Invalid(_)), "{url}: {err}");
            assert!(!err.to_string().contains("s3cret"), "{url}: {err}");
        }
    }
}
