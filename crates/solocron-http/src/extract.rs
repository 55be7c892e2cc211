//! Extractors whose rejections are problems naming the parameter, instead of axum's plain
//! text. A value is checked against its schema in the OpenAPI document first
//! ([`crate::takes`]), so a refusal names the parameter once and says what it takes in the
//! user's terms (`limit: must be a whole number from 1 to 200, got "abc"`), never in serde's
//! or Rust's.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use serde::de::DeserializeOwned;
use serde_json::Value;
use utoipa::openapi::path::ParameterIn;
use utoipa::{IntoParams, ToSchema};

use crate::problem::Problem;
use crate::takes::{shown_json, shown_text, Takes, SHOWN_CHARS_MAX};

/// Most bytes of a request body (actions carry a reason, not documents).
pub const BODY_BYTES_MAX: usize = 8 * 1024;
/// Most bytes of a query string.
pub const QUERY_BYTES_MAX: usize = 2 * 1024;

/// A query string, deserialized; a bad one answers 400 naming the parameter.
pub struct Query<T>(pub T);

impl<T: DeserializeOwned + IntoParams, S: Send + Sync> FromRequestParts<S> for Query<T> {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Problem> {
        let q = parts.uri.query().unwrap_or_default();
        if q.len() > QUERY_BYTES_MAX {
            return Err(Problem::bad_param("query", format!("must be at most {QUERY_BYTES_MAX} bytes")));
        }
        read_query(q).map(Query)
    }
}

/// The parameters `T` takes, by name, as the document describes them.
fn params_of<T: IntoParams>() -> Vec<(String, Takes)> {
    T::into_params(|| Some(ParameterIn::Query))
        .into_iter()
        .map(|p| {
            let takes = p
                .schema
                .as_ref()
                .and_then(|s| serde_json::to_value(s).ok())
                .map_or(Takes { kind: crate::takes::Kind::Anything, nullable: false }, |s| Takes::of(&s));
            (p.name, takes)
        })
        .collect()
}

fn read_query<T: DeserializeOwned + IntoParams>(q: &str) -> Result<T, Problem> {
    let uri = format!("/?{q}").parse().map_err(|_| Problem::bad_param("query", "must be a valid query string"))?;
    let params = params_of::<T>();
    let pairs = axum::extract::Query::<Vec<(String, String)>>::try_from_uri(&uri)
        .map_err(|_| Problem::bad_param("query", "must be name=value pairs joined by &"))?
        .0;
    check_pairs(&params, &pairs)?;
    axum::extract::Query::<T>::try_from_uri(&uri).map(|axum::extract::Query(t)| t).map_err(|e| {
        // Every value passed its schema above; should serde still refuse one, name it (serde
        // prefixes its message with the parameter) and say what it takes, not serde's words.
        let text = e.body_text();
        let named = text.trim_start_matches("Failed to deserialize query string: ").split(": ").next();
        match params.iter().find(|(name, _)| Some(name.as_str()) == named) {
            Some((name, takes)) => Problem::bad_param(name, format!("must be {}", takes.words())),
            None => Problem::bad_param("query", "is not understood here; see /api/v1/openapi.json"),
        }
    })
}

/// Refuses a parameter the endpoint does not take, one given twice, or a value its schema
/// does not allow.
fn check_pairs(params: &[(String, Takes)], pairs: &[(String, String)]) -> Result<(), Problem> {
    for (i, (name, value)) in pairs.iter().enumerate() {
        let Some((_, takes)) = params.iter().find(|(p, _)| p == name) else {
            return Err(unknown(name, params.iter().map(|(p, _)| p.as_str()), ("query", "a parameter")));
        };
        if pairs[..i].iter().any(|(earlier, _)| earlier == name) {
            return Err(Problem::bad_param(name, "is given more than once; give it once"));
        }
        if !takes.takes_text(value) {
            // A `+` sent unencoded arrives as a space: say so where it is the likely cause.
            let plus = if takes.kind == crate::takes::Kind::Instant && value.contains(' ') {
                " (send a `+` as %2B)"
            } else {
                ""
            };
            return Err(Problem::bad_param(
                name,
                format!("must be {}, got {}{plus}", takes.words(), shown_text(value)),
            ));
        }
    }
    Ok(())
}

/// A name the endpoint does not take, with those it does; `(within, what)`: `("query", "a
/// parameter")` or `("body", "a field")`.
fn unknown<'a>(name: &str, known: impl Iterator<Item = &'a str>, (within, what): (&str, &str)) -> Problem {
    let known = known.collect::<Vec<_>>().join(", ");
    let takes = if known.is_empty() { "none".into() } else { known };
    if name.is_empty() {
        return Problem::bad_param(within, format!("holds {what} without a name; this endpoint takes {takes}"));
    }
    let shown: String = name.chars().take(SHOWN_CHARS_MAX).collect();
    Problem::bad_param(shown, format!("is not {what} of this endpoint, which takes {takes}"))
}

/// A JSON body, optional: an empty body is `T::default()`. A bad one answers 400 naming the
/// field and what it takes in JSON terms (a string, a number, an object).
pub struct Body<T>(pub T);

impl<T: DeserializeOwned + Default + ToSchema, S: Send + Sync> FromRequest<S> for Body<T> {
    type Rejection = Problem;

    async fn from_request(req: Request, state: &S) -> Result<Self, Problem> {
        let bytes = Bytes::from_request(req, state)
            .await
            .map_err(|_| Problem::bad_param("body", format!("must be readable and at most {BODY_BYTES_MAX} bytes")))?;
        if bytes.iter().all(u8::is_ascii_whitespace) || bytes.trim_ascii() == b"null" {
            return Ok(Body(T::default()));
        }
        let value: Value =
            serde_json::from_slice(&bytes).map_err(|e| Problem::bad_param("body", format!("must be JSON ({e})")))?;
        // serde would also take a struct from an array of its fields in order: only an
        // object is a body here.
        let Value::Object(fields) = &value else {
            return Err(Problem::bad_param("body", format!("must be a JSON object, got {}", shown_json(&value))));
        };
        let schema = serde_json::to_value(T::schema()).unwrap_or_default();
        check_fields(&schema, fields)?;
        serde_json::from_value(value).map(Body).map_err(|_| {
            // Unreachable while the schema says what serde reads: say where to look, not serde's words.
            Problem::bad_param("body", "does not match this operation's request body in /api/v1/openapi.json")
        })
    }
}

/// Refuses a field the body does not take (where its schema closes it), one whose value its
/// schema does not allow, and a missing required one.
fn check_fields(schema: &Value, fields: &serde_json::Map<String, Value>) -> Result<(), Problem> {
    let Some(properties) = schema.get("properties").and_then(Value::as_object) else {
        return Ok(());
    };
    let closed = schema.get("additionalProperties") == Some(&Value::Bool(false));
    for (name, value) in fields {
        let Some(property) = properties.get(name) else {
            if closed {
                return Err(unknown(name, properties.keys().map(String::as_str), ("body", "a field")));
            }
            continue;
        };
        let takes = Takes::of(property);
        if !takes.takes_json(value) {
            return Err(Problem::bad_param(name, format!("must be {}, got {}", takes.json_words(), shown_json(value))));
        }
    }
    let required = schema.get("required").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str);
    if let Some(missing) = required.into_iter().find(|r| !fields.contains_key(*r)) {
        let takes = properties.get(missing).map_or(String::from("a value"), |p| Takes::of(p).words());
        return Err(Problem::bad_param(missing, format!("is missing; it must be {takes}")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize, Debug, IntoParams)]
    #[serde(deny_unknown_fields)]
    #[into_params(parameter_in = Query)]
    #[allow(dead_code)]
    struct Q {
        #[param(minimum = 1, maximum = 10)]
        limit: Option<usize>,
        since: Option<chrono::DateTime<chrono::Utc>>,
    }

    #[derive(serde::Deserialize, Debug, Default, ToSchema)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct B {
        reason: Option<String>,
        wait: Option<u64>,
    }

    #[derive(serde::Deserialize, Debug, Default, ToSchema)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct R {
        #[schema(min_length = 1)]
        reason: String,
    }

    async fn body<T: DeserializeOwned + Default + ToSchema>(text: &'static str) -> Result<T, Problem> {
        let req = axum::http::Request::builder().body(axum::body::Body::from(text)).unwrap();
        <Body<T> as FromRequest<()>>::from_request(req, &()).await.map(|Body(b)| b)
    }

    #[tokio::test]
    async fn a_body_is_an_object_or_nothing() {
        assert_eq!(body::<B>("").await.unwrap().reason, None);
        assert_eq!(body::<B>("null").await.unwrap().reason, None);
        assert_eq!(body::<B>(r#"{"reason": "x"}"#).await.unwrap().reason.as_deref(), Some("x"));
        let p = body::<B>("[null, null]").await.unwrap_err();
        assert_eq!(
            (p.param.as_deref(), p.detail.as_str()),
            (Some("body"), "body: must be a JSON object, got an array")
        );
    }

    #[tokio::test]
    async fn a_bad_field_is_named_with_what_it_takes_in_json_terms() {
        let p = body::<B>(r#"{"wait": "soon"}"#).await.unwrap_err();
        assert_eq!(p.param.as_deref(), Some("wait"));
        assert_eq!(p.detail, r#"wait: must be a whole number of at least 0 or null, got "soon""#);
        let p = body::<B>(r#"{"reson": "x"}"#).await.unwrap_err();
        assert_eq!(p.detail, "reson: is not a field of this endpoint, which takes reason, wait");
        let p = body::<B>(r#"{"": "x"}"#).await.unwrap_err();
        assert_eq!(p.detail, "body: holds a field without a name; this endpoint takes reason, wait");
        let p = body::<R>("{}").await.unwrap_err();
        assert_eq!(p.detail, "reason: is missing; it must be a non-empty string");
        let p = body::<R>(r#"{"reason": {"a": 1}}"#).await.unwrap_err();
        assert_eq!(p.detail, "reason: must be a non-empty string, got an object");
    }

    #[test]
    fn a_bad_query_names_its_parameter_once() {
        let p = read_query::<Q>("limit=abc").unwrap_err();
        assert_eq!(p.param.as_deref(), Some("limit"), "{p:?}");
        assert_eq!(p.detail, r#"limit: must be a whole number from 1 to 10, got "abc""#);
        let p = read_query::<Q>("limit=11").unwrap_err();
        assert_eq!(p.detail, r#"limit: must be a whole number from 1 to 10, got "11""#);
        let p = read_query::<Q>("limt=3").unwrap_err();
        assert_eq!(p.detail, "limt: is not a parameter of this endpoint, which takes limit, since");
        let p = read_query::<Q>("=3").unwrap_err();
        assert_eq!(p.detail, "query: holds a parameter without a name; this endpoint takes limit, since");
        let p = read_query::<Q>("limit=3&limit=4").unwrap_err();
        assert_eq!(p.detail, "limit: is given more than once; give it once");
        let p = read_query::<Q>("since=2026-01-31T09:00:00+01:00").unwrap_err();
        assert!(p.detail.starts_with("since: must be an RFC 3339 instant") && p.detail.ends_with("%2B)"), "{p:?}");
        assert_eq!(read_query::<Q>("limit=3").unwrap().limit, Some(3));
        assert!(read_query::<Q>("since=2026-01-31T09:00:00%2B01:00").unwrap().since.is_some());
    }
}
