//! The fleet's clock: what [`solocron_core::StoreBase::now`] answers on a store that has no
//! clock of its own.
//!
//! etcd has no time API, so "the store's clock", which schedules follow (a node whose clock
//! runs 2 s ahead must not start ticks 2 s early), is taken to be the **median of the
//! fleet's clocks**: every process using a prefix tells the others its clock through etcd,
//! and each one's [`FleetClock::now`] is its own clock plus the median offset of those it
//! heard (its own included, at about zero). One clock off, among three or more, is outvoted;
//! with two that disagree, the lower middle is taken (the later schedule: no tick starts
//! early by either clock).
//!
//! **How a clock is told.** Two keys: `{p}clock/ask` and `{p}clock/answer`. Every process
//! watches both. On start it puts `ask`; whoever sees a put of `ask` puts `answer` with its
//! id and its clock (at most once per [`ANSWER_GAP`]), and every process also answers every
//! [`ANSWER_EVERY`]. Whoever sees a put of `answer` takes `sender's clock − own clock at
//! receipt` as a sample of their offset: too low by the one-way delay through etcd (a few
//! ms), so of a sender's last [`SAMPLES_PER_PEER`] samples the highest is used (NTP's
//! least delay). Senders not heard for [`PEER_FRESH`] are forgotten; at most [`PEERS_MAX`]
//! are kept. Both keys are one key each, overwritten: nothing accumulates in etcd (a watch
//! sees every put, however quickly the next one follows).
//!
//! **At start.** The first [`FleetClock::now`] starts the watch, asks, and waits up to
//! [`READY_WAIT`] for the answers of the live processes; alone, a process follows its own
//! clock. The offset is one per process (every store of a process estimates the same real
//! time), and every instant the store records is read on the fleet's clock too
//! (`etcd::now_ms`), so a record's `claimed_at` agrees with the schedules it was claimed by.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use etcd_client::{Client, EventType, PutOptions, WatchFilterType, WatchOptions, WatchStream};
use tokio::sync::OnceCell;
use tokio::task::AbortHandle;

use crate::keys::Keys;

/// How often every process tells its clock, asked or not.
pub const ANSWER_EVERY: Duration = Duration::from_secs(5);
/// Least time between two answers of one process (many asks at once get one answer).
const ANSWER_GAP: Duration = Duration::from_millis(100);
/// A sender not heard for this long is forgotten: three answers missed.
const PEER_FRESH: Duration = Duration::from_secs(15);
/// Samples kept per sender; the highest (least delayed) is its offset.
const SAMPLES_PER_PEER: usize = 4;
/// Most senders kept (a fleet's nodes, and the admin commands of the last seconds).
const PEERS_MAX: usize = 1024;
/// How long the first [`FleetClock::now`] waits for the answers to its ask.
pub const READY_WAIT: Duration = Duration::from_millis(250);
/// How long a broken watch waits before it is made again.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// The fleet's clock minus this process's, in ms, as last computed.
static FLEET_OFFSET_MS: AtomicI64 = AtomicI64::new(0);

/// The fleet's clock minus this process's, in ms (zero until other clocks are heard).
pub(crate) fn fleet_offset_ms() -> i64 {
    FLEET_OFFSET_MS.load(Ordering::Relaxed)
}

/// This process's own clock, in ms: what answers tell and samples compare with.
pub(crate) fn process_now_ms() -> i64 {
    Utc::now().timestamp_millis()
}

/// Recomputes the fleet's offset from what `peers` heard.
fn settle(peers: &Mutex<Peers>) -> i64 {
    let offset = peers.lock().unwrap_or_else(PoisonError::into_inner).median_offset(Instant::now()).unwrap_or(0);
    FLEET_OFFSET_MS.store(offset, Ordering::Relaxed);
    offset
}

/// The offsets heard, by sender.
#[derive(Debug, Default)]
struct Peers {
    by_sender: HashMap<u64, Peer>,
}

#[derive(Debug)]
struct Peer {
    /// `sender's clock − ours`, in ms, newest last.
    samples: VecDeque<i64>,
    heard: Instant,
}

impl Peers {
    /// Takes one answer: `sender` said its clock read `their_ms` when ours read `our_ms`.
    fn hear(&mut self, sender: u64, their_ms: i64, our_ms: i64, at: Instant) {
        if self.by_sender.len() >= PEERS_MAX && !self.by_sender.contains_key(&sender) {
            self.forget_stale(at);
            if self.by_sender.len() >= PEERS_MAX {
                return;
            }
        }
        let peer = self.by_sender.entry(sender).or_insert_with(|| Peer { samples: VecDeque::new(), heard: at });
        if peer.samples.len() == SAMPLES_PER_PEER {
            peer.samples.pop_front();
        }
        peer.samples.push_back(their_ms - our_ms);
        peer.heard = at;
    }

    fn forget_stale(&mut self, now: Instant) {
        self.by_sender.retain(|_, p| now.duration_since(p.heard) < PEER_FRESH);
    }

    /// The lower median of the fresh senders' offsets, in ms; `None` when none is fresh.
    fn median_offset(&mut self, now: Instant) -> Option<i64> {
        self.forget_stale(now);
        let mut offsets: Vec<i64> = self.by_sender.values().filter_map(|p| p.samples.iter().max().copied()).collect();
        offsets.sort_unstable();
        offsets.get(offsets.len().checked_sub(1)? / 2).copied()
    }
}

/// This process's view of the fleet's clock (see the module docs).
pub(crate) struct FleetClock {
    /// This process's sender id in answers.
    id: u64,
    peers: Arc<Mutex<Peers>>,
    started: OnceCell<AbortHandle>,
}

impl FleetClock {
    pub(crate) fn new() -> FleetClock {
        FleetClock { id: fastrand::u64(..), peers: Arc::default(), started: OnceCell::new() }
    }

    /// The fleet's time now: this process's clock plus the median offset heard.
    pub(crate) async fn now(&self, client: &Client, keys: &Keys) -> DateTime<Utc> {
        self.started
            .get_or_init(|| async {
                let task = tokio::spawn(listen(client.clone(), Ask::new(keys), self.id, self.peers.clone()));
                tokio::time::sleep(READY_WAIT).await;
                task.abort_handle()
            })
            .await;
        let offset = settle(&self.peers);
        Utc::now() + chrono::Duration::milliseconds(offset)
    }
}

impl Drop for FleetClock {
    fn drop(&mut self) {
        if let Some(task) = self.started.get() {
            task.abort();
        }
    }
}

/// The two keys.
#[derive(Clone)]
struct Ask {
    ask: String,
    answer: String,
}

impl Ask {
    fn new(keys: &Keys) -> Ask {
        Ask { ask: format!("{}clock/ask", keys.prefix()), answer: format!("{}clock/answer", keys.prefix()) }
    }
}

/// Watches, asks and answers until aborted, making the watch again when it breaks.
async fn listen(client: Client, keys: Ask, id: u64, peers: Arc<Mutex<Peers>>) {
    loop {
        if let Err(e) = listen_once(&client, &keys, id, &peers).await {
            tracing::debug!(error = %e, "the fleet clock's watch broke; making it again");
        }
        tokio::time::sleep(RETRY_AFTER).await;
    }
}

async fn listen_once(client: &Client, keys: &Ask, id: u64, peers: &Mutex<Peers>) -> Result<(), etcd_client::Error> {
    let mut stream = watch(client, keys).await?;
    let mut c = client.clone();
    c.put(keys.ask.clone(), id.to_string(), None::<PutOptions>).await?;
    let mut every = tokio::time::interval(ANSWER_EVERY);
    let mut answered: Option<Instant> = None;
    loop {
        let asked = tokio::select! {
            message = stream.message() => match message? {
                Some(resp) if resp.canceled() => return Ok(()),
                Some(resp) => {
                    let asked = hear(&resp, keys, peers);
                    settle(peers);
                    asked
                }
                None => return Ok(()),
            },
            _ = every.tick() => true,
        };
        if asked && answered.is_none_or(|at| at.elapsed() >= ANSWER_GAP) {
            c.put(keys.answer.clone(), format!("{id} {}", process_now_ms()), None::<PutOptions>).await?;
            answered = Some(Instant::now());
        }
    }
}

/// Both watches, on one stream, confirmed in place.
async fn watch(client: &Client, keys: &Ask) -> Result<WatchStream, etcd_client::Error> {
    let puts = || Some(WatchOptions::new().with_filters([WatchFilterType::NoDelete]));
    let mut stream = client.clone().watch(keys.ask.clone(), puts()).await?;
    crate::watch::created(&mut stream).await?;
    stream.watch(keys.answer.clone(), puts()).await?;
    crate::watch::created(&mut stream).await?;
    Ok(stream)
}

/// Takes the answers of one watch message as samples; whether it holds an ask.
fn hear(resp: &etcd_client::WatchResponse, keys: &Ask, peers: &Mutex<Peers>) -> bool {
    let (our_ms, at) = (process_now_ms(), Instant::now());
    let mut asked = false;
    for event in resp.events().iter().filter(|e| e.event_type() == EventType::Put) {
        let Some(kv) = event.kv() else { continue };
        if kv.key() == keys.ask.as_bytes() {
            asked = true;
            continue;
        }
        let answer = std::str::from_utf8(kv.value()).ok().and_then(|v| v.split_once(' '));
        match answer.and_then(|(sender, ms)| Some((sender.parse::<u64>().ok()?, ms.parse::<i64>().ok()?))) {
            Some((sender, their_ms)) => {
                peers.lock().unwrap_or_else(PoisonError::into_inner).hear(sender, their_ms, our_ms, at)
            }
            None => tracing::debug!("skipping an unreadable clock answer"),
        }
    }
    asked
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_outvotes_one_clock_and_takes_the_lower_middle_of_two() {
        let t = Instant::now();
        let mut p = Peers::default();
        assert_eq!(p.median_offset(t), None, "nobody heard: the process's own clock");
        p.hear(1, 10_000, 10_000, t); // itself
        p.hear(2, 12_000, 10_000, t); // 2 s ahead
        assert_eq!(p.median_offset(t), Some(0), "of two, the lower: no tick early by either");
        p.hear(3, 7_990, 10_000, t); // 2 s behind
        assert_eq!(p.median_offset(t), Some(0), "one ahead and one behind are outvoted");
        let fast = Peers::median_offset(&mut fast_view(t), t);
        assert_eq!(fast, Some(-2_000), "the fast node follows the fleet: 2 s back");
    }

    /// What the node 2 s ahead hears: itself, and two nodes 2 s behind it.
    fn fast_view(t: Instant) -> Peers {
        let mut p = Peers::default();
        p.hear(2, 12_000, 12_000, t);
        p.hear(1, 10_000, 12_000, t);
        p.hear(3, 10_000, 12_000, t);
        p
    }

    #[test]
    fn the_least_delayed_sample_counts_and_silent_senders_are_forgotten() {
        let t = Instant::now();
        let mut p = Peers::default();
        for delay in [30, 2, 50, 9] {
            p.hear(1, 5_000, 5_000 + delay, t);
        }
        assert_eq!(p.median_offset(t), Some(-2), "the highest sample: the least delay");
        for _ in 0..SAMPLES_PER_PEER {
            p.hear(1, 5_000, 5_100, t);
        }
        assert_eq!(p.median_offset(t), Some(-100), "only the last few samples are kept");
        assert_eq!(p.median_offset(t + PEER_FRESH), None, "a silent sender is forgotten");
    }

    #[test]
    fn senders_are_bounded() {
        let t = Instant::now();
        let mut p = Peers::default();
        for sender in 0..(PEERS_MAX as u64 + 10) {
            p.hear(sender, 0, 0, t);
        }
        assert_eq!(p.by_sender.len(), PEERS_MAX);
    }
}
