//! The Lua scripts: one per [`Store`](solocron_core::Store) method that writes or reads more
//! than one key. Each is the shared prelude (`lua/prelude.lua`: key names, the clock, the
//! run life helpers) followed by the method's body, and runs as one atomic EVALSHA
//! ([`redis::Script`] loads it again after a `NOSCRIPT`, e.g. after a restart).

use std::sync::LazyLock;

use redis::Script;

const PRELUDE: &str = include_str!("lua/prelude.lua");

/// Every script of the store, compiled (hashed) once per process.
pub(crate) struct Scripts {
    pub claim: Script,
    pub renew: Script,
    pub finish: Script,
    pub expired: Script,
    pub recover: Script,
    pub history: Script,
    pub register: Script,
    pub registrations: Script,
    pub set_paused: Script,
    pub controls: Script,
    pub request_run: Script,
    pub pending: Script,
    pub unlock: Script,
    pub prune: Script,
    pub migrate: Script,
    pub memory_since: Script,
}

/// The prelude and `body`, as one script.
fn script(body: &str) -> Script {
    Script::new(&format!("{PRELUDE}\n{body}"))
}

pub(crate) static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    claim: script(include_str!("lua/claim.lua")),
    renew: script(include_str!("lua/renew.lua")),
    finish: script(include_str!("lua/finish.lua")),
    expired: script(include_str!("lua/expired.lua")),
    recover: script(include_str!("lua/recover.lua")),
    history: script(include_str!("lua/history.lua")),
    register: script(include_str!("lua/register.lua")),
    registrations: script(include_str!("lua/registrations.lua")),
    set_paused: script(include_str!("lua/set_paused.lua")),
    controls: script(include_str!("lua/controls.lua")),
    request_run: script(include_str!("lua/request_run.lua")),
    pending: script(include_str!("lua/pending.lua")),
    unlock: script(include_str!("lua/unlock.lua")),
    prune: script(include_str!("lua/prune.lua")),
    migrate: script(include_str!("lua/migrate.lua")),
    memory_since: script(include_str!("lua/memory_since.lua")),
});
