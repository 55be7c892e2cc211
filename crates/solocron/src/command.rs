//! Command jobs: a process started directly (no shell unless the argv names one), in its
//! own process group so that stopping it stops its children too.

use std::process::ExitStatus;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use chrono::SecondsFormat;
use solocron_core::{output_tail, OUTPUT_TAIL_BYTES_MAX};
use solocron_os::spawn::Spawned;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::time::timeout;

use crate::job::{Handler, Outcome, RunContext};

/// Longest output line forwarded to the log; the record keeps the tail regardless.
const LOG_LINE_BYTES_MAX: usize = 1024;
/// How long to wait for the output pipes to close after the process exited (a grandchild
/// may hold them open).
const PIPE_DRAIN_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// A [`Handler`] that runs a process.
///
/// The process gets `SOLOCRON_JOB`, `SOLOCRON_SCHEDULED_AT`, `SOLOCRON_FENCING_TOKEN`,
/// `SOLOCRON_NODE_ID`, `SOLOCRON_RUN_ID`, `SOLOCRON_ATTEMPT`. Its stdout and stderr are
/// logged line by line and their last 4 KiB kept. To stop it, its process group gets
/// SIGTERM, then SIGKILL after `kill_grace`; when it exits, what is left of its group is
/// killed. If the node dies, the process gets SIGKILL from the kernel and the rest of its
/// group from the node's guardian process. The program is looked up in `PATH` unless it
/// contains a `/`; like `posix_spawn`, a script needs its `#!` line (there is no fallback
/// to `/bin/sh`).
///
/// ```
/// let cmd = solocron::Command::new(["/bin/echo", "hello"]).unwrap();
/// # let _ = cmd;
/// ```
#[derive(Clone)]
pub struct Command {
    argv: Vec<String>,
    /// Variables set beside the run's own ([`Command::env`]).
    env: Vec<(String, String)>,
}

impl Command {
    /// A command from its argv; `None` if argv is empty.
    pub fn new<I, S>(argv: I) -> Option<Command>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let argv: Vec<String> = argv.into_iter().map(Into::into).collect();
        (!argv.is_empty()).then_some(Command { argv, env: Vec::new() })
    }

    /// Sets an environment variable of the process, beside the run's own `SOLOCRON_*`
    /// (which it cannot replace).
    ///
    /// ```
    /// let cmd = solocron::Command::new(["/usr/bin/env"]).unwrap().env("REPORT_FORMAT", "csv");
    /// # let _ = cmd;
    /// ```
    pub fn env(mut self, name: impl Into<String>, value: impl Into<String>) -> Command {
        let name = name.into();
        // The last value set wins (a process would see the first of two).
        self.env.retain(|(n, _)| *n != name);
        self.env.push((name, value.into()));
        self
    }

    fn spawn(&self, ctx: &RunContext) -> std::io::Result<Spawned> {
        let run = [
            ("SOLOCRON_JOB", ctx.job.clone()),
            ("SOLOCRON_SCHEDULED_AT", ctx.scheduled_at.to_rfc3339_opts(SecondsFormat::Millis, true)),
            ("SOLOCRON_FENCING_TOKEN", ctx.fencing_token.to_string()),
            ("SOLOCRON_NODE_ID", ctx.node_id.clone()),
            ("SOLOCRON_RUN_ID", ctx.run_id.clone()),
            ("SOLOCRON_ATTEMPT", ctx.attempt.to_string()),
        ];
        let mut env: Vec<(&str, String)> = self
            .env
            .iter()
            .filter(|(name, _)| run.iter().all(|(r, _)| r != name))
            .map(|(n, v)| (n.as_str(), v.clone()))
            .collect();
        env.extend(run);
        // Its own process group, SIGKILL if the node dies, and the group killed by the
        // guardian then: a job must not outlive a node that was SIGKILLed, since its lease
        // will lapse and another node may re-run the tick.
        solocron_os::spawn::spawn(&self.argv, &env)
    }
}

impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Variable names only: a value may be a secret.
        let names: Vec<&str> = self.env.iter().map(|(n, _)| n.as_str()).collect();
        f.debug_struct("Command").field("argv", &self.argv).field("env", &names).finish()
    }
}

#[async_trait]
impl Handler for Command {
    async fn run(&self, ctx: RunContext) -> Outcome {
        let mut child = match self.spawn(&ctx) {
            Ok(c) => c,
            Err(e) => {
                return Outcome {
                    success: false,
                    exit_code: None,
                    output: format!("cannot start {:?}: {e}", self.argv[0]),
                    reason: None,
                }
            }
        };
        // If this future is dropped (the engine gave up on it), `child` kills the group.
        let tail = Arc::new(Mutex::new(Vec::with_capacity(OUTPUT_TAIL_BYTES_MAX)));
        let readers = [
            child.stdout.take().map(|s| tokio::spawn(pump(s, tail.clone(), ctx.run_id.clone()))),
            child.stderr.take().map(|s| tokio::spawn(pump(s, tail.clone(), ctx.run_id.clone()))),
        ];
        let status = tokio::select! {
            status = child.wait() => status,
            _ = ctx.cancel.cancelled() => stop(&mut child, ctx.kill_grace).await,
        };
        // Leftovers of the group (a backgrounded grandchild) went with the job, in `wait`.
        // Both pipes drain at once, within one PIPE_DRAIN_WAIT.
        let drain_until = tokio::time::Instant::now() + PIPE_DRAIN_WAIT;
        for r in readers.into_iter().flatten() {
            if tokio::time::timeout_at(drain_until, r).await.is_err() {
                tracing::debug!(run = %ctx.run_id, "output pipe still open after exit; tail may be short");
            }
        }
        let output = output_tail(&String::from_utf8_lossy(&tail.lock().expect("not poisoned"))).to_owned();
        match status {
            Ok(st) => Outcome { success: st.success(), exit_code: exit_code(st), output, reason: None },
            Err(e) => {
                Outcome { success: false, exit_code: None, output: format!("{output}\nwait failed: {e}"), reason: None }
            }
        }
    }
}

/// SIGTERM to the group, then SIGKILL after the grace.
async fn stop(child: &mut Spawned, grace: std::time::Duration) -> std::io::Result<ExitStatus> {
    child.terminate_group();
    match timeout(grace, child.wait()).await {
        Ok(status) => status,
        Err(_) => {
            child.kill_group();
            child.wait().await
        }
    }
}

fn exit_code(st: ExitStatus) -> Option<i32> {
    use std::os::unix::process::ExitStatusExt as _;
    st.code().or_else(|| st.signal().map(|s| 128 + s))
}

/// Copies a pipe into the shared tail (bounded) and logs it line by line.
async fn pump(mut pipe: impl AsyncRead + Unpin, tail: Arc<Mutex<Vec<u8>>>, run_id: String) {
    let mut buf = [0u8; 4096];
    let mut line = Vec::new();
    loop {
        let n = match pipe.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        {
            let mut t = tail.lock().expect("not poisoned");
            t.extend_from_slice(&buf[..n]);
            if t.len() > 2 * OUTPUT_TAIL_BYTES_MAX {
                let cut = t.len() - OUTPUT_TAIL_BYTES_MAX;
                t.drain(..cut);
            }
        }
        for &b in &buf[..n] {
            if b == b'\n' {
                log_line(&run_id, &line);
                line.clear();
            } else if line.len() < LOG_LINE_BYTES_MAX {
                line.push(b);
            }
        }
    }
    if !line.is_empty() {
        log_line(&run_id, &line);
    }
}

fn log_line(run_id: &str, line: &[u8]) {
    tracing::info!(target: "solocron::output", run = %run_id, "{}", String::from_utf8_lossy(line));
}
