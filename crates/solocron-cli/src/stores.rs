//! Opens the store a configuration names (password put in), through `solocron-stores`.

use std::sync::Arc;

use solocron_core::{redact_url, Store};

use crate::config::StoreConfig;

/// The URL with the password from `password_env` or `password_file` put in, if set.
fn with_password(cfg: &StoreConfig) -> Result<String, String> {
    let password = match (&cfg.password_env, &cfg.password_file) {
        (Some(var), _) => {
            Some(std::env::var(var).map_err(|_| format!("store.password_env: variable `{var}` is not set"))?)
        }
        (_, Some(path)) => Some(
            std::fs::read_to_string(path)
                .map_err(|e| format!("store.password_file: cannot read `{path}`: {e}"))?
                .trim_end_matches(['\n', '\r'])
                .to_owned(),
        ),
        _ => None,
    };
    let Some(password) = password else { return Ok(cfg.url.clone()) };
    let mut u = url::Url::parse(&cfg.url).map_err(|e| format!("`{}` is not a URL: {e}", redact_url(&cfg.url)))?;
    u.set_password(Some(&password)).map_err(|_| format!("`{}` cannot carry a password", redact_url(&cfg.url)))?;
    Ok(u.to_string())
}

/// Why a store could not be opened: what is wrong (never with a password), and whether it
/// is only unreachable (it may answer later) rather than misconfigured.
#[derive(Debug)]
pub struct OpenFailed {
    /// What is wrong, the URL's password masked.
    pub message: String,
    /// The store did not answer: it may later (the daemon waits for it).
    pub unreachable: bool,
}

impl OpenFailed {
    fn bad(message: String) -> OpenFailed {
        OpenFailed { message, unreachable: false }
    }
}

/// Connects to the configured store, its tables or keys behind the configured prefix.
pub async fn open(cfg: &StoreConfig) -> Result<Arc<dyn Store>, OpenFailed> {
    let url = with_password(cfg).map_err(OpenFailed::bad)?;
    solocron_stores::open(&url, &cfg.prefix).await.map_err(|e| OpenFailed {
        unreachable: matches!(e, solocron_stores::OpenError::Store(solocron_core::StoreError::Unavailable(_))),
        message: e.to_string(),
    })
}

/// What `migrate --drop` would remove, in words; the URL's password stays out of it.
pub fn footprint(cfg: &StoreConfig) -> Result<String, String> {
    solocron_stores::footprint(&cfg.url, &cfg.prefix).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_password_comes_from_a_file_or_the_environment() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pw");
        std::fs::write(&file, "p@ss word\n").unwrap();
        let mut cfg = StoreConfig::from_url("postgres://app@db:5432/x");
        cfg.password_file = Some(file.display().to_string());
        let url = with_password(&cfg).unwrap();
        assert_eq!(url::Url::parse(&url).unwrap().password(), Some("p%40ss%20word"));
        cfg.password_file = None;
        cfg.password_env = Some("SOLOCRON_TEST_SURELY_UNSET".into());
        assert!(with_password(&cfg).unwrap_err().contains("SOLOCRON_TEST_SURELY_UNSET"));
    }
}
