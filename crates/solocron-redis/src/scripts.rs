//! The Lua code: one handler per [`Store`](solocron_core::Store) method that writes or reads
//! more than one key, each in its own file under `lua/`, after the shared head
//! (`lua/prelude.lua`: per-call state, key names, the clock, the run life helpers).
//!
//! The code reaches Redis in one of two forms, both built from the same files:
//!
//! - **A Functions library** (Redis 7+): the head and every method's file, loaded once per
//!   server with `FUNCTION LOAD`; each call is an `FCALL`. The head's definitions are made
//!   once, at load, instead of on every call: about a sixth of a claim's server time
//!   (benchmarks/2026-11-24-evening-redis-functions-mariadb-claim-7391480.md).
//! - **One script per method** (the head, the method's file, and the call), run with
//!   `EVALSHA`: used where the server refuses `FUNCTION LOAD` (an ACL, a proxy).
//!
//! The library's name, and its functions' names, carry the hash of its source, so nodes of
//! different builds sharing one Redis each load and call their own code.

use std::sync::LazyLock;

use redis::Script;

const PRELUDE: &str = include_str!("lua/prelude.lua");

/// One method's code in both forms.
pub(crate) struct Method {
    /// The library function's name: `<library>_<method>`.
    pub function: String,
    /// The standalone script: head, method, call.
    pub script: Script,
}

/// The library and every method of the store, built (and hashed) once per process.
pub(crate) struct Code {
    /// `FUNCTION LOAD`'s argument: the `#!lua name=<library>` line, the head, every method.
    pub library: String,
    pub claim: Method,
    pub renew: Method,
    pub finish: Method,
    pub finish_all: Method,
    pub finish_retry: Method,
    pub expired: Method,
    pub recover: Method,
    pub history: Method,
    pub register: Method,
    pub register_stage: Method,
    pub registrations: Method,
    pub registrations_page: Method,
    pub set_paused: Method,
    pub controls: Method,
    pub request_run: Method,
    pub pending: Method,
    pub unlock: Method,
    pub prune: Method,
    pub migrate: Method,
    pub memory_since: Method,
    pub taken: Method,
    pub heartbeat: Method,
    pub goodbye: Method,
    pub nodes: Method,
    pub actions: Method,
    pub job_write: Method,
    pub managed_jobs: Method,
    pub managed_version: Method,
    pub job_revisions: Method,
}

/// Every method: its name (its handler in `handlers`, and its file), its file, and
/// whether it only reads (flagged `no-writes` in the library, so that it still answers
/// when the server refuses writes, e.g. at `maxmemory`).
const METHODS: [(&str, &str, bool); 29] = [
    ("claim", include_str!("lua/claim.lua"), false),
    ("renew", include_str!("lua/renew.lua"), false),
    ("finish", include_str!("lua/finish.lua"), false),
    ("finish_all", include_str!("lua/finish_all.lua"), false),
    ("finish_retry", include_str!("lua/finish_retry.lua"), false),
    ("expired", include_str!("lua/expired.lua"), true),
    ("recover", include_str!("lua/recover.lua"), false),
    ("history", include_str!("lua/history.lua"), true),
    ("register", include_str!("lua/register.lua"), false),
    ("register_stage", include_str!("lua/register_stage.lua"), false),
    ("registrations", include_str!("lua/registrations.lua"), true),
    ("registrations_page", include_str!("lua/registrations_page.lua"), true),
    ("set_paused", include_str!("lua/set_paused.lua"), false),
    ("controls", include_str!("lua/controls.lua"), true),
    ("request_run", include_str!("lua/request_run.lua"), false),
    ("pending", include_str!("lua/pending.lua"), true),
    ("unlock", include_str!("lua/unlock.lua"), false),
    ("prune", include_str!("lua/prune.lua"), false),
    ("migrate", include_str!("lua/migrate.lua"), false),
    ("memory_since", include_str!("lua/memory_since.lua"), false),
    ("taken", include_str!("lua/taken.lua"), true),
    ("heartbeat", include_str!("lua/heartbeat.lua"), false),
    ("goodbye", include_str!("lua/goodbye.lua"), false),
    ("nodes", include_str!("lua/nodes.lua"), true),
    ("actions", include_str!("lua/actions.lua"), true),
    ("job_write", include_str!("lua/job_write.lua"), false),
    ("managed_jobs", include_str!("lua/managed_jobs.lua"), true),
    ("managed_version", include_str!("lua/managed_version.lua"), true),
    ("job_revisions", include_str!("lua/job_revisions.lua"), true),
];

/// Stands for the library's name until the code is hashed.
const UNNAMED: &str = "solocron_UNNAMED";

/// A method's file in its own block (its helpers' names stay local to it), checked to
/// add the handler its name promises.
fn block(name: &str, body: &str) -> String {
    assert!(body.contains(&format!("\nhandlers.{name} = function(KEYS, ARGV)\n")), "lua/{name}.lua adds no handler");
    format!("do\n{body}end\n")
}

/// The library and the standalone scripts of [`METHODS`].
fn build() -> Code {
    let mut library = format!("{PRELUDE}\n");
    for (name, body, _) in METHODS {
        library.push_str(&block(name, body));
    }
    for (method, _, read_only) in METHODS {
        let flags = if read_only { "{'no-writes'}" } else { "{}" };
        library.push_str(&format!(
            "redis.register_function{{function_name = '{UNNAMED}_{method}', flags = {flags}, \
             callback = function(keys, args) begin(args) return handlers.{method}(keys, args) end}}\n"
        ));
    }
    // The hash of everything but the name names the library; `[a-z0-9_]` only.
    let name = format!("solocron_{}", &Script::new(&library).get_hash()[..16]);
    let library = format!("#!lua name={name}\n{}", library.replace(UNNAMED, &name));
    let method = |method: &str| {
        let (_, body, _) = METHODS.iter().find(|(m, _, _)| *m == method).expect("a listed method");
        Method {
            function: format!("{name}_{method}"),
            script: Script::new(&format!(
                "{PRELUDE}\n{}begin(ARGV)\nreturn handlers.{method}(KEYS, ARGV)\n",
                block(method, body)
            )),
        }
    };
    Code {
        claim: method("claim"),
        renew: method("renew"),
        finish: method("finish"),
        finish_all: method("finish_all"),
        finish_retry: method("finish_retry"),
        expired: method("expired"),
        recover: method("recover"),
        history: method("history"),
        register: method("register"),
        register_stage: method("register_stage"),
        registrations: method("registrations"),
        registrations_page: method("registrations_page"),
        set_paused: method("set_paused"),
        controls: method("controls"),
        request_run: method("request_run"),
        pending: method("pending"),
        unlock: method("unlock"),
        prune: method("prune"),
        migrate: method("migrate"),
        memory_since: method("memory_since"),
        taken: method("taken"),
        heartbeat: method("heartbeat"),
        goodbye: method("goodbye"),
        nodes: method("nodes"),
        actions: method("actions"),
        job_write: method("job_write"),
        managed_jobs: method("managed_jobs"),
        managed_version: method("managed_version"),
        job_revisions: method("job_revisions"),
        library,
    }
}

pub(crate) static CODE: LazyLock<Code> = LazyLock::new(build);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_library_registers_every_method_under_its_hashed_name() {
        let code = &*CODE;
        let first = code.library.lines().next().expect("a first line");
        let name = first.strip_prefix("#!lua name=").expect("a library header");
        assert!(name.len() == "solocron_".len() + 16 && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'));
        for (method, _, _) in METHODS {
            assert!(code.library.contains(&format!("function_name = '{name}_{method}'")), "{method}");
        }
        assert!(!code.library.contains(UNNAMED));
        assert_eq!(code.renew.function, format!("{name}_renew"));
        assert!(code.renew.script.get_hash() != code.finish.script.get_hash());
    }
}
