//! A run's end, announced once. The rooms that record ends in the store (the runner, the
//! recovery scan, a claim that records a missed tick skipped) announce each tick's last end
//! here; whoever wants to hear of them (alerts) listens. A leaf: the rooms that record ends
//! know nothing of who listens, and the listener is set up above them (by the scheduler),
//! so no arrow goes from the engine or the runner up to alerts.

use std::sync::OnceLock;

use solocron_core::{RunId, RunState};

/// Hears the ends a node announces.
pub(crate) trait Listener: Send + Sync + 'static {
    /// `run` ended in `state`, as this node recorded it in the store, and no attempt of its
    /// tick follows. Called on the recorder's task: what takes time is spawned.
    fn ended(&self, run: &RunId, state: RunState);
}

/// Where a node's recorded ends are announced; at most one listener hears them.
#[derive(Default)]
pub(crate) struct Ends {
    listener: OnceLock<Box<dyn Listener>>,
}

impl Ends {
    /// Sets who hears the ends from now on (once: a node has one alerting).
    pub(crate) fn listen(&self, listener: impl Listener) {
        let set = self.listener.set(Box::new(listener));
        assert!(set.is_ok(), "a node's ends have one listener");
    }

    /// Announces that `run` ended for good in `state` (see [`Listener::ended`]).
    pub(crate) fn announce(&self, run: &RunId, state: RunState) {
        debug_assert!(state.is_terminal(), "only an end is announced");
        if let Some(listener) = self.listener.get() {
            listener.ended(run, state);
        }
    }
}
