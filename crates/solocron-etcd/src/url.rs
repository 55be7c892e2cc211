//! The `etcd://` URL: endpoints and optional credentials (percent-decoded here, handed to
//! the client, never shown). What is shown of a URL goes through
//! [`solocron_core::redact_url`], the one masker.

use solocron_core::{redact_url, StoreError};

/// Where to connect, parsed from an `etcd://` URL.
#[derive(Debug, PartialEq)]
pub(crate) struct Target {
    pub hosts: Vec<String>,
    /// User and password.
    pub user: Option<(String, String)>,
}

/// Decodes `%XX` escapes (for credentials in the URL).
fn percent_decode(s: &str) -> Result<String, StoreError> {
    let bad = || StoreError::Invalid("bad percent-encoding in the etcd URL's credentials".into());
    let mut out = Vec::with_capacity(s.len());
    let mut bytes = s.bytes();
    while let Some(b) = bytes.next() {
        if b == b'%' {
            let hex = [bytes.next().ok_or_else(bad)?, bytes.next().ok_or_else(bad)?];
            let hex = std::str::from_utf8(&hex).map_err(|_| bad())?;
            out.push(u8::from_str_radix(hex, 16).map_err(|_| bad())?);
        } else {
            out.push(b);
        }
    }
    String::from_utf8(out).map_err(|_| bad())
}

/// Parses `etcd://[user[:password]@]host:port[,host:port...][/]`.
pub(crate) fn parse_url(url: &str) -> Result<Target, StoreError> {
    let invalid = |why: &str| {
        StoreError::Invalid(format!("{why}: `{}`; expected etcd://host:port[,host:port...]", redact_url(url)))
    };
    let rest = url.strip_prefix("etcd://").ok_or_else(|| invalid("not an etcd URL"))?;
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.contains(['/', '?', '#']) {
        return Err(invalid("an etcd URL takes no path or query (the key prefix is configured apart)"));
    }
    let (user, hosts) = match rest.rsplit_once('@') {
        Some((credentials, hosts)) => {
            let (user, password) = credentials.split_once(':').unwrap_or((credentials, ""));
            (Some((percent_decode(user)?, percent_decode(password)?)), hosts)
        }
        None => (None, rest),
    };
    let hosts: Vec<String> = hosts.split(',').map(str::trim).map(str::to_owned).collect();
    for host in &hosts {
        let port = host.rsplit_once(':').map(|(h, p)| (h, p.parse::<u16>()));
        if !matches!(port, Some((h, Ok(_))) if !h.is_empty()) {
            return Err(StoreError::Invalid(format!(
                "etcd endpoint `{host}` is not host:port; expected etcd://host:port[,host:port...]"
            )));
        }
    }
    Ok(Target { hosts, user })
}

/// What the store shows of itself: the URL without its password, and the key prefix.
pub(crate) fn description(url: &str, key_prefix: &str) -> String {
    format!("{} (key prefix {key_prefix})", redact_url(url))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_hosts_and_optional_credentials() {
        let t = parse_url("etcd://a:2379,b:2380/").unwrap();
        assert_eq!((t.hosts, t.user), (vec!["a:2379".to_owned(), "b:2380".to_owned()], None));
        let t = parse_url("etcd://root:p%40ss@127.0.0.1:2379").unwrap();
        assert_eq!(t.user, Some(("root".into(), "p@ss".into())));
        for bad in ["http://a:2379", "etcd://a", "etcd://a:x", "etcd://a:1/prefix", "etcd://:1", "etcd://a:1,"] {
            assert!(matches!(parse_url(bad), Err(StoreError::Invalid(_))), "{bad}");
        }
    }

    #[test]
    fn no_password_is_shown() {
        let shown = description("etcd://alice:hunter2@h1:2379,h2:2379", "/solocron/");
        assert_eq!(shown, "etcd://alice:***@h1:2379,h2:2379 (key prefix /solocron/)");
        for bad in ["http://alice:hunter2@a:2379", "etcd://alice:hunter2@a:x", "etcd://alice:hunter2@a:1/p"] {
            let err = parse_url(bad).unwrap_err();
            assert!(!err.to_string().contains("hunter2"), "{err}");
        }
    }
}
