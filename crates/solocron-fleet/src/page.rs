//! The one envelope of every list, in the API (`/api/v1`) and in the CLI's `--format json`
//! alike: a client reads jobs, runs, nodes, actions and revisions the same way (`items`,
//! then `next_cursor` until it is null). The wire shape of a list is decided here only.

use crate::{JobPage, JobSummary, RunPage, RunView};
use serde::Serialize;
use utoipa::ToSchema;

/// One page of a list. A list the server does not page (the nodes; the newest actions or
/// revisions, up to `limit`) is one page whose `next_cursor` is null.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Page<T: ToSchema> {
    /// The items, in the list's order.
    pub items: Vec<T>,
    /// Pass as `cursor` to read the next page; null on the last page.
    #[schema(required = true)]
    pub next_cursor: Option<String>,
}

impl<T: ToSchema> Page<T> {
    /// The whole list, as one page.
    pub fn whole(items: Vec<T>) -> Page<T> {
        Page { items, next_cursor: None }
    }
}

impl From<RunPage> for Page<RunView> {
    fn from(p: RunPage) -> Page<RunView> {
        Page { items: p.runs, next_cursor: p.next_cursor }
    }
}

/// One page of jobs: the envelope of every list, with what the jobs' filters need.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct JobList {
    /// The jobs, by name, and the next page's cursor.
    #[serde(flatten)]
    pub page: Page<JobSummary>,
    /// How many jobs match the filter, on every page.
    pub total: usize,
    /// Every namespace of a known job, sorted (whatever the filter): what a namespace
    /// filter can choose from.
    pub namespaces: Vec<String>,
}

impl From<JobPage> for JobList {
    fn from(p: JobPage) -> JobList {
        JobList { page: Page { items: p.jobs, next_cursor: p.next_cursor }, total: p.total, namespaces: p.namespaces }
    }
}
