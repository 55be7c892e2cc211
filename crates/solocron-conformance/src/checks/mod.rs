//! The checks, each a `pub async fn name(f: &impl StoreFactory)` named after the guarantee
//! it checks; each panics (with what the store answered) where the store breaks it.
//!
//! Every check starts on a fresh namespace and opens as many independent stores as it
//! needs, like that many processes. Expiry checks use leases of 300-800 ms and sleep just
//! past them, so a check takes at most a few seconds.
//!
//! The files follow the store's role traits (`solocron_core::roles`): `claim.rs`
//! `ClaimStore`; `lease.rs`, `recovery.rs`, `retry.rs` `RunStore`; `history.rs`
//! `HistoryStore`; `registry.rs` `RegistryStore`; `control.rs` `ControlStore` and
//! `RequestStore`; `fleet.rs` `FleetStore` and `AuditStore`; `managed.rs` `ManagedStore`;
//! `migrate.rs` `SchemaStore`. `namespaces.rs` checks that every trait's scans keep to the
//! namespaces asked for. A new trait gets a file of its own here.

mod claim;
mod control;
mod fleet;
mod history;
mod lease;
mod managed;
mod migrate;
mod namespaces;
mod recovery;
mod registry;
mod retry;
mod support;

pub use claim::*;
pub use control::*;
pub use fleet::*;
pub use history::*;
pub use lease::*;
pub use managed::*;
pub use migrate::*;
pub use namespaces::*;
pub use recovery::*;
pub use registry::*;
pub use retry::*;
