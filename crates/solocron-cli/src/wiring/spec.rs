//! A jobs document's jobs (`solocron jobs apply`) as the store keeps them: each `[[jobs]]`
//! table checked by `solocron-spec`'s one checker and kept in that crate's JSON form, the
//! text the API writes too and every node reads back, so a node, `jobs apply` and the API
//! accept exactly the same jobs.

use solocron_spec::{CheckedJob, JobSpec};

use crate::config::parse_jobs;
use crate::{bad_input, Failure};

/// A job of a jobs document as the store keeps it: checked, its definition a JSON object
/// (keys sorted, `[defaults]` merged in, no `name`).
pub struct Spec {
    /// The job, checked.
    pub job: CheckedJob,
    /// Its definition as the store keeps it.
    pub json: String,
}

/// The jobs of a `[[jobs]]` document, each checked like a configuration's job.
pub fn specs_of_document(file: &str, text: &str) -> Result<Vec<Spec>, Failure> {
    let doc = parse_jobs(file, text).map_err(|e| bad_input(e.to_string()))?;
    let specs = doc.specs.iter().zip(doc.jobs).map(|(spec, job)| {
        // The store keys the job by its full name, which carries its namespace.
        let stored = JobSpec { name: None, namespace: None, ..spec.merged(&doc.defaults) };
        Spec { job, json: stored.to_json() }
    });
    Ok(specs.collect())
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Map, Value};

    use super::*;

    /// How a definition was checked before `solocron-spec` read JSON itself: written out as
    /// a `[[jobs]]` table and parsed by the configuration's rules, its errors' keys made the
    /// definition's own (`http.url`) and their lines dropped. The JSON form must say what
    /// this says, word for word.
    fn through_toml(name: &str, spec: &str) -> Result<CheckedJob, (String, String)> {
        let body = || "(body)".to_owned();
        let value: Value = serde_json::from_str(spec).map_err(|e| (body(), format!("not JSON: {e}")))?;
        let Value::Object(mut fields) = value else {
            return Err((body(), "a job definition is a JSON object of a [[jobs]] entry's keys".into()));
        };
        match fields.remove("name") {
            Some(Value::String(n)) if n == name => {}
            Some(_) => {
                return Err(("name".into(), format!("is the job's name, `{name}`: leave it out or make it equal")))
            }
            None => {}
        }
        match fields.remove("namespace") {
            Some(Value::String(ns)) if ns == solocron_core::namespace_of(name) => {}
            Some(_) => {
                let ns = solocron_core::namespace_of(name);
                return Err((
                    "namespace".into(),
                    format!("is the job's, `{ns}` (from its name `{name}`): leave it out or make it equal"),
                ));
            }
            None => {}
        }
        if let Some(key) = null_key(&fields, "") {
            return Err((key, "is null: leave the key out instead".into()));
        }
        let mut entry = Map::new();
        entry.insert("name".into(), Value::String(name.to_owned()));
        entry.extend(fields);
        let text =
            toml::to_string(&json!({ "jobs": [entry] })).map_err(|e| (body(), format!("not a job definition: {e}")))?;
        let mut doc =
            parse_jobs("the job definition", &text).map_err(|e| (own_key(&e.key), without_line(&e.message)))?;
        Ok(doc.jobs.remove(0))
    }

    fn null_key(fields: &Map<String, Value>, prefix: &str) -> Option<String> {
        fields.iter().find_map(|(k, v)| match v {
            Value::Null => Some(format!("{prefix}{k}")),
            Value::Object(inner) => null_key(inner, &format!("{prefix}{k}.")),
            _ => None,
        })
    }

    fn own_key(key: &str) -> String {
        let rest = key.strip_prefix("jobs[0]").unwrap_or(key);
        let rest = match rest.strip_prefix(" (") {
            Some(r) => r.split_once(").").map_or("", |(_, k)| k),
            None => rest.strip_prefix('.').unwrap_or(rest),
        };
        if rest.is_empty() {
            "(body)".to_owned()
        } else {
            rest.to_owned()
        }
    }

    fn without_line(message: &str) -> String {
        match message.find(" (line ") {
            Some(at) => {
                let end = message[at..].find(')').map_or(message.len(), |e| at + e + 1);
                format!("{}{}", &message[..at], &message[end..])
            }
            None => message.to_owned(),
        }
    }

    #[test]
    fn a_document_and_its_stored_definitions_check_alike() {
        let doc = "[defaults]\nlease = \"10s\"\n[[jobs]]\nname = \"sync\"\nschedule = \"0 * * * * *\"\nhttp = { url = \"https://x.example/run\" }\n";
        let Ok(specs) = specs_of_document("jobs.toml", doc) else { panic!("the document is valid") };
        assert_eq!(specs.len(), 1);
        assert_eq!(specs[0].json, r#"{"http":{"url":"https://x.example/run"},"lease":"10s","schedule":"0 * * * * *"}"#);
        let again = solocron_spec::check_definition("sync", &specs[0].json).unwrap();
        assert_eq!((again.name.as_str(), again.policy.lease), ("sync", std::time::Duration::from_secs(10)));
    }

    #[test]
    fn a_bad_definition_names_its_own_key() {
        let bad = |spec: &str| {
            let e = solocron_spec::check_definition("sync", spec).unwrap_err();
            (e.key, e.message)
        };
        assert_eq!(bad(r#"{"schedule": "nope", "command": ["true"]}"#).0, "schedule");
        assert_eq!(bad(r#"{"schedule": "* * * * *", "http": {"url": "ftp://x"}}"#).0, "http.url");
        let (key, msg) = bad(r#"{"schedule": "* * * * *", "comand": ["true"]}"#);
        assert!(key == "comand" && msg.contains("did you mean `command`") && !msg.contains("line"), "{key}: {msg}");
        assert_eq!(bad(r#"{"schedule": "* * * * *", "command": ["true"], "lease": null}"#).0, "lease");
        assert_eq!(bad(r#"{"name": "other", "schedule": "* * * * *", "command": ["true"]}"#).0, "name");
        assert_eq!(bad("[1, 2]").0, "(body)");
        assert_eq!(bad(r#"{"schedule": 5, "command": ["true"]}"#).0, "schedule");
    }

    /// A document's stored text, as it was made before `solocron-spec`: the TOML table
    /// itself, `[defaults]` merged in, as JSON.
    fn stored_through_toml(text: &str) -> Vec<String> {
        let doc: toml::Table = text.parse().unwrap();
        let defaults = doc.get("defaults").and_then(toml::Value::as_table).cloned().unwrap_or_default();
        let tables = doc.get("jobs").and_then(toml::Value::as_array).cloned().unwrap_or_default();
        let merged = tables.into_iter().map(|table| {
            let mut merged = defaults.clone();
            merged.extend(table.as_table().cloned().unwrap_or_default());
            merged.remove("name");
            merged.remove("namespace");
            serde_json::to_string(&merged).unwrap()
        });
        merged.collect()
    }

    #[test]
    fn a_document_is_stored_as_the_same_text_as_before() {
        let docs = [
            "[[jobs]]\nname = \"a\"\nschedule = \"@hourly\"\ncommand = [\"/bin/true\", \"x y\"]\n",
            "[defaults]\ntimezone = \"Europe/Berlin\"\nretry = { attempts = 4 }\nnamespace = \"billing\"\n[[jobs]]\nname = \"a\"\nschedule = \"@hourly\"\ncommand = [\"/bin/true\"]\nmax_catchup = 0x10\nretry = { backoff = \"1m\", jitter = false }\n[[jobs]]\nname = \"b\"\nschedule = \"0 * * * * *\"\nlease = \"10s\"\n[jobs.http]\nurl = \"https://x.example/é?q=\\\"1\\\"\"\nheaders = {}\nheaders_env = { Authorization = \"TOKEN\" }\nbody = '{\"k\": [1, 2]}'\ntimeout = \"2m\"\nexpect_status = \"2xx,409\"\n",
            ALL_KEYS,
        ];
        for doc in docs {
            let Ok(specs) = specs_of_document("jobs.toml", doc) else { panic!("valid: {doc}") };
            let now: Vec<String> = specs.into_iter().map(|s| s.json).collect();
            assert_eq!(now, stored_through_toml(doc), "{doc}");
        }
    }

    /// Every key of a `[[jobs]]` entry, each set in one of them (a job runs a `command` or
    /// calls `http`, and has one `timeout`).
    const ALL_KEYS: &str = r#"
[defaults]
namespace = "billing"
[[jobs]]
name = "backup"
schedule = "@daily"
command = ["/usr/local/bin/backup", "--all"]
timeout = "10m"
[[jobs]]
name = "sync"
schedule = "0 */5 * * * *"
timezone = "Europe/Berlin"
lease = "30s"
overlap = "allow"
misfire = "all"
catchup = "1h"
max_catchup = 50
on_crash = "retry"
max_attempts = 4
kill_grace = "5s"
retry = { attempts = 3, backoff = "10s", max_backoff = "5m", jitter = false }
[jobs.http]
url = "https://billing.internal/jobs/sync"
method = "PUT"
headers = { "Content-Type" = "application/json" }
headers_env = { Authorization = "SERVICE_TOKEN" }
headers_file = { X-Api-Key = "/run/secrets/key" }
body = "{}"
timeout = "30s"
expect_status = "2xx,304"
ca_file = "/etc/ssl/private-ca.pem"
"#;

    #[test]
    fn every_key_of_a_jobs_table_is_in_the_api_documents_job_spec() {
        let Ok(doc) = parse_jobs("all.toml", ALL_KEYS) else { panic!("every key, each valid") };
        let keys =
            |v: &Value| -> std::collections::BTreeSet<String> { v.as_object().unwrap().keys().cloned().collect() };
        let mut written = std::collections::BTreeSet::new();
        for spec in doc.specs.iter().chain([&doc.defaults]) {
            written.extend(keys(&serde_json::to_value(spec).unwrap()));
        }
        let api: Value = serde_json::from_str(&solocron_http::openapi_json()).unwrap();
        let schemas = &api["components"]["schemas"];
        assert_eq!(written, keys(&schemas["JobSpec"]["properties"]));
        let sync = serde_json::to_value(&doc.specs[1]).unwrap();
        assert_eq!(keys(&sync["http"]), keys(&schemas["HttpSpec"]["properties"]));
        assert_eq!(keys(&sync["retry"]), keys(&schemas["RetrySpec"]["properties"]));
    }

    #[test]
    fn a_definition_is_refused_in_the_words_its_table_would_be() {
        let bodies = [
            r#"{}"#,
            r#"[1]"#,
            r#"5"#,
            r#"{"#,
            r#"{"schedule": "* * * * *"}"#,
            r#"{"schedule": "nope", "command": ["true"]}"#,
            r#"{"schedule": "* * * * *", "timezone": "Mars/Olympus", "command": ["true"]}"#,
            r#"{"schedule": 5, "command": ["true"]}"#,
            r#"{"schedule": "* * * * *", "command": "true"}"#,
            r#"{"schedule": "* * * * *", "command": []}"#,
            r#"{"schedule": "* * * * *", "command": [""]}"#,
            r#"{"schedule": "* * * * *", "command": ["a", 5]}"#,
            r#"{"schedule": "* * * * *", "command": [["a"]]}"#,
            r#"{"schedule": "* * * * *", "command": ["true"], "comand": 1}"#,
            r#"{"schedule": "* * * * *", "command": ["true"], "retries": 1}"#,
            r#"{"schedule": "* * * * *", "command": ["true"], "lease": null}"#,
            r#"{"schedule": "* * * * *", "command": ["true"], "retry": {"backoff": null}}"#,
            r#"{"schedule": "* * * * *", "command": ["true"], "lease": "10ms"}"#,
            r#"{"schedule": "* * * * *", "command": ["true"], "lease": 30}"#,
            r#"{"schedule": "* * * * *", "command": ["true"], "overlap": "sometimes"}"#,
            r#"{"schedule": "* * * * *", "command": ["true"], "max_attempts": "3"}"#,
            r#"{"schedule": "* * * * *", "command": ["true"], "max_attempts": -1}"#,
            r#"{"schedule": "* * * * *", "command": ["true"], "max_attempts": 5000000000}"#,
            r#"{"schedule": "* * * * *", "command": ["true"], "max_attempts": 1.5}"#,
            r#"{"schedule": "* * * * *", "command": ["true"], "max_attempts": 3.0}"#,
            r#"{"schedule": "* * * * *", "command": ["true"], "max_attempts": true}"#,
            r#"{"schedule": "* * * * *", "command": ["true"], "max_attempts": 0}"#,
            r#"{"schedule": "* * * * *", "command": ["true"], "retry": 3}"#,
            r#"{"schedule": "* * * * *", "command": ["true"], "retry": []}"#,
            r#"{"schedule": "* * * * *", "command": ["true"], "retry": {"atempts": 2}}"#,
            r#"{"schedule": "* * * * *", "command": ["true"], "retry": {"attempts": 1}}"#,
            r#"{"schedule": "* * * * *", "command": ["true"], "retry": {"jitter": "yes"}}"#,
            r#"{"schedule": "* * * * *", "command": ["true"], "retry": {"backoff": "1m", "max_backoff": "1s"}}"#,
            r#"{"schedule": "* * * * *", "command": ["true"], "http": {"url": "http://x"}}"#,
            r#"{"schedule": "* * * * *", "http": "https://x"}"#,
            r#"{"schedule": "* * * * *", "http": []}"#,
            r#"{"schedule": "* * * * *", "http": {}}"#,
            r#"{"schedule": "* * * * *", "http": {"url": "ftp://x"}}"#,
            r#"{"schedule": "* * * * *", "http": {"url": "https://ops:pw@"}}"#,
            r#"{"schedule": "* * * * *", "http": {"urll": "x"}}"#,
            r#"{"schedule": "* * * * *", "http": {"url": 5}}"#,
            r#"{"schedule": "* * * * *", "http": {"url": "http://x", "method": "P T"}}"#,
            r#"{"schedule": "* * * * *", "http": {"url": "http://x", "headers": {"Bad Name": "x"}}}"#,
            r#"{"schedule": "* * * * *", "http": {"url": "http://x", "headers": {"X-A": "a\nb"}}}"#,
            r#"{"schedule": "* * * * *", "http": {"url": "http://x", "headers": {"X-A": 5}}}"#,
            r#"{"schedule": "* * * * *", "http": {"url": "http://x", "headers": "x"}}"#,
            r#"{"schedule": "* * * * *", "http": {"url": "http://x", "headers": {"Idempotency-Key": "x"}}}"#,
            r#"{"schedule": "* * * * *", "http": {"url": "http://x", "headers": {"a": "x"}, "headers_env": {"A": "V"}}}"#,
            r#"{"schedule": "* * * * *", "http": {"url": "http://x", "headers_env": {"A": ""}}}"#,
            r#"{"schedule": "* * * * *", "http": {"url": "http://x", "headers_file": {"A B": "/f"}}}"#,
            r#"{"schedule": "* * * * *", "http": {"url": "http://x", "headers_file": {"X-Key": 3}}}"#,
            r#"{"schedule": "* * * * *", "http": {"url": "http://x", "expect_status": "2xx,abc"}}"#,
            r#"{"schedule": "* * * * *", "http": {"url": "http://x", "expect_status": 200}}"#,
            r#"{"schedule": "* * * * *", "http": {"url": "http://x", "timeout": "30 parsecs"}}"#,
            r#"{"schedule": "* * * * *", "http": {"url": "http://x", "timeout": "1m"}, "timeout": "1m"}"#,
            r#"{"schedule": "* * * * *", "http": {"url": "http://x", "ca_file": ""}}"#,
            r#"{"schedule": "* * * * *", "http": {"urll": "x"}, "lease": 5}"#,
            r#"{"schedule": "* * * * *", "http": {"url": 5, "headers": {"X": 5}}, "retry": {"x": 1}}"#,
            r#"{"retry": {"x": 1}, "http": {"url": "http://x", "headers_env": {"X": 1}, "headers": {"Y": 2}}}"#,
            r#"{"name": "other", "schedule": "* * * * *", "command": ["true"]}"#,
            r#"{"name": 5, "schedule": "* * * * *", "command": ["true"]}"#,
            r#"{"name": "sync", "schedule": "* * * * *", "command": ["true"]}"#,
            r#"{"namespace": "default", "schedule": "* * * * *", "command": ["true"]}"#,
            r#"{"namespace": "billing", "schedule": "* * * * *", "command": ["true"]}"#,
            r#"{"schedule": "* * * * *", "command": ["true"], "kill_grace": "1h"}"#,
            r#"{"schedule": "* * * * *", "command": ["true"], "catchup": "400d"}"#,
        ];
        let mut differ = Vec::new();
        for body in bodies {
            let now = solocron_spec::check_definition("sync", body).map(|j| j.policy).map_err(|e| (e.key, e.message));
            let before = through_toml("sync", body).map(|j| j.policy);
            if now != before {
                differ.push(format!("{body}\n  now:    {now:?}\n  before: {before:?}"));
            }
        }
        assert!(differ.is_empty(), "{}", differ.join("\n"));
    }
}
