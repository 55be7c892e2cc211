//! Secrets out of what is shown: the one place that decides how a store URL is printed.

/// `url` with every password replaced by `***`: the password of `user:password@`, a lone
/// `secret@` (it may be a password put there), and the value of any query parameter whose
/// name contains `pass` (`?password=...`). Text without `://` after a scheme that holds an
/// `@` is hidden whole, since where its secret sits cannot be told. Used by every store's
/// `describe` and every error that names a URL.
///
/// ```
/// use solocron_core::redact_url;
/// assert_eq!(redact_url("postgres://app:s3cret@db:5432/x"), "postgres://app:***@db:5432/x");
/// assert_eq!(redact_url("redis://:s3cret@host:6379/0"), "redis://:***@host:6379/0");
/// assert_eq!(redact_url("mysql://u:pw@h/db?password=s3cret&ssl=1"), "mysql://u:***@h/db?password=***&ssl=1");
/// // A lone `name@` is hidden too: some drivers read it as a password.
/// assert_eq!(redact_url("redis://s3cret@host"), "redis://***@host");
/// assert_eq!(redact_url("sqlite://app.db"), "sqlite://app.db");
/// ```
pub fn redact_url(url: &str) -> String {
    // A `://` after something that is no scheme is not where the URL's parts start: drivers
    // parse the WHATWG way (the `url` crate), which drops tabs and newlines and reads
    // `https:u:pw@h` as `https://u:pw@h`, so `mysql:/\n/u:pw@h/?a=b://c` holds a password
    // before its first `://` (found by fuzzing). Such text is hidden whole, like any without.
    let Some((scheme, rest)) = url.split_once("://").filter(|(scheme, _)| is_scheme(scheme)) else {
        return if url.contains('@') { "<a URL without `://`, hidden>".to_owned() } else { url.to_owned() };
    };
    // More slashes after `://` are skipped by the WHATWG parser for special schemes
    // (`http:///:pw@h` has the password `pw`; found by fuzzing): the authority starts after
    // them. For other schemes that hides a path that looks like one, which is harmless.
    let (slashes, rest) = rest.split_at(rest.len() - rest.trim_start_matches('/').len());
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let authority = match authority.rsplit_once('@') {
        Some((user, host)) => match user.split_once(':') {
            Some((name, _)) => format!("{name}:***@{host}"),
            None => format!("***@{host}"),
        },
        None => authority.to_owned(),
    };
    let Some((path, query)) = tail.split_once('?') else { return format!("{scheme}://{slashes}{authority}{tail}") };
    let (query, fragment) = match query.split_once('#') {
        Some((q, f)) => (q, format!("#{f}")),
        None => (query, String::new()),
    };
    let query: Vec<String> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((k, _)) if k.to_ascii_lowercase().contains("pass") => format!("{k}=***"),
            _ => pair.to_owned(),
        })
        .collect();
    format!("{scheme}://{slashes}{authority}{path}?{}{fragment}", query.join("&"))
}

/// Whether `s` is a URL scheme: a letter, then letters, digits, `+`, `-` or `.`.
fn is_scheme(s: &str) -> bool {
    s.starts_with(|c: char| c.is_ascii_alphabetic())
        && s.chars().all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
}

/// `text` (an error message, say) with every occurrence of `url` replaced by its redacted
/// form: for errors from a driver that quotes the URL it was given.
///
/// ```
/// let url = "postgres://app:s3cret@db/x";
/// let said = format!("cannot connect to {url}: refused");
/// assert_eq!(solocron_core::redact_in(&said, url), "cannot connect to postgres://app:***@db/x: refused");
/// ```
pub fn redact_in(text: &str, url: &str) -> String {
    if url.is_empty() {
        return text.to_owned();
    }
    text.replace(url, &redact_url(url))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_password_survives_redaction() {
        let secret = "s3cr%40et";
        for url in [
            format!("postgres://app:{secret}@db:5432/x"),
            format!("postgresql://app:{secret}@db/x?sslmode=require"),
            format!("mysql://root:{secret}@127.0.0.1:3306/test"),
            format!("redis://:{secret}@host:6379/0"),
            format!("redis://{secret}@host"),
            format!("rediss://alice:{secret}@host/0?password={secret}"),
            format!("etcd://user:{secret}@h1:2379,h2:2379"),
            format!("postgres://app@db/x?password={secret}#frag"),
            format!("user:{secret}@host"),
            // The drivers' URL parser drops tabs and newlines and needs no `//` after
            // `https:`: the password comes before the first `://` (found by fuzzing).
            format!("mysql:/\n\n/u:{secret}@h/dj?passwostgres://app@dbw@h/"),
            format!("https:\x08:{secret}@h/db?q,://u:pQw@h/dh"),
            // Special schemes skip more slashes before the authority (found by fuzzing).
            format!("http:///:{secret}@lm"),
            format!("https:////u:{secret}@h/x?a=b"),
        ] {
            let shown = redact_url(&url);
            assert!(!shown.contains(secret), "{url} -> {shown}");
        }
    }

    #[test]
    fn what_is_not_secret_stays_readable() {
        assert_eq!(redact_url("etcd://alice:pw@h1:2379,h2:2379/"), "etcd://alice:***@h1:2379,h2:2379/");
        assert_eq!(redact_url("postgres://db/x?sslmode=require"), "postgres://db/x?sslmode=require");
        assert_eq!(redact_url("sqlite:relative.db"), "sqlite:relative.db");
        assert_eq!(redact_url("sqlite:///tmp/a@b.db"), "sqlite:///tmp/a@b.db");
    }
}
