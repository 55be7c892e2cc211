//! Starting a job's process the way `posix_spawn` does (a `clone` sharing the node's memory
//! until the child calls `execve`), plus the one thing `posix_spawn` cannot do: the death
//! signal (`PR_SET_PDEATHSIG`), so that a job never outlives a node that was SIGKILLed.
//!
//! Why by hand: with a `pre_exec` hook (the only way to set the death signal through std
//! or tokio), std falls back from `posix_spawn` to `fork`, which copies the node's page
//! tables and makes every thread of the node fault on copy-on-write until the child execs.
//! Measured with 100 `/bin/date` started at one instant over 3 nodes (Redis, same run):
//! fork p50 64 / p99 149 ms, posix_spawn-like p50 39 / p99 88 ms against the machine's floor
//! of p99 81–85 ms. No maintained crate spawns with `CLONE_VM | CLONE_VFORK` and a death
//! signal. The child follows glibc's `spawni.c`: its own stack, every signal blocked from
//! before the `clone` until just before `execve`, handlers reset to the default in the
//! child, and only async-signal-safe calls on data prepared by the parent.

use std::ffi::{CString, OsStr, OsString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::io::unix::AsyncFd;
use tokio::net::unix::pipe;

/// The child's stack. It runs a handful of system calls; glibc gives its spawn child 32 KiB
/// plus the argv size (for a shell-script fallback we do not have).
const CHILD_STACK_BYTES: usize = 64 * 1024;

/// What the child needs, prepared by the parent: nothing in the child allocates.
struct ChildPlan {
    path: CString,
    /// NUL-terminated arrays of pointers into `_argv` and `_envp`.
    argv: Vec<*const libc::c_char>,
    envp: Vec<*const libc::c_char>,
    /// Owners of the strings `argv` and `envp` point into.
    _argv: Vec<CString>,
    _envp: Vec<CString>,
    stdin: RawFd,
    stdout: RawFd,
    stderr: RawFd,
    /// Whether the child gets SIGKILL when the node dies.
    death_signal: bool,
    parent: libc::pid_t,
    /// The spawning thread's signal mask, restored in the parent after the `clone`.
    mask: libc::sigset_t,
    /// `errno` of the step that failed in the child; 0 while none did.
    error: AtomicI32,
    /// The guardian's socket, on which the child announces its group before `execve`
    /// (-1: none).
    guardian: RawFd,
    /// How many bytes of its announcement the child wrote.
    announced: AtomicUsize,
}

/// The standard streams of a process to start.
pub(crate) struct ChildIo {
    pub(crate) stdin: OwnedFd,
    pub(crate) stdout: OwnedFd,
    pub(crate) stderr: OwnedFd,
}

/// What a started process is to the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A job: SIGKILL when the node dies (`PR_SET_PDEATHSIG`), and its group listed with
    /// the guardian from before its program starts.
    Job,
    /// The guardian itself: lives on, since it must act once the node is gone.
    Guardian,
}

/// A started job: its own process group (its pid), a pidfd to wait on, its output. The
/// node's guardian knows its group from the start until its leader is reaped.
///
/// Dropped before [`Spawned::wait`] returned, it kills the job's group and reaps the job
/// on a thread of its own: a job never outlives the value that stands for it.
#[derive(Debug)]
pub struct Spawned {
    pid: libc::pid_t,
    pidfd: AsyncFd<OwnedFd>,
    /// Read end of its stdout (taken by whoever reads it).
    pub stdout: Option<pipe::Receiver>,
    /// Read end of its stderr (taken by whoever reads it).
    pub stderr: Option<pipe::Receiver>,
    reaped: bool,
}

/// Starts a job: `argv[0]` (looked up in `PATH` unless it has a `/`) with `argv`, the
/// node's environment plus `env`, stdin from `/dev/null`, stdout and stderr to pipes, in
/// a new process group, with SIGKILL as its death signal, and its group known to the
/// node's guardian (a process that kills the group if the node dies) from before its
/// program starts. Needs a tokio runtime (the pidfd and the pipes join its reactor).
///
/// # Errors
/// `NotFound` if the program is not found, the `execve` error (`EACCES`, ...) if it
/// cannot start, `Unsupported` on a kernel without pidfds (before Linux 5.2).
///
/// # Panics
/// If `argv` is empty.
pub fn spawn(argv: &[String], env: &[(&str, String)]) -> io::Result<Spawned> {
    let (out_read, out_write) = pipe()?;
    let (err_read, err_write) = pipe()?;
    let stdin = OwnedFd::from(std::fs::File::open("/dev/null")?);
    let io = ChildIo { stdin, stdout: out_write, stderr: err_write };
    let (pid, pidfd) = start(argv, env, io, Kind::Job)?;
    let watched = (|| {
        // SAFETY: the Spawned owns the pidfd until it is dropped, and never swaps it.
        let pidfd = unsafe { AsyncFd::register_with_interest(pidfd, tokio::io::Interest::READABLE) }?;
        Ok::<_, io::Error>((pidfd, pipe::Receiver::from_owned_fd(out_read)?, pipe::Receiver::from_owned_fd(err_read)?))
    })();
    match watched {
        Ok((pidfd, stdout, stderr)) => {
            Ok(Spawned { pid, pidfd, stdout: Some(stdout), stderr: Some(stderr), reaped: false })
        }
        Err(e) => {
            // SAFETY: signalling the group of our own unreaped child.
            unsafe { libc::kill(-pid, libc::SIGKILL) };
            crate::guardian::forget(pid);
            reap_blocking(pid);
            Err(e)
        }
    }
}

/// Starts `argv` as [`spawn`] describes, with `io` as its standard streams (closed here
/// once the child has them): its pid, which is also its process group's id, and a pidfd.
/// A [`Kind::Job`]'s child announces its group on the guardian's socket before `execve`,
/// with the guardian locked from just before the `clone` until the group is recorded as
/// listed (or delisted again, if `execve` failed).
pub(crate) fn start(
    argv: &[String],
    env: &[(&str, String)],
    io: ChildIo,
    kind: Kind,
) -> io::Result<(libc::pid_t, OwnedFd)> {
    let (path, args, envs) = exec_strings(argv, env)?;
    let pointers = |v: &[CString]| v.iter().map(|s| s.as_ptr()).chain([std::ptr::null()]).collect::<Vec<_>>();
    let mut plan = ChildPlan {
        path,
        argv: pointers(&args),
        envp: pointers(&envs),
        _argv: args,
        _envp: envs,
        stdin: io.stdin.as_raw_fd(),
        stdout: io.stdout.as_raw_fd(),
        stderr: io.stderr.as_raw_fd(),
        death_signal: kind == Kind::Job,
        // SAFETY: getpid cannot fail.
        parent: unsafe { libc::getpid() },
        // SAFETY: an all-zero sigset_t is a valid (empty) set; it is overwritten below.
        mask: unsafe { std::mem::zeroed() },
        error: AtomicI32::new(0),
        guardian: -1,
        announced: AtomicUsize::new(0),
    };
    let mut stack = vec![0u8; CHILD_STACK_BYTES];
    let mut pidfd: libc::c_int = -1;
    let mut listing = (kind == Kind::Job).then(crate::guardian::Listing::lock);
    plan.guardian = listing.as_ref().and_then(|l| l.socket()).unwrap_or(-1);
    // SAFETY: see `clone_child`. The stack and the plan outlive the child's use of them:
    // with CLONE_VFORK this thread resumes only once the child called execve or exited.
    let pid = unsafe {
        // Every signal, glibc's internal ones included (sigfillset and the libc wrapper
        // leave those out), so that no handler runs in the child on shared memory.
        let mut all: libc::sigset_t = std::mem::zeroed();
        std::ptr::write_bytes(std::ptr::from_mut(&mut all).cast::<u8>(), 0xff, KERNEL_SIGSET_BYTES);
        block_signals(&all, &mut plan.mask);
        let top = stack.as_mut_ptr().add(CHILD_STACK_BYTES);
        let top = top.sub(top as usize % 16);
        let pid = libc::clone(
            child,
            top.cast(),
            libc::CLONE_VM | libc::CLONE_VFORK | libc::CLONE_PIDFD | libc::SIGCHLD,
            std::ptr::from_mut(&mut plan).cast(),
            std::ptr::from_mut(&mut pidfd),
        );
        let clone_error = io::Error::last_os_error();
        let mut ignored: libc::sigset_t = std::mem::zeroed();
        block_signals(&plan.mask, &mut ignored);
        if pid < 0 {
            return Err(clone_error);
        }
        pid
    };
    drop(stack);
    let error = plan.error.load(Ordering::SeqCst);
    if let Some(listing) = listing.take() {
        settle_listing(listing, pid, (error == 0, pidfd >= 0), plan.announced.load(Ordering::SeqCst));
    }
    if pidfd < 0 {
        // A kernel before 5.2 ignores CLONE_PIDFD.
        // SAFETY: signalling our own unreaped child and its group.
        unsafe {
            libc::kill(-pid, libc::SIGKILL);
            libc::kill(pid, libc::SIGKILL);
        }
        reap_blocking(pid);
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "this kernel has no pidfds (Linux 5.2 or later needed)",
        ));
    }
    // SAFETY: the kernel gave us this descriptor with CLONE_PIDFD; nothing else owns it.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    drop(io);
    if error != 0 {
        // The child exited without exec: reap it, report why.
        reap_blocking(pid);
        return Err(io::Error::from_raw_os_error(error));
    }
    Ok((pid, pidfd))
}

/// The program's path, its arguments and its environment (ours, less the names in `env`,
/// plus `env`) as the C strings `execve` takes.
fn exec_strings(argv: &[String], env: &[(&str, String)]) -> io::Result<(CString, Vec<CString>, Vec<CString>)> {
    assert!(!argv.is_empty(), "a command has a program");
    let path = resolve(OsStr::new(&argv[0]))?;
    let args: Vec<CString> = argv.iter().map(|a| cstring(a.as_bytes())).collect::<io::Result<_>>()?;
    let mut vars: Vec<(OsString, OsString)> =
        std::env::vars_os().filter(|(k, _)| !env.iter().any(|(name, _)| OsStr::new(name) == k)).collect();
    vars.extend(env.iter().map(|(k, v)| (OsString::from(k), OsString::from(v))));
    let envs: Vec<CString> = vars
        .into_iter()
        .map(|(k, v)| {
            let mut kv = k.into_vec();
            kv.push(b'=');
            kv.extend(v.into_vec());
            cstring(&kv)
        })
        .collect::<io::Result<_>>()?;
    Ok((cstring(path.as_os_str().as_bytes())?, args, envs))
}

/// Records a job's group with the guardian once its `clone` returned: listed if the child
/// exec'd or announced itself, then delisted again if it did not exec or we have no pidfd
/// to wait on it (it is killed then). The child is unreaped, so its pid, and the group id
/// the guardian may have heard, are ours.
fn settle_listing(listing: crate::guardian::Listing, pid: libc::pid_t, (execd, pidfd): (bool, bool), announced: usize) {
    let listed = (execd || announced > 0) && listing.record(pid, announced);
    drop(listing);
    if listed {
        crate::guardian::complete(pid, announced);
    }
    if !execd || !pidfd {
        crate::guardian::forget(pid);
    }
}

impl Spawned {
    /// The process id, which is also its process group id.
    pub fn pid(&self) -> libc::pid_t {
        self.pid
    }

    /// Sends SIGTERM to the job's process group (a polite stop; [`Spawned::wait`] then
    /// tells when it is over). Nothing once the job was reaped: its group's id may name a
    /// stranger's group by then.
    pub fn terminate_group(&self) {
        self.signal_group(Signal::SIGTERM);
    }

    /// Sends SIGKILL to the job's process group. Nothing once the job was reaped.
    pub fn kill_group(&self) {
        self.signal_group(Signal::SIGKILL);
    }

    fn signal_group(&self, signal: Signal) {
        if self.reaped {
            return;
        }
        // The group may be empty (all exited, leader a zombie): ESRCH is no error here.
        let _ = killpg(Pid::from_raw(self.pid), signal);
    }

    /// Waits for the process to exit, kills what is left of its process group (a
    /// backgrounded grandchild), tells the guardian, and reaps it. The group is killed
    /// before the reap: until then the leader's pid, and so the group's id, cannot be
    /// reused by a stranger. Cancel-safe: dropped before it returns, nothing is lost.
    ///
    /// # Errors
    /// The `waitid`/`waitpid` error; `ECHILD` if the embedding program reaped the job
    /// itself (a `waitpid(-1)`, or SIGCHLD ignored), whose status is then gone.
    pub async fn wait(&mut self) -> io::Result<ExitStatus> {
        loop {
            let mut ready = self.pidfd.readable().await?;
            // SAFETY: an all-zero siginfo_t is valid; waitid fills it.
            let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
            let flags = libc::WEXITED | libc::WNOHANG | libc::WNOWAIT;
            // SAFETY: waitid on our own child, with a valid siginfo pointer.
            if unsafe { libc::waitid(libc::P_PID, self.pid as libc::id_t, &mut info, flags) } != 0 {
                let e = io::Error::last_os_error();
                if e.raw_os_error() == Some(libc::ECHILD) {
                    // Reaped by someone else (SIGCHLD ignored, or a waitpid(-1) of the
                    // embedding program): the status is gone, the pid no longer ours.
                    self.reaped = true;
                    crate::guardian::forget(self.pid);
                }
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            // SAFETY: filled by waitid for an exited child; 0 if none has exited.
            if unsafe { info.si_pid() } == 0 {
                ready.clear_ready();
                continue;
            }
            self.end_group();
            let mut status: libc::c_int = 0;
            // SAFETY: waitpid on our own child, which has exited: it returns at once.
            while unsafe { libc::waitpid(self.pid, &mut status, 0) } < 0 {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    self.reaped = e.raw_os_error() == Some(libc::ECHILD);
                    return Err(e);
                }
            }
            self.reaped = true;
            return Ok(ExitStatus::from_raw(status));
        }
    }

    /// SIGKILLs the process group and delists it from the guardian. Only while the leader
    /// is unreaped (its pid still names this group).
    fn end_group(&self) {
        assert!(!self.reaped, "a group is ended before its leader is reaped");
        // SAFETY: signalling the group of our own unreaped child.
        unsafe { libc::kill(-self.pid, libc::SIGKILL) };
        crate::guardian::forget(self.pid);
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        if self.reaped {
            return;
        }
        // Dropped before it exited (the engine gave up on the run): kill its group (the
        // leader's pidfd too, in case it left the group) and reap it off the async threads.
        // SAFETY: a pidfd we own; no siginfo.
        unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                self.pidfd.as_raw_fd(),
                libc::SIGKILL,
                std::ptr::null::<u8>(),
                0,
            );
        }
        self.end_group();
        let pid = self.pid;
        if std::thread::Builder::new().name("solocron-reap".into()).spawn(move || reap_blocking(pid)).is_err() {
            tracing::warn!(pid, "cannot start a thread to reap a killed job; it stays a zombie until the node exits");
        }
    }
}

/// Waits for child `pid` to exit, retrying interrupted waits.
pub(crate) fn reap_blocking(pid: libc::pid_t) {
    let mut status = 0;
    // SAFETY: waitpid on our own child, with a valid status pointer.
    while unsafe { libc::waitpid(pid, &mut status, 0) } < 0
        && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted
    {}
}

/// Sets the calling thread's signal mask to `set`, the old one into `old`, by the raw
/// system call (glibc's wrapper would refuse to block its internal signals).
///
/// # Safety
/// The caller must be ready for the new mask: blocking every signal, glibc's internal ones
/// included, is only for the moments around a `clone`.
unsafe fn block_signals(set: &libc::sigset_t, old: &mut libc::sigset_t) {
    // SAFETY: both pointers come from references, valid for the kernel's 8 bytes (glibc's
    // sigset_t is larger).
    unsafe {
        libc::syscall(libc::SYS_rt_sigprocmask, libc::SIG_SETMASK, set as *const _, old as *mut _, KERNEL_SIGSET_BYTES)
    };
}

/// The kernel's signal set: 64 signals (glibc's `sigset_t` is larger).
const KERNEL_SIGSET_BYTES: usize = 8;

/// The kernel's `struct sigaction` on x86-64 and aarch64 (handler, flags, restorer, mask).
#[repr(C)]
struct KernelSigaction {
    handler: usize,
    flags: libc::c_ulong,
    restorer: usize,
    mask: u64,
}

/// glibc's internal signals (thread cancellation, set*id), whose handlers its `sigaction`
/// does not let us reset.
const GLIBC_INTERNAL_SIGNALS: [libc::c_int; 2] = [32, 33];

/// The child, between `clone` and `execve`, on its own stack, sharing the node's memory.
/// Only async-signal-safe system calls on the prepared plan; on a failure it records
/// `errno` in the plan and exits with 127.
extern "C" fn child(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the parent's `ChildPlan`, alive until this child execs or exits.
    let plan = unsafe { &*(arg as *const ChildPlan) };
    let fail = |plan: &ChildPlan| -> libc::c_int {
        plan.error.store(errno().max(1), Ordering::SeqCst);
        // SAFETY: _exit is always safe to call.
        unsafe { libc::_exit(127) }
    };
    // SAFETY: every call below is async-signal-safe and takes data the parent prepared.
    unsafe {
        // Handlers are the node's code: none may run here. The default for each caught
        // signal, and for SIGPIPE (ignored by Rust programs, not by the programs they run).
        let mut action: libc::sigaction = std::mem::zeroed();
        for signal in 1..65 {
            if signal == libc::SIGKILL || signal == libc::SIGSTOP {
                continue;
            }
            if libc::sigaction(signal, std::ptr::null(), &mut action) == 0
                && (action.sa_sigaction != libc::SIG_IGN || signal == libc::SIGPIPE)
                && action.sa_sigaction != libc::SIG_DFL
            {
                action.sa_sigaction = libc::SIG_DFL;
                action.sa_flags = 0;
                libc::sigaction(signal, &action, std::ptr::null_mut());
            }
        }
        let default = KernelSigaction { handler: libc::SIG_DFL, flags: 0, restorer: 0, mask: 0 };
        for signal in GLIBC_INTERNAL_SIGNALS {
            libc::syscall(
                libc::SYS_rt_sigaction,
                signal,
                &default,
                std::ptr::null_mut::<KernelSigaction>(),
                KERNEL_SIGSET_BYTES,
            );
        }
        if libc::setpgid(0, 0) != 0 {
            return fail(plan);
        }
        if plan.death_signal {
            let (kill, zero) = (libc::SIGKILL as libc::c_ulong, 0 as libc::c_ulong);
            if libc::prctl(libc::PR_SET_PDEATHSIG, kill, zero, zero, zero) != 0 {
                return fail(plan);
            }
            if libc::getppid() != plan.parent {
                // The node died between the clone and the prctl.
                plan.error.store(libc::ESRCH, Ordering::SeqCst);
                libc::_exit(127);
            }
        }
        if plan.guardian >= 0 {
            // Listed from here on: a node killed after this line leaves no group unguarded.
            // Before the `dup2`s, which could overwrite the socket's descriptor if it is one
            // of 0..=2. By the raw system call: glibc's `send` is a cancellation point, which
            // touches the parent thread's state. A line this short is written whole or not
            // at all; the node sends what is left.
            let mut buffer = [0u8; crate::guardian::ANNOUNCEMENT_MAX];
            let line = crate::guardian::announcement(libc::syscall(libc::SYS_getpid) as libc::pid_t, &mut buffer);
            let sent = libc::syscall(
                libc::SYS_sendto,
                plan.guardian,
                line.as_ptr(),
                line.len(),
                libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
                std::ptr::null::<libc::sockaddr>(),
                0 as libc::socklen_t,
            );
            plan.announced.store(usize::try_from(sent).unwrap_or(0), Ordering::SeqCst);
        }
        for (fd, target) in [(plan.stdin, 0), (plan.stdout, 1), (plan.stderr, 2)] {
            let ok =
                if fd == target { libc::fcntl(fd, libc::F_SETFD, 0) == 0 } else { libc::dup2(fd, target) == target };
            if !ok {
                return fail(plan);
            }
        }
        // The program starts with no signal blocked, as std's spawn does, whatever the
        // embedding program blocks in its own threads.
        let (none, mut ignored): (libc::sigset_t, libc::sigset_t) = (std::mem::zeroed(), std::mem::zeroed());
        block_signals(&none, &mut ignored);
        libc::execve(plan.path.as_ptr(), plan.argv.as_ptr(), plan.envp.as_ptr());
        fail(plan)
    }
}

fn errno() -> libc::c_int {
    // SAFETY: reading this thread's errno.
    unsafe { *libc::__errno_location() }
}

fn cstring(bytes: &[u8]) -> io::Result<CString> {
    CString::new(bytes).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "an argument contains a NUL byte"))
}

/// The program's path: as given if it has a `/`, else the first executable file of that
/// name in `PATH` (as `execvp` would search).
fn resolve(program: &OsStr) -> io::Result<PathBuf> {
    if program.as_bytes().contains(&b'/') {
        return Ok(PathBuf::from(program));
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| OsString::from("/usr/local/bin:/usr/bin:/bin"));
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| is_executable(candidate))
        .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))
}

fn is_executable(path: &Path) -> bool {
    let Ok(c) = cstring(path.as_os_str().as_bytes()) else { return false };
    // SAFETY: a valid NUL-terminated path.
    let executable = unsafe { libc::access(c.as_ptr(), libc::X_OK) == 0 };
    executable && path.is_file()
}

/// A pipe, both ends close-on-exec: (read, write).
pub(crate) fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: pipe2 fills two descriptors we then own.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both were just created and are owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt as _;

    #[tokio::test]
    async fn a_spawned_program_gets_its_args_env_and_own_group_and_reports_its_exit() {
        let _serial = crate::guardian::TEST_SERIAL.lock().await;
        let argv: Vec<String> =
            ["sh", "-c", "echo \"$1 $SOLOCRON_TEST\"; ps -o pgid= -p $$ | tr -d ' ' >&2; exit 3", "sh", "hello"]
                .map(String::from)
                .into();
        let mut child = spawn(&argv, &[("SOLOCRON_TEST", "world".into())]).expect("spawn");
        let (mut out, mut err) = (String::new(), String::new());
        child.stdout.take().unwrap().read_to_string(&mut out).await.unwrap();
        child.stderr.take().unwrap().read_to_string(&mut err).await.unwrap();
        let status = child.wait().await.expect("wait");
        assert_eq!(out, "hello world\n");
        assert_eq!(err.trim(), child.pid().to_string(), "its own process group");
        assert_eq!(status.code(), Some(3));
    }

    /// Whether `pid` is a live process (a zombie is not).
    fn alive(pid: i32) -> bool {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        stat.rsplit(')').next().and_then(|rest| rest.split_whitespace().next()).is_some_and(|state| state != "Z")
    }

    #[tokio::test]
    async fn what_is_left_of_the_group_dies_with_its_leader_and_the_guardian_forgets_it() {
        let _serial = crate::guardian::TEST_SERIAL.lock().await;
        let argv: Vec<String> = ["sh", "-c", "sleep 30 >/dev/null 2>&1 & echo $!"].map(String::from).into();
        let mut child = spawn(&argv, &[]).expect("spawn");
        let mut out = String::new();
        child.stdout.take().unwrap().read_to_string(&mut out).await.unwrap();
        let grandchild: i32 = out.trim().parse().expect("the background pid");
        assert!(alive(grandchild), "the background sleep runs while its shell does");
        assert!(child.wait().await.expect("wait").success());
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while alive(grandchild) {
            assert!(std::time::Instant::now() < deadline, "the grandchild outlived its group's leader");
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert!(!crate::guardian::listed(child.pid()), "the guardian still lists an ended group");
    }

    #[tokio::test]
    async fn each_job_announces_its_own_group_to_the_guardian_before_its_program_starts() {
        let _serial = crate::guardian::TEST_SERIAL.lock().await;
        let completed = crate::guardian::COMPLETED_BY_NODE.load(Ordering::SeqCst);
        let mut children = Vec::new();
        for _ in 0..20 {
            children.push(spawn(&["sleep".into(), "30".into()], &[]).expect("spawn"));
        }
        for child in &children {
            assert!(crate::guardian::listed(child.pid()), "a started job's group is listed");
        }
        assert_eq!(
            crate::guardian::COMPLETED_BY_NODE.load(Ordering::SeqCst),
            completed,
            "every job's process wrote its whole `+pgid` line before execve; the node wrote none"
        );
        drop(children);
    }

    /// Jobs started at once from several threads (which share the guardian while they
    /// start) each announce their whole line: a guardian whose node is gone kills them all.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn jobs_started_at_once_from_many_threads_all_die_with_the_guardians_node() {
        let _serial = crate::guardian::TEST_SERIAL.lock().await;
        let completed = crate::guardian::COMPLETED_BY_NODE.load(Ordering::SeqCst);
        let starts = (0..4).map(|_| {
            tokio::task::spawn_blocking(|| {
                (0..10).map(|_| spawn(&["sleep".into(), "30".into()], &[]).expect("spawn")).collect::<Vec<_>>()
            })
        });
        let mut children = Vec::new();
        for started in futures_util::future::join_all(starts).await {
            children.extend(started.expect("a starting thread"));
        }
        assert!(children.iter().all(|c| crate::guardian::listed(c.pid())), "every started job's group is listed");
        assert_eq!(crate::guardian::COMPLETED_BY_NODE.load(Ordering::SeqCst), completed, "each job wrote its own line");
        crate::guardian::close_guardian();
        for mut child in children {
            let status = child.wait().await.expect("wait");
            assert_eq!(status.signal(), Some(libc::SIGKILL), "the guardian killed the job's group");
        }
    }

    #[tokio::test]
    async fn a_program_that_fails_to_start_leaves_no_group_listed() {
        let _serial = crate::guardian::TEST_SERIAL.lock().await;
        let before = crate::guardian::listed_count();
        let dir = tempfile::tempdir().expect("dir");
        let plain = dir.path().join("plain");
        std::fs::write(&plain, "#!/bin/sh\n").expect("write");
        for _ in 0..5 {
            spawn(&[plain.display().to_string()], &[]).expect_err("not executable");
        }
        assert_eq!(crate::guardian::listed_count(), before, "an announced group whose execve failed is delisted");
    }

    #[tokio::test]
    async fn a_missing_program_is_not_found_and_a_non_executable_one_is_refused() {
        let _serial = crate::guardian::TEST_SERIAL.lock().await;
        let err = spawn(&["no-such-program-solocron".into()], &[]).expect_err("missing");
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
        let dir = tempfile::tempdir().expect("dir");
        let plain = dir.path().join("plain");
        std::fs::write(&plain, "#!/bin/sh\n").expect("write");
        let err = spawn(&[plain.display().to_string()], &[]).expect_err("not executable");
        assert_eq!(err.raw_os_error(), Some(libc::EACCES), "{err}");
    }

    #[tokio::test]
    async fn signals_reach_the_program_with_default_actions_and_sigpipe_is_not_ignored() {
        let _serial = crate::guardian::TEST_SERIAL.lock().await;
        // Rust ignores SIGPIPE; the program must not inherit that.
        let argv: Vec<String> = ["sh", "-c", "grep SigIgn /proc/self/status"].map(String::from).into();
        let mut child = spawn(&argv, &[]).expect("spawn");
        let mut out = String::new();
        child.stdout.take().unwrap().read_to_string(&mut out).await.unwrap();
        child.wait().await.expect("wait");
        let ignored = u64::from_str_radix(out.split_whitespace().nth(1).expect("mask"), 16).expect("hex");
        assert_eq!(ignored & (1 << (libc::SIGPIPE - 1)), 0, "SIGPIPE ignored in the child: {out}");

        // A thread that blocks signals does not pass its mask on.
        let blocked = std::thread::spawn(|| {
            let mut set = nix::sys::signal::SigSet::empty();
            set.add(nix::sys::signal::Signal::SIGTERM);
            set.thread_block().expect("block");
            tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
                let argv: Vec<String> = ["sh", "-c", "grep SigBlk /proc/self/status"].map(String::from).into();
                let mut child = spawn(&argv, &[]).expect("spawn");
                let mut out = String::new();
                child.stdout.take().unwrap().read_to_string(&mut out).await.unwrap();
                child.wait().await.expect("wait");
                out
            })
        })
        .join()
        .unwrap();
        let mask = u64::from_str_radix(blocked.split_whitespace().nth(1).expect("mask"), 16).expect("hex");
        assert_eq!(mask, 0, "the child starts with no signal blocked: {blocked}");

        let mut child = spawn(&["sleep".into(), "30".into()], &[]).expect("spawn");
        // SAFETY: signalling our own child.
        unsafe { libc::kill(child.pid(), libc::SIGTERM) };
        assert_eq!(child.wait().await.expect("wait").signal(), Some(libc::SIGTERM));
    }
}
