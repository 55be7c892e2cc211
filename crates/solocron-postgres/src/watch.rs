//! The PostgreSQL [`RequestWatch`]: `LISTEN` on the channel that `request_run` and the
//! writes of managed jobs notify (`{p}requests`, `{p}` the table prefix), so that an idle
//! node learns of `solocron trigger` or a changed job without reading the store twice a
//! second.

use std::time::Duration;

use async_trait::async_trait;
use solocron_core::RequestWatch;
use sqlx::postgres::{PgListener, PgPool, PgPoolOptions};

/// How long a listener that could not connect, or failed, waits before it returns (so the
/// node reads the requests, then connects again): at most one try per second while the
/// server is unreachable.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// Listens on its own connection (not one of the store's pool, which it would hold forever).
pub(crate) struct PgRequestWatch {
    pool: PgPool,
    channel: String,
    listener: Option<PgListener>,
}

impl PgRequestWatch {
    /// A watch of `{table_prefix}requests`, not yet listening.
    pub(crate) fn new(store_pool: &PgPool, table_prefix: &str) -> PgRequestWatch {
        let options = (*store_pool.connect_options()).clone();
        let pool = PgPoolOptions::new().max_connections(1).connect_lazy_with(options);
        PgRequestWatch { pool, channel: format!("{table_prefix}requests"), listener: None }
    }

    /// Connects and `LISTEN`s: a request committed after this returns is notified.
    async fn make(&self) -> Result<PgListener, sqlx::Error> {
        let mut listener = PgListener::connect_with(&self.pool).await?;
        // A lost connection ends this listener (see `changed`) instead of being remade
        // inside `try_recv`, where a cancelled call would lose the news that notices were
        // missed.
        listener.eager_reconnect(false);
        listener.listen(&self.channel).await?;
        Ok(listener)
    }
}

#[async_trait]
impl RequestWatch for PgRequestWatch {
    async fn changed(&mut self) {
        let Some(listener) = self.listener.as_mut() else {
            match self.make().await {
                Ok(listener) => self.listener = Some(listener),
                Err(err) => {
                    tracing::debug!(error = %err, "cannot listen for run requests; reading them every second");
                    tokio::time::sleep(RETRY_AFTER).await;
                }
            }
            // Listening (requests made before went unnoticed) or failed: either way, read them.
            return;
        };
        match listener.try_recv().await {
            // A burst of requests wakes the node once.
            Ok(Some(_)) => while listener.next_buffered().is_some() {},
            // The connection was lost: notices from now until a new listener is in place go
            // unheard, so the next call makes one and then returns (and the node reads).
            Ok(None) => self.listener = None,
            Err(err) => {
                tracing::debug!(error = %err, "listening for run requests failed; listening again");
                self.listener = None;
            }
        }
    }
}
