//! # solocron-spec
//!
//! A solocron job's definition, one type for every place a job is written: a
//! configuration's `[[jobs]]` entry (and its `[defaults]`), a `solocron jobs apply`
//! document, a managed job's definition in the store, and the body of
//! `PUT /api/v1/jobs/{job}`.
//!
//! - [`JobSpec`] (with [`RetrySpec`] and [`HttpSpec`]): every key, as written; serde and
//!   OpenAPI (`utoipa`) types, unknown keys refused, durations humane strings (`"30s"`).
//! - [`JobSpec::check`]: the one checker. A spec (and the `[defaults]` spec) becomes a
//!   [`CheckedJob`] (its full name, [`Schedule`](solocron_core::Schedule),
//!   [`JobPolicy`](solocron_core::JobPolicy), and its [`Work`]: a command, or a request with
//!   its secret headers still unread), or a [`SpecError`] naming the key at fault (`lease`,
//!   `http.url`, `retry.backoff`) and what is wrong.
//! - The JSON form: [`JobSpec::to_json`] is the text the store keeps (keys sorted, so an
//!   equal definition is equal text); [`JobSpec::from_json`] and [`check_definition`] read
//!   it back, refusing a bad key in the words a configuration's table would be told.
//!
//! Turning a checked job into a runnable `solocron::Job` (reading its secrets, if asked) is
//! the `solocron` library's (`solocron::spec`).
//!
//! ```
//! use solocron_spec::{check_definition, JobSpec, Work};
//!
//! let body = serde_json::json!({
//!     "schedule": "0 */15 * * * *",
//!     "on_crash": "retry",
//!     "http": { "url": "https://billing.internal/jobs/send-invoices", "headers_env": { "Authorization": "BILLING_TOKEN" } }
//! });
//! let spec = JobSpec::from_json("billing/send-invoices", &body)?;
//! let job = spec.check_as("billing/send-invoices")?;
//! let Work::Http(request) = &job.work else { unreachable!("an http job") };
//! assert_eq!(request.secret_headers[0].key(), "http.headers_env.Authorization");
//!
//! // What the store keeps, and what every node checks again before running it.
//! let stored = spec.to_json();
//! assert_eq!(check_definition("billing/send-invoices", &stored)?.policy, job.policy);
//!
//! // A refusal names its key.
//! let late = JobSpec { lease: Some("100ms".into()), ..spec };
//! let e = late.check_as("billing/send-invoices").unwrap_err();
//! assert_eq!(e.key, "lease");
//! # Ok::<(), solocron_spec::SpecError>(())
//! ```
//!
//! **Architecture invariant:** no TOML, no I/O, no engine. The TOML spelling is the CLI's
//! (it deserializes its tables into [`JobSpec`]); secrets and CA files are read by whoever
//! runs the job.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod check;
mod http;
mod json;
mod spec;
mod words;

pub use check::{
    CheckedJob, HttpWork, SecretHeader, SecretSource, SpecError, Work, RETRY_ATTEMPTS_DEFAULT, RETRY_BACKOFF_DEFAULT,
    RETRY_MAX_BACKOFF_DEFAULT,
};
pub use http::EXPECT_STATUS_ITEMS_MAX;
pub use json::check_definition;
pub use spec::{HttpSpec, JobSpec, RetrySpec};
pub use words::{refusal, unknown_key};
