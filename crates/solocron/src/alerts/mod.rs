//! Alerts: someone is told when a tick failed for good, timed out, was lost, abandoned or
//! missed, when a job had no success for too long, and when it is back to success.
//!
//! **One alert per event across the fleet.** An alert's delivery is a run of its own: the
//! tick (`#alert{rule}:{job}`, the instant of the event's tick), claimed in the store like
//! any tick, so exactly one node wins it however many saw the event. `#` is in no job's
//! name ([`solocron_core::validate_job_name`]), so a delivery never meets a job. The
//! delivery then has what every run has: a lease, a fencing token, its end recorded in the
//! history, failure retries with backoff ([`DELIVERY_RETRY`]) when the receiver fails, and
//! recovery by another node when the delivering one dies. A webhook gets the run's facts as
//! headers, and `Idempotency-Key` is the same on every attempt, so a receiver can drop the
//! one duplicate a delivering node's death can cause.
//!
//! **Who raises it.** The node that recorded the event: the end of a run it ran, the drop
//! of a retry or an abandon in its recovery scan, a missed tick it recorded skipped; and,
//! in case that node died before it claimed the alert (or lacks the rule), every node's
//! sweep of the last minutes of its jobs' history. The delivery reads the event back from
//! the store (the tick's newest record), so any node can deliver or retry it. Stale jobs
//! (no success for `stale_after`) are checked by every node for the jobs it runs; the
//! alert's instant is the last success's tick plus `stale_after` (its millisecond set to
//! 999, an instant no scheduled tick has), one per silence.
//!
//! **Bounded.** At most [`AlertRule::max_per_hour`] deliveries per rule and job for events
//! of the last hour; past it the event's alert is recorded `skipped` ("rate limited"), not
//! sent. At most [`RAISING_MAX`](raise::RAISING_MAX) events are being claimed at once on a
//! node.
//!
//! **Rooms.** `rule.rs`: events, targets, rules. `raise.rs`: an event claimed once per
//! rule, within its rate. `sweep.rs`: the loop that sweeps recent history and checks for
//! silences. `deliver.rs`: the delivery jobs, their names, and what they send. Ends come in
//! through the engine's `ends` (this room listens; nothing below it imports it); the
//! scheduler makes the [`Alerting`] and runs [`alerts_loop`].

mod deliver;
mod raise;
mod rule;
mod sweep;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex, Weak};

use chrono::{DateTime, Utc};
use solocron_core::{RunId, RunState};

use crate::ends;
use crate::engine::Engine;
use crate::job::Job;
use raise::run_ended;

pub(crate) use deliver::is_delivery_name;
pub use deliver::DELIVERY_RETRY;
pub use rule::{AlertEvent, AlertRule, AlertTarget, ALERTS_PER_HOUR_DEFAULT, ALERT_RULES_MAX};
pub(crate) use sweep::alerts_loop;

/// The node's rules and what it keeps to apply them.
#[derive(Default)]
pub(crate) struct Alerts {
    rules: Vec<Arc<AlertRule>>,
    /// Deliveries built, by name (a delivery's job is the same for every event).
    deliveries: Mutex<HashMap<String, Arc<Job>>>,
    /// Events being claimed now ([`RAISING_MAX`](raise::RAISING_MAX)).
    raising: AtomicUsize,
    /// Held from counting a rule's recent deliveries to claiming the next: events raised
    /// together (a herd of missed ticks) are counted one after another, so the rate holds
    /// on a node (across nodes it may be passed by a claim or two racing).
    claiming: tokio::sync::Mutex<()>,
    /// The last success each (rule, job) was alerted stale after, so a check does not ask
    /// the store again for the same silence.
    stale_alerted: Mutex<HashMap<(usize, String), DateTime<Utc>>>,
    /// The events a sweep raised already ([`SWEPT_MAX`](sweep::SWEPT_MAX)).
    swept: Mutex<HashSet<RunId>>,
}

/// A node's alerting: its engine, and its rules with what it keeps to apply them. Made by
/// the scheduler; cheap to clone.
#[derive(Clone)]
pub(crate) struct Alerting {
    engine: Arc<Engine>,
    alerts: Arc<Alerts>,
}

impl Alerting {
    /// The alerting of `engine` by `rules`, hearing from now on the ends the engine's rooms
    /// announce (`ends.rs`).
    pub(crate) fn new(engine: &Arc<Engine>, rules: Vec<AlertRule>) -> Alerting {
        let alerts = Arc::new(Alerts::new(rules));
        engine.ends.listen(EndListener { engine: Arc::downgrade(engine), alerts: alerts.clone() });
        Alerting { engine: engine.clone(), alerts }
    }

    /// The delivery job named `name`, if it is one of this node's rules' (a recovery scan
    /// meets deliveries like any run).
    pub(crate) fn delivery(&self, name: &str) -> Option<Arc<Job>> {
        self.alerts.delivery(&self.engine, name)
    }
}

/// Hears the engine's announced ends for alerting. It holds the engine weakly, since the
/// engine holds it; whoever announces an end holds the engine, so it is there then.
struct EndListener {
    engine: Weak<Engine>,
    alerts: Arc<Alerts>,
}

impl ends::Listener for EndListener {
    fn ended(&self, run: &RunId, state: RunState) {
        let Some(event) = self.alerts.wanted(run, state) else { return };
        let Some(engine) = self.engine.upgrade() else { return };
        run_ended(&Alerting { engine, alerts: self.alerts.clone() }, run, event);
    }
}

impl Alerts {
    fn new(rules: Vec<AlertRule>) -> Alerts {
        assert!(rules.len() <= ALERT_RULES_MAX);
        Alerts { rules: rules.into_iter().map(Arc::new).collect(), ..Alerts::default() }
    }

    /// The event `run`'s end in `state` is, if a rule wants it. Every run's end comes here:
    /// a node whose rules want nothing of it does nothing more.
    fn wanted(&self, run: &RunId, state: RunState) -> Option<AlertEvent> {
        let job = &run.tick.job;
        let event = AlertEvent::of_end(state).filter(|_| !job.starts_with('#'))?;
        self.rules.iter().any(|r| r.wants(event, job)).then_some(event)
    }
}
