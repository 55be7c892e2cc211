//! # solocron-os
//!
//! The operating system's edge of solocron: starting, guarding and killing job processes,
//! and the kernel's notice that the wall clock was set. It is the only crate of the
//! workspace allowed `unsafe` (every other crate root says `#![forbid(unsafe_code)]`), so
//! that the system calls which need it are read, reviewed and tested in one place, each
//! `unsafe` block with a `// SAFETY:` comment (the lints below hold that rule).
//!
//! What it owns:
//! - [`spawn`]: starting a job's program in its own process group, with SIGKILL as its
//!   death signal, waiting for it on a pidfd, and killing what is left of its group;
//! - the guardian (private): one small process per node that kills the groups of the
//!   node's running jobs if the node dies without stopping them;
//! - [`wallclock`]: the kernel's notice that the wall clock was stepped;
//! - [`die_with_parent`], for test harnesses that start servers with
//!   [`std::process::Command`], and [`preforked`], for the benchmark's floor of starting
//!   many programs at one instant.
//!
//! Architecture invariant: this crate knows processes, file descriptors and signals, and
//! nothing of what they are for. No store, no schedule, no job policy, no run record: a
//! caller hands it an argv and an environment, and gets back a process to wait on or
//! kill. Linux only (pidfds, `PR_SET_PDEATHSIG`, `timerfd`).
#![warn(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]

mod guardian;
pub mod malloc;
mod parent;
pub mod preforked;
pub mod spawn;
pub mod wallclock;

pub use parent::die_with_parent;
