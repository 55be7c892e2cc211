//! The TOML configuration: parsing, defaults, and validation with errors that name the
//! file and the key. In ripgrep's shape, one file per step:
//!
//! - `raw.rs`: the tables as serde parses them, every key optional, none unknown;
//! - `jobs.rs`: the `[[jobs]]` entries and `[defaults]`, each a `solocron_spec::JobSpec`
//!   checked by that crate's one checker (the job definition language, which a jobs
//!   document, a managed job's definition and the API share), errors at their file's keys;
//! - `alerts.rs`: an `[[alerts]]` entry, written and checked;
//! - `resolve.rs`: the checked [`Config`], defaults filled in, and the checks across tables;
//! - `errors.rs`: [`ConfigError`], and TOML's errors in words naming the key.

// Children by path: the fuzz target (fuzz/fuzz_targets/config.rs) compiles this file in by
// `#[path]`, and a file included so looks for its children beside itself, not under
// `config/`. Written out, both builds find them at the same place.
#[path = "config/alerts.rs"]
mod alerts;
#[path = "config/errors.rs"]
mod errors;
#[path = "config/jobs.rs"]
mod jobs;
#[path = "config/raw.rs"]
mod raw;
#[path = "config/resolve.rs"]
mod resolve;

pub use alerts::{AlertConfig, AlertTargetConfig, Webhook};
pub use resolve::{parse_jobs, Config, StoreConfig, TokenConfig};
pub use solocron_spec::{CheckedJob, SecretSource, Work};

#[cfg(test)]
#[path = "config/tests.rs"]
mod tests;
