//! What a query parameter or a body field takes, read from its schema in the OpenAPI
//! document: a refusal says, in words, what the document says, and checks a value the way
//! the document promises, so the two cannot drift. No message quotes serde or a Rust type.
//!
//! A schema is read as it stands: a `$ref` is not followed (that would need the whole
//! document, which is built from the handlers that use this), so a parameter or field whose
//! value is checked has its schema inline (`#[param(inline)]`); a test keeps it so.

use chrono::{DateTime, Utc};
use serde_json::Value;

/// Most characters of a refused value (or an unknown parameter's name) quoted back in a
/// problem: enough to recognise it, while a pasted kilobyte stays out of the answer.
pub const SHOWN_CHARS_MAX: usize = 64;

/// A kind of value, in the terms of JSON and of a query string.
#[derive(Debug, Clone, PartialEq)]
pub enum Kind {
    /// An integer (in JSON also `5.0`, as JSON Schema counts it), within the bounds.
    WholeNumber { min: Option<f64>, max: Option<f64> },
    /// Any number within the bounds.
    Number { min: Option<f64>, max: Option<f64> },
    /// An RFC 3339 instant.
    Instant,
    /// One of these words.
    OneOf(Vec<String>),
    /// Text of at least this many characters.
    Text { chars_min: u64 },
    /// `true` or `false`.
    Boolean,
    /// A JSON object.
    Object,
    /// A JSON array.
    Array,
    /// Whatever the schema does not narrow.
    Anything,
}

/// What one parameter or field takes.
#[derive(Debug, Clone, PartialEq)]
pub struct Takes {
    /// The kind of value.
    pub kind: Kind,
    /// Whether JSON `null` is taken too.
    pub nullable: bool,
}

impl Takes {
    /// Reads a schema (as the document's JSON); a `$ref` is anything.
    pub fn of(schema: &Value) -> Takes {
        let anything = Takes { kind: Kind::Anything, nullable: true };
        if let Some(alternatives) = schema.get("oneOf").or_else(|| schema.get("anyOf")).and_then(Value::as_array) {
            let is_null = |s: &&Value| s.get("type").and_then(Value::as_str) == Some("null");
            let nullable = alternatives.iter().any(|s| is_null(&s));
            let mut others = alternatives.iter().filter(|s| !is_null(s));
            return match (others.next(), others.next()) {
                (Some(one), None) => {
                    let takes = Takes::of(one);
                    Takes { nullable: nullable || takes.nullable, ..takes }
                }
                _ => anything,
            };
        }
        let types: Vec<&str> = match schema.get("type") {
            Some(Value::String(t)) => vec![t.as_str()],
            Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
            _ => return anything,
        };
        let nullable = types.contains(&"null");
        let bound = |key| schema.get(key).and_then(Value::as_f64);
        let kind = match types.iter().copied().filter(|t| *t != "null").collect::<Vec<_>>()[..] {
            ["integer"] => Kind::WholeNumber { min: bound("minimum"), max: bound("maximum") },
            ["number"] => Kind::Number { min: bound("minimum"), max: bound("maximum") },
            ["string"] => match (schema.get("enum").and_then(Value::as_array), schema.get("format")) {
                (Some(words), _) => Kind::OneOf(words.iter().filter_map(Value::as_str).map(str::to_owned).collect()),
                (None, Some(f)) if f == "date-time" => Kind::Instant,
                _ => Kind::Text { chars_min: schema.get("minLength").and_then(Value::as_u64).unwrap_or(0) },
            },
            ["boolean"] => Kind::Boolean,
            ["object"] => Kind::Object,
            ["array"] => Kind::Array,
            _ => Kind::Anything,
        };
        Takes { kind, nullable }
    }

    /// What it takes, in words: `a whole number from 1 to 200`.
    pub fn words(&self) -> String {
        match &self.kind {
            Kind::WholeNumber { min, max } => format!("a whole number{}", range(*min, *max)),
            Kind::Number { min, max } => format!("a number{}", range(*min, *max)),
            Kind::Instant => "an RFC 3339 instant such as 2026-01-31T09:00:00Z".into(),
            Kind::OneOf(words) => format!("one of {}", words.join(", ")),
            Kind::Text { chars_min: 0 } => "a string".into(),
            Kind::Text { chars_min: 1 } => "a non-empty string".into(),
            Kind::Text { chars_min } => format!("a string of at least {chars_min} characters"),
            Kind::Boolean => "true or false".into(),
            Kind::Object => "an object".into(),
            Kind::Array => "an array".into(),
            Kind::Anything => "a JSON value".into(),
        }
    }

    /// What it takes in a JSON body, in words (`or null` where null is taken).
    pub fn json_words(&self) -> String {
        match (self.nullable, &self.kind) {
            (true, Kind::Anything) | (false, _) => self.words(),
            (true, _) => format!("{} or null", self.words()),
        }
    }

    /// Whether a query string's value (already percent-decoded) is taken.
    pub fn takes_text(&self, text: &str) -> bool {
        match &self.kind {
            Kind::WholeNumber { min, max } => text.parse::<i64>().is_ok_and(|n| within(n as f64, *min, *max)),
            Kind::Number { min, max } => text.parse::<f64>().is_ok_and(|n| n.is_finite() && within(n, *min, *max)),
            // The parser serde uses for the parameter's type, so what passes here parses there.
            Kind::Instant => text.parse::<DateTime<Utc>>().is_ok(),
            Kind::OneOf(words) => words.iter().any(|w| w == text),
            Kind::Text { chars_min } => text.chars().count() as u64 >= *chars_min,
            Kind::Boolean => text == "true" || text == "false",
            Kind::Object | Kind::Array | Kind::Anything => true,
        }
    }

    /// Whether a JSON value is taken.
    pub fn takes_json(&self, value: &Value) -> bool {
        match (&self.kind, value) {
            (_, Value::Null) => self.nullable,
            (Kind::WholeNumber { min, max }, Value::Number(n)) => {
                n.as_f64().is_some_and(|f| f.fract() == 0.0 && within(f, *min, *max))
            }
            (Kind::Number { min, max }, Value::Number(n)) => n.as_f64().is_some_and(|f| within(f, *min, *max)),
            (Kind::Instant | Kind::OneOf(_) | Kind::Text { .. }, Value::String(s)) => self.takes_text(s),
            (Kind::Boolean, Value::Bool(_)) | (Kind::Object, Value::Object(_)) | (Kind::Array, Value::Array(_)) => true,
            (Kind::Anything, _) => true,
            _ => false,
        }
    }
}

fn within(n: f64, min: Option<f64>, max: Option<f64>) -> bool {
    min.is_none_or(|m| n >= m) && max.is_none_or(|m| n <= m)
}

fn range(min: Option<f64>, max: Option<f64>) -> String {
    match (min, max) {
        (Some(a), Some(b)) => format!(" from {a} to {b}"),
        (Some(a), None) => format!(" of at least {a}"),
        (None, Some(b)) => format!(" of at most {b}"),
        (None, None) => String::new(),
    }
}

/// Text quoted back in a problem: as a JSON string, at most [`SHOWN_CHARS_MAX`] characters.
pub fn shown_text(text: &str) -> String {
    let mut shown: String = text.chars().take(SHOWN_CHARS_MAX).collect();
    if shown.len() < text.len() {
        shown.push('…');
    }
    Value::String(shown).to_string()
}

/// A JSON value quoted back in a problem: a scalar as itself, a container by its kind.
pub fn shown_json(value: &Value) -> String {
    match value {
        Value::String(s) => shown_text(s),
        Value::Object(_) => "an object".into(),
        Value::Array(_) => "an array".into(),
        scalar => scalar.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_schema_is_said_in_words() {
        let limit = Takes::of(&json!({"type": "integer", "minimum": 1, "maximum": 200}));
        assert_eq!(limit.words(), "a whole number from 1 to 200");
        let wait = Takes::of(&json!({"type": ["integer", "null"], "format": "int64", "minimum": 0, "maximum": 3600}));
        assert_eq!(wait.json_words(), "a whole number from 0 to 3600 or null");
        assert_eq!(Takes::of(&json!({"type": "string", "format": "date-time"})).kind, Kind::Instant);
        let state = Takes::of(&json!({"oneOf": [{"type": "null"}, {"type": "string", "enum": ["a", "b"]}]}));
        assert_eq!((state.words(), state.nullable), ("one of a, b".to_owned(), true));
        assert_eq!(Takes::of(&json!({"type": "string", "minLength": 1})).words(), "a non-empty string");
        assert_eq!(Takes::of(&json!({})).kind, Kind::Anything);
    }

    #[test]
    fn values_are_checked_as_the_schema_says() {
        let limit = Takes::of(&json!({"type": "integer", "minimum": 1, "maximum": 200}));
        assert!(limit.takes_text("200") && !limit.takes_text("201") && !limit.takes_text("0"));
        assert!(!limit.takes_text("abc") && !limit.takes_text("1.5") && !limit.takes_text(""));
        assert!(limit.takes_json(&json!(5.0)) && !limit.takes_json(&json!(1.5)) && !limit.takes_json(&json!("5")));
        assert!(!limit.takes_json(&Value::Null));
        let instant = Takes::of(&json!({"type": "string", "format": "date-time"}));
        assert!(instant.takes_text("2026-01-31T09:00:00Z") && !instant.takes_text("yesterday"));
        // A `+` left unencoded in a query arrives as a space.
        assert!(!instant.takes_text("2026-01-31T09:00:00 01:00"));
    }

    #[test]
    fn long_values_are_shown_cut() {
        let long = "x".repeat(1000);
        assert_eq!(shown_text(&long).chars().count(), SHOWN_CHARS_MAX + 3);
        assert_eq!(shown_text("a\"b"), r#""a\"b""#);
        assert_eq!(shown_json(&json!({"a": 1})), "an object");
    }
}
