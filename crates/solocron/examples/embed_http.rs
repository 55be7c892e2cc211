//! Embedding solocron with its HTTP API, metrics and console mounted beside a service's own
//! routes (feature `http`):
//!
//! ```sh
//! cargo run -p solocron --features http --example embed_http
//! # then open http://127.0.0.1:9091/ (the console) or /api/v1/jobs, /metrics
//! ```
//!
//! Without tokens the server is read-only and must stay on loopback; give it tokens
//! (`solocron::http::Token::new(name, Role::Operate, secret)`) to allow actions.

#![forbid(unsafe_code)]

use std::sync::Arc;

use solocron::http::{check_listen, install_prometheus, router, HttpOptions};
use solocron::{handler_fn, CancellationToken, Job, Prefix, RunContext, Schedule, Scheduler, Store};
use solocron_sqlite::SqliteStore;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let store: Arc<dyn Store> = Arc::new(SqliteStore::connect("sqlite://embed.db", &Prefix::default()).await?);
    // Install the recorder before the scheduler starts, so no metric is lost.
    let prometheus = install_prometheus();
    let hello = handler_fn(|ctx: RunContext| async move {
        println!("{} ran {}", ctx.node_id, ctx.scheduled_at);
        Ok(())
    });
    let scheduler = Scheduler::builder(store.clone())
        .job(Job::new("hello", Schedule::parse("*/5 * * * * *", "UTC")?, hello))
        .build()?;
    let options = HttpOptions { prometheus, ..HttpOptions::default() };
    let app = axum::Router::new()
        .route("/hello", axum::routing::get(|| async { "the service's own route\n" }))
        .merge(router(store, options));
    let addr = "127.0.0.1:9091".parse()?;
    check_listen(addr, &[])?;
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let shutdown = CancellationToken::new();
    let stop = shutdown.clone();
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        stop.cancel();
    });
    let served = shutdown.clone();
    let server =
        tokio::spawn(async move { axum::serve(listener, app).with_graceful_shutdown(served.cancelled_owned()).await });
    scheduler.run(shutdown).await;
    server.await??;
    Ok(())
}
