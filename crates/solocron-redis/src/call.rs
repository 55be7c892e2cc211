//! How a method's code is called: `FCALL` of the library this process loaded, or, where the
//! server refuses to load it, `EVALSHA` of the method's script (see [`crate::scripts`]).
//!
//! The library is loaded by the first call of a process (`FUNCTION LOAD`; a library of the
//! same name, hence the same code, already there is fine) and again whenever the server
//! answers that the function is unknown: it restarted without persistence, failed over to
//! a replica that never had it, or someone ran `FUNCTION FLUSH`. If loading is refused (an
//! ACL without `FUNCTION`, a proxy that does not forward it), or the function is still
//! unknown right after loading it (a proxy that sent the load elsewhere), the process uses
//! the scripts from then on. Both forms run the same code, so they can be mixed freely in
//! one fleet.
//!
//! Also here: how the store sends a call and names its failure ([`RedisStore::run`]), and
//! how arguments are spelled for the scripts ([`millis`], [`optional`]).

use std::fmt;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::aio::ConnectionManager;
use redis::{Arg, Cmd, RedisError, RedisResult, ScriptInvocation, ToRedisArgs, Value};
use solocron_core::{Namespaces, StoreError};

use crate::decode::convert;
use crate::error::{is_transient, redis_error};
use crate::scripts::{Method, CODE};
use crate::RedisStore;

/// Longest duration (lease, start delay, retention) accepted: 100 years. Keeps every
/// instant the scripts compute far below 2^53 ms, where Lua's doubles stop being exact.
const DURATION_MS_MAX: u128 = 100 * 365 * 24 * 3600 * 1000;

/// A call of one method: its code and its arguments after the prefix.
pub(crate) struct Call {
    method: &'static Method,
    /// The call as `FCALL <function> 1 <key> <prefix> <arguments>...`: written once, in
    /// one buffer (an argument apart would be an allocation, and a batch has thousands);
    /// the script form reads the arguments back from it.
    cmd: Cmd,
}

/// The parts of [`Call::cmd`] before the handler's arguments: `FCALL`, the function, the
/// key count and the key.
const FCALL_HEAD: usize = 4;

impl Call {
    /// A call of `method` declaring `key` (see `lua/prelude.lua`), for the keys under
    /// `prefix` (`ARGV[1]` in every handler).
    pub(crate) fn new(method: &'static Method, key: &str, prefix: &str) -> Call {
        let mut cmd = redis::cmd("FCALL");
        cmd.arg(&method.function).arg(1).arg(key).arg(prefix);
        Call { method, cmd }
    }

    /// Adds an argument.
    pub(crate) fn arg<T: ToRedisArgs>(&mut self, value: T) -> &mut Call {
        self.cmd.arg(value);
        self
    }

    /// Adds `namespaces` as the call's last arguments, one name each: none for every
    /// namespace (a list of them is never empty), as `namespaces_from` in
    /// `lua/prelude.lua` reads them.
    pub(crate) fn namespaces(&mut self, namespaces: &Namespaces) -> &mut Call {
        for name in namespaces.names().unwrap_or_default() {
            self.arg(name.as_str());
        }
        self
    }

    /// The call as an `FCALL` of the library's function.
    fn fcall(&self) -> &Cmd {
        &self.cmd
    }

    /// The call as an invocation of the method's script (`EVALSHA`, loading it on `NOSCRIPT`).
    fn script(&self) -> ScriptInvocation<'static> {
        let mut invocation = self.method.script.prepare_invoke();
        for (i, arg) in self.cmd.args_iter().enumerate().skip(FCALL_HEAD - 1) {
            let Arg::Simple(bytes) = arg else { unreachable!("a call has no cursor argument") };
            if i == FCALL_HEAD - 1 {
                invocation.key(bytes);
            } else {
                invocation.arg(bytes);
            }
        }
        invocation
    }
}

/// Most loads of the library for one call.
const LOADS_PER_CALL_MAX: usize = 2;

const UNKNOWN: u8 = 0;
const LIBRARY: u8 = 1;
const SCRIPTS: u8 = 2;

/// Sends calls in the form the server takes. Clones share what they learned.
#[derive(Clone)]
pub(crate) struct Caller {
    /// The key every call declares (see `lua/prelude.lua`).
    key: String,
    /// [`UNKNOWN`] until the first call, then [`LIBRARY`] or [`SCRIPTS`]. Only ever goes
    /// from `LIBRARY` to `SCRIPTS`, never back, for the life of the process.
    form: Arc<AtomicU8>,
}

impl Caller {
    pub(crate) fn new(key: String) -> Caller {
        Caller { key, form: Arc::new(AtomicU8::new(UNKNOWN)) }
    }

    /// The key every call declares.
    pub(crate) fn key(&self) -> &str {
        &self.key
    }

    /// `Some(true)` once calls go to the library, `Some(false)` once they go to scripts,
    /// `None` before the first call.
    pub(crate) fn calls_library(&self) -> Option<bool> {
        match self.form.load(Ordering::Relaxed) {
            LIBRARY => Some(true),
            SCRIPTS => Some(false),
            _ => None,
        }
    }

    /// Whether calls go to the library; loads it on the first call.
    async fn library(&self, conn: &mut ConnectionManager) -> bool {
        match self.form.load(Ordering::Relaxed) {
            LIBRARY => true,
            SCRIPTS => false,
            _ => self.load(conn).await,
        }
    }

    /// Loads the library; false (and the scripts from then on) if the server refuses it. A
    /// transient failure decides nothing: the call goes as a script this time.
    async fn load(&self, conn: &mut ConnectionManager) -> bool {
        let loaded: RedisResult<Value> = redis::cmd("FUNCTION").arg("LOAD").arg(&CODE.library).query_async(conn).await;
        match loaded {
            Ok(_) => {}
            Err(e) if e.detail().is_some_and(|d| d.contains("already exists")) => {}
            Err(e) if is_transient(&e) => return false,
            Err(e) => {
                self.use_scripts(&format!("the server refused to load it: {e}"));
                return false;
            }
        }
        // Never back from SCRIPTS: another task may have given up on the library meanwhile.
        let _ = self.form.compare_exchange(UNKNOWN, LIBRARY, Ordering::Relaxed, Ordering::Relaxed);
        self.form.load(Ordering::Relaxed) == LIBRARY
    }

    fn use_scripts(&self, why: &str) {
        if self.form.swap(SCRIPTS, Ordering::Relaxed) != SCRIPTS {
            tracing::warn!(
                "not using solocron's Redis Functions library ({why}); calling scripts with EVALSHA instead, \
                 which costs the server more per call"
            );
        }
    }

    /// Sends one call and returns its reply (a server error reply as `Err`).
    pub(crate) async fn send(&self, conn: &mut ConnectionManager, call: &Call) -> RedisResult<Value> {
        if self.library(conn).await {
            let mut reply = call.fcall().query_async(conn).await;
            // The server forgot the library: load it again. Twice, so that a failover right
            // after a load (which the new primary may not have had) does not decide.
            let mut loads = 0;
            while matches!(&reply, Err(e) if function_unknown(e)) {
                if loads == LOADS_PER_CALL_MAX {
                    self.use_scripts("the server did not know its functions right after loading them");
                    break;
                }
                loads += 1;
                if !self.load(conn).await {
                    // Refused (the scripts from now on) or a transient failure (this call only).
                    break;
                }
                reply = call.fcall().query_async(conn).await;
            }
            if !matches!(&reply, Err(e) if function_unknown(e)) {
                return reply;
            }
        }
        call.script().invoke_async(conn).await
    }

    /// Sends calls of one method in one pipeline (each still runs atomically by itself, not
    /// all together), and returns one reply per call, in order. `Err` if the pipeline
    /// failed as a whole (the connection, say); a call's own error is its reply.
    pub(crate) async fn send_all(
        &self,
        conn: &mut ConnectionManager,
        calls: &[Call],
    ) -> RedisResult<Vec<RedisResult<Value>>> {
        let Some(first) = calls.first() else { return Ok(Vec::new()) };
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        let library = self.library(conn).await;
        if library {
            for call in calls {
                pipe.add_command(call.fcall().clone());
            }
        } else {
            // A pipeline cannot load a script on `NOSCRIPT` as a lone call does: load it first.
            pipe.load_script(&first.method.script).ignore();
            for call in calls {
                pipe.invoke_script(&call.script());
            }
        }
        let mut replies: Vec<RedisResult<Value>> = pipe.query_async(conn).await?;
        // Calls that found their code gone (rare: a restart, a failover or a flush between
        // the pipeline's calls, or a script load that failed): once more, each on its own,
        // which loads the code again.
        for (reply, call) in replies.iter_mut().zip(calls) {
            if matches!(reply, Err(e) if function_unknown(e) || e.code() == Some("NOSCRIPT")) {
                *reply = self.send(conn, call).await;
            }
        }
        Ok(replies)
    }
}

impl RedisStore {
    /// A call of `method` on this store's keys.
    pub(crate) fn invocation(&self, method: &'static Method) -> Call {
        Call::new(method, self.caller.key(), &self.prefix)
    }

    /// Runs `call`; errors say which operation failed on which store.
    pub(crate) async fn run(&self, call: &Call, operation: &str) -> Result<Value, StoreError> {
        let mut conn = self.conn.clone();
        self.caller
            .send(&mut conn, call)
            .await
            .map_err(|e| redis_error(e, &format!("{operation} on {}", self.description)))
    }

    /// Runs `calls`, each answering 1 or 0, as one pipeline (each call atomic by itself):
    /// one flag per call, in order.
    pub(crate) async fn run_flags(&self, calls: &[Call], operation: &str) -> Result<Vec<bool>, StoreError> {
        if calls.is_empty() {
            return Ok(Vec::new());
        }
        let mut conn = self.conn.clone();
        let context = || format!("{operation} on {}", self.description);
        let replies = self.caller.send_all(&mut conn, calls).await.map_err(|e| redis_error(e, &context()))?;
        if replies.len() != calls.len() {
            return Err(StoreError::Invalid(format!(
                "{operation} answered {} of {} calls",
                replies.len(),
                calls.len()
            )));
        }
        replies
            .into_iter()
            .map(|reply| {
                let done: i64 = convert(reply.map_err(|e| redis_error(e, &context()))?, "reply")?;
                Ok(done == 1)
            })
            .collect()
    }
}

/// Milliseconds of a duration, refusing absurd ones (see [`DURATION_MS_MAX`]).
pub(crate) fn millis(d: Duration) -> Result<i64, StoreError> {
    let ms = d.as_millis();
    if ms > DURATION_MS_MAX {
        return Err(StoreError::Invalid(format!("duration {d:?} is too long")));
    }
    Ok(ms as i64)
}

/// An optional argument as the scripts take it: `''` for none, `'='` + the value.
pub(crate) fn optional(value: Option<impl fmt::Display>) -> String {
    value.map_or_else(String::new, |v| format!("={v}"))
}

/// An optional integer as [`optional`] spells it, written straight into the call: every
/// run's end carries two, and a formatted string each was a tenth of a run's client time.
pub(crate) struct OptionalInt(pub(crate) Option<i64>);

impl ToRedisArgs for OptionalInt {
    fn write_redis_args<W: ?Sized + redis::RedisWrite>(&self, out: &mut W) {
        let Some(value) = self.0 else { return out.write_arg(b"") };
        let mut digits = itoa::Buffer::new();
        let digits = digits.format(value).as_bytes();
        // '=' and at most 20 characters: i64::MIN is "-9223372036854775808".
        let mut arg = [b'='; 21];
        arg[1..=digits.len()].copy_from_slice(digits);
        out.write_arg(&arg[..=digits.len()]);
    }
}

/// True if the server did not know the called function, or `FCALL` itself (a server
/// replaced by one older than 7.0: the load then fails, and the scripts take over).
fn function_unknown(e: &RedisError) -> bool {
    e.detail()
        .is_some_and(|d| d.starts_with("Function not found") || d.starts_with("unknown command") && d.contains("FCALL"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absurd_durations_are_refused() {
        assert_eq!(millis(Duration::from_millis(1500)).unwrap(), 1500);
        assert!(millis(Duration::from_secs(u64::MAX)).is_err());
    }

    #[test]
    fn optional_arguments_tell_none_from_empty() {
        assert_eq!(optional(None::<&str>), "");
        assert_eq!(optional(Some("")), "=");
        assert_eq!(optional(Some(3)), "=3");
    }

    #[test]
    fn optional_integers_are_spelled_as_optional_spells_them() {
        let spelled = |value: Option<i64>| {
            let mut cmd = redis::cmd("X");
            cmd.arg(OptionalInt(value));
            let args: Vec<Vec<u8>> = cmd
                .args_iter()
                .skip(1)
                .map(|a| match a {
                    Arg::Simple(bytes) => bytes.to_vec(),
                    _ => panic!("not a plain argument"),
                })
                .collect();
            assert_eq!(args.len(), 1, "one argument");
            String::from_utf8(args.concat()).unwrap()
        };
        for value in [None, Some(0), Some(7), Some(-12), Some(i64::MAX), Some(i64::MIN)] {
            assert_eq!(spelled(value), optional(value), "{value:?}");
        }
    }
}
