//! The etcd [`RequestWatch`]: an etcd watch on the run-request keys and one on the managed
//! jobs' version key (put by every write of a managed job), both on one watch stream, so
//! that an idle node learns of `solocron trigger` and of a changed managed job without
//! reading the store twice a second. Nothing else writes these keys: an idle watch is quiet.

use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{Client, WatchFilterType, WatchOptions, WatchStream};
use solocron_core::RequestWatch;

/// How long a watch that could not be made, or broke, waits before it returns (so the
/// node reads the requests, then the watch is made again): at most one try per second
/// while etcd is unreachable.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// Watches every key under the requests family, and the managed jobs' version key, for puts.
pub(crate) struct EtcdRequestWatch {
    client: Client,
    family: String,
    version: String,
    stream: Option<WatchStream>,
}

impl EtcdRequestWatch {
    pub(crate) fn new(client: Client, family: String, version: String) -> EtcdRequestWatch {
        EtcdRequestWatch { client, family, version, stream: None }
    }

    /// Makes both watches and waits until etcd confirms each is in place: a request or a
    /// managed job put after this returns is seen.
    async fn make(&mut self) -> Result<WatchStream, etcd_client::Error> {
        let puts = || WatchOptions::new().with_filters([WatchFilterType::NoDelete]);
        let mut stream = self.client.watch(self.family.clone(), Some(puts().with_prefix())).await?;
        created(&mut stream).await?;
        stream.watch(self.version.clone(), Some(puts())).await?;
        created(&mut stream).await?;
        Ok(stream)
    }
}

/// Waits for etcd to confirm the watch just asked for on `stream`.
pub(crate) async fn created(stream: &mut WatchStream) -> Result<(), etcd_client::Error> {
    loop {
        match stream.message().await? {
            Some(resp) if resp.created() && !resp.canceled() => return Ok(()),
            Some(resp) if resp.canceled() => {
                return Err(etcd_client::Error::WatchError(format!("watch refused: {}", resp.cancel_reason())))
            }
            Some(_) => {}
            None => return Err(etcd_client::Error::WatchError("watch closed before it was made".into())),
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
                    tracing::debug!(error = %err, "cannot watch run requests and managed jobs; reading them every second");
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

/// The store's request watch: etcd watches on its prefix's request keys and managed jobs'
/// version key.
pub(crate) fn watch(store: &crate::EtcdStore) -> Box<dyn RequestWatch> {
    let keys = &store.keys;
    Box::new(EtcdRequestWatch::new(store.client.clone(), keys.family("request"), keys.managed_version()))
}
