//! A job's definition as written: [`JobSpec`], with its `retry` ([`RetrySpec`]) and `http`
//! ([`HttpSpec`]) tables. Every key is optional here and none is unknown: what is required,
//! and what each value may be, is the checker's to say (`check.rs`), in words naming the key.
//! Durations stay humane strings (`"30s"`, `"10m"`), as an operator writes them.
//!
//! The fields are listed in the order an unknown key's error names them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// A job's definition: the keys of a configuration's `[[jobs]]` entry (and of `[defaults]`,
/// where `name`, `schedule`, `command` and `http` are refused), of a `solocron jobs apply`
/// document's, and the body of `PUT /api/v1/jobs/{job}`.
///
/// A job runs exactly one of `command` and `http`. Every other key has a default: the
/// `[defaults]` table's where a configuration has one, else the library's. Checking it
/// (`JobSpec::check`) makes the job a node runs, or names the key at fault.
// serde names the struct, and counts its fields, in its refusal of an array where a table
// belongs (`invalid length 0, expected struct RawRetry with 4 elements`): `expecting` keeps
// the words configurations have always been told there (a test holds the counts true).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields, expecting = "struct RawJob with 16 elements")]
#[schema(example = json!({
    "schedule": "0 */15 * * * *",
    "on_crash": "retry",
    "http": { "url": "https://billing.internal/jobs/send-invoices", "headers_env": { "Authorization": "BILLING_TOKEN" } }
}))]
pub struct JobSpec {
    /// The job's name: its full name (`billing/sync`: namespace `billing`), or its name in
    /// `namespace`. Required in a `[[jobs]]` entry; through the API the name is the path's,
    /// so leave it out or make it equal.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false, example = "send-invoices")]
    pub name: Option<String>,
    /// When it fires, in `timezone`: a cron expression of 6 fields (seconds first) or 5, or
    /// a macro such as `@hourly` or `@daily`. Required.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false, example = "0 */15 * * * *")]
    pub schedule: Option<String>,
    /// What it runs: the program and its arguments (an argv; no shell unless one is named).
    /// A job has a `command` or an `http`, not both.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false, example = json!(["/usr/bin/env", "sh", "-c", "echo cleaning"]))]
    pub command: Option<Vec<String>>,
    /// The IANA time zone its schedule is read in. Default: `UTC`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false, example = "Europe/Berlin")]
    pub timezone: Option<String>,
    /// The namespace (the application) the job belongs to; its full name is
    /// `namespace/name`. Default: the part of `name` before its `/`, else `default`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false, example = "billing")]
    pub namespace: Option<String>,
    /// The longest a run may take; past it the run is stopped and recorded `timed_out`.
    /// Default: none. For an HTTP job, `http.timeout` says the same (set one of them).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false, example = "10m")]
    pub timeout: Option<String>,
    /// How long a node holds a tick without renewing; it renews every third of it. At
    /// least `500ms`, at most a day. Default: `30s`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false, example = "30s")]
    pub lease: Option<String>,
    /// A tick while the job's previous run is still running in the fleet: `skip` (record it
    /// skipped) or `allow` (run it too). Default: `skip`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false, example = "skip")]
    pub overlap: Option<String>,
    /// Ticks no node claimed in time (a node or the store was down): `skip` (record them),
    /// `once` (run the latest) or `all` (run each, oldest first, up to `max_catchup`).
    /// Default: `skip`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false, example = "once")]
    pub misfire: Option<String>,
    /// How far back a node looks for missed ticks. Default: `0s` (not at all).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false, example = "1h")]
    pub catchup: Option<String>,
    /// Most missed ticks run (`misfire = all`) or recorded in one pass. Default: 100.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false, example = 100)]
    pub max_catchup: Option<u32>,
    /// A run whose node died or stalled past its lease: `abandon` (record it so) or `retry`
    /// (claim it again as the next attempt, up to `max_attempts`). Default: `abandon`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false, example = "retry")]
    pub on_crash: Option<String>,
    /// Most attempts of a tick with `on_crash = retry`, the first included. Default: 3.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false, example = 3)]
    pub max_attempts: Option<u32>,
    /// After asking a command to stop (SIGTERM), how long to wait before killing it
    /// (SIGKILL). At most 45 % of the lease. Default: a fifth of the lease, at most `10s`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false, example = "6s")]
    pub kill_grace: Option<String>,
    /// Failure retries: a run that failed or timed out runs again. Default: none. A
    /// `[defaults]` table's `retry` is taken whole by a job that has none.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub retry: Option<RetrySpec>,
    /// A request instead of a `command`: the job calls the service's own endpoint.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub http: Option<HttpSpec>,
}

/// A job's `retry`: failure retries, each a new attempt of its tick after an exponential
/// backoff, on whichever node takes it. Every key has a default: 3 attempts, `10s`
/// doubling up to `5m`, with jitter.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields, expecting = "struct RawRetry with 4 elements")]
#[schema(example = json!({ "attempts": 3, "backoff": "10s", "max_backoff": "5m", "jitter": true }))]
pub struct RetrySpec {
    /// Most attempts of a tick, the first included: 2 to 100. Default: 3.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false, example = 3)]
    pub attempts: Option<u32>,
    /// The wait before the second attempt; it doubles for each one after. At least
    /// `100ms`. Default: `10s`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false, example = "10s")]
    pub backoff: Option<String>,
    /// The longest wait between two attempts. Default: `5m`, or `backoff` if longer.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false, example = "5m")]
    pub max_backoff: Option<String>,
    /// Whether each wait is drawn between half of it and all of it, so that the retries of
    /// jobs that failed together do not all come back at once. Default: `true`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false, example = true)]
    pub jitter: Option<bool>,
}

/// A job's `http`: the request a run makes instead of running a command. Besides these
/// headers, every request carries the run's facts (`Solocron-Job`, `Solocron-Fencing-Token`,
/// `Idempotency-Key`, ...). Secret header values stay where they are (an environment
/// variable, a file) and are read by the node that runs the job.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields, expecting = "struct RawHttpJob with 9 elements")]
#[schema(example = json!({
    "url": "https://billing.internal/jobs/send-invoices",
    "headers": { "Content-Type": "application/json" },
    "headers_env": { "Authorization": "BILLING_TOKEN" },
    "body": "{\"batch\": 500}",
    "expect_status": "2xx"
}))]
pub struct HttpSpec {
    /// The endpoint to call: `http://` or `https://`, with a host. Required.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false, example = "https://billing.internal/jobs/send-invoices")]
    pub url: Option<String>,
    /// The method (sent in upper case). Default: `POST`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false, example = "POST")]
    pub method: Option<String>,
    /// Header name to its value. Not the run's facts (`Solocron-*`, `Idempotency-Key`), nor
    /// `Content-Length` or `Transfer-Encoding`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false, example = json!({ "Content-Type": "application/json" }))]
    pub headers: Option<BTreeMap<String, String>>,
    /// Header name to the environment variable holding its secret value (read by the node
    /// that runs the job; never printed, nor part of the job's fingerprint).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false, example = json!({ "Authorization": "BILLING_TOKEN" }))]
    pub headers_env: Option<BTreeMap<String, String>>,
    /// Header name to the file holding its secret value (its trailing newline is no part
    /// of it).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false, example = json!({ "X-Api-Key": "/run/secrets/billing-key" }))]
    pub headers_file: Option<BTreeMap<String, String>>,
    /// The request body, sent as is (set `Content-Type` in `headers`). Default: none.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false, example = "{\"batch\": 500}")]
    pub body: Option<String>,
    /// The job's timeout, said here (set this or the job's `timeout`, not both): past it
    /// the request is dropped and the run recorded `timed_out`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false, example = "2m")]
    pub timeout: Option<String>,
    /// The statuses that count as success: `200`, `2xx`, `200-299`, or a comma-separated
    /// list of these (`2xx,409`). Default: `2xx`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false, example = "2xx,409")]
    pub expect_status: Option<String>,
    /// A PEM file of CA certificates trusted besides the system's roots (a private CA),
    /// read by the node that runs the job.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false, example = "/etc/ssl/private-ca.pem")]
    pub ca_file: Option<String>,
}

impl JobSpec {
    /// This spec with `defaults` (a configuration's `[defaults]`) filling in each key it
    /// leaves out; a `retry` table is taken whole. What a jobs document's job means on its
    /// own, as the store keeps it.
    ///
    /// ```
    /// use solocron_spec::JobSpec;
    /// let defaults = JobSpec { lease: Some("10s".into()), timeout: Some("1m".into()), ..JobSpec::default() };
    /// let job = JobSpec { name: Some("sync".into()), timeout: Some("5m".into()), ..JobSpec::default() };
    /// let merged = job.merged(&defaults);
    /// assert_eq!((merged.lease.as_deref(), merged.timeout.as_deref()), (Some("10s"), Some("5m")));
    /// ```
    pub fn merged(&self, defaults: &JobSpec) -> JobSpec {
        fn or<T: Clone>(own: &Option<T>, default: &Option<T>) -> Option<T> {
            own.as_ref().or(default.as_ref()).cloned()
        }
        let (j, d) = (self, defaults);
        JobSpec {
            name: or(&j.name, &d.name),
            schedule: or(&j.schedule, &d.schedule),
            command: or(&j.command, &d.command),
            timezone: or(&j.timezone, &d.timezone),
            namespace: or(&j.namespace, &d.namespace),
            timeout: or(&j.timeout, &d.timeout),
            lease: or(&j.lease, &d.lease),
            overlap: or(&j.overlap, &d.overlap),
            misfire: or(&j.misfire, &d.misfire),
            catchup: or(&j.catchup, &d.catchup),
            max_catchup: or(&j.max_catchup, &d.max_catchup),
            on_crash: or(&j.on_crash, &d.on_crash),
            max_attempts: or(&j.max_attempts, &d.max_attempts),
            kill_grace: or(&j.kill_grace, &d.kill_grace),
            retry: or(&j.retry, &d.retry),
            http: or(&j.http, &d.http),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde::de::DeserializeOwned;
    use serde_json::Value;
    use utoipa::PartialSchema;

    use super::*;

    /// The keys `T` deserializes, from serde's own refusal of an unknown one.
    fn keys_of<T: DeserializeOwned + std::fmt::Debug>() -> Vec<String> {
        let e = serde_json::from_str::<T>(r#"{"?": 1}"#).unwrap_err().to_string();
        e.split('`').skip(3).step_by(2).map(str::to_owned).collect()
    }

    /// What serde says `T` is, in its refusal of a value of another type.
    fn expecting<T: DeserializeOwned + std::fmt::Debug>() -> String {
        let e = serde_json::from_str::<T>("5").unwrap_err().to_string();
        e.split(", expected ").nth(1).unwrap().split(" at line").next().unwrap().to_owned()
    }

    /// The properties of `T`'s schema, in order, and whether any may be null.
    fn properties_of<T: PartialSchema>() -> (Vec<String>, bool) {
        let schema = serde_json::to_value(T::schema()).unwrap();
        let props = schema["properties"].as_object().unwrap();
        let nullable = props.values().any(|p| p.to_string().contains("\"null\""));
        (props.keys().cloned().collect(), nullable)
    }

    #[test]
    fn the_schema_lists_every_key_a_spec_takes_none_of_them_nullable() {
        let mut keys = keys_of::<JobSpec>();
        assert_eq!(keys.len(), 16, "{keys:?}");
        keys.sort();
        assert_eq!(properties_of::<JobSpec>(), (keys, false));
        let mut keys = keys_of::<RetrySpec>();
        keys.sort();
        assert_eq!(properties_of::<RetrySpec>(), (keys, false));
        let mut keys = keys_of::<HttpSpec>();
        keys.sort();
        assert_eq!(properties_of::<HttpSpec>(), (keys, false));
        for (expecting, keys) in [
            (expecting::<JobSpec>(), keys_of::<JobSpec>()),
            (expecting::<RetrySpec>(), keys_of::<RetrySpec>()),
            (expecting::<HttpSpec>(), keys_of::<HttpSpec>()),
        ] {
            assert!(expecting.ends_with(&format!(" with {} elements", keys.len())), "{expecting}");
        }
        let schema = serde_json::to_value(JobSpec::schema()).unwrap();
        assert_eq!(schema["additionalProperties"], Value::Bool(false), "{schema}");
        assert!(schema["properties"]["lease"]["description"].as_str().unwrap().contains("500ms"));
    }
}
