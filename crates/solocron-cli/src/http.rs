//! The HTTP server in the binary: `run --http` beside the scheduler, and `serve` alone.

use std::net::SocketAddr;
use std::sync::Arc;

use clap::Args;
use solocron_core::Store;
use solocron_http::{DeclaredJobs, HttpOptions, Token};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::config::{Config, SecretSource, TokenConfig};
use crate::wiring::{declared, init_logging, Asked, LogFormat, Signals, Target};
use crate::{bad_input, Failure};

/// The tokens' secrets, read from their environment variables or files. Errors name the
/// key and the variable or file, never the secret.
fn tokens(cfg: Option<&Config>) -> Result<Vec<Token>, Failure> {
    let Some(cfg) = cfg else { return Ok(Vec::new()) };
    cfg.http.tokens.iter().map(|t| token(&cfg.file, t)).collect()
}

fn token(file: &str, t: &TokenConfig) -> Result<Token, Failure> {
    let secret = match &t.source {
        SecretSource::Env(var) => std::env::var(var).map_err(|_| {
            bad_input(format!("{file}: {}.token_env: the environment variable {var} is not set", t.key))
        })?,
        SecretSource::File(path) => std::fs::read_to_string(path)
            .map_err(|e| bad_input(format!("{file}: {}.token_file: cannot read {path}: {e}", t.key)))?,
    };
    Token::new(&t.name, t.role, &secret).map_err(|e| bad_input(format!("{file}: {}: {e}", t.key)))
}

/// Binds `addr` (checked against the tokens) and serves until `stop` is cancelled.
pub async fn start(
    addr: SocketAddr,
    cfg: Option<&Config>,
    declared: DeclaredJobs,
    store: Arc<dyn Store>,
    stop: CancellationToken,
) -> Result<JoinHandle<()>, Failure> {
    let tokens = tokens(cfg)?;
    solocron_http::check_listen(addr, &tokens).map_err(bad_input)?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| bad_input(format!("--http {addr}: cannot listen: {e}")))?;
    let bound = listener.local_addr().map_err(|e| bad_input(format!("--http {addr}: {e}")))?;
    let options = HttpOptions {
        tokens,
        declared,
        prometheus: solocron_http::install_prometheus(),
        allow_command_jobs: cfg.is_some_and(|c| c.http.allow_command_jobs),
    };
    let token_count = options.tokens.len();
    let app = solocron_http::router(store, options);
    tracing::info!(address = %bound, tokens = token_count, "serving the HTTP API, metrics and console");
    Ok(tokio::spawn(async move {
        let served = axum::serve(listener, app).with_graceful_shutdown(stop.cancelled_owned()).await;
        if let Err(e) = served {
            tracing::error!(error = %e, "the HTTP server stopped");
        }
    }))
}

/// Where to serve: `--http`, else `[http] listen`.
pub fn listen(flag: Option<SocketAddr>, cfg: Option<&Config>) -> Option<SocketAddr> {
    flag.or(cfg.and_then(|c| c.http.listen))
}

/// `solocron serve`'s arguments.
#[derive(Args)]
pub struct ServeArgs {
    #[command(flatten)]
    target: Target,
    /// Address and port to serve on (default: [http] listen, else 127.0.0.1:9090).
    #[arg(long, value_name = "ADDR")]
    http: Option<SocketAddr>,
}

/// `solocron serve`: the API, metrics and console over a store, with no jobs of its own.
pub async fn serve(a: ServeArgs) -> Result<(), Failure> {
    init_logging(LogFormat::Text);
    let cfg = a.target.config()?;
    // Serving reads and acts; it never creates a store (a typo in a path must not serve an
    // empty fleet) nor changes a schema.
    let store = a.target.connect(cfg.as_ref()).await?;
    let addr = listen(a.http, cfg.as_ref()).unwrap_or(SocketAddr::from(([127, 0, 0, 1], 9090)));
    let stop = CancellationToken::new();
    let shown = DeclaredJobs::new(declared(cfg.as_ref()));
    let server = start(addr, cfg.as_ref(), shown.clone(), store, stop.clone()).await?;
    // SIGHUP reads the configuration's declared jobs again (what the server shows).
    let mut signals = Signals::new();
    while let Asked::Reload = signals.next().await {
        match a.target.config() {
            Ok(cfg) => shown.set(declared(cfg.as_ref())),
            Err(Failure(_, why)) => tracing::error!(error = %why, "configuration not reloaded: it has an error"),
        }
    }
    stop.cancel();
    let _ = server.await;
    Ok(())
}
