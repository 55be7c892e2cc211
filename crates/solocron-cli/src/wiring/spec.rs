//! A managed job's two spellings: the `[[jobs]]` table an operator writes, and the JSON
//! definition the store keeps and the API takes, checked both ways by the configuration's
//! own rules (`config::parse_jobs`), so a node, `jobs apply` and the API accept exactly the
//! same jobs.

use serde_json::{json, Map, Value};

use crate::config::{parse_jobs, JobConfig, Work};
use crate::{bad_input, Failure};

/// Where a definition's errors point when it came from the store or the API.
const SPEC_LABEL: &str = "the job definition";

/// A job of a jobs document as the store keeps it: checked, its definition a JSON object
/// (keys sorted, `[defaults]` merged in, no `name`).
pub struct Spec {
    /// The job, checked.
    pub job: JobConfig,
    /// Its definition as the store keeps it.
    pub json: String,
}

/// The jobs of a `[[jobs]]` document, each checked like a configuration's job.
pub fn specs_of_document(file: &str, text: &str) -> Result<Vec<Spec>, Failure> {
    let jobs = parse_jobs(file, text).map_err(|e| bad_input(e.to_string()))?;
    let doc: toml::Table = text.parse().map_err(|e| bad_input(format!("{file}: {e}")))?;
    let defaults = doc.get("defaults").and_then(toml::Value::as_table).cloned().unwrap_or_default();
    let tables = doc.get("jobs").and_then(toml::Value::as_array).cloned().unwrap_or_default();
    assert_eq!(tables.len(), jobs.len(), "parse_jobs read every [[jobs]] table");
    let mut specs = Vec::with_capacity(jobs.len());
    for (job, table) in jobs.into_iter().zip(tables) {
        let mut merged = defaults.clone();
        merged.extend(table.as_table().cloned().unwrap_or_default());
        // The store keys the job by its full name, which carries its namespace.
        merged.remove("name");
        merged.remove("namespace");
        let json = serde_json::to_string(&merged).map_err(|e| bad_input(format!("{file}: {e}")))?;
        specs.push(Spec { job, json });
    }
    Ok(specs)
}

/// A managed job's definition checked as every node checks it: the job, or the key at
/// fault (`schedule`, `http.url`) and what is wrong.
pub fn job_of_spec(name: &str, spec: &str) -> Result<JobConfig, (String, String)> {
    let body = || "(body)".to_owned();
    let value: Value = serde_json::from_str(spec).map_err(|e| (body(), format!("not JSON: {e}")))?;
    let Value::Object(mut fields) = value else {
        return Err((body(), "a job definition is a JSON object of a [[jobs]] entry's keys".into()));
    };
    match fields.remove("name") {
        Some(Value::String(n)) if n == name => {}
        Some(_) => return Err(("name".into(), format!("is the job's name, `{name}`: leave it out or make it equal"))),
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
    let mut jobs = parse_jobs(SPEC_LABEL, &text).map_err(|e| (own_key(&e.key), without_line(&e.message)))?;
    Ok(jobs.remove(0))
}

/// The first key (dotted) whose value is null.
fn null_key(fields: &Map<String, Value>, prefix: &str) -> Option<String> {
    fields.iter().find_map(|(k, v)| match v {
        Value::Null => Some(format!("{prefix}{k}")),
        Value::Object(inner) => null_key(inner, &format!("{prefix}{k}.")),
        _ => None,
    })
}

/// `jobs[0] (sync).http.url` as `http.url`: the definition's own key.
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

/// A message without its ` (line N)`: the line of a document the caller never saw.
fn without_line(message: &str) -> String {
    match message.find(" (line ") {
        Some(at) => {
            let end = message[at..].find(')').map_or(message.len(), |e| at + e + 1);
            format!("{}{}", &message[..at], &message[end..])
        }
        None => message.to_owned(),
    }
}

/// A managed job's definition checked by the configuration's rules, for the HTTP API:
/// command jobs only where `[http] allow_command_jobs` says so (a command written through
/// the API is code run on the fleet's hosts).
#[derive(Debug)]
pub struct ConfigRules {
    /// `[http] allow_command_jobs`.
    pub allow_command_jobs: bool,
}

impl solocron_fleet::SpecCheck for ConfigRules {
    fn check(&self, job: &str, spec: &Value) -> Result<String, (String, String)> {
        // Keys sorted (serde_json's map), so an equal definition is equal text.
        let text = serde_json::to_string(spec).map_err(|e| ("(body)".to_owned(), e.to_string()))?;
        solocron_core::check_spec_text(&text).map_err(|e| ("(body)".to_owned(), e))?;
        let checked = job_of_spec(job, &text)?;
        if matches!(checked.work, Work::Command(_)) && !self.allow_command_jobs {
            let why = "command jobs are refused through the API ([http] allow_command_jobs = false): use http = { url = ... }";
            return Err(("command".to_owned(), why.to_owned()));
        }
        Ok(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_document_and_its_stored_definitions_check_alike() {
        let doc = "[defaults]\nlease = \"10s\"\n[[jobs]]\nname = \"sync\"\nschedule = \"0 * * * * *\"\nhttp = { url = \"https://x.example/run\" }\n";
        let Ok(specs) = specs_of_document("jobs.toml", doc) else { panic!("the document is valid") };
        assert_eq!(specs.len(), 1);
        assert_eq!(specs[0].json, r#"{"http":{"url":"https://x.example/run"},"lease":"10s","schedule":"0 * * * * *"}"#);
        let again = job_of_spec("sync", &specs[0].json).unwrap();
        assert_eq!((again.name.as_str(), again.policy.lease), ("sync", std::time::Duration::from_secs(10)));
    }

    #[test]
    fn a_bad_definition_names_its_own_key() {
        let bad = |spec: &str| job_of_spec("sync", spec).unwrap_err();
        assert_eq!(bad(r#"{"schedule": "nope", "command": ["true"]}"#).0, "schedule");
        assert_eq!(bad(r#"{"schedule": "* * * * *", "http": {"url": "ftp://x"}}"#).0, "http.url");
        let (key, msg) = bad(r#"{"schedule": "* * * * *", "comand": ["true"]}"#);
        assert!(key == "comand" && msg.contains("did you mean `command`") && !msg.contains("line"), "{key}: {msg}");
        assert_eq!(bad(r#"{"schedule": "* * * * *", "command": ["true"], "lease": null}"#).0, "lease");
        assert_eq!(bad(r#"{"name": "other", "schedule": "* * * * *", "command": ["true"]}"#).0, "name");
        assert_eq!(bad("[1, 2]").0, "(body)");
        assert_eq!(bad(r#"{"schedule": 5, "command": ["true"]}"#).0, "schedule");
    }
}
