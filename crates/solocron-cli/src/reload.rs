//! `solocron reload`: checks a configuration file, then asks the running daemon to re-read
//! it (SIGHUP to the pid its pid file holds); and the pid file `solocron run` keeps
//! (`--pid-file`, or `[node] pid_file`). Under systemd, `systemctl reload` sends the same
//! signal (the unit's `ExecReload`).

use std::path::{Path, PathBuf};

use clap::Args;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::wiring::load;
use crate::{bad_input, Failure};

/// `solocron reload`.
#[derive(Args)]
pub struct ReloadArgs {
    /// The configuration file the daemon runs with: checked first, never sent if it has an
    /// error (the daemon would refuse it whole anyway).
    #[arg(long, short, default_value = "solocron.toml")]
    config: PathBuf,
    /// The daemon's pid file (default: [node] pid_file).
    #[arg(long, value_name = "PATH")]
    pid_file: Option<PathBuf>,
}

/// Checks the configuration, then sends SIGHUP to the daemon of the pid file.
pub fn reload(a: ReloadArgs) -> Result<(), Failure> {
    let cfg = load(&a.config).map_err(|Failure(code, msg)| Failure(code, format!("not reloaded: {msg}")))?;
    let Some(path) = a.pid_file.or(cfg.pid_file) else {
        return Err(bad_input(format!(
            "not reloaded: which daemon? give --pid-file PATH, or set [node] pid_file in {} (under systemd: systemctl reload)",
            a.config.display()
        )));
    };
    let pid = daemon_pid(&path)?;
    kill(Pid::from_raw(pid), Signal::SIGHUP).map_err(|e| Failure(1, format!("cannot signal pid {pid}: {e}")))?;
    println!("asked the daemon (pid {pid}) to reload {}; its log says what changed", a.config.display());
    Ok(())
}

/// The pid in `path`, if it names a live `solocron run` process.
fn daemon_pid(path: &Path) -> Result<i32, Failure> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        bad_input(format!("{}: cannot read the pid file: {e} (is the daemon running?)", path.display()))
    })?;
    let pid: i32 = text
        .trim()
        .parse()
        .ok()
        .filter(|p| *p > 1)
        .ok_or_else(|| bad_input(format!("{}: not a pid: {:?}", path.display(), text.trim())))?;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
    let is_daemon = args.first().is_some_and(|a| a.ends_with(b"solocron")) && args.iter().any(|a| *a == b"run");
    if !is_daemon {
        return Err(bad_input(format!(
            "{}: pid {pid} is not a running `solocron run` (a stale pid file?)",
            path.display()
        )));
    }
    Ok(pid)
}

/// The daemon's pid file: written at start, removed at exit (if it still holds this pid).
pub struct PidFile(PathBuf);

impl PidFile {
    /// Writes this process's pid to `path` (replacing what is there).
    pub fn write(path: &Path) -> Result<PidFile, Failure> {
        std::fs::write(path, format!("{}\n", std::process::id()))
            .map_err(|e| bad_input(format!("{}: cannot write the pid file: {e}", path.display())))?;
        Ok(PidFile(path.to_owned()))
    }
}

impl Drop for PidFile {
    fn drop(&mut self) {
        let ours = std::fs::read_to_string(&self.0).is_ok_and(|t| t.trim() == std::process::id().to_string());
        if ours {
            let _ = std::fs::remove_file(&self.0);
        }
    }
}
