//! Errors as `application/problem+json` (RFC 9457), with a message a person can act on.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use solocron_fleet::FleetError;
use utoipa::ToSchema;

/// An error response: RFC 9457's members, plus the parameter at fault where there is one.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Problem {
    /// A URI naming the kind of problem (`about:blank` when the status says it all).
    #[serde(rename = "type")]
    pub kind: String,
    /// The kind of problem, in words.
    pub title: String,
    /// The HTTP status.
    pub status: u16,
    /// What went wrong this time, and what to do about it.
    pub detail: String,
    /// The request parameter at fault.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub param: Option<String>,
}

impl Problem {
    /// A problem with this status and detail.
    pub fn new(status: StatusCode, detail: impl Into<String>) -> Problem {
        Problem {
            kind: "about:blank".into(),
            title: status.canonical_reason().unwrap_or("Error").into(),
            status: status.as_u16(),
            detail: detail.into(),
            param: None,
        }
    }

    /// 400, naming the parameter.
    pub fn bad_param(param: impl Into<String>, detail: impl Into<String>) -> Problem {
        let param = param.into();
        Problem {
            param: Some(param.clone()),
            ..Problem::new(StatusCode::BAD_REQUEST, format!("{param}: {}", detail.into()))
        }
    }

    /// 401: no token, or a wrong one.
    pub fn unauthorized(detail: impl Into<String>) -> Problem {
        Problem::new(StatusCode::UNAUTHORIZED, detail)
    }

    fn status(&self) -> StatusCode {
        StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let status = self.status();
        let body = serde_json::to_vec(&self).expect("a problem serializes");
        let mut res = (status, body).into_response();
        let headers = res.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/problem+json"));
        if status == StatusCode::UNAUTHORIZED {
            headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer realm=\"solocron\""));
        }
        res
    }
}

impl From<FleetError> for Problem {
    fn from(e: FleetError) -> Problem {
        match e {
            FleetError::UnknownJob { .. } | FleetError::NotFound(_) => {
                Problem::new(StatusCode::NOT_FOUND, e.to_string())
            }
            FleetError::BadParam { param, message } => Problem::bad_param(param, message),
            FleetError::Conflict(_) => Problem::new(StatusCode::CONFLICT, e.to_string()),
            FleetError::Store(s) => {
                // The store's message is already masked (no credentials); it helps the operator.
                tracing::warn!(error = %s, "HTTP API: store call failed");
                Problem::new(StatusCode::SERVICE_UNAVAILABLE, format!("the store did not answer: {s}; retry shortly"))
            }
        }
    }
}
