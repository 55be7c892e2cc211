//! The Redis [`RequestWatch`]: a subscription to `{prefix}requests`, which the
//! `request_run` and `job_write` scripts publish to, so that an idle node learns of
//! `solocron trigger` and of a changed managed job without asking Redis twice a second.

use std::time::Duration;

use async_trait::async_trait;
use futures_util::{FutureExt, StreamExt};
use redis::aio::PubSubStream;
use solocron_core::RequestWatch;

/// How long a subscription that could not be made waits before it returns (so the node
/// reads the requests, then subscribes again): at most one try per second while Redis is
/// unreachable.
const RETRY_AFTER: Duration = Duration::from_secs(1);
/// How long subscribing may take.
const SUBSCRIBE_TIMEOUT: Duration = Duration::from_secs(5);

/// Subscribes on its own connection (a subscribed connection can do nothing else).
pub(crate) struct RedisRequestWatch {
    client: redis::Client,
    channel: String,
    messages: Option<PubSubStream>,
    warned: bool,
}

impl RedisRequestWatch {
    pub(crate) fn new(client: redis::Client, channel: String) -> RedisRequestWatch {
        RedisRequestWatch { client, channel, messages: None, warned: false }
    }

    /// Connects and subscribes: a request published after this returns is heard.
    async fn make(&self) -> Result<PubSubStream, String> {
        let subscribe = async {
            let mut pubsub = self.client.get_async_pubsub().await?;
            pubsub.subscribe(&self.channel).await?;
            Ok::<_, redis::RedisError>(pubsub.into_on_message())
        };
        match tokio::time::timeout(SUBSCRIBE_TIMEOUT, subscribe).await {
            Ok(Ok(messages)) => Ok(messages),
            Ok(Err(err)) => Err(err.to_string()),
            Err(_) => Err(format!("no answer within {SUBSCRIBE_TIMEOUT:?}")),
        }
    }
}

#[async_trait]
impl RequestWatch for RedisRequestWatch {
    async fn changed(&mut self) {
        let Some(messages) = self.messages.as_mut() else {
            match self.make().await {
                Ok(messages) => {
                    self.messages = Some(messages);
                    self.warned = false;
                }
                Err(err) => {
                    if !std::mem::replace(&mut self.warned, true) {
                        tracing::warn!(error = %err, channel = %self.channel,
                            "cannot subscribe to run requests (an ACL without channel rights?); reading them every second");
                    }
                    tokio::time::sleep(RETRY_AFTER).await;
                }
            }
            // Subscribed (requests made before went unheard) or failed: either way, read them.
            return;
        };
        let mut heard = messages.next().await;
        // A burst of requests wakes the node once.
        while heard.is_some() {
            match messages.next().now_or_never() {
                Some(next) => heard = next,
                None => return,
            }
        }
        // The connection closed: subscribe again at the next call.
        self.messages = None;
    }
}

/// The store's request watch: a subscription to `{prefix}requests`, on a connection of its
/// own.
pub(crate) fn watch(store: &crate::RedisStore) -> Box<dyn RequestWatch> {
    Box::new(RedisRequestWatch::new(store.client.clone(), format!("{}requests", store.prefix)))
}
