//! Serde's refusals in words a newcomer can act on: for an unknown key the likeliest meant
//! one and every key its table takes; for a value of the wrong type the type expected, in
//! the words of a `[[jobs]]` table (an array, a table, true or false). The JSON form here and
//! the CLI's TOML files say the same thing the same way.

/// The unknown key serde's `message` names (`unknown field `x`, expected one of ...`), if it
/// is that refusal.
///
/// ```
/// let m = "unknown field `lese`, expected one of `name`, `lease`";
/// assert_eq!(solocron_spec::unknown_key(m), Some("lese"));
/// assert_eq!(solocron_spec::unknown_key("invalid type: integer `5`, expected a string"), None);
/// ```
pub fn unknown_key(message: &str) -> Option<&str> {
    unknown_field(message).map(|(unknown, _)| unknown)
}

/// Serde's `unknown field `x`, expected one of `a`, `b`` as (`x`, [`a`, `b`]).
fn unknown_field(message: &str) -> Option<(&str, Vec<String>)> {
    let rest = message.strip_prefix("unknown field ")?;
    let mut quoted = rest.split('`').skip(1).step_by(2);
    let unknown = quoted.next()?;
    Some((unknown, quoted.map(str::to_owned).collect()))
}

/// Serde's refusal `message` of the value at `key` (its whole dotted key, as in a
/// configuration: `jobs[0] (a).command`), in words: the likeliest meant key for an unknown
/// one, the type expected for a wrong one (with an example for a table's `command` or
/// `http`), else `message` itself. `place` says where in the text the value is
/// (` (line 7)`), or is empty.
///
/// ```
/// use solocron_spec::refusal;
/// let m = "unknown field `schedul`, expected one of `name`, `schedule`";
/// assert_eq!(refusal("jobs[0] (a).schedul", m, ""), "unknown key; did you mean `schedule`? The keys here are: name, schedule");
/// let m = "invalid type: string \"3\", expected u32";
/// assert_eq!(refusal("jobs[0] (a).max_attempts", m, " (line 4)"), "must be a whole number of 0 or more, without quotes, not a string \"3\" (line 4)");
/// ```
pub fn refusal(key: &str, message: &str, place: &str) -> String {
    if let Some((unknown, valid)) = unknown_field(message) {
        let keys = if valid.is_empty() { "none".to_owned() } else { valid.join(", ") };
        return match closest(unknown, &valid) {
            Some(meant) => format!("unknown key{place}; did you mean `{meant}`? The keys here are: {keys}"),
            None => format!("unknown key{place}; the keys here are: {keys}"),
        };
    }
    let Some((found, expected)) = wrong_type(message) else { return format!("{message}{place}") };
    let example = if key.ends_with(".command") {
        ": the program and its arguments, e.g. command = [\"/bin/sh\", \"-c\", \"echo hi\"]"
    } else if key.ends_with(".http") {
        ": the request, e.g. http = { url = \"https://billing.internal/jobs/invoices\" }"
    } else {
        ""
    };
    format!("must be {expected}, not {found}{place}{example}")
}

/// Serde's `invalid type: string "x", expected a sequence` (or `invalid value: ...`) as
/// (what was found, what was expected), in a `[[jobs]]` table's words.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_likeliest_meant_key_is_within_a_third_of_its_length_in_edits() {
        assert_eq!(
            (edit_distance("schedul", "schedule"), edit_distance("", "ab"), edit_distance("kitten", "sitting")),
            (1, 2, 3)
        );
        let valid = ["schedule".to_owned(), "name".to_owned()];
        assert_eq!(closest("schedul", &valid), Some("schedule"));
        assert_eq!(closest("retries", &valid), None);
    }

    #[test]
    fn a_wrong_type_is_said_in_a_tables_words_with_an_example_where_one_helps() {
        let said = |key, m| refusal(key, m, "");
        assert_eq!(
            said("jobs[0] (a).command", "invalid type: string \"echo hi\", expected a sequence"),
            "must be an array, not a string \"echo hi\": the program and its arguments, e.g. command = [\"/bin/sh\", \"-c\", \"echo hi\"]"
        );
        assert!(said("jobs[0] (a).http", "invalid type: string \"x\", expected struct HttpSpec")
            .starts_with("must be a table, not a string \"x\": the request"));
        assert_eq!(
            said("retry.jitter", "invalid type: string \"yes\", expected a boolean"),
            "must be true or false, without quotes, not a string \"yes\""
        );
        assert_eq!(
            said("x", "invalid value: integer `-1`, expected u32"),
            "must be a whole number of 0 or more, without quotes, not an integer `-1`"
        );
        assert_eq!(said("x", "something else"), "something else");
        // A configuration's own `[http]` is no job's request.
        assert_eq!(
            said("http", "invalid type: integer `5`, expected struct RawHttp"),
            "must be a table, not an integer `5`"
        );
    }
}
