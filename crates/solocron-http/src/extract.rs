//! Extractors whose rejections are problems naming the parameter, instead of axum's plain
//! text.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use crate::problem::Problem;

/// Most bytes of a request body (actions carry a reason, not documents).
pub const BODY_BYTES_MAX: usize = 8 * 1024;
/// Most bytes of a query string.
pub const QUERY_BYTES_MAX: usize = 2 * 1024;

/// A query string, deserialized; a bad one answers 400 naming the parameter.
pub struct Query<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for Query<T> {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Problem> {
        let q = parts.uri.query().unwrap_or_default();
        if q.len() > QUERY_BYTES_MAX {
            return Err(Problem::bad_param("query", format!("longer than {QUERY_BYTES_MAX} bytes")));
        }
        serde_urlencoded_like(q).map(Query)
    }
}

fn serde_urlencoded_like<T: DeserializeOwned>(q: &str) -> Result<T, Problem> {
    axum::extract::Query::<T>::try_from_uri(
        &format!("/?{q}").parse().map_err(|_| Problem::bad_param("query", "not a valid query string"))?,
    )
    .map(|axum::extract::Query(t)| t)
    .map_err(|e| {
        let text = e.body_text();
        let param = field_in(&text).unwrap_or("query");
        Problem::bad_param(param, text.trim_start_matches("Failed to deserialize query string: ").to_owned())
    })
}

/// The field serde named in its message (`unknown field `x``, `missing field `x``, or
/// `x: invalid digit`), if any.
fn field_in(message: &str) -> Option<&str> {
    if let Some(start) = message.find("field `") {
        let rest = &message[start + 7..];
        return rest.split('`').next();
    }
    let body = message.trim_start_matches("Failed to deserialize query string: ");
    body.split_once(": ").map(|(f, _)| f).filter(|f| f.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
}

/// A JSON body, optional: an empty body is `T::default()`. A bad one answers 400 naming the
/// field where serde could.
pub struct Body<T>(pub T);

impl<T: DeserializeOwned + Default, S: Send + Sync> FromRequest<S> for Body<T> {
    type Rejection = Problem;

    async fn from_request(req: Request, state: &S) -> Result<Self, Problem> {
        let bytes = Bytes::from_request(req, state)
            .await
            .map_err(|_| Problem::bad_param("body", format!("unreadable, or longer than {BODY_BYTES_MAX} bytes")))?;
        if bytes.iter().all(u8::is_ascii_whitespace) || bytes.trim_ascii() == b"null" {
            return Ok(Body(T::default()));
        }
        let value: serde_json::Value =
            serde_json::from_slice(&bytes).map_err(|e| Problem::bad_param("body", format!("not JSON: {e}")))?;
        // serde would also take a struct from an array of its fields in order: only an
        // object is a body here.
        if !value.is_object() {
            return Err(Problem::bad_param("body", "must be a JSON object"));
        }
        serde_json::from_value(value).map(Body).map_err(|e| {
            let text = e.to_string();
            let param = field_in(&text).unwrap_or("body").to_owned();
            Problem::bad_param(param, text)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize, Debug)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Q {
        limit: Option<usize>,
    }

    #[derive(serde::Deserialize, Debug, Default)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct B {
        reason: Option<String>,
        wait: Option<u64>,
    }

    async fn body(text: &'static str) -> Result<B, Problem> {
        let req = axum::http::Request::builder().body(axum::body::Body::from(text)).unwrap();
        <Body<B> as FromRequest<()>>::from_request(req, &()).await.map(|Body(b)| b)
    }

    #[tokio::test]
    async fn a_body_is_an_object_or_nothing() {
        assert_eq!(body("").await.unwrap().reason, None);
        assert_eq!(body("null").await.unwrap().reason, None);
        assert_eq!(body(r#"{"reason": "x"}"#).await.unwrap().reason.as_deref(), Some("x"));
        assert_eq!(body("[null, null]").await.unwrap_err().param.as_deref(), Some("body"));
        assert_eq!(body(r#"{"wait": "soon"}"#).await.unwrap_err().param.as_deref(), Some("body"));
        assert_eq!(body(r#"{"reson": "x"}"#).await.unwrap_err().param.as_deref(), Some("reson"));
    }

    #[test]
    fn a_bad_query_names_its_parameter() {
        let p = serde_urlencoded_like::<Q>("limit=abc").unwrap_err();
        assert_eq!(p.param.as_deref(), Some("limit"), "{p:?}");
        let p = serde_urlencoded_like::<Q>("limt=3").unwrap_err();
        assert_eq!(p.param.as_deref(), Some("limt"), "{p:?}");
        assert_eq!(serde_urlencoded_like::<Q>("limit=3").unwrap().limit, Some(3));
    }
}
