//! # solocron
//!
//! Exactly-once cron across a fleet. Every node runs the same [`Scheduler`] with the same
//! [`Job`]s over a shared [`Store`]; each scheduled run of each job
//! (a tick: job name and scheduled instant) executes exactly once across all of them.
//!
//! - A tick is claimed with one atomic store operation, batched for ticks due together.
//! - The winner holds a lease judged by the store's clock, renews it every lease/3, and
//!   stops the job if it loses it.
//! - Every run gets a fencing token larger than every earlier token of its job.
//! - Runs whose node died are recovered by policy (`abandon` or `retry`); missed ticks are
//!   caught up by policy; shutdown drains.
//!
//! Jobs run async Rust code ([`handler_fn`]), processes ([`Command`]) or HTTP requests
//! ([`HttpJob`]).
#![forbid(unsafe_code)]
#![warn(missing_docs)]

// The rooms import in one direction, layer by layer; a room may import from its own layer
// or those below it, never in a circle. tests/arrows.rs reads the sources and fails on an
// arrow against these layers, on a circle, and on any room but this hall naming the
// scheduler.
//
//   scheduler     builds the node, starts its loops and drains them; `run_here`
//   node's loops  timer (→ backups, catchup), recovery (→ alerts), housekeeping, alerts,
//                 follow (the declared and managed jobs, followed)
//   engine        claims ticks; `Engine::start` is the one door every claimed run goes through
//   runner        one run's life, over `runner::Env`, which the engine lends it
//   batches       renewals and ends sent to the store in batches
//   leaves        job, jobset, command, http_job, spec, metrics, store_call (every store
//                 call's bound), store_clock, ends, retry, backoff, spread, unanswered, lead
//
// News goes up without an arrow up: a run's recorded end is announced on `ends` (a leaf)
// and alerting listens; the listener is set up by the scheduler.

mod alerts;
mod backoff;
mod backups;
mod batches;
mod catchup;
mod command;
mod ends;
mod engine;
pub mod follow;
mod housekeeping;
mod http_job;
mod job;
mod jobset;
mod lead;
pub mod metrics;
mod recovery;
mod retry;
mod runner;
mod scheduler;
pub mod spec;
mod spread;
mod store_call;
mod store_clock;
mod timer;
mod unanswered;

pub use alerts::{AlertEvent, AlertRule, AlertTarget, ALERTS_PER_HOUR_DEFAULT, ALERT_RULES_MAX, DELIVERY_RETRY};
pub use command::Command;
pub use housekeeping::{prune_pass, REGISTRATION_STALE_AFTER};
pub use http_job::{ExpectStatus, HttpJob, HttpJobError, RESPONSE_READ_BYTES_MAX};
pub use job::{
    handler_fn, handler_with_state, BoxError, FnHandler, Handler, HandlerResult, Job, Outcome, RunContext, StateHandler,
};
pub use jobset::{BuildError, JobChanges, Jobs};
pub use lead::{CLAIM_AHEAD, CLAIM_AHEAD_MAX};
pub use scheduler::{NodeIdInUse, Scheduler, SchedulerBuilder, SystemClock, NODE_ID_WATCH};
pub use solocron_core as core;
pub use solocron_core::{JobPolicy, Misfire, OnCrash, Overlap, Prefix, Schedule, Store, StoreError};
/// The HTTP API, Prometheus metrics and web console as an axum router, to mount next to a
/// service's own routes (feature `http`): `solocron::http::router(store, options)`.
#[cfg(feature = "http")]
pub use solocron_http as http;
/// The token that stops [`Scheduler::run`] (and tells a handler to stop: [`RunContext::cancel`]).
pub use tokio_util::sync::CancellationToken;

/// README.md's Rust blocks, compiled as doctests so the library example stays true.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;
