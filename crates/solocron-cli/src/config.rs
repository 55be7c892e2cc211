//! The TOML configuration: parsing, defaults, and validation with errors that name the
//! file and the key.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;
use solocron_core::{parse_duration, JobPolicy, Misfire, OnCrash, Overlap, Prefix, Schedule};

/// The store used when the configuration has no `[store]`.
pub const DEFAULT_STORE_URL: &str = "sqlite://solocron.db";

/// A configuration error: which file, which key, what is wrong.
#[derive(Debug, thiserror::Error)]
#[error("{file}: {key}: {message}")]
pub struct ConfigError {
    pub file: String,
    pub key: String,
    pub message: String,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    store: RawStore,
    #[serde(default)]
    node: RawNode,
    #[serde(default)]
    defaults: RawJob,
    #[serde(default)]
    jobs: Vec<RawJob>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawStore {
    url: Option<String>,
    prefix: Option<String>,
    /// Refused with a pointer to `prefix` (its old name for SQL stores).
    table_prefix: Option<String>,
    /// Refused with a pointer to `prefix` (its old name for Redis and etcd).
    key_prefix: Option<String>,
    password_env: Option<String>,
    password_file: Option<String>,
    migrate: Option<bool>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawNode {
    id: Option<String>,
    shutdown_grace: Option<String>,
    max_concurrent_runs: Option<usize>,
    history_retention: Option<String>,
}

/// One `[[jobs]]` entry, or `[defaults]` (where `name`, `schedule` and `command` are refused).
#[derive(Debug, Deserialize, Default, Clone)]
#[serde(deny_unknown_fields)]
struct RawJob {
    name: Option<String>,
    schedule: Option<String>,
    command: Option<Vec<String>>,
    timezone: Option<String>,
    timeout: Option<String>,
    lease: Option<String>,
    overlap: Option<String>,
    misfire: Option<String>,
    catchup: Option<String>,
    max_catchup: Option<u32>,
    on_crash: Option<String>,
    max_attempts: Option<u32>,
    kill_grace: Option<String>,
}

/// A validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// The file it came from.
    pub file: String,
    pub store: StoreConfig,
    /// `None`: never prune.
    pub history_retention: Option<Duration>,
    pub node_id: Option<String>,
    pub shutdown_grace: Duration,
    pub max_concurrent_runs: usize,
    pub jobs: Vec<JobConfig>,
}

/// Where the store is and how to reach it.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// The URL as written (no password injected; see [`crate::stores`]).
    pub url: String,
    /// The namespace of solocron's tables or keys in the store (`[store] prefix`).
    pub prefix: Prefix,
    pub password_env: Option<String>,
    pub password_file: Option<String>,
    /// Apply migrations at `run` (default true).
    pub migrate: bool,
}

impl StoreConfig {
    /// A store given on the command line (`--store URL`), with defaults for the rest.
    pub fn from_url(url: &str) -> StoreConfig {
        StoreConfig {
            url: url.to_owned(),
            prefix: Prefix::default(),
            password_env: None,
            password_file: None,
            migrate: true,
        }
    }
}

/// A validated job.
#[derive(Debug, Clone)]
pub struct JobConfig {
    pub name: String,
    pub schedule: Schedule,
    pub command: Vec<String>,
    pub policy: JobPolicy,
}

impl Config {
    /// Reads and validates `path`.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            file: file.clone(),
            key: "(file)".into(),
            message: format!("cannot read: {e}"),
        })?;
        let mut cfg = Config::parse(&file, &text)?;
        if let Some(url) = path.parent().and_then(|dir| rebase_sqlite(&cfg.store.url, dir)) {
            cfg.store.url = url;
        }
        Ok(cfg)
    }

    /// Parses and validates `text`, naming `file` in errors.
    pub fn parse(file: &str, text: &str) -> Result<Config, ConfigError> {
        let raw: RawConfig = toml::from_str(text).map_err(|e| ConfigError {
            file: file.to_owned(),
            key: toml_error_key(&e),
            message: e.message().to_owned() + &toml_error_place(text, &e),
        })?;
        let err = |key: String, message: String| ConfigError { file: file.to_owned(), key, message };
        for key in ["name", "schedule", "command"] {
            let set = match key {
                "name" => raw.defaults.name.is_some(),
                "schedule" => raw.defaults.schedule.is_some(),
                _ => raw.defaults.command.is_some(),
            };
            if set {
                return Err(err(format!("defaults.{key}"), "cannot be defaulted; set it on each job".into()));
            }
        }
        let node = &raw.node;
        let shutdown_grace = match &node.shutdown_grace {
            Some(s) => parse_duration(s).map_err(|e| err("node.shutdown_grace".into(), e.to_string()))?,
            None => Duration::from_secs(30),
        };
        if let Some(id) = &node.id {
            if id.trim().is_empty() {
                return Err(err("node.id".into(), "must not be empty".into()));
            }
        }
        let mut jobs = Vec::new();
        let mut seen: HashMap<String, usize> = HashMap::new();
        for (i, j) in raw.jobs.iter().enumerate() {
            let job = resolve_job(i, j, &raw.defaults).map_err(|(key, message)| err(key, message))?;
            if let Some(first) = seen.insert(job.name.clone(), i) {
                return Err(err(
                    format!("jobs[{i}].name"),
                    format!("job name `{}` is already used by jobs[{first}]; names must be unique", job.name),
                ));
            }
            jobs.push(job);
        }
        let history_retention = history_retention(node, &jobs).map_err(|(key, message)| err(key, message))?;
        let store = resolve_store(&raw.store).map_err(|(key, message)| err(key, message))?;
        Ok(Config {
            file: file.to_owned(),
            store,
            history_retention,
            node_id: node.id.clone(),
            shutdown_grace,
            max_concurrent_runs: node.max_concurrent_runs.unwrap_or(1024),
            jobs,
        })
    }
}

/// `[node] history_retention`: `None` keeps every record. A retention shorter than the
/// jobs' floor is refused rather than raised, so the operator learns why.
fn history_retention(node: &RawNode, jobs: &[JobConfig]) -> Result<Option<Duration>, KeyError> {
    let key = || "node.history_retention".to_owned();
    let retention = match node.history_retention.as_deref() {
        None => Duration::from_secs(30 * 86_400),
        Some("never") => return Ok(None),
        Some(s) => parse_duration(s).map_err(|e| (key(), e.to_string()))?,
    };
    let floor = solocron_core::retention_floor(jobs.iter().map(|j| &j.policy));
    if retention < floor {
        return Err((
            key(),
            format!(
                "{} is too short: a pruned tick could be claimed again by a node whose clock lags, or by a catch-up looking back; use at least {} (a day, and twice the longest catchup)",
                solocron_core::format_duration(retention),
                solocron_core::format_duration(floor)
            ),
        ));
    }
    Ok(Some(retention))
}

/// `[store]`, with the defaults filled in.
/// A `sqlite:` URL whose file path is relative, made relative to `dir` (the configuration
/// file's folder), so that every command given the same file opens the same database
/// whatever directory it runs from; `None` when there is nothing to change.
fn rebase_sqlite(url: &str, dir: &Path) -> Option<String> {
    let rest = url.strip_prefix("sqlite:")?;
    let path = rest.strip_prefix("//").unwrap_or(rest);
    if path.is_empty() || path.starts_with('/') || dir.as_os_str().is_empty() {
        return None;
    }
    Some(format!("sqlite://{}", dir.join(path).display()))
}

fn resolve_store(store: &RawStore) -> Result<StoreConfig, KeyError> {
    let prefix = store_prefix(store)?;
    if store.password_env.is_some() && store.password_file.is_some() {
        return Err(("store.password_env".into(), "set password_env or password_file, not both".into()));
    }
    Ok(StoreConfig {
        url: store.url.clone().unwrap_or_else(|| DEFAULT_STORE_URL.to_owned()),
        prefix,
        password_env: store.password_env.clone(),
        password_file: store.password_file.clone(),
        migrate: store.migrate.unwrap_or(true),
    })
}

/// `[store] prefix`, checked by the one rule every store shares. The keys it replaced are
/// refused with what to write instead, so an old configuration is not silently moved to the
/// default namespace (where its nodes would find none of their history).
fn store_prefix(store: &RawStore) -> Result<Prefix, KeyError> {
    let renamed = |key: &str, old: &str| {
        let name = old.trim_matches(|c| matches!(c, '{' | '}' | ':' | '/')).trim_end_matches('_');
        let how = match Prefix::parse(name) {
            Ok(_) => format!(
                "without the trailing `_` or the store's punctuation: `{key} = \"{old}\"` -> `prefix = \"{name}\"`"
            ),
            Err(e) => format!("`{old}` has no such name: {e}"),
        };
        (format!("store.{key}"), format!("became `prefix`, one name for every store, {how}"))
    };
    if let Some(old) = &store.table_prefix {
        return Err(renamed("table_prefix", old));
    }
    if let Some(old) = &store.key_prefix {
        return Err(renamed("key_prefix", old));
    }
    match &store.prefix {
        Some(p) => Prefix::parse(p).map_err(|e| ("store.prefix".to_owned(), e.to_string())),
        None => Ok(Prefix::default()),
    }
}

/// The dotted key a TOML error points at, where it can be told from the message.
fn toml_error_key(e: &toml::de::Error) -> String {
    let msg = e.message();
    if let Some(rest) = msg.strip_prefix("unknown field `") {
        if let Some(end) = rest.find('`') {
            return format!("unknown key `{}`", &rest[..end]);
        }
    }
    "(syntax)".to_owned()
}

fn toml_error_place(text: &str, e: &toml::de::Error) -> String {
    let Some(span) = e.span() else { return String::new() };
    let line = text[..span.start.min(text.len())].matches('\n').count() + 1;
    format!(" (line {line})")
}

type KeyError = (String, String);

fn resolve_job(i: usize, j: &RawJob, d: &RawJob) -> Result<JobConfig, KeyError> {
    let name = j.name.clone().ok_or_else(|| (format!("jobs[{i}].name"), "is required".into()))?;
    // The library's rule, so a configuration names only jobs the scheduler accepts.
    solocron_core::validate_job_name(&name).map_err(|e| (format!("jobs[{i}].name"), e.to_string()))?;
    let key = |k: &str| format!("jobs[{i}] ({name}).{k}");
    let schedule_expr = j.schedule.as_deref().ok_or_else(|| (key("schedule"), "is required".into()))?;
    let zone = j.timezone.as_deref().or(d.timezone.as_deref()).unwrap_or("UTC");
    let schedule = Schedule::parse(schedule_expr, zone).map_err(|e| {
        let k = if matches!(e, solocron_core::ScheduleError::TimeZone(_)) { "timezone" } else { "schedule" };
        (key(k), e.to_string())
    })?;
    let command = j.command.clone().ok_or_else(|| {
        (key("command"), "is required (an argv array, e.g. [\"/usr/bin/env\", \"sh\", \"-c\", \"echo hi\"])".into())
    })?;
    if command.is_empty() || command[0].is_empty() {
        return Err((key("command"), "must name a program: a non-empty argv array".into()));
    }
    let policy = resolve_policy(j, d, &key)?;
    Ok(JobConfig { name, schedule, command, policy })
}

fn resolve_policy(j: &RawJob, d: &RawJob, key: &dyn Fn(&str) -> String) -> Result<JobPolicy, KeyError> {
    let base = JobPolicy::default();
    let dur = |k: &str, v: &Option<String>, dv: &Option<String>| -> Result<Option<Duration>, KeyError> {
        match v.as_ref().or(dv.as_ref()) {
            Some(s) => parse_duration(s).map(Some).map_err(|e| (key(k), e.to_string())),
            None => Ok(None),
        }
    };
    fn pick<T: std::str::FromStr<Err = String>>(
        key: &dyn Fn(&str) -> String,
        k: &str,
        v: &Option<String>,
        dv: &Option<String>,
        default: T,
    ) -> Result<T, KeyError> {
        match v.as_ref().or(dv.as_ref()) {
            Some(s) => s.parse().map_err(|e| (key(k), e)),
            None => Ok(default),
        }
    }
    let lease = dur("lease", &j.lease, &d.lease)?.unwrap_or(base.lease);
    let policy = JobPolicy {
        lease,
        timeout: dur("timeout", &j.timeout, &d.timeout)?,
        overlap: pick::<Overlap>(key, "overlap", &j.overlap, &d.overlap, base.overlap)?,
        misfire: pick::<Misfire>(key, "misfire", &j.misfire, &d.misfire, base.misfire)?,
        catchup: dur("catchup", &j.catchup, &d.catchup)?.unwrap_or(base.catchup),
        max_catchup: j.max_catchup.or(d.max_catchup).unwrap_or(base.max_catchup),
        on_crash: pick::<OnCrash>(key, "on_crash", &j.on_crash, &d.on_crash, base.on_crash)?,
        max_attempts: j.max_attempts.or(d.max_attempts).unwrap_or(base.max_attempts),
        kill_grace: dur("kill_grace", &j.kill_grace, &d.kill_grace)?.unwrap_or(JobPolicy::default_kill_grace(lease)),
    };
    policy.validate().map_err(|e| (key(e.field), e.why))?;
    Ok(policy)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
[store]
url = "sqlite://x.db"
[node]
id = "web-1"
[defaults]
timezone = "Europe/Berlin"
lease = "10s"
[[jobs]]
name = "a"
schedule = "*/5 * * * * *"
command = ["/bin/true"]
[[jobs]]
name = "b"
schedule = "0 0 1 * * *"
timezone = "Asia/Shanghai"
command = ["/bin/true"]
lease = "3s"
on_crash = "retry"
max_attempts = 5
misfire = "all"
catchup = "1h"
"#;

    fn error_of(toml: &str) -> String {
        Config::parse("test.toml", toml).unwrap_err().to_string()
    }

    #[test]
    fn defaults_apply_and_jobs_override_them() {
        let c = Config::parse("test.toml", GOOD).unwrap();
        assert_eq!(c.store.url, "sqlite://x.db");
        assert_eq!(c.store.prefix, Prefix::default());
        assert_eq!(c.history_retention, Some(Duration::from_secs(30 * 86_400)));
        assert_eq!(c.jobs[0].schedule.zone().name(), "Europe/Berlin");
        assert_eq!(c.jobs[0].policy.lease, Duration::from_secs(10));
        assert_eq!(c.jobs[1].schedule.zone().name(), "Asia/Shanghai");
        assert_eq!(c.jobs[1].policy.lease, Duration::from_secs(3));
        assert_eq!(c.jobs[1].policy.on_crash, OnCrash::Retry);
        assert_eq!(c.jobs[1].policy.misfire, Misfire::All);
        assert_eq!(c.jobs[1].policy.catchup, Duration::from_secs(3600));
    }

    #[test]
    fn missing_store_means_the_sqlite_default() {
        let c = Config::parse("t.toml", "").unwrap();
        assert_eq!(c.store.url, DEFAULT_STORE_URL);
    }

    #[test]
    fn each_bad_input_names_file_and_key() {
        let cases = [
            (GOOD.replace("lease = \"3s\"", "lease = \"3 parsecs\""), "jobs[1] (b).lease"),
            (GOOD.replace("*/5 * * * * *", "*/5 * 25 * * *"), "the hour field `25`"),
            (GOOD.replace("Asia/Shanghai", "Asia/Atlantis"), "jobs[1] (b).timezone"),
            (GOOD.replace("name = \"b\"", "name = \"a\""), "already used by jobs[0]"),
            (GOOD.replace("on_crash = \"retry\"", "on_crash = \"pray\""), "jobs[1] (b).on_crash"),
            (GOOD.replace("max_attempts = 5", "max_attempts = 0"), "jobs[1] (b).max_attempts"),
            (GOOD.replace("[node]", "[node]\ncolour = \"red\""), "unknown key `colour`"),
            (GOOD.replace("command = [\"/bin/true\"]\nlease", "command = []\nlease"), "jobs[1] (b).command"),
            (GOOD.replace("[defaults]", "[defaults]\nschedule = \"* * * * *\""), "defaults.schedule"),
            (
                GOOD.replace("[node]", "[node]\nhistory_retention = \"1h\""),
                "node.history_retention: 1h 00m is too short",
            ),
            (
                GOOD.replace("[node]", "[node]\nhistory_retention = \"40d\"")
                    .replace("catchup = \"1h\"", "catchup = \"30d\""),
                "node.history_retention",
            ),
            (
                GOOD.replace("url = \"sqlite://x.db\"", "url = \"sqlite://x.db\"\nprefix = \"Bad-Prefix\""),
                "store.prefix: bad prefix `Bad-Prefix`",
            ),
        ];
        for (toml, want) in cases {
            let e = error_of(&toml);
            assert!(e.starts_with("test.toml: "), "{e}");
            assert!(e.contains(want), "expected `{want}` in: {e}");
        }
    }

    #[test]
    fn a_bad_job_name_is_refused_by_the_core_rule_at_its_file_and_key() {
        let long = "x".repeat(solocron_core::JOB_NAME_CHARS_MAX + 1);
        let cases = [
            ("a@b", "test.toml: jobs[1].name: job name `a@b` contains `@`, which separates the parts of a run id"),
            ("b#2", "test.toml: jobs[1].name: job name `b#2` contains `#`"),
            ("", "test.toml: jobs[1].name: the job name is empty"),
            ("nightly backup", "test.toml: jobs[1].name: job name `nightly backup` contains a space"),
            ("b\\u0007", "test.toml: jobs[1].name: job name `b\\u{7}` contains a control character (U+0007)"),
            (&long, "test.toml: jobs[1].name: job name `xxxx"),
        ];
        for (name, want) in cases {
            let e = error_of(&GOOD.replace("name = \"b\"", &format!("name = \"{name}\"")));
            assert!(e.starts_with(want), "{name}: expected `{want}` at the start of: {e}");
            assert!(e.contains("a job name is 1 to 191 characters with no whitespace"), "says what is allowed: {e}");
        }
        let missing = error_of(&GOOD.replace("name = \"b\"\n", ""));
        assert_eq!(missing, "test.toml: jobs[1].name: is required");
        for fine in ["billing.invoices-daily", "a/b:c", "日次"] {
            let c = Config::parse("test.toml", &GOOD.replace("name = \"b\"", &format!("name = \"{fine}\""))).unwrap();
            assert_eq!(c.jobs[1].name, fine);
        }
    }

    #[test]
    fn one_prefix_names_the_namespace_and_its_old_names_say_what_to_write() {
        let with = |line: &str| GOOD.replace("url = \"sqlite://x.db\"", &format!("url = \"sqlite://x.db\"\n{line}"));
        let c = Config::parse("test.toml", &with("prefix = \"billing\"")).unwrap();
        assert_eq!(c.store.prefix.as_str(), "billing");
        let cases = [
            ("table_prefix = \"solocron_\"", "store.table_prefix: became `prefix`", "-> `prefix = \"solocron\"`"),
            ("table_prefix = \"billing_\"", "store.table_prefix", "-> `prefix = \"billing\"`"),
            ("key_prefix = \"{billing}:\"", "store.key_prefix: became `prefix`", "-> `prefix = \"billing\"`"),
            ("key_prefix = \"/billing/\"", "store.key_prefix", "-> `prefix = \"billing\"`"),
            ("table_prefix = \"_Odd\"", "store.table_prefix", "bad prefix `_Odd`"),
        ];
        for (line, key, advice) in cases {
            let e = error_of(&with(line));
            assert!(e.starts_with("test.toml: ") && e.contains(key) && e.contains(advice), "{line}: {e}");
        }
    }

    #[test]
    fn a_relative_sqlite_path_is_relative_to_the_configuration_file() {
        let dir = Path::new("/etc/solocron");
        assert_eq!(rebase_sqlite("sqlite://app.db", dir).as_deref(), Some("sqlite:///etc/solocron/app.db"));
        assert_eq!(rebase_sqlite("sqlite:data/app.db", dir).as_deref(), Some("sqlite:///etc/solocron/data/app.db"));
        assert_eq!(rebase_sqlite("sqlite://app.db", Path::new("sub")).as_deref(), Some("sqlite://sub/app.db"));
        assert_eq!(rebase_sqlite("sqlite:///var/app.db", dir), None, "absolute stays");
        assert_eq!(rebase_sqlite("sqlite://app.db", Path::new("")), None, "a file in the current directory");
        assert_eq!(rebase_sqlite("postgres://db/app", dir), None);
    }
}
