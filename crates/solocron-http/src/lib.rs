//! # solocron-http
//!
//! solocron's HTTP server, as an [`axum::Router`]: the JSON API under `/api/v1` (described
//! by the OpenAPI 3.1 document at `/api/v1/openapi.json`, generated from the handlers),
//! Prometheus metrics at `/metrics`, `/healthz` and `/readyz`, and the web console at `/`.
//! Every list answers one envelope, [`Page`] (`items`, then `next_cursor` until it is null);
//! every refusal is a [`Problem`] naming the parameter at fault.
//! The daemon (`solocron run --http`) and `solocron serve` mount it; a service embedding
//! the library can mount it next to its own routes.
//!
//! The server keeps no state of its own: every answer is read from the store, so any
//! number of instances behind any load balancer answer alike, and nothing is read while
//! nobody asks.
//!
//! **Security by default:** [`check_listen`] refuses a non-loopback address without tokens;
//! with tokens every API call and `/metrics` need one; actions always need a token of the
//! `operate` role and are recorded in the store's audit log under the token's name. No CORS
//! headers are sent, bodies and query strings are bounded, secrets are kept as digests.
//!
//! ```no_run
//! # async fn demo(store: std::sync::Arc<dyn solocron_core::Store>) -> std::io::Result<()> {
//! use solocron_http::{router, HttpOptions, Role, Token};
//! let tokens = vec![Token::new("ops", Role::Operate, "a-long-random-secret").unwrap()];
//! let app = router(store, HttpOptions { tokens, ..HttpOptions::default() });
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:9090").await?;
//! axum::serve(listener, app).await
//! # }
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod api;
mod auth;
mod console;
mod extract;
mod health;
mod openapi;
mod problem;
mod prometheus;
mod takes;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::http::{header, HeaderValue, StatusCode};
use axum::routing::{get, post};
use axum::Router;
use solocron_core::Store;
use solocron_fleet::Declared;
use tower_http::set_header::SetResponseHeaderLayer;

pub use api::ACTIONS_PAGE_MAX;
pub use auth::{Caller, Role, Token, TokenError, TOKEN_SECRET_BYTES_MAX, TOKEN_SECRET_BYTES_MIN};
pub use extract::{BODY_BYTES_MAX, QUERY_BYTES_MAX};
pub use openapi::openapi_json;
pub use problem::Problem;
pub use prometheus::{install_prometheus, MetricsHandle, HISTOGRAM_BUCKETS_SECONDS, OPENMETRICS_CONTENT_TYPE};
pub use solocron_fleet::{JobList, Page};

/// How the server behaves beyond its store.
#[derive(Debug, Clone, Default)]
pub struct HttpOptions {
    /// The API tokens; none: read-only access (loopback only, see [`check_listen`]).
    pub tokens: Vec<Token>,
    /// Jobs this process knows from its configuration (shown with where they are declared).
    pub declared: DeclaredJobs,
    /// Where `/metrics` renders from ([`install_prometheus`]); none: `/metrics` answers 404.
    pub prometheus: Option<MetricsHandle>,
    /// Whether managed jobs written here may run commands (`[http] allow_command_jobs`).
    /// Off by default: a command written through the API is code run on the fleet's hosts.
    pub allow_command_jobs: bool,
}

/// The jobs a process declares in its configuration, shared with the server: a reloaded
/// configuration ([`DeclaredJobs::set`]) shows in the next answer. Cheap to clone: every
/// clone sees the same list.
#[derive(Debug, Clone, Default)]
pub struct DeclaredJobs(Arc<std::sync::RwLock<Arc<Vec<Declared>>>>);

impl DeclaredJobs {
    /// A shared list holding `jobs`.
    pub fn new(jobs: Vec<Declared>) -> DeclaredJobs {
        DeclaredJobs(Arc::new(std::sync::RwLock::new(Arc::new(jobs))))
    }

    /// Replaces the list.
    pub fn set(&self, jobs: Vec<Declared>) {
        *self.0.write().unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(jobs);
    }

    /// The list now.
    pub fn get(&self) -> Arc<Vec<Declared>> {
        self.0.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }
}

/// The router's shared state: the store and the options.
#[derive(Clone)]
pub struct AppState(Arc<Inner>);

struct Inner {
    store: Arc<dyn Store>,
    options: HttpOptions,
}

impl AppState {
    pub(crate) fn store(&self) -> &dyn Store {
        self.0.store.as_ref()
    }
    pub(crate) fn tokens(&self) -> &[Token] {
        &self.0.options.tokens
    }
    pub(crate) fn declared(&self) -> Arc<Vec<Declared>> {
        self.0.options.declared.get()
    }
    pub(crate) fn allow_command_jobs(&self) -> bool {
        self.0.options.allow_command_jobs
    }
    pub(crate) fn prometheus(&self) -> Option<&MetricsHandle> {
        self.0.options.prometheus.as_ref()
    }
}

/// Refuses to serve on an address other machines can reach unless tokens are configured.
///
/// ```
/// use solocron_http::{check_listen, Role, Token};
/// assert!(check_listen("127.0.0.1:9090".parse().unwrap(), &[]).is_ok());
/// assert!(check_listen("0.0.0.0:9090".parse().unwrap(), &[]).is_err());
/// let t = Token::new("ops", Role::Read, "0123456789abcdef").unwrap();
/// assert!(check_listen("0.0.0.0:9090".parse().unwrap(), &[t]).is_ok());
/// ```
pub fn check_listen(addr: SocketAddr, tokens: &[Token]) -> Result<(), String> {
    if addr.ip().is_loopback() || !tokens.is_empty() {
        return Ok(());
    }
    Err(format!(
        "refusing to serve HTTP on {addr} without tokens: anyone on the network could read the fleet; \
         listen on 127.0.0.1, or configure [[http.tokens]] (token_env or token_file)"
    ))
}

/// The whole server: API, OpenAPI document, metrics, health, console.
pub fn router(store: Arc<dyn Store>, options: HttpOptions) -> Router {
    let state = AppState(Arc::new(Inner { store, options }));
    let api = Router::new()
        .route("/jobs", get(api::jobs))
        .route("/jobs/{job}", get(api::job).put(api::put_job).delete(api::delete_job))
        .route("/jobs/{job}/revisions", get(api::revisions))
        .route("/jobs/{job}/trigger", post(api::trigger))
        .route("/jobs/{job}/pause", post(api::pause))
        .route("/jobs/{job}/resume", post(api::resume))
        .route("/jobs/{job}/unlock", post(api::unlock))
        .route("/runs", get(api::runs))
        .route("/runs/{id}", get(api::run))
        .route("/nodes", get(api::nodes))
        .route("/actions", get(api::actions))
        .route("/whoami", get(api::whoami))
        .route("/openapi.json", get(openapi::document))
        .fallback(|| async { Problem::new(StatusCode::NOT_FOUND, "no such API route; see /api/v1/openapi.json") })
        .method_not_allowed_fallback(|| async {
            Problem::new(StatusCode::METHOD_NOT_ALLOWED, "method not allowed here; see /api/v1/openapi.json")
        })
        .layer(SetResponseHeaderLayer::overriding(header::CACHE_CONTROL, HeaderValue::from_static("no-store")));
    Router::new()
        .nest("/api/v1", api)
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .route("/metrics", get(health::metrics))
        .merge(console::routes())
        .layer(axum::middleware::from_fn(health::bound_uri))
        .layer(axum::extract::DefaultBodyLimit::max(BODY_BYTES_MAX))
        .layer(SetResponseHeaderLayer::overriding(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff")))
        .layer(SetResponseHeaderLayer::overriding(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY")))
        .layer(SetResponseHeaderLayer::overriding(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer")))
        .with_state(state)
}
