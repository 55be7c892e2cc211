//! The configuration as parsed from TOML, before any check: serde's `Raw*` tables (and
//! `solocron-spec`'s `JobSpec` for `[defaults]` and each `[[jobs]]` entry), every key
//! optional (defaults are [`super::resolve`]'s), none unknown. A table's keys are listed in
//! the order an unknown key's error names them.

use serde::Deserialize;
use solocron_spec::JobSpec;

use super::alerts::RawAlert;

/// A configuration file as written: every table optional, no key unknown.
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    #[serde(default)]
    pub(super) store: RawStore,
    #[serde(default)]
    pub(super) node: RawNode,
    #[serde(default)]
    pub(super) defaults: JobSpec,
    #[serde(default)]
    pub(super) jobs: Vec<JobSpec>,
    #[serde(default)]
    pub(super) http: RawHttp,
    #[serde(default)]
    pub(super) alerts: Vec<RawAlert>,
}

/// `[http]` as written.
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawHttp {
    pub(super) listen: Option<String>,
    pub(super) allow_command_jobs: Option<bool>,
    #[serde(default)]
    pub(super) tokens: Vec<RawToken>,
}

/// One `[[http.tokens]]` entry as written.
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawToken {
    pub(super) name: Option<String>,
    pub(super) role: Option<String>,
    pub(super) token_env: Option<String>,
    pub(super) token_file: Option<String>,
}

/// `[store]` as written.
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawStore {
    pub(super) url: Option<String>,
    pub(super) prefix: Option<String>,
    /// Refused with a pointer to `prefix` (its old name for SQL stores).
    pub(super) table_prefix: Option<String>,
    /// Refused with a pointer to `prefix` (its old name for Redis and etcd).
    pub(super) key_prefix: Option<String>,
    pub(super) password_env: Option<String>,
    pub(super) password_file: Option<String>,
    pub(super) migrate: Option<bool>,
}

/// `[node]` as written.
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawNode {
    pub(super) id: Option<String>,
    pub(super) namespaces: Option<Vec<String>>,
    pub(super) shutdown_grace: Option<String>,
    pub(super) max_concurrent_runs: Option<usize>,
    pub(super) history_retention: Option<String>,
    pub(super) pid_file: Option<String>,
}

/// A document of jobs only (`solocron jobs apply -f FILE`, a managed job's definition):
/// `[[jobs]]` tables and an optional `[defaults]`, checked exactly like a configuration's.
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawJobs {
    #[serde(default)]
    pub(super) defaults: JobSpec,
    #[serde(default)]
    pub(super) jobs: Vec<JobSpec>,
}
