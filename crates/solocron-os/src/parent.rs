//! A death signal for processes started with [`std::process::Command`]: test harnesses
//! start servers (etcd members) that must not outlive a test binary killed mid-run.

use std::io;
use std::os::unix::process::CommandExt as _;

use nix::sys::prctl::set_pdeathsig;
use nix::sys::signal::Signal;
use nix::unistd::{getppid, Pid};

/// Makes the process that `cmd` starts get SIGKILL when its parent dies (Linux's
/// `PR_SET_PDEATHSIG`, set between `fork` and `exec`). If the parent is already gone by
/// then, starting it fails with `ESRCH` instead.
///
/// The signal comes when the *thread* that started the process exits, not only the whole
/// process: start long-lived children from a thread that lives as long as the program.
///
/// This hook makes std start the process with `fork` rather than `posix_spawn`; fine for a
/// test harness, but [`crate::spawn::spawn`] is the way to start jobs.
///
/// ```no_run
/// let mut cmd = std::process::Command::new("sleep");
/// cmd.arg("30");
/// solocron_os::die_with_parent(&mut cmd);
/// let child = cmd.spawn()?;
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn die_with_parent(cmd: &mut std::process::Command) {
    // The pid of this process, which the child's parent is until this process dies.
    let parent = Pid::from_raw(i32::try_from(std::process::id()).expect("a pid fits a pid_t"));
    // SAFETY: the hook runs in the child between fork and exec, where only async-signal-safe
    // calls are allowed: prctl(2) and getppid(2) are, and it allocates nothing
    // (`io::Error::from_raw_os_error` holds the code inline).
    unsafe {
        cmd.pre_exec(move || {
            set_pdeathsig(Signal::SIGKILL).map_err(io::Error::from)?;
            if getppid() != parent {
                // The parent died between the fork and the prctl: no signal will come.
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        })
    };
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    /// A child started from a thread dies with that thread (as it would with its process).
    #[test]
    fn a_process_tied_to_its_parent_dies_with_the_thread_that_started_it() {
        let pid = std::thread::spawn(|| {
            let mut cmd = std::process::Command::new("sleep");
            cmd.arg("30");
            super::die_with_parent(&mut cmd);
            // Not waited for here: the test reaps it below, after the thread is gone.
            cmd.spawn().expect("spawn sleep").id()
        })
        .join()
        .expect("spawning thread");
        let pid = nix::unistd::Pid::from_raw(pid as i32);
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match nix::sys::wait::waitpid(pid, Some(nix::sys::wait::WaitPidFlag::WNOHANG)).expect("waitpid") {
                nix::sys::wait::WaitStatus::Signaled(_, signal, _) => {
                    assert_eq!(signal, nix::sys::signal::Signal::SIGKILL, "killed by its death signal");
                    return;
                }
                nix::sys::wait::WaitStatus::StillAlive => {
                    assert!(Instant::now() < deadline, "the child outlived the thread that started it");
                    std::thread::sleep(Duration::from_millis(10));
                }
                other => panic!("unexpected status {other:?}"),
            }
        }
    }
}
