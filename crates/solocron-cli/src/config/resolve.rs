//! From the raw tables to the checked configuration: each table resolved with its defaults
//! filled in, and the checks that span tables (every job in a namespace the node serves, a
//! history retention no shorter than the jobs need).

use std::path::Path;
use std::time::Duration;

use solocron_core::{parse_duration, Namespaces, Prefix};
use solocron_spec::{CheckedJob, JobSpec, SecretSource};

use super::alerts::{resolve_alerts, AlertConfig};
use super::errors::{ConfigError, KeyError};
use super::jobs::{check_defaults, namespace_key, resolve_jobs};
use super::raw::{RawConfig, RawHttp, RawJobs, RawNode, RawStore};

/// The store used when the configuration has no `[store]`.
pub const DEFAULT_STORE_URL: &str = "sqlite://solocron.db";
/// `[node] shutdown_grace` unless the file says.
const SHUTDOWN_GRACE_DEFAULT: Duration = Duration::from_secs(30);
/// `[node] max_concurrent_runs` unless the file says.
const MAX_CONCURRENT_RUNS_DEFAULT: usize = 1024;

/// A validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// The file it came from.
    pub file: String,
    /// `[store]`.
    pub store: StoreConfig,
    /// `None`: never prune.
    pub history_retention: Option<Duration>,
    /// `[node] id`; `None`: the hostname and pid.
    pub node_id: Option<String>,
    /// `[node] namespaces`: the namespaces this node serves (default `default` alone).
    pub namespaces: Namespaces,
    /// `[node] shutdown_grace`: how long a drain waits for running jobs (default 30 s).
    pub shutdown_grace: Duration,
    /// `[node] max_concurrent_runs` (default 1024).
    pub max_concurrent_runs: usize,
    /// `[node] pid_file`: where `solocron run` writes its pid, for `solocron reload`.
    pub pid_file: Option<std::path::PathBuf>,
    /// `[[jobs]]`, `[defaults]` applied.
    pub jobs: Vec<CheckedJob>,
    /// `[http]`.
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
    /// The token's name, as the audit log records who acted.
    pub name: String,
    /// What it may do: read, or operate too.
    pub role: solocron_http::Role,
    /// Where its secret is.
    pub source: SecretSource,
}

/// Where the store is and how to reach it.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// The URL as written (no password injected; see [`crate::stores`]).
    pub url: String,
    /// The namespace of solocron's tables or keys in the store (`[store] prefix`).
    pub prefix: Prefix,
    /// `[store] password_env`: the variable holding the password left out of the URL.
    pub password_env: Option<String>,
    /// `[store] password_file`: the file holding it.
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

impl Config {
    /// Reads and validates `path`.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError::at(&file)(("(file)".into(), format!("cannot read: {e}"))))?;
        let mut cfg = Config::parse(&file, &text)?;
        if let Some(url) = path.parent().and_then(|dir| rebase_sqlite(&cfg.store.url, dir)) {
            cfg.store.url = url;
        }
        Ok(cfg)
    }

    /// Parses and validates `text`, naming `file` in errors. The tables are checked in the
    /// order below, so the first error a file has is the one it is told.
    pub fn parse(file: &str, text: &str) -> Result<Config, ConfigError> {
        let raw: RawConfig = toml::from_str(text).map_err(|e| ConfigError::toml(file, text, &e))?;
        let at = ConfigError::at(file);
        check_defaults(&raw.defaults).map_err(&at)?;
        let node = &raw.node;
        let shutdown_grace = match &node.shutdown_grace {
            Some(s) => parse_duration(s).map_err(|e| at(("node.shutdown_grace".into(), e.to_string())))?,
            None => SHUTDOWN_GRACE_DEFAULT,
        };
        if node.id.as_ref().is_some_and(|id| id.trim().is_empty()) {
            return Err(at(("node.id".into(), "must not be empty".into())));
        }
        let namespaces = resolve_namespaces(node).map_err(&at)?;
        let jobs = resolve_jobs(&raw.defaults, &raw.jobs).map_err(&at)?;
        served(&raw, &jobs, &namespaces).map_err(&at)?;
        Ok(Config {
            file: file.to_owned(),
            history_retention: history_retention(node, &jobs).map_err(&at)?,
            store: resolve_store(&raw.store).map_err(&at)?,
            http: resolve_http(&raw.http).map_err(&at)?,
            alerts: resolve_alerts(&raw.alerts).map_err(&at)?,
            node_id: node.id.clone(),
            namespaces,
            shutdown_grace,
            max_concurrent_runs: node.max_concurrent_runs.unwrap_or(MAX_CONCURRENT_RUNS_DEFAULT),
            pid_file: node.pid_file.as_ref().map(std::path::PathBuf::from),
            jobs,
        })
    }
}

/// A document of `[[jobs]]` (and `[defaults]`), checked: each job as written and as
/// checked, and the defaults they share.
#[derive(Debug, Clone)]
pub struct JobsDocument {
    /// `[defaults]` (empty where the document has none).
    pub defaults: JobSpec,
    /// Each `[[jobs]]` entry as written.
    pub specs: Vec<JobSpec>,
    /// Each entry checked, `[defaults]` applied, in the same order.
    pub jobs: Vec<CheckedJob>,
}

/// Parses and validates a document of `[[jobs]]` (and `[defaults]`) only, naming `file` in
/// errors, with the same rules and messages as [`Config::parse`].
pub fn parse_jobs(file: &str, text: &str) -> Result<JobsDocument, ConfigError> {
    let raw: RawJobs = toml::from_str(text).map_err(|e| ConfigError::toml(file, text, &e))?;
    let at = ConfigError::at(file);
    check_defaults(&raw.defaults).map_err(&at)?;
    let jobs = resolve_jobs(&raw.defaults, &raw.jobs).map_err(at)?;
    Ok(JobsDocument { defaults: raw.defaults, specs: raw.jobs, jobs })
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
fn served(raw: &RawConfig, jobs: &[CheckedJob], namespaces: &Namespaces) -> Result<(), KeyError> {
    for (i, job) in jobs.iter().enumerate() {
        let namespace = solocron_core::namespace_of(&job.name);
        if !namespaces.contains(namespace) {
            let key = namespace_key(&raw.jobs[i], &raw.defaults);
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
fn history_retention(node: &RawNode, jobs: &[CheckedJob]) -> Result<Option<Duration>, KeyError> {
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

/// A `sqlite:` URL whose file path is relative, made relative to `dir` (the configuration
/// file's folder), so that every command given the same file opens the same database
/// whatever directory it runs from; `None` when there is nothing to change.
pub(super) fn rebase_sqlite(url: &str, dir: &Path) -> Option<String> {
    let rest = url.strip_prefix("sqlite:")?;
    let path = rest.strip_prefix("//").unwrap_or(rest);
    if path.is_empty() || path.starts_with('/') || dir.as_os_str().is_empty() {
        return None;
    }
    Some(format!("sqlite://{}", dir.join(path).display()))
}

/// `[store]`, with the defaults filled in.
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
