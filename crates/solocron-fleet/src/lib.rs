//! # solocron-fleet
//!
//! What an operator sees and does, over any [`OperatorStore`](solocron_core::OperatorStore): the jobs the fleet knows (declared in
//! a configuration, registered by nodes, or touched by an operator) with their schedule,
//! next fire, pause, last runs and drift; the run history with cursor paging; the nodes and
//! whether they are alive; and the operator's actions (pause, resume, trigger, unlock),
//! each recorded by the store in its audit log. The CLI's admin commands and the HTTP API
//! both read and act through this crate, so they agree on every answer.
//!
//! The views are plain data (`serde::Serialize`, with `utoipa` schemas for the API's
//! OpenAPI document). Nothing here knows HTTP, the terminal or a concrete store.
//!
//! ```no_run
//! # async fn demo(store: &dyn solocron_core::OperatorStore) -> Result<(), solocron_fleet::FleetError> {
//! use solocron_fleet::{Fleet, JobFilter};
//! let fleet = Fleet::read(store, Vec::new()).await?;
//! let page = fleet.jobs(store, &JobFilter::default()).await?;
//! for job in &page.jobs {
//!     println!("{} next {:?}", job.name, job.next_fire);
//! }
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod act;
mod jobs;
mod managed;
mod page;
mod runs;
mod views;

use solocron_core::{Schedule, StoreError};

pub use act::{pause, resume, trigger, unlock, Actor, Triggered, TRIGGER_WAIT_MAX};
pub use jobs::{Fleet, JobFilter, JobStateFilter, JOBS_PAGE_MAX};
pub use managed::{check_writable, delete_job, put_job, revisions, JobWritten, RevisionView};
pub use page::{JobList, Page};
pub use runs::{parse_run_id, run_detail, runs_page, RunFilter, RUNS_PAGE_MAX};
pub use views::{
    ActionView, FireTime, JobDetail, JobPage, JobSummary, ManagedView, NodeView, PauseView, RecentRun,
    RegistrationView, RunDetail, RunPage, RunView,
};

/// A job the reader knows from its own configuration (not only from the store).
#[derive(Debug, Clone)]
pub struct Declared {
    /// The job's name.
    pub name: String,
    /// Its schedule.
    pub schedule: Schedule,
    /// Where it is declared (the configuration file), shown to operators; one string for
    /// all the jobs of a file.
    pub source: std::sync::Arc<str>,
}

/// Why a read or an action could not be answered.
#[derive(Debug, Clone, thiserror::Error)]
pub enum FleetError {
    /// No configuration declares the job, no node registered it, no operator touched it.
    #[error("unknown job `{job}`: not in the configuration nor registered by any node (known: {known})")]
    UnknownJob {
        /// The name asked for.
        job: String,
        /// The known names, joined (at most [`KNOWN_NAMES_SHOWN_MAX`]), or `none`.
        known: String,
    },
    /// A parameter is malformed or out of range.
    #[error("{param}: {message}")]
    BadParam {
        /// The parameter's name, as the caller spelled it.
        param: String,
        /// What is wrong with it.
        message: String,
    },
    /// The thing asked for does not exist (a run id with no record).
    #[error("{0}")]
    NotFound(String),
    /// The write conflicts with the state: the job changed meanwhile, or a configuration
    /// declares it.
    #[error("{0}")]
    Conflict(String),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Most job names listed in an "unknown job" error.
pub const KNOWN_NAMES_SHOWN_MAX: usize = 20;

impl FleetError {
    /// A [`FleetError::BadParam`].
    pub fn bad(param: impl Into<String>, message: impl Into<String>) -> FleetError {
        FleetError::BadParam { param: param.into(), message: message.into() }
    }
}
