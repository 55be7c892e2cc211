//! What a store instance remembers between calls, as shortcuts that are never trusted: the
//! jobs' guards and switches it last saw ([`Known`]: a short claim plans from them instead
//! of reading), and the running records it last wrote ([`Held`]: a renewal skips its read).
//! Every write compares the revisions it planned from, so a stale memory costs a failed
//! `Txn` and a re-plan, never a wrong decision.

use std::collections::HashMap;
use std::sync::Mutex;

use solocron_core::RunId;

use crate::codec::{Guard, StoredRun};
use crate::EtcdStore;

/// Most jobs whose guard and switch an instance remembers; beyond, it forgets them all.
const KNOWN_MAX: usize = 100_000;

/// Most runs whose lease a store instance remembers between renewals; beyond, it forgets
/// them all (renewals then read first). Only the engine's own running runs are remembered.
const HELD_MAX: usize = 100_000;

/// What a chunk's read tells about one job.
#[derive(Debug, Clone)]
pub(crate) struct JobView {
    pub guard: Guard,
    /// Mod revision of the guard key; 0 if absent (a compare of an absent key's
    /// mod_revision sees 0, so "still absent" is the same compare).
    pub guard_rev: i64,
    pub paused: Option<String>,
    pub control_rev: i64,
}

/// What this instance last saw of jobs' guards and switches, each at its revision: a guess
/// that lets a short claim skip its read. Never trusted: every claim compares the revisions
/// it planned from, so a stale entry costs a failed `Txn` and a re-plan, never a wrong
/// decision.
#[derive(Debug, Default)]
pub(crate) struct Known(Mutex<HashMap<String, JobView>>);

impl Known {
    /// `jobs` as remembered; `None` unless every one of them is.
    pub(crate) fn guess(&self, jobs: &[String]) -> Option<HashMap<String, JobView>> {
        let known = self.0.lock().unwrap_or_else(|e| e.into_inner());
        jobs.iter().map(|j| Some((j.clone(), known.get(j)?.clone()))).collect()
    }

    /// Remembers `jobs` as they were read.
    pub(crate) fn learn(&self, jobs: &HashMap<String, JobView>) {
        self.learn_jobs(jobs.iter().map(|(j, v)| (j.clone(), v.clone())));
    }

    pub(crate) fn learn_jobs(&self, jobs: impl IntoIterator<Item = (String, JobView)>) {
        let mut known = self.0.lock().unwrap_or_else(|e| e.into_inner());
        for (job, view) in jobs {
            if known.len() >= KNOWN_MAX && !known.contains_key(&job) {
                known.clear();
            }
            known.insert(job, view);
        }
    }

    /// Forgets every job (after an uninstall).
    pub(crate) fn forget_all(&self) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }

    /// Remembers a guard this instance wrote at `revision` (a finish), if its job is known.
    pub(crate) fn learn_guard(&self, guard: &Guard, revision: i64) {
        let mut known = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(view) = known.get_mut(&guard.job) {
            view.guard = guard.clone();
            view.guard_rev = revision;
        }
    }
}

/// A running record as this store instance last wrote it, at `revision`: lets a renewal
/// skip a read.
#[derive(Debug, Clone)]
pub(crate) struct Held {
    pub record: StoredRun,
    pub revision: i64,
}

impl EtcdStore {
    /// Remembers a run this instance claimed or renewed.
    pub(crate) fn remember(&self, held: Held) {
        let Ok(id) = held.record.id() else { return };
        let mut map = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if map.len() >= HELD_MAX {
            map.clear();
        }
        map.insert(id, held);
    }

    pub(crate) fn recall(&self, run: &RunId) -> Option<Held> {
        self.held.lock().unwrap_or_else(|e| e.into_inner()).get(run).cloned()
    }

    pub(crate) fn forget(&self, run: &RunId) {
        self.held.lock().unwrap_or_else(|e| e.into_inner()).remove(run);
    }

    /// Forgets every run, job and shared lease this instance remembers (after an uninstall).
    pub(crate) fn forget_all(&self) {
        self.held.lock().unwrap_or_else(|e| e.into_inner()).clear();
        self.shared.lock().unwrap_or_else(|e| e.into_inner()).clear();
        self.known.forget_all();
    }
}
