//! A definition's JSON form: the text the store keeps for a managed job
//! ([`JobSpec::to_json`]), and back ([`JobSpec::from_json`], [`check_definition`]), each
//! refusal naming its key (`http.url`) in the words a `[[jobs]]` table's would have.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use crate::check::{CheckedJob, SpecError};
use crate::spec::{HttpSpec, JobSpec, RetrySpec};
use crate::words::refusal;

/// Where an error points that no one key is at.
const BODY: &str = "(body)";

impl JobSpec {
    /// The definition the store keeps for this spec: a JSON object of the keys it sets,
    /// sorted (nested tables too), so an equal definition is equal text and writing it
    /// again makes no new revision.
    ///
    /// ```
    /// use solocron_spec::{HttpSpec, JobSpec};
    /// let spec = JobSpec {
    ///     schedule: Some("0 * * * * *".into()),
    ///     lease: Some("10s".into()),
    ///     http: Some(HttpSpec { url: Some("https://x.example/run".into()), ..HttpSpec::default() }),
    ///     ..JobSpec::default()
    /// };
    /// assert_eq!(spec.to_json(), r#"{"http":{"url":"https://x.example/run"},"lease":"10s","schedule":"0 * * * * *"}"#);
    /// ```
    pub fn to_json(&self) -> String {
        let mut value = serde_json::to_value(self).expect("a spec is strings, numbers and tables");
        value.sort_all_objects();
        value.to_string()
    }

    /// The definition of managed job `job` (a JSON object: the keys of a `[[jobs]]` entry),
    /// as a spec: its `name` and `namespace`, where given, must be the job's; no key is null
    /// or unknown, and each value has its key's type. An error names the key (`http.url`,
    /// `comand`) and says what is wrong as a configuration's would.
    ///
    /// ```
    /// use solocron_spec::JobSpec;
    /// let body = serde_json::json!({"schedule": "@hourly", "comand": ["true"]});
    /// let e = JobSpec::from_json("sync", &body).unwrap_err();
    /// assert_eq!(e.key, "comand");
    /// assert!(e.message.starts_with("unknown key; did you mean `command`?"), "{e}");
    /// ```
    pub fn from_json(job: &str, definition: &Value) -> Result<JobSpec, SpecError> {
        let Value::Object(fields) = definition else {
            return Err(SpecError::new(BODY, "a job definition is a JSON object of a [[jobs]] entry's keys"));
        };
        match fields.get("name") {
            Some(Value::String(n)) if n == job => {}
            Some(_) => return Err(name_refused(job)),
            None => {}
        }
        match fields.get("namespace") {
            Some(Value::String(ns)) if ns == solocron_core::namespace_of(job) => {}
            Some(_) => return Err(namespace_refused(job)),
            None => {}
        }
        if let Some(key) = null_key(fields, "") {
            return Err(SpecError::new(key, "is null: leave the key out instead"));
        }
        if let Some(e) = first_refused(Table::Job, "", fields) {
            return Err(e);
        }
        serde_json::from_value(definition.clone()).map_err(|e| SpecError::new(BODY, e.to_string()))
    }

    /// This definition as managed job `job`'s: its `name` and `namespace`, where given,
    /// must be the job's; then checked as a configuration's job with no `[defaults]`.
    ///
    /// ```
    /// use solocron_spec::JobSpec;
    /// let spec = JobSpec { schedule: Some("@daily".into()), command: Some(vec!["/bin/backup".into()]), ..JobSpec::default() };
    /// assert_eq!(spec.check_as("billing/backup")?.name, "billing/backup");
    /// let other = JobSpec { namespace: Some("ops".into()), ..spec };
    /// assert_eq!(other.check_as("billing/backup").unwrap_err().key, "namespace");
    /// # Ok::<(), solocron_spec::SpecError>(())
    /// ```
    pub fn check_as(&self, job: &str) -> Result<CheckedJob, SpecError> {
        if self.name.as_deref().is_some_and(|n| n != job) {
            return Err(name_refused(job));
        }
        if self.namespace.as_deref().is_some_and(|ns| ns != solocron_core::namespace_of(job)) {
            return Err(namespace_refused(job));
        }
        // The full name carries the namespace.
        let own = JobSpec { name: Some(job.to_owned()), namespace: None, ..self.clone() };
        own.check(&JobSpec::default())
    }
}

/// A managed job's definition as the store keeps it (JSON text), checked as every node
/// checks it before running it: the job, or the key at fault (`schedule`, `http.url`) and
/// what is wrong.
///
/// ```
/// let job = solocron_spec::check_definition("sync", r#"{"schedule": "0 * * * * *", "http": {"url": "https://x.example/run"}}"#)?;
/// assert_eq!(job.name, "sync");
/// let e = solocron_spec::check_definition("sync", r#"{"schedule": "0 * * * * *", "http": {"url": "ftp://x"}}"#).unwrap_err();
/// assert_eq!(e.key, "http.url");
/// # Ok::<(), solocron_spec::SpecError>(())
/// ```
pub fn check_definition(job: &str, text: &str) -> Result<CheckedJob, SpecError> {
    let value: Value = serde_json::from_str(text).map_err(|e| SpecError::new(BODY, format!("not JSON: {e}")))?;
    JobSpec::from_json(job, &value)?.check_as(job)
}

fn name_refused(job: &str) -> SpecError {
    SpecError::new("name", format!("is the job's name, `{job}`: leave it out or make it equal"))
}

fn namespace_refused(job: &str) -> SpecError {
    let ns = solocron_core::namespace_of(job);
    SpecError::new("namespace", format!("is the job's, `{ns}` (from its name `{job}`): leave it out or make it equal"))
}

/// The first key (dotted) whose value is null.
fn null_key(fields: &Map<String, Value>, prefix: &str) -> Option<String> {
    fields.iter().find_map(|(k, v)| match v {
        Value::Null => Some(format!("{prefix}{k}")),
        Value::Object(inner) => null_key(inner, &format!("{prefix}{k}.")),
        _ => None,
    })
}

/// The tables of a definition, each with the type its keys deserialize into.
#[derive(Clone, Copy)]
enum Table {
    Job,
    Retry,
    Http,
    /// `http.headers`, `http.headers_env`, `http.headers_file`: names to strings.
    Strings,
}

impl Table {
    /// The table at `key` in this one, if it is one.
    fn inner(self, key: &str) -> Option<Table> {
        match (self, key) {
            (Table::Job, "retry") => Some(Table::Retry),
            (Table::Job, "http") => Some(Table::Http),
            (Table::Http, "headers" | "headers_env" | "headers_file") => Some(Table::Strings),
            _ => None,
        }
    }

    /// Serde's refusal of `key = value` in this table, if it refuses it: an unknown key,
    /// or a value (or a value inside it) of the wrong type.
    fn refuses(self, key: &str, value: &Value) -> Option<String> {
        let one = Value::Object(Map::from_iter([(key.to_owned(), value.clone())]));
        let refused = match self {
            Table::Job => serde_json::from_value::<JobSpec>(one).err(),
            Table::Retry => serde_json::from_value::<RetrySpec>(one).err(),
            Table::Http => serde_json::from_value::<HttpSpec>(one).err(),
            Table::Strings => serde_json::from_value::<BTreeMap<String, String>>(one).err(),
        };
        refused.map(|e| e.to_string())
    }
}

/// The first key of `fields` that its table refuses, with serde's words made a
/// configuration's. Keys are taken in the order a `[[jobs]]` table lists them once written
/// out (plain values first, then each table, depth first; each group sorted), so a
/// definition with two faults is told the one its table would be told first.
fn first_refused(table: Table, prefix: &str, fields: &Map<String, Value>) -> Option<SpecError> {
    let (tables, values): (Vec<_>, Vec<_>) = fields.iter().partition(|(_, v)| is_table(v));
    for (key, value) in values.into_iter().chain(tables) {
        let Some(message) = table.refuses(key, value) else { continue };
        let path = format!("{prefix}{key}");
        if let (Some(inner), Value::Object(fields)) = (table.inner(key), value) {
            if let Some(e) = first_refused(inner, &format!("{path}."), fields) {
                return Some(e);
            }
        }
        // Said as of a configuration's job at that key, so a `command` or `http` of the
        // wrong type gets the example it gets there.
        return Some(SpecError::new(&path, refusal(&format!("jobs[0].{path}"), &message, "")));
    }
    None
}

/// Whether `value` is written as a table of its own (`[jobs.http]`, `[[jobs.x]]`) rather
/// than on its key's line.
fn is_table(value: &Value) -> bool {
    match value {
        Value::Object(_) => true,
        Value::Array(items) => !items.is_empty() && items.iter().all(Value::is_object),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(body: &str) -> (String, String) {
        let e = check_definition("sync", body).unwrap_err();
        (e.key, e.message)
    }

    #[test]
    fn a_bad_definition_names_its_own_key() {
        assert_eq!(refused(r#"{"schedule": "nope", "command": ["true"]}"#).0, "schedule");
        assert_eq!(refused(r#"{"schedule": "* * * * *", "http": {"url": "ftp://x"}}"#).0, "http.url");
        let (key, msg) = refused(r#"{"schedule": "* * * * *", "comand": ["true"]}"#);
        assert!(key == "comand" && msg.contains("did you mean `command`") && !msg.contains("line"), "{key}: {msg}");
        assert_eq!(refused(r#"{"schedule": "* * * * *", "command": ["true"], "lease": null}"#).0, "lease");
        assert_eq!(refused(r#"{"name": "other", "schedule": "* * * * *", "command": ["true"]}"#).0, "name");
        assert_eq!(refused("[1, 2]").0, "(body)");
        assert_eq!(refused("{").0, "(body)");
        assert_eq!(
            refused(r#"{"schedule": 5, "command": ["true"]}"#),
            ("schedule".into(), "must be a string, not an integer `5`".into())
        );
        let (key, msg) =
            refused(r#"{"schedule": "* * * * *", "http": {"url": "http://x", "headers_file": {"X-Key": 3}}}"#);
        assert_eq!((key.as_str(), msg.as_str()), ("http.headers_file.X-Key", "must be a string, not an integer `3`"));
        let (key, msg) = refused(r#"{"schedule": "* * * * *", "command": ["true"], "retry": {"atempts": 2}}"#);
        assert!(key == "retry.atempts" && msg.contains("did you mean `attempts`"), "{key}: {msg}");
    }

    #[test]
    fn plain_values_are_told_before_tables_as_a_written_table_would_tell_them() {
        let (key, _) = refused(r#"{"http": {"urll": "x"}, "lease": 5, "schedule": "* * * * *"}"#);
        assert_eq!(key, "lease");
    }

    #[test]
    fn a_definition_given_its_own_name_and_namespace_is_kept_as_given() {
        let body = serde_json::json!({"name": "billing/sync", "namespace": "billing", "schedule": "@hourly", "command": ["true"]});
        let spec = JobSpec::from_json("billing/sync", &body).unwrap();
        assert_eq!(spec.to_json(), body.to_string());
        assert_eq!(spec.check_as("billing/sync").unwrap().name, "billing/sync");
        assert_eq!(JobSpec::from_json("billing/other", &body).unwrap_err().key, "name");
        let body = serde_json::json!({"namespace": "ops", "schedule": "@hourly", "command": ["true"]});
        assert_eq!(JobSpec::from_json("billing/sync", &body).unwrap_err().key, "namespace");
    }
}
