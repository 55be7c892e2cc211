//! Records runs' ends in batches: when many runs end at once (a herd of short jobs), their
//! `finish` calls go to the store as a few [`Store::finish_all`] calls instead of one round
//! trip each queued behind the pool, which let owners' leases run out before their ends
//! were written (the run then fell to recovery and its `on_crash` policy).
//!
//! A run's end waits in a bounded queue; one worker task takes whatever is queued when a
//! batch slot frees up (up to [`FINISH_BATCH_MAX`]), so a lone end goes out at once and a
//! burst goes out in as many batches as the burst needs.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use solocron_core::{Ending, Store, StoreError, FINISH_BATCH_MAX};
use tokio::sync::{mpsc, oneshot, Semaphore};

/// Ends waiting for a batch, per engine. A full queue makes owners wait (each within its
/// own deadline), which bounds memory whatever the burst.
const QUEUE_MAX: usize = 8 * FINISH_BATCH_MAX;
/// Batches in flight at once: enough to keep a pooled store busy, few enough that a burst
/// does not take every connection from claims and renewals.
const BATCHES_IN_FLIGHT: usize = 4;
/// Longest a batch may take before its ends are answered with an error (their owners retry
/// while their leases allow).
const BATCH_WAIT: Duration = Duration::from_secs(10);

type Answer = oneshot::Sender<Result<bool, StoreError>>;
/// The worker's side of the queue, and the store it records into.
type Worker = (mpsc::Receiver<(Ending, Answer)>, Arc<dyn Store>);

/// A handle to the engine's batcher of run ends; cheap to clone.
#[derive(Clone)]
pub(crate) struct Ends {
    queue: mpsc::Sender<(Ending, Answer)>,
    /// The worker's end of the queue until the first end starts the worker (on the runtime
    /// that runs the engine; the engine may be built outside one).
    idle: Arc<Mutex<Option<Worker>>>,
}

impl Ends {
    pub(crate) fn new(store: Arc<dyn Store>) -> Ends {
        let (queue, rx) = mpsc::channel(QUEUE_MAX);
        Ends { queue, idle: Arc::new(Mutex::new(Some((rx, store)))) }
    }

    /// Records one run's end through the next batch; what [`Store::finish`] would answer.
    /// Cancel-safe: dropped before it returns, the end may still be recorded.
    pub(crate) async fn finish(&self, ending: Ending) -> Result<bool, StoreError> {
        if let Some((rx, store)) = self.idle.lock().expect("not poisoned").take() {
            tokio::spawn(work(rx, store));
        }
        let (answer, answered) = oneshot::channel();
        self.queue
            .send((ending, answer))
            .await
            .map_err(|_| StoreError::Unavailable("the engine's end recorder stopped".into()))?;
        answered.await.unwrap_or_else(|_| Err(StoreError::Unavailable("the batch of run ends was dropped".into())))
    }
}

/// Takes what is queued whenever a batch slot is free, until every handle is dropped.
async fn work(mut rx: mpsc::Receiver<(Ending, Answer)>, store: Arc<dyn Store>) {
    let slots = Arc::new(Semaphore::new(BATCHES_IN_FLIGHT));
    while let Some(first) = rx.recv().await {
        let Ok(slot) = slots.clone().acquire_owned().await else { return };
        // Ends that arrived while waiting for the slot join this batch.
        let mut batch = vec![first];
        while batch.len() < FINISH_BATCH_MAX {
            match rx.try_recv() {
                Ok(next) => batch.push(next),
                Err(_) => break,
            }
        }
        let store = store.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let (endings, answers): (Vec<Ending>, Vec<Answer>) = batch.into_iter().unzip();
            let result = match tokio::time::timeout(BATCH_WAIT, store.finish_all(&endings)).await {
                Ok(Ok(done)) if done.len() == endings.len() => Ok(done),
                Ok(Ok(done)) => {
                    Err(StoreError::Invalid(format!("the store answered {} of {} run ends", done.len(), endings.len())))
                }
                Ok(Err(e)) => Err(e),
                Err(_) => Err(StoreError::Unavailable(format!("recording {} run ends timed out", endings.len()))),
            };
            match result {
                Ok(done) => answers.into_iter().zip(done).for_each(|(a, d)| drop(a.send(Ok(d)))),
                Err(e) => answers.into_iter().for_each(|a| drop(a.send(Err(e.clone())))),
            }
        });
    }
}
