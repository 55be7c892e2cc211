//! What the commands share to stand a node or a command up: the configuration and the
//! store a command works on (`target`), the scheduler and its jobs with their secrets read
//! (`node`), the jobs a configuration declares (`declared`), a jobs document's definitions
//! as the store keeps them (`spec`), and the process's signals, log and operator name
//! (`process`).
//!
//! A leaf: it imports only `config`, `stores` and the crate root, and every command module
//! imports it, so the commands never import each other to share a piece (a test in
//! `tests/rooms.rs` keeps it so).

mod declared;
mod node;
mod process;
mod spec;
mod target;

pub use declared::{declared, declared_jobs};
pub use node::{jobs, scheduler};
pub use process::{init_logging, operator, Asked, LogFormat, Signals};
pub use spec::{specs_of_document, Spec};
pub use target::{load, require_current_schema, Target};
