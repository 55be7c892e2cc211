//! Sends runs' lease renewals and ends to the store in batches: when many runs renew or
//! end at once (a herd of short jobs ending, a herd whose claim was answered late confirming
//! its leases), their `renew` and `finish` calls go to the store as a few
//! [`RunStore::renew_all`](solocron_core::RunStore::renew_all) and [`RunStore::finish_all`](solocron_core::RunStore::finish_all) calls instead of one round trip each
//! queued behind the pool, which let owners' leases run out before their renewals or ends
//! were written (the run then stopped, or fell to recovery and its `on_crash` policy).
//!
//! A call waits in a bounded queue; one worker task per kind takes whatever is queued when a
//! batch slot frees up (up to the kind's batch size), so a lone call goes out at once and a
//! burst goes out in as many batches as the burst needs. A batch the store refuses as a
//! whole for a reason other than being unreachable (one end it cannot store, say) is sent
//! again one call at a time, so one bad item fails only itself.

use std::marker::PhantomData;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::BoxFuture;
use solocron_core::{Ending, Renewal, RunStore, StoreError, FINISH_BATCH_MAX, RENEW_BATCH_MAX};
use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio::time::Instant;

use crate::metrics::{self, StoreOp};

/// Batches in flight at once, of all kinds together: enough to keep a pooled store busy,
/// few enough that a burst leaves connections for claims and recovery (PostgreSQL and
/// MySQL pools hold 8; SQLite's 2, whose writes take turns on the file's lock anyway).
const BATCHES_IN_FLIGHT: usize = 3;
/// Longest a batch may take before its items are answered with an error (their owners retry
/// while their leases allow); shorter when every item's caller gives up sooner.
const BATCH_WAIT: Duration = Duration::from_secs(10);
/// Items of a refused batch sent one by one at once.
const ONE_BY_ONE_IN_FLIGHT: usize = 16;

/// The engine's batchers: one for lease renewals and one for runs' ends, sharing
/// [`BATCHES_IN_FLIGHT`] slots.
pub(crate) struct Batches {
    /// Where runs' lease renewals go.
    pub(crate) renewals: Batcher<Renewals>,
    /// Where runs' ends go to be recorded.
    pub(crate) ends: Batcher<Finishes>,
}

impl Batches {
    pub(crate) fn new(store: Arc<dyn RunStore>) -> Batches {
        let slots = Arc::new(Semaphore::new(BATCHES_IN_FLIGHT));
        Batches { renewals: Batcher::new(store.clone(), slots.clone()), ends: Batcher::new(store, slots) }
    }
}

/// One kind of call that the store takes in batches.
pub(crate) trait Kind: Send + Sync + 'static {
    /// One call's input.
    type Item: Send + Sync + 'static;
    /// Most items per batch.
    const BATCH_MAX: usize;
    /// What a batch is, for logs and errors ("run ends").
    const WHAT: &'static str;
    /// Which store operation a failed call counts under.
    const OP: StoreOp;
    /// Whether an item whose caller stopped waiting is still sent. A renewal nobody waits
    /// for is dropped (its owner sends a fresh one); an end is recorded all the same.
    const SEND_ABANDONED: bool;
    /// The batch call: one answer per item, in order.
    fn all<'a>(store: &'a dyn RunStore, items: &'a [Self::Item]) -> BoxFuture<'a, Result<Vec<bool>, StoreError>>;
    /// The call for one item.
    fn one<'a>(store: &'a dyn RunStore, item: &'a Self::Item) -> BoxFuture<'a, Result<bool, StoreError>>;
}

/// Runs' ends: [`RunStore::finish_all`](solocron_core::RunStore::finish_all).
pub(crate) struct Finishes;

impl Kind for Finishes {
    type Item = Ending;
    const BATCH_MAX: usize = FINISH_BATCH_MAX;
    const WHAT: &'static str = "run ends";
    const OP: StoreOp = StoreOp::Finish;
    const SEND_ABANDONED: bool = true;
    fn all<'a>(store: &'a dyn RunStore, items: &'a [Ending]) -> BoxFuture<'a, Result<Vec<bool>, StoreError>> {
        store.finish_all(items)
    }
    fn one<'a>(store: &'a dyn RunStore, item: &'a Ending) -> BoxFuture<'a, Result<bool, StoreError>> {
        store.finish(&item.lease, &item.end)
    }
}

/// Lease renewals: [`RunStore::renew_all`](solocron_core::RunStore::renew_all).
pub(crate) struct Renewals;

impl Kind for Renewals {
    type Item = Renewal;
    const BATCH_MAX: usize = RENEW_BATCH_MAX;
    const WHAT: &'static str = "lease renewals";
    const OP: StoreOp = StoreOp::Renew;
    const SEND_ABANDONED: bool = false;
    fn all<'a>(store: &'a dyn RunStore, items: &'a [Renewal]) -> BoxFuture<'a, Result<Vec<bool>, StoreError>> {
        store.renew_all(items)
    }
    fn one<'a>(store: &'a dyn RunStore, item: &'a Renewal) -> BoxFuture<'a, Result<bool, StoreError>> {
        store.renew(&item.lease, item.length)
    }
}

type Answer = oneshot::Sender<Result<bool, StoreError>>;

/// One queued call: its item, where its answer goes, and when its caller gives up.
struct Queued<T> {
    item: T,
    answer: Answer,
    deadline: Instant,
}

type Queue<K> = mpsc::Sender<Queued<<K as Kind>::Item>>;

/// A handle to the engine's batcher of one kind of call; cheap to clone.
pub(crate) struct Batcher<K: Kind> {
    store: Arc<dyn RunStore>,
    /// The running worker's queue. The worker starts with the first call, on the runtime
    /// that runs the engine (which may be built outside one), and again if that runtime
    /// went away (the engine used by `run_here` in one runtime, then `run` in another).
    queue: Arc<Mutex<Option<Queue<K>>>>,
    /// Batch slots, shared by the engine's batchers of every kind.
    slots: Arc<Semaphore>,
    kind: PhantomData<K>,
}

impl<K: Kind> Clone for Batcher<K> {
    fn clone(&self) -> Self {
        Batcher { store: self.store.clone(), queue: self.queue.clone(), slots: self.slots.clone(), kind: PhantomData }
    }
}

impl<K: Kind> Batcher<K> {
    /// A batcher over `store` whose batches take `slots` (see [`BATCHES_IN_FLIGHT`]).
    pub(crate) fn new(store: Arc<dyn RunStore>, slots: Arc<Semaphore>) -> Batcher<K> {
        Batcher { store, queue: Arc::default(), slots, kind: PhantomData }
    }

    /// Sends one item through the next batch; what the one-item call would answer. The
    /// caller gives up at `deadline` (its batch is cut short then, if every other caller
    /// of the batch gave up too). Cancel-safe: dropped before it returns, the item may
    /// still be sent. A full queue (eight batches' worth) makes callers wait, each within
    /// its own deadline, which bounds memory whatever the burst.
    pub(crate) async fn send(&self, item: K::Item, deadline: Instant) -> Result<bool, StoreError> {
        let queue = {
            let mut queue = self.queue.lock().expect("not poisoned");
            match queue.as_ref().filter(|q| !q.is_closed()) {
                Some(q) => q.clone(),
                None => {
                    let (tx, rx) = mpsc::channel(8 * K::BATCH_MAX);
                    tokio::spawn(work::<K>(rx, self.store.clone(), self.slots.clone()));
                    queue.insert(tx).clone()
                }
            }
        };
        let (answer, answered) = oneshot::channel();
        queue
            .send(Queued { item, answer, deadline })
            .await
            .map_err(|_| StoreError::Unavailable(format!("the engine's batcher of {} stopped", K::WHAT)))?;
        answered.await.unwrap_or_else(|_| Err(StoreError::Unavailable(format!("a batch of {} was dropped", K::WHAT))))
    }
}

/// Takes what is queued whenever a batch slot is free, until every handle is dropped.
async fn work<K: Kind>(mut rx: mpsc::Receiver<Queued<K::Item>>, store: Arc<dyn RunStore>, slots: Arc<Semaphore>) {
    while let Some(first) = rx.recv().await {
        let Ok(slot) = slots.clone().acquire_owned().await else { return };
        // Items that arrived while waiting for the slot join this batch; those nobody
        // waits for any more are left out, if this kind leaves them.
        let mut batch = Vec::with_capacity((1 + rx.len()).min(K::BATCH_MAX));
        batch.push(first);
        while batch.len() < K::BATCH_MAX {
            match rx.try_recv() {
                Ok(next) => batch.push(next),
                Err(_) => break,
            }
        }
        if !K::SEND_ABANDONED {
            batch.retain(|q| !q.answer.is_closed());
            if batch.is_empty() {
                continue;
            }
        }
        let store = store.clone();
        tokio::spawn(async move {
            let _slot = slot;
            send_batch::<K>(store.as_ref(), batch).await;
        });
    }
}

/// Sends a batch and answers each item: the batch's answer, or, if the store refused the
/// batch as a whole for a reason other than being unreachable, each item's own, chunk by
/// chunk as they come.
async fn send_batch<K: Kind>(store: &dyn RunStore, batch: Vec<Queued<K::Item>>) {
    debug_assert!(!batch.is_empty() && batch.len() <= K::BATCH_MAX);
    let latest = batch.iter().map(|q| q.deadline).max().expect("a batch has an item");
    let wait = BATCH_WAIT.min(latest.saturating_duration_since(Instant::now()));
    let (items, answers): (Vec<K::Item>, Vec<Answer>) = batch.into_iter().map(|q| (q.item, q.answer)).unzip();
    let failure = match tokio::time::timeout(wait, K::all(store, &items)).await {
        Ok(Ok(done)) if done.len() == items.len() => {
            for (answer, done) in answers.into_iter().zip(done) {
                // The caller may have stopped waiting (its deadline passed): nothing to tell.
                let _ = answer.send(Ok(done));
            }
            return;
        }
        Ok(Ok(done)) => {
            StoreError::Invalid(format!("the store answered {} of {} {}", done.len(), items.len(), K::WHAT))
        }
        Ok(Err(e)) => e,
        Err(_) => StoreError::Unavailable(format!("sending {} {} timed out", items.len(), K::WHAT)),
    };
    metrics::store_error(K::OP);
    if items.len() == 1 || matches!(failure, StoreError::Unavailable(_)) {
        for answer in answers {
            let _ = answer.send(Err(failure.clone()));
        }
        return;
    }
    tracing::warn!(items = items.len(), what = K::WHAT, error = %failure, "a batch was refused; sending its items one by one");
    let mut answers = answers.into_iter();
    for some in items.chunks(ONE_BY_ONE_IN_FLIGHT) {
        let calls = some.iter().map(|item| tokio::time::timeout(BATCH_WAIT, K::one(store, item)));
        for (result, answer) in futures_util::future::join_all(calls).await.into_iter().zip(answers.by_ref()) {
            let result =
                result.unwrap_or_else(|_| Err(StoreError::Unavailable(format!("one of {} timed out", K::WHAT))));
            if result.is_err() {
                metrics::store_error(K::OP);
            }
            let _ = answer.send(result);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use solocron_core::{
        ClaimMode, ClaimOutcome, ClaimRequest, ClaimStore, RunEnd, RunState, SchemaStore, Tick, Trigger,
    };
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
            nonce: 0,
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
            let store = SqliteStore::connect(
                &format!("sqlite://{}/s.db", dir.path().display()),
                &solocron_core::Prefix::default(),
            )
            .await
            .unwrap();
            store.migrate().await.unwrap();
            store
        });
        let (a, b) = (ending(&store, &first, 0), ending(&store, &first, 1));
        let store: Arc<dyn RunStore> = Arc::new(store);
        let ends = Batcher::<Finishes>::new(store.clone(), Arc::new(Semaphore::new(BATCHES_IN_FLIGHT)));
        let deadline = || Instant::now() + Duration::from_secs(5);
        assert!(first.block_on(async { ends.send(a, deadline()).await }).unwrap());
        drop(first);
        let second = runtime();
        let recorded = second.block_on(async { ends.send(b, deadline()).await }).unwrap();
        assert!(recorded, "recorded through a worker on the new runtime");
    }
}
