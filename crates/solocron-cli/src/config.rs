//! The TOML configuration: parsing, defaults, and validation with errors that name the
//! file and the key.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use solocron_core::{parse_duration, JobPolicy, Misfire, Namespaces, OnCrash, Overlap, Prefix, RetryPolicy, Schedule};

// A child by path, so that the fuzz target compiling this file in finds it too.
#[path = "alert_config.rs"]
mod alert_config;
use alert_config::{resolve_alerts, RawAlert};
pub use alert_config::{AlertConfig, AlertTargetConfig};

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
    #[serde(default)]
    http: RawHttp,
    #[serde(default)]
    alerts: Vec<RawAlert>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawHttp {
    listen: Option<String>,
    allow_command_jobs: Option<bool>,
    #[serde(default)]
    tokens: Vec<RawToken>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawToken {
    name: Option<String>,
    role: Option<String>,
    token_env: Option<String>,
    token_file: Option<String>,
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
    namespaces: Option<Vec<String>>,
    shutdown_grace: Option<String>,
    max_concurrent_runs: Option<usize>,
    history_retention: Option<String>,
    pid_file: Option<String>,
}

/// One `[[jobs]]` entry, or `[defaults]` (where `name`, `schedule`, `command` and `http` are
/// refused).
#[derive(Debug, Deserialize, Default, Clone)]
#[serde(deny_unknown_fields)]
struct RawJob {
    name: Option<String>,
    schedule: Option<String>,
    command: Option<Vec<String>>,
    timezone: Option<String>,
    namespace: Option<String>,
    timeout: Option<String>,
    lease: Option<String>,
    overlap: Option<String>,
    misfire: Option<String>,
    catchup: Option<String>,
    max_catchup: Option<u32>,
    on_crash: Option<String>,
    max_attempts: Option<u32>,
    kill_grace: Option<String>,
    retry: Option<RawRetry>,
    http: Option<RawHttpJob>,
}

/// A job's `retry = { ... }`: failure retries. Every key is optional (see [`resolve_retry`]).
#[derive(Debug, Deserialize, Default, Clone)]
#[serde(deny_unknown_fields)]
struct RawRetry {
    attempts: Option<u32>,
    backoff: Option<String>,
    max_backoff: Option<String>,
    jitter: Option<bool>,
}

/// Attempts of a `retry` that does not say, the first included.
const RETRY_ATTEMPTS_DEFAULT: u32 = 3;
/// The first wait of a `retry` that does not say.
const RETRY_BACKOFF_DEFAULT: Duration = Duration::from_secs(10);
/// The longest wait of a `retry` that does not say (or its `backoff`, if longer).
const RETRY_MAX_BACKOFF_DEFAULT: Duration = Duration::from_secs(300);

/// A job's `http = { ... }`: a request instead of a command.
#[derive(Debug, Deserialize, Default, Clone)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawHttpJob {
    pub(crate) url: Option<String>,
    pub(crate) method: Option<String>,
    #[serde(default)]
    pub(crate) headers: BTreeMap<String, String>,
    /// Header name to the environment variable holding its (secret) value.
    #[serde(default)]
    pub(crate) headers_env: BTreeMap<String, String>,
    /// Header name to the file holding its (secret) value.
    #[serde(default)]
    pub(crate) headers_file: BTreeMap<String, String>,
    pub(crate) body: Option<String>,
    pub(crate) timeout: Option<String>,
    pub(crate) expect_status: Option<String>,
    pub(crate) ca_file: Option<String>,
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
    /// `[node] namespaces`: the namespaces this node serves (default `default` alone).
    pub namespaces: Namespaces,
    pub shutdown_grace: Duration,
    pub max_concurrent_runs: usize,
    /// `[node] pid_file`: where `solocron run` writes its pid, for `solocron reload`.
    pub pid_file: Option<std::path::PathBuf>,
    pub jobs: Vec<JobConfig>,
    pub http: HttpConfig,
    /// `[[alerts]]`.
    pub alerts: Vec<AlertConfig>,
}

/// `[http]`: where the API, metrics and console are served, and the tokens they accept.
#[derive(Debug, Clone, Default)]
pub struct HttpConfig {
    /// `[http] listen`; `None`: no HTTP unless `--http` says.
    pub listen: Option<std::net::SocketAddr>,
    /// `[[http.tokens]]`, whose secrets are read only when serving.
    pub tokens: Vec<TokenConfig>,
    /// `[http] allow_command_jobs`: managed jobs may run commands (the API accepts them,
    /// and this node runs them). Off by default: a command written through the API is code
    /// run on the fleet's hosts.
    pub allow_command_jobs: bool,
}

/// One `[[http.tokens]]` entry: the secret stays where it is (an environment variable or a
/// file) until the server starts, and is never printed.
#[derive(Debug, Clone)]
pub struct TokenConfig {
    /// The key, for errors: `http.tokens[0]`.
    pub key: String,
    pub name: String,
    pub role: solocron_http::Role,
    pub source: SecretSource,
}

/// Where a secret is read from.
#[derive(Debug, Clone)]
pub enum SecretSource {
    Env(String),
    File(String),
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
    pub work: Work,
    pub policy: JobPolicy,
}

/// What a job runs: exactly one of `command` and `http`.
#[derive(Debug, Clone)]
pub enum Work {
    /// `command`: a non-empty argv.
    Command(Vec<String>),
    /// `http`: a request.
    Http(Box<HttpWork>),
}

/// A job's `http`, checked by the library's rules. Its secrets and CA file stay where they
/// are until the scheduler is built (`daemon::scheduler`), and are never printed.
#[derive(Debug, Clone)]
pub struct HttpWork {
    /// The request without its secret headers or CA file.
    pub request: solocron::HttpJob,
    pub secret_headers: Vec<SecretHeader>,
    /// `http.ca_file`, as written (relative paths from the working directory, like every
    /// other `*_file` key).
    pub ca_file: Option<String>,
    /// The key of the job's `http`, for errors: `jobs[0] (sync).http`.
    pub key: String,
}

/// One entry of `http.headers_env` or `http.headers_file`.
#[derive(Debug, Clone)]
pub struct SecretHeader {
    /// The key, for errors: `jobs[0] (sync).http.headers_env.Authorization`.
    pub key: String,
    pub name: String,
    pub source: SecretSource,
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
        let raw: RawConfig = toml::from_str(text).map_err(|e| {
            let (key, message) = toml_error(text, &e);
            ConfigError { file: file.to_owned(), key, message }
        })?;
        let err = |key: String, message: String| ConfigError { file: file.to_owned(), key, message };
        check_defaults(&raw).map_err(|(key, message)| err(key, message))?;
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
        let namespaces = resolve_namespaces(node).map_err(|(key, message)| err(key, message))?;
        let jobs = resolve_jobs(&raw).map_err(|(key, message)| err(key, message))?;
        served(&raw, &jobs, &namespaces).map_err(|(key, message)| err(key, message))?;
        let history_retention = history_retention(node, &jobs).map_err(|(key, message)| err(key, message))?;
        let store = resolve_store(&raw.store).map_err(|(key, message)| err(key, message))?;
        let http = resolve_http(&raw.http).map_err(|(key, message)| err(key, message))?;
        let alerts = resolve_alerts(&raw.alerts).map_err(|(key, message)| err(key, message))?;
        Ok(Config {
            file: file.to_owned(),
            store,
            history_retention,
            node_id: node.id.clone(),
            namespaces,
            shutdown_grace,
            max_concurrent_runs: node.max_concurrent_runs.unwrap_or(1024),
            pid_file: node.pid_file.as_ref().map(std::path::PathBuf::from),
            jobs,
            http,
            alerts,
        })
    }
}

/// A document of jobs only (`solocron jobs apply -f FILE`, a managed job's definition):
/// `[[jobs]]` tables and an optional `[defaults]`, checked exactly like a configuration's.
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawJobs {
    #[serde(default)]
    defaults: RawJob,
    #[serde(default)]
    jobs: Vec<RawJob>,
}

/// Parses and validates a document of `[[jobs]]` (and `[defaults]`) only, naming `file` in
/// errors, with the same rules and messages as [`Config::parse`].
pub fn parse_jobs(file: &str, text: &str) -> Result<Vec<JobConfig>, ConfigError> {
    let raw: RawJobs = toml::from_str(text).map_err(|e| {
        let (key, message) = toml_error(text, &e);
        ConfigError { file: file.to_owned(), key, message }
    })?;
    let whole = RawConfig { defaults: raw.defaults, jobs: raw.jobs, ..RawConfig::default() };
    let err = |key: String, message: String| ConfigError { file: file.to_owned(), key, message };
    check_defaults(&whole).map_err(|(key, message)| err(key, message))?;
    resolve_jobs(&whole).map_err(|(key, message)| err(key, message))
}

/// `[defaults]` may not hold what only a job can say.
fn check_defaults(raw: &RawConfig) -> Result<(), KeyError> {
    for key in ["name", "schedule", "command", "http"] {
        let set = match key {
            "name" => raw.defaults.name.is_some(),
            "schedule" => raw.defaults.schedule.is_some(),
            "command" => raw.defaults.command.is_some(),
            _ => raw.defaults.http.is_some(),
        };
        if set {
            return Err((format!("defaults.{key}"), "cannot be defaulted; set it on each job".into()));
        }
    }
    Ok(())
}

/// Every `[[jobs]]` entry, checked, names unique.
fn resolve_jobs(raw: &RawConfig) -> Result<Vec<JobConfig>, KeyError> {
    let mut jobs = Vec::new();
    let mut seen: HashMap<String, usize> = HashMap::new();
    for (i, j) in raw.jobs.iter().enumerate() {
        let job = resolve_job(i, j, &raw.defaults)?;
        if let Some(first) = seen.insert(job.name.clone(), i) {
            return Err((
                format!("jobs[{i}].name"),
                format!("job name `{}` is already used by jobs[{first}]; names must be unique", job.name),
            ));
        }
        jobs.push(job);
    }
    Ok(jobs)
}

/// `[node] namespaces`: 1 to [`solocron_core::NAMESPACES_MAX`] valid names, `default`
/// alone when absent.
fn resolve_namespaces(node: &RawNode) -> Result<Namespaces, KeyError> {
    let Some(list) = &node.namespaces else { return Ok(Namespaces::default()) };
    for (i, name) in list.iter().enumerate() {
        solocron_core::validate_namespace(name).map_err(|e| (format!("node.namespaces[{i}]"), e.to_string()))?;
    }
    Namespaces::only(list).map_err(|e| ("node.namespaces".to_owned(), e.to_string()))
}

/// Every job is in a namespace the node serves: a job it would never run is a mistake.
fn served(raw: &RawConfig, jobs: &[JobConfig], namespaces: &Namespaces) -> Result<(), KeyError> {
    for (i, job) in jobs.iter().enumerate() {
        let namespace = solocron_core::namespace_of(&job.name);
        if !namespaces.contains(namespace) {
            let key =
                if raw.jobs[i].namespace.is_some() || raw.defaults.namespace.is_some() { "namespace" } else { "name" };
            return Err((
                format!("jobs[{i}] ({}).{key}", job.name),
                format!(
                    "is in namespace `{namespace}`, which this node does not serve ({namespaces}): add it to [node] namespaces"
                ),
            ));
        }
    }
    Ok(())
}

/// `[http]`, checked: an address that parses, tokens with a name, a role and one secret
/// source each, no name twice.
fn resolve_http(http: &RawHttp) -> Result<HttpConfig, KeyError> {
    let listen = match &http.listen {
        Some(s) => Some(s.parse().map_err(|_| {
            ("http.listen".to_owned(), format!("`{s}` is not an address and port, such as 127.0.0.1:9090"))
        })?),
        None => None,
    };
    let mut tokens: Vec<TokenConfig> = Vec::new();
    for (i, t) in http.tokens.iter().enumerate() {
        let key = format!("http.tokens[{i}]");
        let name = t.name.clone().ok_or_else(|| (format!("{key}.name"), "is required".into()))?;
        let role = t.role.as_deref().ok_or_else(|| (format!("{key}.role"), "is required: read or operate".into()))?;
        let role = role.parse().map_err(|e| (format!("{key}.role"), e))?;
        let source = match (&t.token_env, &t.token_file) {
            (Some(v), None) => SecretSource::Env(v.clone()),
            (None, Some(f)) => SecretSource::File(f.clone()),
            _ => return Err((format!("{key}.token_env"), "set token_env or token_file (exactly one)".into())),
        };
        if tokens.iter().any(|o| o.name == name) {
            return Err((format!("{key}.name"), format!("token name `{name}` is used twice")));
        }
        tokens.push(TokenConfig { key, name, role, source });
    }
    Ok(HttpConfig { listen, tokens, allow_command_jobs: http.allow_command_jobs.unwrap_or(false) })
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

/// A TOML error as (key, message): the key it is at, named once (`jobs[0] (a).command`),
/// and what is wrong in words a newcomer can act on: the type expected, or for an unknown
/// key the likeliest meant one and every key that table takes.
fn toml_error(text: &str, e: &toml::de::Error) -> KeyError {
    let place = toml_error_place(text, e);
    let path = e.span().and_then(|span| toml_key_path(text, span.start));
    let msg = e.message();
    if let Some((unknown, valid)) = unknown_field(msg) {
        // In an inline table (`http = { urll = ... }`) the path stops at the table.
        let key = match path {
            Some(p) if p == unknown || p.ends_with(&format!(".{unknown}")) => p,
            Some(p) => format!("{p}.{unknown}"),
            None => unknown.clone(),
        };
        let keys = if valid.is_empty() { "none".to_owned() } else { valid.join(", ") };
        let message = match closest(&unknown, &valid) {
            Some(meant) => format!("unknown key{place}; did you mean `{meant}`? The keys here are: {keys}"),
            None => format!("unknown key{place}; the keys here are: {keys}"),
        };
        return (key, message);
    }
    match (wrong_type(msg), path) {
        (Some((found, expected)), Some(key)) => {
            let example = if key.ends_with(".command") {
                ": the program and its arguments, e.g. command = [\"/bin/sh\", \"-c\", \"echo hi\"]"
            } else if key.ends_with(".http") {
                ": the request, e.g. http = { url = \"https://billing.internal/jobs/invoices\" }"
            } else {
                ""
            };
            (key, format!("must be {expected}, not {found}{place}{example}"))
        }
        (_, key) => (key.unwrap_or_else(|| "(syntax)".to_owned()), format!("{msg}{place}")),
    }
}

fn toml_error_place(text: &str, e: &toml::de::Error) -> String {
    let Some(span) = e.span() else { return String::new() };
    let Some(before) = text.get(..span.start) else { return String::new() };
    let line = before.matches('\n').count() + 1;
    format!(" (line {line})")
}

/// Serde's `unknown field `x`, expected one of `a`, `b`` as (`x`, [`a`, `b`]).
fn unknown_field(msg: &str) -> Option<(String, Vec<String>)> {
    let rest = msg.strip_prefix("unknown field ")?;
    let mut quoted = rest.split('`').skip(1).step_by(2).map(str::to_owned);
    let unknown = quoted.next()?;
    Some((unknown, quoted.collect()))
}

/// Serde's `invalid type: string "x", expected a sequence` (or `invalid value: ...`) as
/// (what was found, what was expected), in TOML's words.
fn wrong_type(msg: &str) -> Option<(String, String)> {
    let rest = msg.strip_prefix("invalid type: ").or_else(|| msg.strip_prefix("invalid value: "))?;
    let (found, expected) = rest.split_once(", expected ")?;
    let expected = match expected {
        "a sequence" => "an array".to_owned(),
        "a boolean" => "true or false, without quotes".to_owned(),
        e if ["u8", "u16", "u32", "u64", "usize"].contains(&e) => "a whole number of 0 or more, without quotes".into(),
        e if ["i8", "i16", "i32", "i64", "isize"].contains(&e) => "a whole number, without quotes".to_owned(),
        e if e.starts_with("struct ") || e == "a map" => "a table".to_owned(),
        e => e.to_owned(),
    };
    let found = match found {
        "sequence" => "an array".to_owned(),
        "map" => "a table".to_owned(),
        f => match f.split_once(' ') {
            Some((kind, value)) if kind.starts_with(['a', 'e', 'i', 'o', 'u']) => format!("an {kind} {value}"),
            Some((kind, value)) => format!("a {kind} {value}"),
            None => f.to_owned(),
        },
    };
    Some((found, expected))
}

/// The dotted key at byte `at` of `text`: the table its line is in (`[[jobs]]` counted, so
/// `jobs[1]`, with the job's name where it has one, and `[jobs.http]` as that job's), the
/// key on that line, and the keys of the inline tables `at` is in (`http.headers.X`).
fn toml_key_path(text: &str, at: usize) -> Option<String> {
    let line_start = text.get(..at)?.rfind('\n').map_or(0, |i| i + 1);
    let line = text[line_start..].lines().next().unwrap_or_default();
    let mut table = String::new();
    let mut arrays: HashMap<String, usize> = HashMap::new();
    for l in text[..line_start].lines() {
        match toml_header(l) {
            Some((name, true)) => {
                let n = arrays.entry(name.clone()).or_default();
                table = format!("{name}[{n}]");
                *n += 1;
            }
            Some((name, false)) => table = array_member(&name, &arrays),
            None => {}
        }
    }
    let key = match toml_header(line) {
        Some((name, _)) => return Some(name),
        None => match inline_keys(text.get(line_start..at)?) {
            keys if !keys.is_empty() => keys.join("."),
            _ => line.split_once('=')?.0.trim().trim_matches('"').to_owned(),
        },
    };
    if key.is_empty() || key.contains(['{', '[']) {
        return None;
    }
    if let Some((i, rest)) = table.strip_prefix("jobs[").and_then(|r| r.split_once(']')) {
        if let Some(name) = i.parse::<usize>().ok().and_then(|i| job_name_at(text, i)) {
            table = format!("jobs[{i}] ({name}){rest}");
        }
    }
    Some(if table.is_empty() { key } else { format!("{table}.{key}") })
}

/// A `[a.b]` table inside the last `[[a]]` entry, as `a[n].b`.
fn array_member(name: &str, arrays: &HashMap<String, usize>) -> String {
    for (array, n) in arrays {
        if let Some(rest) = name.strip_prefix(array.as_str()).filter(|r| r.starts_with('.')) {
            return format!("{array}[{}]{rest}", n.saturating_sub(1));
        }
    }
    name.to_owned()
}

/// The keys leading to the end of `before` (a line's start up to an error) through its
/// inline tables: `http = { headers = { X = ` gives [http, headers, X]; empty at a line's
/// first key. Quoted text is skipped, so a brace in a string does not count.
fn inline_keys(before: &str) -> Vec<String> {
    let (mut open, mut key, mut token) = (Vec::new(), String::new(), String::new());
    let mut quote: Option<char> = None;
    for c in before.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => token.push(c),
            (None, '"' | '\'') => quote = Some(c),
            (None, '=') => key = std::mem::take(&mut token).trim().to_owned(),
            (None, '{') => open.push(std::mem::take(&mut key)),
            (None, '}') => {
                open.pop();
                key.clear();
            }
            (None, ',') => {
                key.clear();
                token.clear();
            }
            (None, c) => token.push(c),
        }
    }
    if open.is_empty() {
        return Vec::new();
    }
    open.extend((!key.is_empty()).then_some(key));
    open
}

/// A table header line, `[a.b]` or `[[a.b]]`: (its dotted name, whether an array of tables).
fn toml_header(line: &str) -> Option<(String, bool)> {
    let l = line.trim();
    let (inner, array) = match l.strip_prefix("[[") {
        Some(rest) => (rest.split_once("]]")?.0, true),
        None => (l.strip_prefix('[')?.split_once(']')?.0, false),
    };
    let name: Vec<&str> = inner.split('.').map(|p| p.trim().trim_matches('"')).collect();
    Some((name.join("."), array))
}

/// The `name` of the `i`th job, when the text parses as TOML (a wrong type still does).
fn job_name_at(text: &str, i: usize) -> Option<String> {
    let doc: toml::Table = text.parse().ok()?;
    Some(doc.get("jobs")?.get(i)?.get("name")?.as_str()?.to_owned())
}

/// The valid key `word` was likeliest meant to be: within a third of its length in edits.
fn closest<'a>(word: &str, valid: &'a [String]) -> Option<&'a str> {
    let within = (word.chars().count() / 3).max(1);
    valid.iter().map(|v| (edit_distance(word, v), v.as_str())).filter(|(d, _)| *d <= within).min().map(|(_, v)| v)
}

/// Levenshtein distance, in characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            cur.push((prev[j] + usize::from(ca != *cb)).min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b.len()]
}

pub(crate) type KeyError = (String, String);

/// The full name of job `i`, `name` in `namespace` (see [`solocron_core::namespace_of`]),
/// checked by the library's rule, so a configuration names only jobs the scheduler accepts.
fn full_name(i: usize, name: &str, namespace: Option<&str>) -> Result<String, KeyError> {
    let Some(namespace) = namespace else {
        solocron_core::validate_job_name(name).map_err(|e| (format!("jobs[{i}].name"), e.to_string()))?;
        return Ok(name.to_owned());
    };
    let key = || format!("jobs[{i}] ({name}).namespace");
    solocron_core::validate_namespace(namespace).map_err(|e| (key(), e.to_string()))?;
    if namespace == solocron_core::DEFAULT_NAMESPACE && name.contains('/') {
        return Err((
            format!("jobs[{i}].name"),
            format!("`{name}` is in namespace `default`, where a name holds no `/` (the part before it would be its namespace)"),
        ));
    }
    let full = solocron_core::full_job_name(namespace, name);
    solocron_core::validate_job_name(&full).map_err(|e| (format!("jobs[{i}].name"), e.to_string()))?;
    Ok(full)
}

fn resolve_job(i: usize, j: &RawJob, d: &RawJob) -> Result<JobConfig, KeyError> {
    let name = j.name.clone().ok_or_else(|| (format!("jobs[{i}].name"), "is required".into()))?;
    let name = full_name(i, &name, j.namespace.as_deref().or(d.namespace.as_deref()))?;
    let key = |k: &str| format!("jobs[{i}] ({name}).{k}");
    let schedule_expr = j.schedule.as_deref().ok_or_else(|| (key("schedule"), "is required".into()))?;
    let zone = j.timezone.as_deref().or(d.timezone.as_deref()).unwrap_or("UTC");
    let schedule = Schedule::parse(schedule_expr, zone).map_err(|e| {
        let k = if matches!(e, solocron_core::ScheduleError::TimeZone(_)) { "timezone" } else { "schedule" };
        (key(k), e.to_string())
    })?;
    let (work, policy) = match (&j.command, &j.http) {
        (Some(_), Some(_)) => {
            return Err((key("http"), "a job runs a `command` or calls `http`, not both: remove one".into()))
        }
        (None, None) => return Err((
            key("command"),
            "is required (an argv array, e.g. [\"/usr/bin/env\", \"sh\", \"-c\", \"echo hi\"]), or instead http = { url = \"https://...\" }"
                .into(),
        )),
        (Some(command), None) => {
            if command.is_empty() || command[0].is_empty() {
                return Err((key("command"), "must name a program: a non-empty argv array".into()));
            }
            (Work::Command(command.clone()), resolve_policy(j, d, &key)?)
        }
        (None, Some(http)) => {
            let work = resolve_http_job(http, &key)?;
            (Work::Http(Box::new(work)), http_policy(j, http, d, &key)?)
        }
    };
    Ok(JobConfig { name, schedule, work, policy })
}

/// A job's `http`, checked by the library's rules (`solocron::HttpJob`), each error at its key.
pub(crate) fn resolve_http_job(h: &RawHttpJob, key: &dyn Fn(&str) -> String) -> Result<HttpWork, KeyError> {
    let at = |e: solocron::HttpJobError| (key(&format!("http.{}", e.field)), e.why);
    let url = h.url.as_deref().ok_or_else(|| {
        (key("http.url"), "is required: the endpoint to call, e.g. \"https://billing.internal/jobs/invoices\"".into())
    })?;
    let mut request = solocron::HttpJob::new(url).map_err(at)?;
    if let Some(m) = &h.method {
        request = request.method(m).map_err(at)?;
    }
    for (name, value) in &h.headers {
        request = request.header(name, value).map_err(|e| (key(&format!("http.headers.{name}")), e.why))?;
    }
    if let Some(b) = &h.body {
        request = request.body(b.as_bytes());
    }
    if let Some(s) = &h.expect_status {
        request = request.expect_status(s).map_err(at)?;
    }
    let mut names = std::collections::HashSet::new();
    let tables = [("headers", &h.headers), ("headers_env", &h.headers_env), ("headers_file", &h.headers_file)];
    for (table, name) in tables.iter().flat_map(|(t, m)| m.keys().map(move |n| (t, n))) {
        if !names.insert(name.to_ascii_lowercase()) {
            let why = format!("`{name}` is set twice (in headers, headers_env or headers_file): keep one");
            return Err((key(&format!("http.{table}.{name}")), why));
        }
    }
    let mut secret_headers = Vec::new();
    let sources = h.headers_env.iter().map(|(n, v)| ("headers_env", n, SecretSource::Env(v.clone())));
    let sources = sources.chain(h.headers_file.iter().map(|(n, v)| ("headers_file", n, SecretSource::File(v.clone()))));
    for (table, name, source) in sources {
        let k = key(&format!("http.{table}.{name}"));
        let (SecretSource::Env(what) | SecretSource::File(what)) = &source;
        if what.is_empty() {
            let what = if table == "headers_env" { "an environment variable" } else { "a file" };
            return Err((k, format!("must name {what}")));
        }
        // The name by the library's rule; the value is read when the scheduler is built.
        request.clone().secret_header(name, "").map_err(|e| (k.clone(), e.why))?;
        secret_headers.push(SecretHeader { key: k, name: name.clone(), source });
    }
    if h.ca_file.as_deref() == Some("") {
        return Err((key("http.ca_file"), "must name a PEM file of CA certificates".into()));
    }
    Ok(HttpWork { request, secret_headers, ca_file: h.ca_file.clone(), key: key("http") })
}

/// An HTTP job's policy: `http.timeout` is the job's `timeout` (one limit: past it the
/// request is dropped and the run recorded `timed_out`), so setting both is refused.
fn http_policy(j: &RawJob, h: &RawHttpJob, d: &RawJob, key: &dyn Fn(&str) -> String) -> Result<JobPolicy, KeyError> {
    let Some(t) = &h.timeout else { return resolve_policy(j, d, key) };
    if j.timeout.is_some() {
        return Err((key("http.timeout"), "is the job's timeout: set `timeout` or `http.timeout`, not both".into()));
    }
    parse_duration(t).map_err(|e| (key("http.timeout"), e.to_string()))?;
    let with = RawJob { timeout: Some(t.clone()), ..j.clone() };
    let http_key = |k: &str| if k == "timeout" { key("http.timeout") } else { key(k) };
    resolve_policy(&with, d, &http_key)
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
        retry: j.retry.as_ref().or(d.retry.as_ref()).map(|r| resolve_retry(r, key)).transpose()?,
    };
    policy.validate().map_err(|e| (key(e.field), e.why))?;
    Ok(policy)
}

/// A `retry` table (the job's, or else `[defaults]`'s, taken whole) with its defaults: 3
/// attempts, 10 s doubling up to 5 min, with jitter.
fn resolve_retry(r: &RawRetry, key: &dyn Fn(&str) -> String) -> Result<RetryPolicy, KeyError> {
    let dur = |k: &str, v: &Option<String>| -> Result<Option<Duration>, KeyError> {
        v.as_ref().map(|s| parse_duration(s).map_err(|e| (key(k), e.to_string()))).transpose()
    };
    let backoff = dur("retry.backoff", &r.backoff)?.unwrap_or(RETRY_BACKOFF_DEFAULT);
    Ok(RetryPolicy {
        attempts: r.attempts.unwrap_or(RETRY_ATTEMPTS_DEFAULT),
        backoff,
        max_backoff: dur("retry.max_backoff", &r.max_backoff)?.unwrap_or(RETRY_MAX_BACKOFF_DEFAULT.max(backoff)),
        jitter: r.jitter.unwrap_or(true),
    })
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
    fn a_retry_table_takes_defaults_for_what_it_leaves_out_and_defaults_apply_it_to_every_job() {
        let c =
            Config::parse("t.toml", &GOOD.replace("max_attempts = 5", "retry = { attempts = 4, backoff = \"20m\" }"))
                .unwrap();
        let b = c.jobs[1].policy.retry.expect("b retries");
        assert_eq!(
            (b.attempts, b.backoff, b.max_backoff, b.jitter),
            (4, Duration::from_secs(1200), Duration::from_secs(1200), true)
        );
        assert_eq!(c.jobs[0].policy.retry, None, "no retry unless asked");
        let c = Config::parse("t.toml", &GOOD.replace("[defaults]", "[defaults]\nretry = {}")).unwrap();
        let a = c.jobs[0].policy.retry.expect("a retries by the defaults");
        assert_eq!((a.attempts, a.backoff, a.max_backoff), (3, Duration::from_secs(10), Duration::from_secs(300)));
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
            (
                GOOD.replace("max_attempts = 5", "retry = { attempts = 1 }"),
                "jobs[1] (b).retry.attempts: must be between 2",
            ),
            (GOOD.replace("max_attempts = 5", "retry = { backoff = \"soon\" }"), "jobs[1] (b).retry.backoff"),
            (
                GOOD.replace("max_attempts = 5", "retry = { backoff = \"1m\", max_backoff = \"30s\" }"),
                "jobs[1] (b).retry.max_backoff: must be at least `retry.backoff`",
            ),
            (GOOD.replace("max_attempts = 5", "retry = { tries = 3 }"), "tries"),
            (GOOD.replace("[node]", "[node]\ncolour = \"red\""), "node.colour: unknown key (line 5)"),
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
    fn a_value_of_the_wrong_type_names_its_key_and_the_type_expected() {
        let e = error_of(&GOOD.replace("command = [\"/bin/true\"]\nlease", "command = \"echo hi\"\nlease"));
        assert!(
            e.starts_with("test.toml: jobs[1] (b).command: must be an array, not a string \"echo hi\" (line 17)"),
            "{e}"
        );
        assert!(e.contains("e.g. command = [\"/bin/sh\", \"-c\", \"echo hi\"]"), "{e}");
        let e = error_of(&GOOD.replace("max_attempts = 5", "max_attempts = \"5\""));
        assert!(e.starts_with("test.toml: jobs[1] (b).max_attempts: must be a whole number"), "{e}");
        let e = error_of(&GOOD.replace("[node]", "[node]\nmax_concurrent_runs = true"));
        assert!(e.starts_with("test.toml: node.max_concurrent_runs: must be a whole number"), "{e}");
        let e = error_of("[store]\nmigrate = \"yes\"\n");
        assert_eq!(e, "test.toml: store.migrate: must be true or false, without quotes, not a string \"yes\" (line 2)");
    }

    #[test]
    fn a_job_is_named_in_its_namespace_which_the_node_must_serve() {
        let served = GOOD.replace("[node]", "[node]\nnamespaces = [\"billing\", \"default\"]");
        let with = |job_b: &str| served.replace("name = \"b\"", job_b);
        let full = |toml: &str| Config::parse("test.toml", toml).unwrap().jobs[1].name.clone();
        assert_eq!(full(&with("name = \"b\"\nnamespace = \"billing\"")), "billing/b");
        assert_eq!(full(&with("name = \"billing/b\"")), "billing/b", "the same job, by its full name");
        assert_eq!(full(&with("name = \"x/y\"\nnamespace = \"billing\"")), "billing/x/y");
        assert_eq!(full(&served.replace("[defaults]", "[defaults]\nnamespace = \"billing\"")), "billing/b");
        let cfg = Config::parse("test.toml", &served).unwrap();
        assert_eq!(cfg.namespaces.names().unwrap(), ["billing", "default"]);
        assert_eq!(Config::parse("test.toml", GOOD).unwrap().namespaces, solocron_core::Namespaces::default());
        let cases = [
            (with("name = \"b\"\nnamespace = \"shipping\""), "test.toml: jobs[1] (shipping/b).namespace: is in namespace `shipping`, which this node does not serve (billing, default)"),
            (with("name = \"shipping/b\""), "test.toml: jobs[1] (shipping/b).name: is in namespace `shipping`"),
            (with("name = \"b\"\nnamespace = \"Billing\""), "test.toml: jobs[1] (b).namespace: `Billing` is not a namespace name; a namespace is 1 to 63 characters"),
            (with("name = \"x/y\"\nnamespace = \"default\""), "test.toml: jobs[1].name: `x/y` is in namespace `default`, where a name holds no `/`"),
            (with("name = \"Ops/b\""), "test.toml: jobs[1].name: job name `Ops/b`: the part before its first `/` is its namespace, and `Ops` is not a namespace name"),
            (GOOD.replace("[node]", "[node]\nnamespaces = [\"a\", \"B\"]"), "test.toml: node.namespaces[1]: `B` is not a namespace name"),
            (GOOD.replace("[node]", "[node]\nnamespaces = []"), "test.toml: node.namespaces: 0 namespaces; a node serves 1 to 64"),
        ];
        for (toml, want) in cases {
            let e = error_of(&toml);
            assert!(e.starts_with(want), "expected `{want}` at the start of: {e}");
        }
    }

    #[test]
    fn an_unknown_key_is_named_once_with_the_likeliest_meant_and_the_keys_of_its_table() {
        let e = error_of(&GOOD.replace("name = \"b\"", "name = \"b\"\nschedul = \"x\""));
        assert!(
            e.starts_with("test.toml: jobs[1] (b).schedul: unknown key (line 15); did you mean `schedule`?"),
            "{e}"
        );
        assert!(e.contains("The keys here are: name, schedule, command, timezone"), "{e}");
        assert_eq!(e.matches("schedul`").count() + e.matches(".schedul:").count(), 1, "named once: {e}");
        let e = error_of(&GOOD.replace("[node]", "[nodes]"));
        assert!(e.starts_with("test.toml: nodes: unknown key (line 4); did you mean `node`?"), "{e}");
        let e = error_of(&format!("{GOOD}retries = 3\n"));
        assert!(e.starts_with("test.toml: jobs[1] (b).retries: unknown key"), "{e}");
        assert!(!e.contains("did you mean"), "nothing is close to `retries`: {e}");
        assert_eq!(
            (edit_distance("schedul", "schedule"), edit_distance("", "ab"), edit_distance("kitten", "sitting")),
            (1, 2, 3)
        );
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
        for fine in ["billing.invoices-daily", "日次"] {
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

    const HTTP: &str = r#"
[[jobs]]
name = "sync"
schedule = "0 */5 * * * *"
http = { url = "https://billing.internal/jobs/sync", method = "PUT", headers = { "Content-Type" = "application/json" }, headers_env = { Authorization = "SERVICE_TOKEN" }, headers_file = { X-Api-Key = "/run/secrets/key" }, body = "{}", timeout = "30s", expect_status = "2xx,304", ca_file = "/etc/ssl/private-ca.pem" }
"#;

    #[test]
    fn an_http_job_is_a_request_whose_timeout_is_the_jobs_and_whose_secrets_stay_unread() {
        let c = Config::parse("test.toml", HTTP).unwrap();
        let Work::Http(w) = &c.jobs[0].work else { panic!("{:?}", c.jobs[0].work) };
        assert_eq!(c.jobs[0].policy.timeout, Some(Duration::from_secs(30)));
        assert_eq!(w.ca_file.as_deref(), Some("/etc/ssl/private-ca.pem"));
        assert_eq!(w.key, "jobs[0] (sync).http");
        let secrets: Vec<(&str, &str)> = w.secret_headers.iter().map(|h| (h.key.as_str(), h.name.as_str())).collect();
        assert_eq!(
            secrets,
            [
                ("jobs[0] (sync).http.headers_env.Authorization", "Authorization"),
                ("jobs[0] (sync).http.headers_file.X-Api-Key", "X-Api-Key")
            ]
        );
        let fingerprint = w.request.fingerprint();
        assert!(fingerprint.starts_with("http PUT https://billing.internal/jobs/sync"), "{fingerprint}");
        assert!(fingerprint.contains("expect 2xx,304"), "{fingerprint}");
        let toml = "[[jobs]]\nname = \"s\"\nschedule = \"* * * * *\"\n[jobs.http]\nurl = \"http://127.0.0.1:8080/x\"\n";
        assert!(matches!(Config::parse("t.toml", toml).unwrap().jobs[0].work, Work::Http(_)), "a [jobs.http] table");
    }

    #[test]
    fn each_bad_http_part_names_its_key() {
        let http = |from: &str, to: &str| {
            assert!(HTTP.contains(from), "{from}");
            HTTP.replace(from, to)
        };
        let cases = [
            (http("http = {", "command = [\"/bin/true\"]\nhttp = {"), "jobs[0] (sync).http: a job runs a `command` or calls `http`, not both"),
            (http("https://billing", "ftp://billing"), "jobs[0] (sync).http.url: `ftp://billing.internal/jobs/sync` must start with http:// or https://"),
            (http("url = \"https://billing.internal/jobs/sync\"", "url = \"https://ops:pw@\""), "jobs[0] (sync).http.url: `https://ops:***@` "),
            (http("url = \"https://billing.internal/jobs/sync\", ", ""), "jobs[0] (sync).http.url: is required"),
            (http("2xx,304", "2xx,abc"), "jobs[0] (sync).http.expect_status: `abc` is not a status"),
            (http("\"PUT\"", "\"P T\""), "jobs[0] (sync).http.method: `P T` is not an HTTP method"),
            (http("\"Content-Type\"", "\"Idempotency-Key\""), "jobs[0] (sync).http.headers.Idempotency-Key: `Idempotency-Key` is set by solocron"),
            (http("X-Api-Key", "Authorization"), "jobs[0] (sync).http.headers_file.Authorization: `Authorization` is set twice"),
            (http("\"SERVICE_TOKEN\"", "\"\""), "jobs[0] (sync).http.headers_env.Authorization: must name an environment variable"),
            (http("timeout = \"30s\"", "timeout = \"30 parsecs\""), "jobs[0] (sync).http.timeout"),
            (http("schedule =", "timeout = \"1m\"\nschedule ="), "jobs[0] (sync).http.timeout: is the job's timeout: set `timeout` or `http.timeout`, not both"),
            (http("ca_file = \"/etc/ssl/private-ca.pem\"", "ca_file = \"\""), "jobs[0] (sync).http.ca_file: must name"),
            (http("url =", "urll = \"x\", url ="), "jobs[0] (sync).http.urll: unknown key (line 5); did you mean `url`?"),
            (http("\"2xx,304\"", "200"), "jobs[0] (sync).http.expect_status: must be a string, not an integer `200` (line 5)"),
            (http("\"/run/secrets/key\"", "3"), "jobs[0] (sync).http.headers_file.X-Api-Key: must be a string"),
            (http("name = \"sync\"", "name = \"sync\"\n[defaults.http]\nurl = \"http://x\"\n[[jobs]]\nname = \"x\""), "defaults.http: cannot be defaulted"),
            (
                "[[jobs]]\nname = \"s\"\nschedule = \"* * * * *\"\n[jobs.http]\nurl = \"http://h/\"\nmethd = \"GET\"\n".into(),
                "jobs[0] (s).http.methd: unknown key (line 6); did you mean `method`? The keys here are: url, method, headers",
            ),
            (
                "[[jobs]]\nname = \"s\"\nschedule = \"* * * * *\"\n".into(),
                "jobs[0] (s).command: is required (an argv array, e.g. [\"/usr/bin/env\", \"sh\", \"-c\", \"echo hi\"]), or instead http = { url",
            ),
        ];
        for (toml, want) in cases {
            let e = error_of(&toml);
            assert!(e.starts_with(&format!("test.toml: {want}")), "expected `test.toml: {want}` at the start of: {e}");
            assert!(!e.contains(":pw@"), "{e}");
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
