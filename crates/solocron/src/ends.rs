//! Records runs' ends in batches: when many runs end at once (a herd of short jobs), their
//! `finish` calls go to the store as a few [`Store::finish_all`] calls instead of one round
//! trip each queued behind the pool, which let owners' leases run out before their ends
//! were written (the run then fell to recovery and its `on_crash` policy).
//!
//! A run's end waits in a bounded queue; one worker task takes whatever is queued when a
//! batch slot frees up (up to [`FINISH_BATCH_MAX`]), so a lone end goes out at once and a
//! burst goes out in as many batches as the burst needs. A batch the store refuses as a
//! whole for a reason other than being unreachable (one end it cannot store, say) is sent
//! again one end at a time, so one bad end fails only itself.

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
/// Ends of a refused batch sent one by one at once.
const ONE_BY_ONE_IN_FLIGHT: usize = 16;

type Answer = oneshot::Sender<Result<bool, StoreError>>;
type Queue = mpsc::Sender<(Ending, Answer)>;

/// A handle to the engine's batcher of run ends; cheap to clone.
#[derive(Clone)]
pub(crate) struct Ends {
    store: Arc<dyn Store>,
    /// The running worker's queue. The worker starts with the first end, on the runtime
    /// that runs the engine (which may be built outside one), and again if that runtime
    /// went away (the engine used by `run_here` in one runtime, then `run` in another).
    queue: Arc<Mutex<Option<Queue>>>,
}

impl Ends {
    pub(crate) fn new(store: Arc<dyn Store>) -> Ends {
        Ends { store, queue: Arc::default() }
    }

    /// Records one run's end through the next batch; what [`Store::finish`] would answer.
    /// Cancel-safe: dropped before it returns, the end may still be recorded.
    pub(crate) async fn finish(&self, ending: Ending) -> Result<bool, StoreError> {
        let queue = {
            let mut queue = self.queue.lock().expect("not poisoned");
            match queue.as_ref().filter(|q| !q.is_closed()) {
                Some(q) => q.clone(),
                None => {
                    let (tx, rx) = mpsc::channel(QUEUE_MAX);
                    tokio::spawn(work(rx, self.store.clone()));
                    queue.insert(tx).clone()
                }
            }
        };
        let (answer, answered) = oneshot::channel();
        queue
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
            for (answer, result) in answers.into_iter().zip(record(store.as_ref(), &endings).await) {
                // The owner may have stopped waiting (its deadline passed): nothing to tell.
                let _ = answer.send(result);
            }
        });
    }
}

/// One answer per end: the batch's, or, if the store refused the batch as a whole for a
/// reason other than being unreachable, each end's own.
async fn record(store: &dyn Store, endings: &[Ending]) -> Vec<Result<bool, StoreError>> {
    let failure = match tokio::time::timeout(BATCH_WAIT, store.finish_all(endings)).await {
        Ok(Ok(done)) if done.len() == endings.len() => return done.into_iter().map(Ok).collect(),
        Ok(Ok(done)) => StoreError::Invalid(format!("the store answered {} of {} run ends", done.len(), endings.len())),
        Ok(Err(e)) => e,
        Err(_) => StoreError::Unavailable(format!("recording {} run ends timed out", endings.len())),
    };
    if endings.len() == 1 || matches!(failure, StoreError::Unavailable(_)) {
        return endings.iter().map(|_| Err(failure.clone())).collect();
    }
    tracing::warn!(ends = endings.len(), error = %failure, "a batch of run ends was refused; recording them one by one");
    let mut answers = Vec::with_capacity(endings.len());
    for some in endings.chunks(ONE_BY_ONE_IN_FLIGHT) {
        let finishes = some.iter().map(|e| tokio::time::timeout(BATCH_WAIT, store.finish(&e.lease, &e.end)));
        for answer in futures_util::future::join_all(finishes).await {
            answers.push(
                answer.unwrap_or_else(|_| Err(StoreError::Unavailable("recording a run's end timed out".into()))),
            );
        }
    }
    answers
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use solocron_core::{ClaimMode, ClaimOutcome, ClaimRequest, RunEnd, RunState, Tick, Trigger};
    use solocron_sqlite::SqliteStore;

    use super::*;

    fn ending(store: &SqliteStore, rt: &tokio::runtime::Runtime, minute: i64) -> Ending {
        let tick = Tick::new("job", chrono::DateTime::from_timestamp(minute * 60, 0).unwrap());
        let request = ClaimRequest {
            tick,
            trigger: Trigger::Schedule,
            node: "n".into(),
            lease: Duration::from_secs(60),
            mode: ClaimMode::Run { skip_if_running: false },
        };
        let lease = match rt.block_on(store.claim(&[request])).unwrap().pop() {
            Some(ClaimOutcome::Won(lease)) => lease,
            other => panic!("claim not won: {other:?}"),
        };
        let end = RunEnd {
            state: RunState::Succeeded,
            reason: None,
            exit_code: None,
            output: String::new(),
            started_after: None,
        };
        Ending { lease, end }
    }

    /// The engine may record ends in one runtime (`run_here` in a short-lived one) and then
    /// in another (`run`): the worker is started again where the first one went away.
    #[test]
    fn ends_are_recorded_after_the_runtime_that_started_the_worker_is_gone() {
        let dir = tempfile::tempdir().unwrap();
        let runtime = || tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let first = runtime();
        let store = first.block_on(async {
            let store = SqliteStore::connect(&format!("sqlite://{}/s.db", dir.path().display())).await.unwrap();
            store.migrate().await.unwrap();
            store
        });
        let (a, b) = (ending(&store, &first, 0), ending(&store, &first, 1));
        let store: Arc<dyn Store> = Arc::new(store);
        let ends = Ends::new(store.clone());
        assert!(first.block_on(ends.finish(a)).unwrap());
        drop(first);
        let second = runtime();
        assert!(second.block_on(ends.finish(b)).unwrap(), "recorded through a worker on the new runtime");
    }
}
