//! The etcd [`RequestWatch`]: an etcd watch on the run-request keys, so that an idle node
//! learns of `solocron trigger` without reading the requests twice a second.

use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{Client, WatchFilterType, WatchOptions, WatchStream};
use solocron_core::RequestWatch;

/// How long a watch that could not be made, or broke, waits before it returns (so the
/// node reads the requests, then the watch is made again): at most one try per second
/// while etcd is unreachable.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// Watches every key under the requests family for puts.
pub(crate) struct EtcdRequestWatch {
    client: Client,
    family: String,
    stream: Option<WatchStream>,
}

impl EtcdRequestWatch {
    pub(crate) fn new(client: Client, family: String) -> EtcdRequestWatch {
        EtcdRequestWatch { client, family, stream: None }
    }

    /// Makes the watch and waits until etcd confirms it is in place: a request put after
    /// this returns is seen.
    async fn make(&mut self) -> Result<WatchStream, etcd_client::Error> {
        let options = WatchOptions::new().with_prefix().with_filters([WatchFilterType::NoDelete]);
        let mut stream = self.client.watch(self.family.clone(), Some(options)).await?;
        loop {
            match stream.message().await? {
                Some(resp) if resp.created() && !resp.canceled() => return Ok(stream),
                Some(resp) if resp.canceled() => {
                    return Err(etcd_client::Error::WatchError(format!("watch refused: {}", resp.cancel_reason())))
                }
                Some(_) => {}
                None => return Err(etcd_client::Error::WatchError("watch closed before it was made".into())),
            }
        }
    }
}

#[async_trait]
impl RequestWatch for EtcdRequestWatch {
    async fn changed(&mut self) {
        let Some(stream) = self.stream.as_mut() else {
            match self.make().await {
                Ok(stream) => self.stream = Some(stream),
                Err(err) => {
                    tracing::debug!(error = %err, "cannot watch run requests; reading them every second");
                    tokio::time::sleep(RETRY_AFTER).await;
                }
            }
            // Made (requests put before it went unseen) or failed: either way, read them.
            return;
        };
        loop {
            match stream.message().await {
                Ok(Some(resp)) if resp.canceled() => break,
                Ok(Some(resp)) if !resp.events().is_empty() => return,
                Ok(Some(_)) => {} // progress notices
                Ok(None) => break,
                Err(err) => {
                    tracing::debug!(error = %err, "the run-request watch broke; making it again");
                    break;
                }
            }
        }
        self.stream = None;
    }
}

/// The store's request watch: an etcd watch on its prefix's request keys.
pub(crate) fn watch(store: &crate::EtcdStore) -> Box<dyn RequestWatch> {
    Box::new(EtcdRequestWatch::new(store.client.clone(), store.keys.family("request")))
}
