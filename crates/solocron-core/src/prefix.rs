//! The namespace every store puts its tables or keys behind, so several fleets (or
//! applications) share one database, one Redis or one etcd. One rule, checked here once;
//! each store derives its own spelling from the same name.

use std::fmt;

/// Longest prefix name: short enough that every SQL table name derived from it stays far
/// below PostgreSQL's 63-byte identifier limit.
pub const PREFIX_LEN_MAX: usize = 40;

/// A store namespace: 1 to [`PREFIX_LEN_MAX`] characters of `a-z`, `0-9` and `_`, starting
/// with a letter. It means the same on every store:
///
/// | store | tables or keys with the prefix `billing` |
/// |---|---|
/// | SQL (SQLite, PostgreSQL, MySQL) | tables `billing_runs`, `billing_fences`, ... ([`Prefix::table_prefix`]) |
/// | Redis | keys `{billing}:...`: one hash tag, so one Redis Cluster slot ([`Prefix::redis_key_prefix`]) |
/// | etcd | keys `/billing/...` ([`Prefix::etcd_key_prefix`]) |
///
/// ```
/// use solocron_core::Prefix;
/// let p = Prefix::parse("billing").unwrap();
/// assert_eq!(p.table_prefix(), "billing_");
/// assert_eq!(p.redis_key_prefix(), "{billing}:");
/// assert_eq!(p.etcd_key_prefix(), "/billing/");
/// assert_eq!(Prefix::default().as_str(), "solocron");
/// assert!(Prefix::parse("Billing").unwrap_err().to_string().contains("a-z"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Prefix(String);

/// A prefix that breaks the rule of [`Prefix`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "bad prefix `{given}`: use 1 to {PREFIX_LEN_MAX} characters of a-z, 0-9 and _, starting with a letter (like `solocron` or `billing_cron`)"
)]
pub struct PrefixError {
    /// What was given.
    pub given: String,
}

impl Prefix {
    /// The default namespace, `solocron`.
    pub const DEFAULT: &'static str = "solocron";

    /// Checks `name` against the one rule every store shares.
    pub fn parse(name: &str) -> Result<Prefix, PrefixError> {
        let mut bytes = name.bytes();
        let first_ok = bytes.next().is_some_and(|b| b.is_ascii_lowercase());
        let rest_ok = bytes.all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
        if first_ok && rest_ok && name.len() <= PREFIX_LEN_MAX {
            Ok(Prefix(name.to_owned()))
        } else {
            Err(PrefixError { given: name.to_owned() })
        }
    }

    /// The name itself.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// What SQL stores put before each table name: the name and `_`. Safe to splice into
    /// SQL unquoted (letters, digits and `_` only).
    pub fn table_prefix(&self) -> String {
        format!("{}_", self.0)
    }

    /// What Redis puts before each key: the name as the key's hash tag, then `:`.
    pub fn redis_key_prefix(&self) -> String {
        format!("{{{}}}:", self.0)
    }

    /// What etcd puts before each key: `/name/`.
    pub fn etcd_key_prefix(&self) -> String {
        format!("/{}/", self.0)
    }
}

impl Default for Prefix {
    fn default() -> Prefix {
        Prefix(Prefix::DEFAULT.to_owned())
    }
}

impl fmt::Display for Prefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::str::FromStr for Prefix {
    type Err = PrefixError;
    fn from_str(s: &str) -> Result<Prefix, PrefixError> {
        Prefix::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_rule_for_every_store() {
        for good in ["solocron", "a", "billing_cron", "solocron_t0123456789abcdef", &"x".repeat(PREFIX_LEN_MAX)] {
            assert!(Prefix::parse(good).is_ok(), "{good}");
        }
        let bad = ["", "_x", "9x", "Billing", "a-b", "a:b", "{a}", "a/b", "a b", "é", &"x".repeat(PREFIX_LEN_MAX + 1)];
        for bad in bad {
            let err = Prefix::parse(bad).unwrap_err();
            assert!(err.to_string().contains(&format!("`{bad}`")), "{err}");
        }
    }

    #[test]
    fn the_default_keeps_every_stores_historic_names() {
        let p = Prefix::default();
        assert_eq!(p.table_prefix(), "solocron_");
        assert_eq!(p.redis_key_prefix(), "{solocron}:");
        assert_eq!(p.etcd_key_prefix(), "/solocron/");
    }
}
