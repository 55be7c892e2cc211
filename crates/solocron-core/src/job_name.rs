//! The one rule for job names, checked by the library's scheduler builder and the
//! configuration parser alike, so that a name one accepts the other accepts too, and every
//! store can hold it.

use std::fmt;

/// Longest job name, in characters (Unicode scalar values). The tightest store sets it:
/// MySQL's key columns are `VARCHAR(191)` characters (764 bytes of `utf8mb4`, within
/// InnoDB's oldest index limit), so a name valid here fits every store.
pub const JOB_NAME_CHARS_MAX: usize = 191;

/// Most characters of a refused name quoted in its error: enough to recognise it, while a
/// pasted megabyte does not become a megabyte of error message.
const JOB_NAME_SHOWN_CHARS_MAX: usize = 64;

/// What a job name may be, said in every [`JobNameError`].
const JOB_NAME_RULE: &str = "a job name is 1 to 191 characters with no whitespace, no control characters, \
     no `@` and no `#`, and a `/` only after a namespace (like `backup`, `billing.invoices-daily` or `billing/sync`)";

/// Checks a job name against the one rule every part of solocron shares: 1 to
/// [`JOB_NAME_CHARS_MAX`] characters, none of them whitespace, a control character, `@`
/// or `#`. Anything else is allowed, including non-ASCII letters and `/ : % . - _`: every
/// store holds them (etcd escapes `%` and `/` in its keys; Redis run ids keep `:`).
/// `name` is a full name (see [`crate::namespace_of`]): the part before its first `/`, if
/// any, is its namespace, which must be a valid one other than `default`, and something
/// must follow the `/`.
///
/// Why each part:
/// - **`@` and `#`** delimit a run id, `job@2026-01-01T00:00:00.000Z#1` (what
///   `solocron history --output` takes): with neither in the name, the id splits back into
///   its job, instant and attempt in exactly one way.
/// - **Whitespace**: MySQL compares `'a'` and `'a '` as equal, so two jobs would share one
///   fence; a leading or inner space is invisible in a log line (`job=a b`), in the
///   space-separated `status` table and on a command line.
/// - **The namespace part** keeps a full name's namespace readable by every store, and a
///   job of `default` from being spelled two ways.
/// - **Control characters** (newlines, escapes, NUL) forge lines in logs and tables, and
///   NUL ends a string in C clients.
/// - **Empty**: there is nothing to name the job by in logs or on a command line.
/// - **[`JOB_NAME_CHARS_MAX`]**: every store can hold the name (see there).
///
/// ```
/// use solocron_core::validate_job_name;
/// assert!(validate_job_name("billing/invoices:daily").is_ok());
/// let err = validate_job_name("a@b").unwrap_err();
/// assert!(err.to_string().contains("`@`"), "{err}");
/// ```
pub fn validate_job_name(name: &str) -> Result<(), JobNameError> {
    if name.is_empty() {
        return Err(JobNameError::Empty);
    }
    let chars = name.chars().count();
    if chars > JOB_NAME_CHARS_MAX {
        return Err(JobNameError::TooLong { name: shown(name), chars });
    }
    if let Some(found) = name.chars().find(|&c| c.is_whitespace() || c.is_control() || c == '@' || c == '#') {
        return Err(JobNameError::Forbidden { name: shown(name), found });
    }
    match name.split_once('/') {
        Some((namespace, rest)) => {
            let bad = |why: String| JobNameError::Namespace { name: shown(name), why };
            if namespace == crate::DEFAULT_NAMESPACE {
                return Err(bad("the namespace `default` is written without a prefix".into()));
            }
            crate::validate_namespace(namespace).map_err(|e| bad(e.to_string()))?;
            if rest.is_empty() {
                return Err(bad("nothing follows the `/`".into()));
            }
            Ok(())
        }
        None => Ok(()),
    }
}

/// A job name that breaks the rule of [`validate_job_name`]. Its message says what is
/// wrong and what a job name may be.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JobNameError {
    /// The name is empty.
    #[error("the job name is empty; {JOB_NAME_RULE}")]
    Empty,
    /// The name is longer than [`JOB_NAME_CHARS_MAX`].
    #[error("job name `{name}` is {chars} characters long; {JOB_NAME_RULE}")]
    TooLong {
        /// The name as given, escaped and shortened for display.
        name: String,
        /// How many characters it has.
        chars: usize,
    },
    /// The name contains a character it may not.
    #[error("job name `{name}` contains {}; {JOB_NAME_RULE}", Found(*.found))]
    Forbidden {
        /// The name as given, escaped and shortened for display.
        name: String,
        /// The first forbidden character.
        found: char,
    },
    /// The part before the first `/` is not a namespace (see [`crate::namespace_of`]).
    #[error("job name `{name}`: the part before its first `/` is its namespace, and {why}")]
    Namespace {
        /// The name as given, escaped and shortened for display.
        name: String,
        /// What is wrong with the namespace part.
        why: String,
    },
}

/// The name for an error message: control characters escaped (a refused newline must not
/// split the message), and no longer than [`JOB_NAME_SHOWN_CHARS_MAX`].
fn shown(name: &str) -> String {
    let mut out: String = name.chars().take(JOB_NAME_SHOWN_CHARS_MAX).flat_map(char::escape_debug).collect();
    if name.chars().nth(JOB_NAME_SHOWN_CHARS_MAX).is_some() {
        out.push('…');
    }
    out
}

/// A forbidden character, described so that an invisible one can be found.
struct Found(char);

impl fmt::Display for Found {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            '@' | '#' => write!(f, "`{}`, which separates the parts of a run id (job@instant#attempt)", self.0),
            ' ' => f.write_str("a space"),
            c if c.is_whitespace() => write!(f, "whitespace (U+{:04X})", u32::from(c)),
            c => write!(f, "a control character (U+{:04X})", u32::from(c)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{RunId, Tick};

    #[test]
    fn names_any_store_holds_and_a_run_id_splits_back_are_accepted() {
        let longest_ascii = "x".repeat(JOB_NAME_CHARS_MAX);
        // Counted in characters, not bytes: 191 four-byte characters still fit MySQL.
        let longest_wide = "é".repeat(JOB_NAME_CHARS_MAX);
        let emoji = "🦀".repeat(JOB_NAME_CHARS_MAX);
        let good = ["a", "backup", "billing.invoices-daily", "a/b:c", "{x}", "50%", "Ünïcode", "日次バックアップ", "_"];
        for name in good.iter().copied().chain([longest_ascii.as_str(), &longest_wide, &emoji]) {
            assert_eq!(validate_job_name(name), Ok(()), "{name}");
            // The reason for `@` and `#`: the run id splits back into exactly this name.
            let id = RunId { tick: Tick::new(name, "2026-11-01T05:00:00Z".parse().unwrap()), attempt: 12 }.to_string();
            let (rest, attempt) = id.rsplit_once('#').unwrap();
            let (job, at) = rest.split_once('@').unwrap();
            assert_eq!((job, at, attempt), (name, "2026-11-01T05:00:00.000Z", "12"));
        }
    }

    #[test]
    fn each_refused_name_says_what_is_wrong_and_what_is_allowed() {
        let too_long = "x".repeat(JOB_NAME_CHARS_MAX + 1);
        let cases = [
            ("", "the job name is empty"),
            ("a@b", "job name `a@b` contains `@`, which separates the parts of a run id"),
            ("a#1", "job name `a#1` contains `#`"),
            ("@", "contains `@`"),
            ("nightly backup", "job name `nightly backup` contains a space"),
            (" a", "contains a space"),
            ("a ", "contains a space"),
            ("a\tb", "job name `a\\tb` contains whitespace (U+0009)"),
            ("a\u{a0}b", "whitespace (U+00A0)"),
            ("a\u{3000}b", "whitespace (U+3000)"),
            ("a\nb", "job name `a\\nb` contains whitespace (U+000A)"),
            ("a\u{0}b", "job name `a\\0b` contains a control character (U+0000)"),
            ("a\u{1b}[31mred", "contains a control character (U+001B)"),
            ("a\u{7f}", "a control character (U+007F)"),
            (&too_long, "is 192 characters long"),
        ];
        for (name, want) in cases {
            let err = validate_job_name(name).unwrap_err().to_string();
            assert!(err.contains(want), "{name:?}: expected `{want}` in: {err}");
            assert!(err.contains("1 to 191 characters with no whitespace"), "{name:?}: the rule is said: {err}");
            assert!(!err.contains('\n'), "{name:?}: one line: {err}");
        }
    }

    #[test]
    fn the_part_before_a_slash_must_be_a_namespace() {
        for name in ["billing/sync", "team-7/a/b", "x/日次"] {
            assert_eq!(validate_job_name(name), Ok(()), "{name}");
        }
        let cases = [
            ("Billing/x", "`Billing` is not a namespace name"),
            ("/x", "`` is not a namespace name"),
            ("a.b/x", "`a.b` is not a namespace name"),
            ("x/", "nothing follows the `/`"),
            ("default/x", "the namespace `default` is written without a prefix"),
        ];
        for (name, want) in cases {
            let err = validate_job_name(name).unwrap_err().to_string();
            assert!(err.contains(want) && err.contains("is its namespace"), "{name:?}: expected `{want}` in: {err}");
        }
    }

    #[test]
    fn a_huge_refused_name_is_quoted_shortened() {
        let err = validate_job_name(&"y".repeat(1_000_000)).unwrap_err();
        assert_eq!(err, JobNameError::TooLong { name: format!("{}…", "y".repeat(64)), chars: 1_000_000 });
        assert!(err.to_string().len() < 400, "{err}");
    }

    #[test]
    fn the_rule_in_words_matches_the_bound() {
        assert!(JOB_NAME_RULE.contains(&format!("1 to {JOB_NAME_CHARS_MAX} characters")));
    }
}
