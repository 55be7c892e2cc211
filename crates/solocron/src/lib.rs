//! # solocron
//!
//! Exactly-once cron across a fleet. Every node runs the same [`Scheduler`] with the same
//! [`Job`]s over a shared [`Store`](solocron_core::Store); each scheduled run of each job
//! (a tick: job name and scheduled instant) executes exactly once across all of them.
//!
//! - A tick is claimed with one atomic store operation, batched for ticks due together.
//! - The winner holds a lease judged by the store's clock, renews it every lease/3, and
//!   stops the job if it loses it.
//! - Every run gets a fencing token larger than every earlier token of its job.
//! - Runs whose node died are recovered by policy (`abandon` or `retry`); missed ticks are
//!   caught up by policy; shutdown drains.
//!
//! Jobs run async Rust code ([`handler_fn`]) or processes ([`Command`]).
#![warn(missing_docs)]

mod backoff;
mod batches;
mod command;
mod guardian;
mod housekeeping;
mod job;
mod lead;
mod runner;
mod scheduler;
mod spawn;
mod wallclock;

pub use command::Command;
pub use housekeeping::{prune_pass, REGISTRATION_STALE_AFTER};
pub use job::{handler_fn, FnHandler, Handler, Job, Outcome, RunContext};
pub use lead::{CLAIM_AHEAD, CLAIM_AHEAD_MAX};
pub use scheduler::{BuildError, Scheduler, SchedulerBuilder, SystemClock};
pub use solocron_core as core;
