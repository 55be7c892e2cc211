//! Programs forked ahead of an instant and released together: what is left when every
//! `fork` is done beforehand is the cost of the `execve`s (and the programs' own start) at
//! one instant. The benchmark shows command jobs' start lateness beside this floor, which
//! no way of spawning can go below on the machine.
//!
//! ```no_run
//! use solocron_os::preforked::Gate;
//!
//! let gate = Gate::new()?;
//! let held = (0..100).map(|_| gate.hold("/bin/date", &["date", "+%s%N"])).collect::<Result<Vec<_>, _>>()?;
//! gate.open(); // every held child execs now
//! for child in held {
//!     let (_status, stdout) = child.wait_with_output()?;
//! #   let _ = stdout;
//! }
//! # Ok::<(), std::io::Error>(())
//! ```

use std::ffi::CString;
use std::fs::File;
use std::io::{self, Read as _};
use std::os::fd::{AsRawFd as _, OwnedFd, RawFd};
use std::os::unix::process::ExitStatusExt as _;
use std::process::ExitStatus;

use nix::sys::signal::{kill, Signal};
use nix::sys::wait::waitpid;
use nix::unistd::{fork, ForkResult, Pid};

/// A gate that held children wait at: a pipe whose write end only the parent keeps open.
/// [`Gate::open`] closes it, so every child reads end-of-file at once and execs.
///
/// A child forked meanwhile by another thread (another gate's, or any `fork` that has not
/// exec'd yet) holds a copy of the write end too, and the gate opens only once that child
/// has exec'd or exited: hold and open from one thread, with nothing else forking.
#[derive(Debug)]
pub struct Gate {
    read: OwnedFd,
    write: OwnedFd,
}

/// A child forked ahead, waiting at its [`Gate`] to exec its program, its stdout to a pipe.
/// Dropped before [`Preforked::wait_with_output`], it is killed and reaped.
#[derive(Debug)]
pub struct Preforked {
    pid: Pid,
    stdout: Option<File>,
    reaped: bool,
}

impl Gate {
    /// A closed gate.
    ///
    /// # Errors
    /// The `pipe2` error (out of descriptors).
    pub fn new() -> io::Result<Gate> {
        let (read, write) = crate::spawn::pipe()?;
        Ok(Gate { read, write })
    }

    /// Forks a child that waits at this gate, then execs `path` with `argv` (`argv[0]`
    /// included), its stdout to a pipe; stdin, stderr and the environment are this
    /// process's. The child is a plain `fork` (page tables copied now, not at the
    /// instant), its program unchecked until it execs: one that cannot start exits with
    /// 127.
    ///
    /// # Errors
    /// A NUL byte in `path` or `argv`, or the `pipe2`/`fork` error.
    pub fn hold(&self, path: &str, argv: &[&str]) -> io::Result<Preforked> {
        let nul = |_| io::Error::new(io::ErrorKind::InvalidInput, "a program or argument contains a NUL byte");
        let path = CString::new(path).map_err(nul)?;
        let args: Vec<CString> = argv.iter().map(|a| CString::new(*a).map_err(nul)).collect::<io::Result<_>>()?;
        let argv: Vec<*const libc::c_char> = args.iter().map(|a| a.as_ptr()).chain([std::ptr::null()]).collect();
        let (out_read, out_write) = crate::spawn::pipe()?;
        let (gate_read, gate_write) = (self.read.as_raw_fd(), self.write.as_raw_fd());
        // SAFETY: this process may have other threads: the child makes only
        // async-signal-safe calls (see `held_child`) on values prepared before the fork, so
        // the locks it inherited from other threads never matter.
        match unsafe { fork() }? {
            ForkResult::Child => held_child(gate_read, gate_write, out_write.as_raw_fd(), &path, &argv),
            ForkResult::Parent { child } => {
                Ok(Preforked { pid: child, stdout: Some(File::from(out_read)), reaped: false })
            }
        }
    }

    /// Opens the gate: every child held at it execs now.
    pub fn open(self) {
        drop(self);
    }
}

/// The forked child: waits for the gate's end-of-file, then execs. Never returns.
fn held_child(gate_read: RawFd, gate_write: RawFd, stdout: RawFd, path: &CString, argv: &[*const libc::c_char]) -> ! {
    // SAFETY: close, read, dup2, execv and _exit are async-signal-safe; the descriptors
    // are this child's copies and the pointers point into the parent's prepared strings,
    // copied with the address space.
    unsafe {
        // Its copy of the write end would keep the gate from ever opening.
        libc::close(gate_write);
        let mut byte = 0u8;
        while libc::read(gate_read, (&raw mut byte).cast(), 1) < 0 && *libc::__errno_location() == libc::EINTR {}
        libc::dup2(stdout, 1);
        libc::execv(path.as_ptr(), argv.as_ptr());
        libc::_exit(127)
    }
}

impl Preforked {
    /// Reads the child's stdout to its end, waits for the child to exit, and returns how it
    /// ended and what it wrote. Blocks: the child must have been let through its gate.
    ///
    /// # Errors
    /// The read's or `waitpid`'s error.
    pub fn wait_with_output(mut self) -> io::Result<(ExitStatus, Vec<u8>)> {
        let mut output = Vec::new();
        if let Some(mut stdout) = self.stdout.take() {
            stdout.read_to_end(&mut output)?;
        }
        let status = self.reap()?;
        Ok((status, output))
    }

    fn reap(&mut self) -> io::Result<ExitStatus> {
        let mut status = 0;
        loop {
            // SAFETY: waitpid on our own unreaped child, with a valid status pointer.
            if unsafe { libc::waitpid(self.pid.as_raw(), &mut status, 0) } >= 0 {
                self.reaped = true;
                return Ok(ExitStatus::from_raw(status));
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                self.reaped = e.raw_os_error() == Some(libc::ECHILD);
                return Err(e);
            }
        }
    }
}

impl Drop for Preforked {
    fn drop(&mut self) {
        if !self.reaped {
            // Unreaped, so the pid is still our child's.
            let _ = kill(self.pid, Signal::SIGKILL);
            let _ = waitpid(self.pid, None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    /// Nothing runs before the gate opens; once it does, every held child runs its program.
    #[test]
    fn held_children_exec_only_once_the_gate_opens() {
        let _serial = crate::guardian::TEST_SERIAL.blocking_lock();
        let dir = tempfile::tempdir().expect("dir");
        let marker = dir.path().join("ran");
        let script = format!("touch {}; echo $0", marker.display());
        let gate = Gate::new().expect("gate");
        let held: Vec<Preforked> =
            (0..5).map(|i| gate.hold("/bin/sh", &["sh", "-c", &script, &i.to_string()]).expect("hold")).collect();
        std::thread::sleep(Duration::from_millis(200));
        assert!(!marker.exists(), "a held child ran its program before the gate opened");
        let opened = Instant::now();
        gate.open();
        for (i, child) in held.into_iter().enumerate() {
            let (status, stdout) = child.wait_with_output().expect("wait");
            assert!(status.success());
            assert_eq!(String::from_utf8_lossy(&stdout), format!("{i}\n"));
        }
        assert!(marker.exists());
        assert!(opened.elapsed() < Duration::from_secs(5));
    }

    /// A program that cannot start exits with 127; a held child dropped unopened is killed
    /// and reaped.
    #[test]
    fn a_missing_program_exits_127_and_a_dropped_child_is_reaped() {
        let _serial = crate::guardian::TEST_SERIAL.blocking_lock();
        let gate = Gate::new().expect("gate");
        let missing = gate.hold("/no/such/program", &["x"]).expect("hold");
        let dropped = gate.hold("/bin/true", &["true"]).expect("hold");
        let pid = dropped.pid;
        drop(dropped);
        assert_eq!(waitpid(pid, None).map(|_| ()), Err(nix::errno::Errno::ECHILD), "reaped on drop");
        gate.open();
        let (status, _) = missing.wait_with_output().expect("wait");
        assert_eq!(status.code(), Some(127));
    }
}
