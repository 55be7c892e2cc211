//! Namespaces: several applications on one store, each running, recovering and pruning only
//! its own jobs.
//!
//! A job's **full name** is its name in the namespace `default`, and `namespace/name` in any
//! other (`billing/sync-invoices`). Every store keys a job by its full name, so two
//! namespaces' jobs of the same name never share a tick, a fence, a pause or a history; and
//! the namespace of any stored job is read back from its full name alone
//! ([`namespace_of`]), which is what lets a store filter by namespace ([`Namespaces`]).
//! That works because a full name has at most one namespace part: the part before the
//! first `/` is always the namespace, so a name in `default` holds no `/`
//! ([`crate::validate_job_name`]).

use std::fmt;

/// The namespace of a job that names none, written without a prefix in a full name.
pub const DEFAULT_NAMESPACE: &str = "default";

/// Longest namespace name, in bytes (a DNS label's bound).
pub const NAMESPACE_LEN_MAX: usize = 63;

/// Most namespaces one node serves (a store's filter stays one short list).
pub const NAMESPACES_MAX: usize = 64;

/// What a namespace name may be, said in every [`NamespaceError`].
const NAMESPACE_RULE: &str = "a namespace is 1 to 63 characters of `a-z`, `0-9`, `-` and `_`, \
     starting with a letter or a digit (like `billing` or `team-7`)";

/// Checks a namespace name: 1 to [`NAMESPACE_LEN_MAX`] characters of `a-z`, `0-9`, `-` and
/// `_`, the first a letter or a digit. It is the part before the `/` of a full job name, so
/// it holds no `/`; lower case only, so `Billing` and `billing` are never two namespaces.
///
/// ```
/// use solocron_core::validate_namespace;
/// assert!(validate_namespace("billing").is_ok());
/// assert!(validate_namespace("Billing").is_err());
/// ```
pub fn validate_namespace(namespace: &str) -> Result<(), NamespaceError> {
    let ok_char = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_';
    let first_ok = namespace.chars().next().is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    if namespace.len() > NAMESPACE_LEN_MAX || !first_ok || !namespace.chars().all(ok_char) {
        let shown: String = namespace.chars().take(NAMESPACE_LEN_MAX + 1).flat_map(char::escape_debug).collect();
        return Err(NamespaceError(shown));
    }
    Ok(())
}

/// A namespace name that breaks the rule of [`validate_namespace`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a namespace name; {NAMESPACE_RULE}")]
pub struct NamespaceError(String);

/// The namespace of the job whose full name is `job`: the part before its first `/`, or
/// [`DEFAULT_NAMESPACE`] when it has none.
///
/// ```
/// use solocron_core::namespace_of;
/// assert_eq!(namespace_of("billing/sync"), "billing");
/// assert_eq!(namespace_of("backup"), "default");
/// ```
pub fn namespace_of(job: &str) -> &str {
    job.split_once('/').map_or(DEFAULT_NAMESPACE, |(ns, _)| ns)
}

/// The full name of the job `name` of `namespace`: `name` itself in [`DEFAULT_NAMESPACE`],
/// `namespace/name` in any other.
///
/// ```
/// use solocron_core::full_job_name;
/// assert_eq!(full_job_name("billing", "sync"), "billing/sync");
/// assert_eq!(full_job_name("default", "backup"), "backup");
/// ```
pub fn full_job_name(namespace: &str, name: &str) -> String {
    if namespace == DEFAULT_NAMESPACE {
        name.to_string()
    } else {
        format!("{namespace}/{name}")
    }
}

/// The namespaces a node serves, or every namespace (an operator's view): what the store's
/// scans for expired runs, pending requests and old records are limited to.
///
/// ```
/// use solocron_core::Namespaces;
/// let billing = Namespaces::only(["billing"]).unwrap();
/// assert!(billing.serves("billing/sync"));
/// assert!(!billing.serves("backup"));
/// assert!(Namespaces::all().serves("backup"));
/// assert_eq!(Namespaces::default().names(), Some(&["default".to_string()][..]));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Namespaces(Option<Vec<String>>);

impl Namespaces {
    /// Every namespace.
    pub const ALL: Namespaces = Namespaces(None);

    /// Every namespace.
    pub fn all() -> Namespaces {
        Namespaces::ALL
    }

    /// The namespaces named (sorted, each once): 1 to [`NAMESPACES_MAX`], each valid.
    pub fn only<S: AsRef<str>>(names: impl IntoIterator<Item = S>) -> Result<Namespaces, NamespacesError> {
        let mut list = Vec::new();
        for name in names {
            let name = name.as_ref();
            validate_namespace(name).map_err(NamespacesError::Name)?;
            list.push(name.to_string());
        }
        list.sort();
        list.dedup();
        if list.is_empty() || list.len() > NAMESPACES_MAX {
            return Err(NamespacesError::Count(list.len()));
        }
        Ok(Namespaces(Some(list)))
    }

    /// The namespaces named, sorted; `None` for every namespace.
    pub fn names(&self) -> Option<&[String]> {
        self.0.as_deref()
    }

    /// Whether the job whose full name is `job` is in one of these namespaces.
    pub fn serves(&self, job: &str) -> bool {
        self.contains(namespace_of(job))
    }

    /// Whether `namespace` is one of these.
    pub fn contains(&self, namespace: &str) -> bool {
        self.0.as_ref().is_none_or(|list| list.binary_search_by(|n| n.as_str().cmp(namespace)).is_ok())
    }
}

/// Only [`DEFAULT_NAMESPACE`]: what a node serves unless configured otherwise.
impl Default for Namespaces {
    fn default() -> Namespaces {
        Namespaces(Some(vec![DEFAULT_NAMESPACE.to_string()]))
    }
}

impl fmt::Display for Namespaces {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            None => f.write_str("every namespace"),
            Some(list) => f.write_str(&list.join(", ")),
        }
    }
}

/// A list of namespaces that [`Namespaces::only`] refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NamespacesError {
    /// One name breaks the rule.
    #[error(transparent)]
    Name(NamespaceError),
    /// None, or more than [`NAMESPACES_MAX`].
    #[error("{0} namespaces; a node serves 1 to {NAMESPACES_MAX}")]
    Count(usize),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_name_splits_back_into_its_namespace() {
        for (ns, name) in [("default", "backup"), ("billing", "sync"), ("team-7", "a/b:c")] {
            let full = full_job_name(ns, name);
            assert_eq!(namespace_of(&full), ns, "{full}");
        }
    }

    #[test]
    fn namespace_names_follow_the_rule() {
        for good in ["default", "billing", "a", "team-7", "x_y", "0abc", &"a".repeat(63)] {
            assert!(validate_namespace(good).is_ok(), "{good}");
        }
        for bad in ["", "Billing", "-a", "_a", "a/b", "a b", "é", "a.b", &"a".repeat(64)] {
            let err = validate_namespace(bad).unwrap_err().to_string();
            assert!(err.contains("is not a namespace name"), "{bad}: {err}");
        }
    }

    #[test]
    fn a_node_serves_only_its_namespaces() {
        let ns = Namespaces::only(["billing", "default", "billing"]).unwrap();
        assert_eq!(ns.names().unwrap(), ["billing", "default"]);
        assert!(ns.serves("billing/x") && ns.serves("x") && !ns.serves("shipping/x"));
        assert!(matches!(Namespaces::only(Vec::<String>::new()), Err(NamespacesError::Count(0))));
        assert!(matches!(Namespaces::only(["Bad"]), Err(NamespacesError::Name(_))));
        assert_eq!(Namespaces::only(["b", "a"]).unwrap().to_string(), "a, b");
    }
}
