//! The guardian: one small process per node that kills the process groups of the node's
//! running command jobs if the node dies without stopping them itself (SIGKILL, a crash).
//!
//! The death signal (`PR_SET_PDEATHSIG`, set in [`crate::spawn`]) reaches a job's own
//! process only. Processes it started in turn (`sh -c 'a; b'` forks `a`) would live on
//! after a SIGKILLed node, and, once the lease lapses and another node retries the tick,
//! run beside the retry. The guardian closes that: each job's process announces its group
//! (`+pgid`) itself, between `clone` and `execve` (so no moment after the job's program
//! starts finds it unlisted), and the node delists it (`-pgid`) as it ends, over a socket
//! that only the node holds open at its end; when the socket reaches end-of-file (the node
//! is gone, however it went), the guardian SIGKILLs every group still listed and exits.
//!
//! Why a `/bin/sh` script: solocron is a library inside programs it does not control, so
//! it cannot re-execute itself as a helper, and a forked copy of the node would keep the
//! node's memory alive. The script uses shell builtins only (`read`, `case`, `kill`), so
//! it never forks; it ignores HUP, INT and TERM, so that a signal aimed at the whole
//! service does not remove the protection before the node itself is gone.
//!
//! A group is listed before its leader is reaped and delisted before that too (see
//! [`crate::spawn::Spawned::wait`]): while the leader is unreaped its pid, and so the
//! group's id, cannot be reused, so the guardian never kills a stranger's group on the
//! node's account. (If the node dies, the leaders are reaped by init before the guardian
//! acts; a group whose members had all ended by then could in principle have had its id
//! reused in those milliseconds.)

use std::collections::BTreeSet;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The script: a space-delimited list of groups; on end-of-file, SIGKILL each.
const SCRIPT: &str = r#"trap '' HUP INT TERM
groups=' '
while read -r line; do
  g=${line#?}
  case $line in
    +*) case $groups in *" $g "*) ;; *) groups="$groups$g " ;; esac ;;
    -*) case $groups in *" $g "*) groups="${groups%% $g *} ${groups#* $g }" ;; esac ;;
  esac
done
for g in $groups; do kill -s KILL -- "-$g" 2>/dev/null; done
"#;

/// Most groups the node keeps listed: far above any node's concurrent runs. Past it a job
/// runs unguarded (with a warning) rather than the list growing without bound.
const GROUPS_MAX: usize = 100_000;

/// How long one message may wait for room in the socket before the guardian counts as
/// stuck and is replaced. A new guardian gets longer for the whole list.
const SEND_WAIT: Duration = Duration::from_millis(100);
const LIST_WAIT: Duration = Duration::from_secs(2);

/// What the node has told its guardian.
static STATE: Mutex<State> = Mutex::new(State { guardian: None, groups: BTreeSet::new() });

struct State {
    /// The running guardian: started with the first command job; `None` until then, or
    /// after one could not be started (tried again at the next message).
    guardian: Option<Guardian>,
    /// The groups to kill if the node dies: kept here, so that a replacement guardian is
    /// told all of them.
    groups: BTreeSet<libc::pid_t>,
}

/// A running guardian.
struct Guardian {
    pid: libc::pid_t,
    /// The node's end of the socket that is the guardian's stdin (close-on-exec,
    /// non-blocking).
    socket: OwnedFd,
}

/// The guardian, locked while one job starts: its socket cannot be replaced, nor its
/// descriptor reused, until the job's process has announced itself (the child writes
/// `+pid` to [`Listing::socket`] before `execve`, so a node killed at any moment after the
/// job's program starts leaves its group listed) and the node has recorded it.
pub(crate) struct Listing {
    state: MutexGuard<'static, State>,
}

impl Listing {
    /// Locks the guardian, starting one if there is none (a failure is logged: the job
    /// runs unguarded).
    pub(crate) fn lock() -> Listing {
        let mut state = STATE.lock().unwrap_or_else(|e| e.into_inner());
        if state.guardian.is_none() && state.groups.len() < GROUPS_MAX {
            if let Err(e) = state.tell("") {
                tracing::warn!(error = %e, "cannot start the guardian process; if this node dies, what its jobs started may outlive it");
            }
        }
        if let Some(guardian) = &state.guardian {
            // Room for the child's line (a guardian behind on its input, in a burst of
            // starts), waiting as long as a message from the node would; without it the
            // child's write fails and the node writes the line once the program started.
            let mut fd = libc::pollfd { fd: guardian.socket.as_raw_fd(), events: libc::POLLOUT, revents: 0 };
            let ms = libc::c_int::try_from(SEND_WAIT.as_millis()).unwrap_or(libc::c_int::MAX);
            // SAFETY: one valid pollfd.
            unsafe { libc::poll(&mut fd, 1, ms) };
        }
        Listing { state }
    }

    /// The socket a starting job announces itself on: `None` without a guardian, or when
    /// [`GROUPS_MAX`] groups are listed already.
    pub(crate) fn socket(&self) -> Option<RawFd> {
        let room = self.state.groups.len() < GROUPS_MAX;
        self.state.guardian.as_ref().filter(|_| room).map(|g| g.socket.as_raw_fd())
    }

    /// Records that the job `pgid` started, of whose announcement line (see
    /// [`announcement`]) its process wrote the first `announced` bytes itself: the node
    /// sends the rest, if any. A failure to reach the guardian is logged; the job runs
    /// unguarded.
    pub(crate) fn started(&mut self, pgid: libc::pid_t, announced: usize) {
        assert!(pgid > 0, "a process group id");
        let mut buffer = [0u8; ANNOUNCEMENT_MAX];
        let line = announcement(pgid, &mut buffer);
        assert!(announced <= line.len(), "the child writes at most its line");
        if self.state.groups.len() >= GROUPS_MAX {
            tracing::warn!(pgid, "{GROUPS_MAX} job process groups listed already; this one is not guarded");
            return;
        }
        self.state.groups.insert(pgid);
        if announced == line.len() {
            return;
        }
        #[cfg(test)]
        COMPLETED_BY_NODE.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let rest = std::str::from_utf8(&line[announced..]).expect("an announcement is ASCII");
        if let Err(e) = self.state.tell(rest) {
            tracing::warn!(pgid, error = %e, "cannot tell the guardian of a job; if this node dies, what the job started may outlive it");
        }
    }

    /// Delists `pgid`, as [`forget`] does.
    pub(crate) fn forget(&mut self, pgid: libc::pid_t) {
        self.state.forget(pgid);
    }
}

/// Longest announcement: `+`, a pid (at most 10 digits), a newline.
pub(crate) const ANNOUNCEMENT_MAX: usize = 12;

/// Writes `+pgid\n`, the line that lists a group, into `buffer`, and returns it. Allocates
/// nothing: the child of a `clone` calls it.
pub(crate) fn announcement(pgid: libc::pid_t, buffer: &mut [u8; ANNOUNCEMENT_MAX]) -> &[u8] {
    let mut digits = [0u8; 10];
    let (mut n, mut len) = (pgid.unsigned_abs(), 0);
    loop {
        digits[len] = b'0' + (n % 10) as u8;
        len += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    buffer[0] = b'+';
    for i in 0..len {
        buffer[1 + i] = digits[len - 1 - i];
    }
    buffer[1 + len] = b'\n';
    &buffer[..len + 2]
}

/// How many announcements the node had to complete (its job's process could not write the
/// whole line itself).
#[cfg(test)]
pub(crate) static COMPLETED_BY_NODE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Delists `pgid`: its group has been killed and its leader is about to be reaped. If the
/// guardian cannot be told, it is replaced by one that never heard of `pgid`: a listed
/// group whose id may be reused must not stay with a guardian.
pub(crate) fn forget(pgid: libc::pid_t) {
    STATE.lock().unwrap_or_else(|e| e.into_inner()).forget(pgid);
}

/// Held by the tests that start jobs, and by those that end a guardian on purpose (which
/// kills every listed group).
#[cfg(test)]
pub(crate) static TEST_SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// How many groups the guardian lists.
#[cfg(test)]
pub(crate) fn listed_count() -> usize {
    STATE.lock().unwrap_or_else(|e| e.into_inner()).groups.len()
}

/// Whether the guardian lists `pgid`.
#[cfg(test)]
pub(crate) fn listed(pgid: libc::pid_t) -> bool {
    STATE.lock().unwrap_or_else(|e| e.into_inner()).groups.contains(&pgid)
}

impl State {
    /// See [`forget`].
    fn forget(&mut self, pgid: libc::pid_t) {
        if !self.groups.remove(&pgid) {
            return;
        }
        if let Err(e) = self.tell(&format!("-{pgid}\n")) {
            tracing::warn!(pgid, error = %e, "cannot tell the guardian that a job ended");
        }
    }

    /// Sends `line` to the guardian. If there is none, or it does not take the line in
    /// time (gone, stopped, or a send failed part-way), it is killed and a new one is
    /// started and told every listed group, `line` included (already applied to `groups`).
    fn tell(&mut self, line: &str) -> io::Result<()> {
        if let Some(guardian) = &self.guardian {
            match send(&guardian.socket, line.as_bytes(), SEND_WAIT) {
                Ok(()) => return Ok(()),
                Err(e) => {
                    tracing::warn!(pid = guardian.pid, error = %e, "the guardian process does not answer; replacing it")
                }
            }
        }
        if let Some(old) = self.guardian.take() {
            old.kill();
        }
        let fresh = Guardian::start()?;
        let list: String = self.groups.iter().map(|g| format!("+{g}\n")).collect();
        if let Err(e) = send(&fresh.socket, list.as_bytes(), LIST_WAIT) {
            // Closing its socket now would make it kill what it was told so far.
            fresh.kill();
            return Err(e);
        }
        self.guardian = Some(fresh);
        Ok(())
    }
}

impl Guardian {
    fn start() -> io::Result<Guardian> {
        // A socket rather than a pipe: `send` with MSG_NOSIGNAL cannot raise SIGPIPE in a
        // program that did not ignore it, and MSG_DONTWAIT cannot stall the node on a
        // stopped guardian.
        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: socketpair fills two descriptors we then own.
        if unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0, fds.as_mut_ptr()) } != 0
        {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: both were just created and are owned by nobody else.
        let (node_end, guardian_end) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        let argv: Vec<String> = ["/bin/sh", "-c", SCRIPT, "solocron-guardian"].map(String::from).into();
        let null = || std::fs::OpenOptions::new().read(true).write(true).open("/dev/null").map(OwnedFd::from);
        let io = crate::spawn::ChildIo { stdin: guardian_end, stdout: null()?, stderr: null()? };
        let (pid, _pidfd) = crate::spawn::start(&argv, &[], io, crate::spawn::Kind::Guardian)?;
        tracing::debug!(pid, "guardian started");
        Ok(Guardian { pid, socket: node_end })
    }

    /// Kills the guardian before its socket closes (so that it cannot act on the
    /// end-of-file), and reaps it off this thread.
    fn kill(self) {
        // SAFETY: signalling our own unreaped child.
        unsafe { libc::kill(self.pid, libc::SIGKILL) };
        let pid = self.pid;
        if std::thread::Builder::new()
            .name("solocron-reap".into())
            .spawn(move || crate::spawn::reap_blocking(pid))
            .is_err()
        {
            tracing::warn!(
                pid,
                "cannot start a thread to reap the old guardian; it stays a zombie until the node exits"
            );
        }
        drop(self.socket);
    }
}

/// Sends all of `bytes`, waiting at most `wait` in all for room in the socket.
fn send(socket: &OwnedFd, mut bytes: &[u8], wait: Duration) -> io::Result<()> {
    let deadline = Instant::now() + wait;
    while !bytes.is_empty() {
        // SAFETY: a socket we own and a valid buffer of that length.
        let sent = unsafe {
            libc::send(socket.as_raw_fd(), bytes.as_ptr().cast(), bytes.len(), libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT)
        };
        if let Ok(n) = usize::try_from(sent) {
            bytes = &bytes[n..];
            continue;
        }
        let e = io::Error::last_os_error();
        match e.kind() {
            io::ErrorKind::Interrupted => continue,
            io::ErrorKind::WouldBlock => {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(io::Error::new(io::ErrorKind::TimedOut, "the guardian takes no more input"));
                }
                let mut fd = libc::pollfd { fd: socket.as_raw_fd(), events: libc::POLLOUT, revents: 0 };
                let ms = libc::c_int::try_from(left.as_millis().max(1)).unwrap_or(libc::c_int::MAX);
                // SAFETY: one valid pollfd.
                unsafe { libc::poll(&mut fd, 1, ms) };
            }
            _ => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write as _;

    #[test]
    fn an_announcement_is_the_line_the_script_reads() {
        let mut buffer = [0u8; ANNOUNCEMENT_MAX];
        for pgid in [1, 7, 10, 4_194_304, libc::pid_t::MAX] {
            assert_eq!(announcement(pgid, &mut buffer), format!("+{pgid}\n").as_bytes());
        }
    }
    use std::os::unix::process::{CommandExt as _, ExitStatusExt as _};
    use std::process::{Child, Command, Stdio};
    use std::time::{Duration, Instant};

    /// `sleep 30` in a process group of its own.
    fn sleeper() -> Child {
        Command::new("sleep").arg("30").process_group(0).spawn().expect("spawn sleep")
    }

    /// Asserts that `child` is still running `for_at_least`, then kills it.
    fn assert_lives(mut child: Child, for_at_least: Duration) {
        let deadline = Instant::now() + for_at_least;
        while Instant::now() < deadline {
            assert!(child.try_wait().unwrap().is_none(), "a group the guardian was not to kill died");
            std::thread::sleep(Duration::from_millis(20));
        }
        child.kill().unwrap();
        child.wait().unwrap();
    }

    /// The script as the node runs it: at end-of-file a listed group is killed, a delisted
    /// one is not, and the script exits.
    #[test]
    fn the_script_kills_the_listed_groups_when_its_input_ends() {
        let (mut kept, dropped) = (sleeper(), sleeper());
        let mut guardian = Command::new("/bin/sh")
            .args(["-c", SCRIPT, "solocron-guardian"])
            .stdin(Stdio::piped())
            .spawn()
            .expect("guardian");
        let mut stdin = guardian.stdin.take().unwrap();
        writeln!(stdin, "+{}\n+{}\n-{}", kept.id(), dropped.id(), dropped.id()).unwrap();
        drop(stdin);
        assert!(guardian.wait().expect("guardian exits").success());
        assert_eq!(kept.wait().unwrap().signal(), Some(libc::SIGKILL), "the listed group was killed");
        assert_lives(dropped, Duration::from_millis(300));
    }

    /// A guardian that died is replaced at the next message, and told every listed group:
    /// when the replacement's input ends, it kills them all.
    #[test]
    fn a_dead_guardian_is_replaced_and_told_the_listed_groups_again() {
        let _serial = TEST_SERIAL.blocking_lock();
        let (mut listed, mut other) = (sleeper(), sleeper());
        let (a, b) = (listed.id() as libc::pid_t, other.id() as libc::pid_t);
        Listing::lock().started(a, 0);
        let first = STATE.lock().unwrap().guardian.as_ref().expect("started").pid;
        // SAFETY: killing the guardian this process started.
        unsafe { libc::kill(first, libc::SIGKILL) };
        std::thread::sleep(Duration::from_millis(100));
        Listing::lock().started(b, 0);
        let second = STATE.lock().unwrap().guardian.take().expect("restarted");
        assert_ne!(second.pid, first, "a new guardian");
        let pid = second.pid;
        drop(second);
        crate::spawn::reap_blocking(pid);
        assert_eq!(listed.wait().unwrap().signal(), Some(libc::SIGKILL), "the group listed before the restart");
        assert_eq!(other.wait().unwrap().signal(), Some(libc::SIGKILL), "the group listed after it");
        STATE.lock().unwrap().groups.retain(|g| ![a, b].contains(g));
    }
}
