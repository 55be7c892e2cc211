//! The configuration's errors: [`ConfigError`] names the file, the key (`jobs[1] (b).lease`)
//! and what is wrong; [`toml_error`] turns a TOML or serde error into that key and words a
//! newcomer can act on (the type expected, the likeliest meant key: `solocron-spec`'s).

use std::collections::HashMap;

/// A configuration error: which file, which key, what is wrong.
#[derive(Debug, thiserror::Error)]
#[error("{file}: {key}: {message}")]
pub struct ConfigError {
    /// The file, as given (`solocron.toml`, `jobs.toml`, `the job definition`).
    pub file: String,
    /// The dotted key at fault (`node.namespaces[1]`, `jobs[0] (sync).http.url`), or
    /// `(file)` and `(syntax)` where no key is.
    pub key: String,
    /// What is wrong, and what to write instead where that is known.
    pub message: String,
}

/// A key and what is wrong with its value: a [`ConfigError`] before its file is known, as
/// every check below the file returns it.
pub(super) type KeyError = (String, String);

impl ConfigError {
    /// The error of `file` at a [`KeyError`]'s key.
    pub(super) fn at(file: &str) -> impl Fn(KeyError) -> ConfigError + '_ {
        move |(key, message)| ConfigError { file: file.to_owned(), key, message }
    }

    /// `file`'s text `text` did not parse (or did not fit the tables it must): the key it
    /// failed at, in words.
    pub(super) fn toml(file: &str, text: &str, e: &toml::de::Error) -> ConfigError {
        ConfigError::at(file)(toml_error(text, e))
    }
}

/// A TOML error as (key, message): the key it is at, named once (`jobs[0] (a).command`),
/// and what is wrong in `solocron-spec`'s words (the JSON form says it the same way): the
/// type expected, or for an unknown key the likeliest meant one and every key that table
/// takes.
pub(super) fn toml_error(text: &str, e: &toml::de::Error) -> KeyError {
    let place = toml_error_place(text, e);
    let path = e.span().and_then(|span| toml_key_path(text, span.start));
    let msg = e.message();
    if let Some(unknown) = solocron_spec::unknown_key(msg) {
        // In an inline table (`http = { urll = ... }`) the path stops at the table.
        let key = match path {
            Some(p) if p == unknown || p.ends_with(&format!(".{unknown}")) => p,
            Some(p) => format!("{p}.{unknown}"),
            None => unknown.to_owned(),
        };
        let message = solocron_spec::refusal(&key, msg, &place);
        return (key, message);
    }
    match path {
        Some(key) => {
            let message = solocron_spec::refusal(&key, msg, &place);
            (key, message)
        }
        None => ("(syntax)".to_owned(), format!("{msg}{place}")),
    }
}

fn toml_error_place(text: &str, e: &toml::de::Error) -> String {
    let Some(span) = e.span() else { return String::new() };
    let Some(before) = text.get(..span.start) else { return String::new() };
    let line = before.matches('\n').count() + 1;
    format!(" (line {line})")
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
