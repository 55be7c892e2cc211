//! The key layout under the store's prefix `{p}`.
//!
//! | key | value | why |
//! | --- | --- | --- |
//! | `{p}schema` | layout version | written once by `migrate` |
//! | `{p}run/{at↓}/{attempt↓}/{job}` | run record (JSON) | the history, newest first in key order |
//! | `{p}alive/{at↓}/{attempt↓}/{job}` | owner node | attached to the run's etcd lease: gone = lease expired or run ended |
//! | `{p}wait/{not_before}/{at↓}/{attempt↓}/{job}` | the run's key | one per `waiting` retry, written and deleted with its record: due ones first in key order |
//! | `{p}job/{job}` | per-job guard (JSON): last fencing token, running runs | the per-job compare-and-swap point |
//! | `{p}control/{job}` | pause switch (JSON) | read by every claim of the job |
//! | `{p}registry/{node}/{job}` | registration (JSON) | one node's definitions in one range |
//! | `{p}request/{at}/{job}` | manual run request (JSON) | oldest first in key order |
//! | `{p}node/{node}/beat` | a node's last heartbeat (JSON) | rewritten by every beat |
//! | `{p}node/{node}/start`, `…/left` | when it started, when it said goodbye (ms) | written only when they change, so a beat needs no read |
//! | `{p}action/{at_µs↓}/{tag}` | an operator's action (JSON) | the audit log, newest first in key order; `tag` makes the key unique |
//! | `{p}managed/job/{job}` | a managed job: who, when (JSON), its definition | its revision is the key's `mod_revision` |
//! | `{p}managed/rev/{job}/{read↓}` | a revision of a managed job: who, when (JSON), the definition it wrote (none: a delete) | `read` is the etcd revision the write read the job at: later writes of a job read later, so its revisions sort newest first |
//! | `{p}managed/count` | how many managed jobs there are | compared by every write that creates or deletes one |
//! | `{p}managed/version` | the job last written | put by every write of a managed job: its `mod_revision` is the newest revision, and the request watch watches it |
//!
//! `at↓` and `attempt↓` are inverted (larger instants sort first) because etcd serves an
//! ascending range with a limit cheaply, while a descending (sorted) range makes it read the
//! whole range before truncating. `{job}` and `{node}` are escaped (`%` and `/`), so that a
//! name can never reach into another key's range.

use solocron_core::{HistoryQuery, Namespaces, RunId};

#[cfg(test)]
use crate::StoreError;

/// The keys of one store, all under its prefix.
#[derive(Debug, Clone)]
pub(crate) struct Keys {
    prefix: String,
}

/// Escapes `%` and `/` so that a name is one key segment.
pub(crate) fn escape(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for c in name.chars() {
        match c {
            '%' => out.push_str("%25"),
            '/' => out.push_str("%2F"),
            c => out.push(c),
        }
    }
    out
}

/// The reverse of [`escape`].
fn unescape(segment: &str) -> String {
    segment.replace("%2F", "/").replace("%25", "%")
}

/// The job whose escaped name is the last segment of `key`: a run, alive, guard or request
/// key, or the run key a waiting retry's index key holds. `None` if the key is not UTF-8.
pub(crate) fn job_of_key(key: &[u8]) -> Option<String> {
    let key = std::str::from_utf8(key).ok()?;
    key.rsplit('/').next().map(unescape)
}

/// Whether `key` (read as [`job_of_key`] reads it) is of a job in `namespaces`. Every key is,
/// for every namespace, without being read; an unreadable one is in none of a list.
pub(crate) fn key_served(namespaces: &Namespaces, key: &[u8]) -> bool {
    namespaces.names().is_none() || job_of_key(key).is_some_and(|job| namespaces.serves(&job))
}

/// Whether `key` (read as [`job_of_key`] reads it) is of a job in the namespace `query`
/// asks for (see [`HistoryQuery::in_namespace`]). Every key is when it asks for none,
/// without being read; an unreadable one is in no namespace asked for.
pub(crate) fn key_in_history(query: &HistoryQuery, key: &[u8]) -> bool {
    query.namespace.is_none() || job_of_key(key).is_some_and(|job| query.in_namespace(&job))
}

/// An instant (ms since the epoch, possibly negative) as 20 digits that sort like the instant.
fn ascending(at: i64) -> String {
    format!("{:020}", (at as u64) ^ (1 << 63))
}

/// An instant as 20 digits that sort in reverse: later instants first.
fn descending(at: i64) -> String {
    format!("{:020}", u64::MAX - ((at as u64) ^ (1 << 63)))
}

/// The suffix naming one run: `{at↓}/{attempt↓}/{job}`.
pub(crate) fn run_suffix(run: &RunId) -> String {
    format!(
        "{}/{:010}/{}",
        descending(run.tick.scheduled_at.timestamp_millis()),
        u32::MAX - run.attempt,
        escape(&run.tick.job)
    )
}

/// The run named by a suffix made by [`run_suffix`].
#[cfg(test)]
fn parse_run_suffix(suffix: &str) -> Result<RunId, StoreError> {
    let bad = || StoreError::Invalid(format!("malformed run key `{suffix}`"));
    let mut parts = suffix.splitn(3, '/');
    let (at, attempt, job) =
        (parts.next().ok_or_else(bad)?, parts.next().ok_or_else(bad)?, parts.next().ok_or_else(bad)?);
    let at = u64::MAX - at.parse::<u64>().map_err(|_| bad())?;
    let at = (at ^ (1 << 63)) as i64;
    let attempt = u32::MAX - attempt.parse::<u32>().map_err(|_| bad())?;
    let at = chrono::DateTime::from_timestamp_millis(at).ok_or_else(bad)?;
    Ok(RunId { tick: solocron_core::Tick::new(unescape(job), at), attempt })
}

impl Keys {
    /// Keys under `prefix`, a [`Prefix`](solocron_core::Prefix)'s etcd spelling (`/name/`).
    pub(crate) fn new(prefix: &str) -> Keys {
        Keys { prefix: prefix.to_owned() }
    }

    /// The prefix itself.
    pub(crate) fn prefix(&self) -> &str {
        &self.prefix
    }

    pub(crate) fn schema(&self) -> String {
        format!("{}schema", self.prefix)
    }

    /// The start of a family of keys (`run/`, `alive/`, `job/`, ...).
    pub(crate) fn family(&self, family: &str) -> String {
        format!("{}{family}/", self.prefix)
    }

    pub(crate) fn run(&self, run: &RunId) -> String {
        format!("{}run/{}", self.prefix, run_suffix(run))
    }

    pub(crate) fn alive(&self, run: &RunId) -> String {
        format!("{}alive/{}", self.prefix, run_suffix(run))
    }

    /// The index key of a `waiting` retry whose not-before is `not_before` (ms): waiting
    /// retries sort by their not-before, oldest first.
    pub(crate) fn wait(&self, not_before: i64, run: &RunId) -> String {
        format!("{}wait/{}/{}", self.prefix, ascending(not_before), run_suffix(run))
    }

    /// Index keys of retries due at `now` (ms; not-before at or before it) sort before this key.
    pub(crate) fn waits_due_end(&self, now: i64) -> String {
        match now.checked_add(1) {
            Some(after) => format!("{}wait/{}", self.prefix, ascending(after)),
            None => prefix_end(&self.family("wait")),
        }
    }

    pub(crate) fn guard(&self, job: &str) -> String {
        format!("{}job/{}", self.prefix, escape(job))
    }

    pub(crate) fn control(&self, job: &str) -> String {
        format!("{}control/{}", self.prefix, escape(job))
    }

    pub(crate) fn registration(&self, node: &str, job: &str) -> String {
        format!("{}registry/{}/{}", self.prefix, escape(node), escape(job))
    }

    /// The start of `node`'s registrations: every one of them, and no other node's (the
    /// node's name is escaped, so it cannot reach into another's range).
    pub(crate) fn node_registrations(&self, node: &str) -> String {
        format!("{}registry/{}/", self.prefix, escape(node))
    }

    pub(crate) fn request(&self, job: &str, at: i64) -> String {
        format!("{}request/{}/{}", self.prefix, ascending(at), escape(job))
    }

    /// One of a node's keys: `part` is `beat`, `start` or `left`.
    pub(crate) fn node(&self, node: &str, part: &str) -> String {
        format!("{}node/{}/{part}", self.prefix, escape(node))
    }

    /// An action's key: `at_us` (microseconds, so that one process's actions never share
    /// an instant) inverted, then `tag`.
    pub(crate) fn action(&self, at_us: i64, tag: &str) -> String {
        format!("{}action/{}/{tag}", self.prefix, descending(at_us))
    }

    /// Action keys of instants before `until_us` (microseconds) start here and run to the
    /// family's end.
    pub(crate) fn actions_before(&self, until_us: i64) -> String {
        match until_us.checked_sub(1) {
            Some(last) => format!("{}action/{}", self.prefix, descending(last)),
            None => prefix_end(&self.family("action")),
        }
    }

    /// A managed job's definition.
    pub(crate) fn managed_job(&self, job: &str) -> String {
        format!("{}managed/job/{}", self.prefix, escape(job))
    }

    /// The start of the revision keys of `job`, or of every job's.
    pub(crate) fn job_revisions(&self, job: Option<&str>) -> String {
        match job {
            Some(job) => format!("{}managed/rev/{}/", self.prefix, escape(job)),
            None => self.family("managed/rev"),
        }
    }

    /// A revision of `job`, made by a write that read the job at etcd revision `read_at`:
    /// later ones sort first.
    pub(crate) fn job_revision(&self, job: &str, read_at: i64) -> String {
        format!("{}{}", self.job_revisions(Some(job)), descending(read_at))
    }

    /// How many managed jobs there are.
    pub(crate) fn managed_count(&self) -> String {
        format!("{}managed/count", self.prefix)
    }

    /// Put by every write of a managed job.
    pub(crate) fn managed_version(&self) -> String {
        format!("{}managed/version", self.prefix)
    }

    /// The first request key at or after instant `at`: requests before `at` sort before it.
    pub(crate) fn requests_from(&self, at: i64) -> String {
        format!("{}request/{}", self.prefix, ascending(at))
    }

    /// Run keys of ticks scheduled before `until`: they start here (newest first).
    pub(crate) fn runs_before(&self, until: i64) -> String {
        match until.checked_sub(1) {
            Some(last) => format!("{}run/{}", self.prefix, descending(last)),
            None => prefix_end(&self.family("run")),
        }
    }

    /// Run keys of ticks scheduled at or after `since` end before this key.
    pub(crate) fn runs_since_end(&self, since: i64) -> String {
        prefix_end(&format!("{}run/{}/", self.prefix, descending(since)))
    }
}

/// The first key after every key starting with `prefix` (etcd's range end for a prefix).
pub(crate) fn prefix_end(prefix: &str) -> String {
    let mut bytes = prefix.as_bytes().to_vec();
    while let Some(last) = bytes.pop() {
        if last < 0x7f {
            bytes.push(last + 1);
            // Only ASCII bytes are ever incremented (prefixes are ASCII), so this stays UTF-8.
            return String::from_utf8(bytes).expect("ASCII");
        }
    }
    "\0".into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use solocron_core::Tick;

    impl Keys {
        /// The run named by a full run (or alive) key, given its family.
        fn parse_run(&self, family: &str, key: &[u8]) -> Result<RunId, StoreError> {
            let key = std::str::from_utf8(key).map_err(|_| StoreError::Invalid("a run key is not UTF-8".into()))?;
            let start = self.family(family);
            let suffix = key
                .strip_prefix(&start)
                .ok_or_else(|| StoreError::Invalid(format!("key `{key}` is not under `{start}`")))?;
            parse_run_suffix(suffix)
        }
    }

    fn run(job: &str, at: &str, attempt: u32) -> RunId {
        RunId { tick: Tick::new(job, at.parse().unwrap()), attempt }
    }

    #[test]
    fn run_keys_sort_newest_first_and_parse_back() {
        let keys = Keys::new("/p/");
        let old = run("a/b%c", "1960-01-01T00:00:00Z", 1);
        let new = run("a", "2020-01-01T00:00:00.001Z", 1);
        let retry = run("a", "2020-01-01T00:00:00.001Z", 2);
        assert!(keys.run(&retry) < keys.run(&new) && keys.run(&new) < keys.run(&old));
        for id in [old, new, retry] {
            assert_eq!(keys.parse_run("run", keys.run(&id).as_bytes()).unwrap(), id);
        }
    }

    #[test]
    fn time_windows_bound_the_run_keys() {
        let keys = Keys::new("/p/");
        let at = |s: &str| s.parse::<chrono::DateTime<chrono::Utc>>().unwrap().timestamp_millis();
        let inside = keys.run(&run("x", "2020-01-01T00:01:00Z", 1));
        let (start, end) =
            (keys.runs_before(at("2020-01-01T00:02:00Z")), keys.runs_since_end(at("2020-01-01T00:01:00Z")));
        assert!(start <= inside && inside < end);
        let later = keys.run(&run("x", "2020-01-01T00:02:00Z", 1));
        let earlier = keys.run(&run("x", "2020-01-01T00:00:59.999Z", 1));
        assert!(later < start && earlier >= end);
    }

    #[test]
    fn a_jobs_revisions_sort_newest_first_within_its_own_range() {
        let keys = Keys::new("/p/");
        let (a, a_slash) = (keys.job_revisions(Some("a")), keys.job_revisions(Some("a/b")));
        assert!(keys.job_revision("a", 9) < keys.job_revision("a", 8));
        assert!(keys.job_revision("a", 8).starts_with(&a) && !keys.job_revision("a/b", 8).starts_with(&a));
        assert!(keys.job_revision("a/b", 8).starts_with(&a_slash));
        assert!(keys.job_revision("a", 1).starts_with(&keys.job_revisions(None)));
        assert!(!keys.managed_version().starts_with(&keys.job_revisions(None)));
    }

    #[test]
    fn a_nodes_registrations_lie_in_its_own_range() {
        let keys = Keys::new("/p/");
        let (a, end) = (keys.node_registrations("a"), prefix_end(&keys.node_registrations("a")));
        let inside = keys.registration("a", "x/y");
        assert!(inside.starts_with(&a) && inside < end);
        for other in [keys.registration("a/b", "x"), keys.registration("ab", "x"), keys.registration("a%", "x")] {
            assert!(!(a <= other && other < end), "{other}");
        }
    }

    #[test]
    fn waiting_retries_sort_by_not_before_and_the_due_end_bounds_them() {
        let keys = Keys::new("/p/");
        let (a, b) = (run("z", "2020-01-01T00:00:00Z", 2), run("a", "2021-01-01T00:00:00Z", 3));
        assert!(keys.wait(-5, &a) < keys.wait(3, &b) && keys.wait(3, &b) < keys.wait(4, &a));
        let due = keys.waits_due_end(3);
        assert!(keys.wait(3, &a) < due && keys.wait(3, &b) < due && keys.wait(4, &a) > due);
        assert!(keys.wait(i64::MAX, &a) < keys.waits_due_end(i64::MAX));
        let family = keys.family("wait");
        assert!(keys.wait(i64::MIN, &b).starts_with(&family) && !keys.run(&b).starts_with(&family));
    }

    #[test]
    fn the_job_of_a_key_is_read_back_from_its_last_segment() {
        let keys = Keys::new("/p/");
        let id = run("billing/a%2Fb", "2020-01-01T00:00:00Z", 3);
        for key in [keys.run(&id), keys.alive(&id), keys.guard("billing/a%2Fb"), keys.request("billing/a%2Fb", 7)] {
            assert_eq!(job_of_key(key.as_bytes()).as_deref(), Some("billing/a%2Fb"), "{key}");
        }
        let billing = Namespaces::only(["billing"]).unwrap();
        assert!(key_served(&billing, keys.run(&id).as_bytes()));
        assert!(!key_served(&billing, keys.run(&run("backup", "2020-01-01T00:00:00Z", 1)).as_bytes()));
        assert!(!key_served(&billing, b"/p/run/\xff"));
        assert!(key_served(&Namespaces::ALL, b"/p/run/\xff"));
    }

    #[test]
    fn a_history_query_keeps_the_keys_of_its_namespace() {
        let keys = Keys::new("/p/");
        let key = |job: &str| keys.run(&run(job, "2020-01-01T00:00:00Z", 1));
        let asking = |ns: Option<&str>| HistoryQuery { namespace: ns.map(str::to_owned), ..HistoryQuery::default() };
        let (billing, default) = (asking(Some("billing")), asking(Some("default")));
        assert!(key_in_history(&billing, key("billing/a/b").as_bytes()));
        assert!(
            !key_in_history(&billing, key("bill/x").as_bytes()) && !key_in_history(&billing, key("billing").as_bytes())
        );
        assert!(key_in_history(&default, key("billing").as_bytes()));
        assert!(!key_in_history(&default, key("billing/x").as_bytes()));
        assert!(!key_in_history(&billing, b"/p/run/\xff"));
        assert!(key_in_history(&asking(None), b"/p/run/\xff"));
    }

    #[test]
    fn requests_sort_oldest_first() {
        let keys = Keys::new("/p/");
        assert!(keys.request("z", -5) < keys.request("a", 3));
        assert!(keys.requests_from(3) <= keys.request("a", 3) && keys.request("a", 2) < keys.requests_from(3));
    }
}
