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
use std::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard};
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

/// The running guardian: started with the first command job; `None` until then, or after
/// one could not be started (tried again at the next message). Shared while jobs start and
/// lines are sent (a child's or the node's line is one write of a dozen bytes, which a
/// stream socket never interleaves with another's); held alone to start or replace one.
static GUARDIAN: RwLock<Option<Guardian>> = RwLock::new(None);

/// The groups to kill if the node dies: kept here, so that a replacement guardian is told
/// all of them. Taken after [`GUARDIAN`], never before.
static GROUPS: Mutex<BTreeSet<libc::pid_t>> = Mutex::new(BTreeSet::new());

fn groups() -> MutexGuard<'static, BTreeSet<libc::pid_t>> {
    GROUPS.lock().unwrap_or_else(|e| e.into_inner())
}

fn shared() -> RwLockReadGuard<'static, Option<Guardian>> {
    GUARDIAN.read().unwrap_or_else(|e| e.into_inner())
}

/// A running guardian.
struct Guardian {
    pid: libc::pid_t,
    /// The node's end of the socket that is the guardian's stdin (close-on-exec,
    /// non-blocking).
    socket: OwnedFd,
}

/// The guardian, held (shared with other starts) while one job starts: it cannot be
/// replaced, nor its socket's descriptor reused, until the job's process has announced
/// itself (the child writes `+pid` to [`Listing::socket`] before `execve`, so a node killed
/// at any moment after the job's program starts leaves its group listed) and the node has
/// recorded the group ([`Listing::record`]).
pub(crate) struct Listing {
    guardian: RwLockReadGuard<'static, Option<Guardian>>,
}

impl Listing {
    /// Holds the guardian, starting one if there is none (a failure is logged: the job
    /// runs unguarded).
    pub(crate) fn lock() -> Listing {
        if shared().is_none() && groups().len() < GROUPS_MAX {
            if let Err(e) = replace(None) {
                tracing::warn!(error = %e, "cannot start the guardian process; if this node dies, what its jobs started may outlive it");
            }
        }
        let guardian = shared();
        if let Some(guardian) = guardian.as_ref() {
            // Room for the child's line (a guardian behind on its input, in a burst of
            // starts), waiting as long as a message from the node would; without it the
            // child's write fails and the node writes the line once the program started.
            let mut fd = libc::pollfd { fd: guardian.socket.as_raw_fd(), events: libc::POLLOUT, revents: 0 };
            let ms = libc::c_int::try_from(SEND_WAIT.as_millis()).unwrap_or(libc::c_int::MAX);
            // SAFETY: one valid pollfd.
            unsafe { libc::poll(&mut fd, 1, ms) };
        }
        Listing { guardian }
    }

    /// The socket a starting job announces itself on: `None` without a guardian, or when
    /// [`GROUPS_MAX`] groups are listed already.
    pub(crate) fn socket(&self) -> Option<RawFd> {
        let room = groups().len() < GROUPS_MAX;
        self.guardian.as_ref().filter(|_| room).map(|g| g.socket.as_raw_fd())
    }

    /// Records the group `pgid` of a job whose process wrote the first `announced` bytes of
    /// its [`announcement`] (while this listing held the guardian, so no replacement can
    /// have missed it): whether it is listed now. One whose process wrote none is not
    /// listed past [`GROUPS_MAX`] (it runs unguarded, with a warning); one that announced
    /// itself always is, since the guardian heard of it. Then drop the listing and call
    /// [`complete`].
    pub(crate) fn record(&self, pgid: libc::pid_t, announced: usize) -> bool {
        assert!(pgid > 0, "a process group id");
        let mut groups = groups();
        if announced == 0 && groups.len() >= GROUPS_MAX {
            tracing::warn!(pgid, "{GROUPS_MAX} job process groups listed already; this one is not guarded");
            return false;
        }
        groups.insert(pgid);
        true
    }
}

/// Completes the announcement of a recorded group whose process wrote `announced` bytes
/// of its line: nothing if it wrote all of it; the whole line if it wrote none; and a new
/// guardian (told every listed group) if it wrote part of it, since a part of a line
/// spoils the stream for every later one. A failure to reach the guardian is logged; the
/// job runs unguarded.
pub(crate) fn complete(pgid: libc::pid_t, announced: usize) {
    let mut buffer = [0u8; ANNOUNCEMENT_MAX];
    let line = announcement(pgid, &mut buffer);
    assert!(announced <= line.len(), "the child writes at most its line");
    if announced == line.len() {
        return;
    }
    #[cfg(test)]
    COMPLETED_BY_NODE.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let told = if announced == 0 {
        tell(std::str::from_utf8(line).expect("an announcement is ASCII"))
    } else {
        let spoiled = shared().as_ref().map(|g| g.pid);
        replace(spoiled)
    };
    if let Err(e) = told {
        tracing::warn!(pgid, error = %e, "cannot tell the guardian of a job; if this node dies, what the job started may outlive it");
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
    if !groups().remove(&pgid) {
        return;
    }
    // A replacement started after the removal never heard of `pgid`; the one before it
    // is told here, or replaced.
    if let Err(e) = tell(&format!("-{pgid}\n")) {
        tracing::warn!(pgid, error = %e, "cannot tell the guardian that a job ended");
    }
}

/// Held by the tests that start jobs, and by those that end a guardian on purpose (which
/// kills every listed group).
#[cfg(test)]
pub(crate) static TEST_SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Ends the guardian as a node's death would (its socket closes, so it kills every group
/// it heard of), and returns once it exited.
#[cfg(test)]
pub(crate) fn close_guardian() {
    let taken = GUARDIAN.write().unwrap_or_else(|e| e.into_inner()).take();
    if let Some(guardian) = taken {
        let pid = guardian.pid;
        drop(guardian);
        crate::spawn::reap_blocking(pid);
    }
}

/// How many groups the guardian lists.
#[cfg(test)]
pub(crate) fn listed_count() -> usize {
    groups().len()
}

/// Whether the guardian lists `pgid`.
#[cfg(test)]
pub(crate) fn listed(pgid: libc::pid_t) -> bool {
    groups().contains(&pgid)
}

/// Sends `line` (one whole line, a dozen bytes) to the guardian. If there is none, or it
/// does not take the line in time (gone, stopped, or it took part of it), it is replaced by
/// a new one told every listed group (`line`'s change is already applied to them).
fn tell(line: &str) -> io::Result<()> {
    // The shared hold ends before `replace` takes the guardian alone.
    let failed = match shared().as_ref() {
        None => None,
        Some(guardian) => match send_line(&guardian.socket, line.as_bytes()) {
            Ok(()) => return Ok(()),
            Err(e) => {
                tracing::warn!(pid = guardian.pid, error = %e, "the guardian process does not answer; replacing it");
                Some(guardian.pid)
            }
        },
    };
    replace(failed)
}

/// Starts a guardian told every listed group, in place of the one `failed` (its pid), or
/// where there is none (`None`); nothing if another thread did so meanwhile. The old one is
/// killed before its socket closes, so that it cannot act on the end-of-file.
fn replace(failed: Option<libc::pid_t>) -> io::Result<()> {
    let mut guardian = GUARDIAN.write().unwrap_or_else(|e| e.into_inner());
    if guardian.as_ref().map(|g| g.pid) != failed {
        return Ok(());
    }
    if let Some(old) = guardian.take() {
        old.kill();
    }
    let fresh = Guardian::start()?;
    let list: String = groups().iter().map(|g| format!("+{g}\n")).collect();
    if let Err(e) = send(&fresh.socket, list.as_bytes(), LIST_WAIT) {
        // Closing its socket now would make it kill what it was told so far.
        fresh.kill();
        return Err(e);
    }
    *guardian = Some(fresh);
    Ok(())
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
fn send(socket: &OwnedFd, bytes: &[u8], wait: Duration) -> io::Result<()> {
    send_in(socket, bytes, wait, false)
}

/// Sends one short line in one write, waiting at most [`SEND_WAIT`] for room: a part of it
/// is an error (other threads and starting jobs write to the same socket).
fn send_line(socket: &OwnedFd, line: &[u8]) -> io::Result<()> {
    debug_assert!(line.len() <= 2 * ANNOUNCEMENT_MAX && line.ends_with(b"\n"));
    send_in(socket, line, SEND_WAIT, true)
}

fn send_in(socket: &OwnedFd, mut bytes: &[u8], wait: Duration, one_write: bool) -> io::Result<()> {
    let deadline = Instant::now() + wait;
    while !bytes.is_empty() {
        // SAFETY: a socket we own and a valid buffer of that length.
        let sent = unsafe {
            libc::send(socket.as_raw_fd(), bytes.as_ptr().cast(), bytes.len(), libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT)
        };
        if let Ok(n) = usize::try_from(sent) {
            if one_write && n < bytes.len() {
                return Err(io::Error::new(io::ErrorKind::WriteZero, "the guardian took part of a line"));
            }
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
        let list = |pgid| {
            let listing = Listing::lock();
            assert!(listing.record(pgid, 0));
            drop(listing);
            complete(pgid, 0);
        };
        list(a);
        let first = shared().as_ref().expect("started").pid;
        // SAFETY: killing the guardian this process started.
        unsafe { libc::kill(first, libc::SIGKILL) };
        std::thread::sleep(Duration::from_millis(100));
        list(b);
        let second = GUARDIAN.write().unwrap().take().expect("restarted");
        assert_ne!(second.pid, first, "a new guardian");
        let pid = second.pid;
        drop(second);
        crate::spawn::reap_blocking(pid);
        assert_eq!(listed.wait().unwrap().signal(), Some(libc::SIGKILL), "the group listed before the restart");
        assert_eq!(other.wait().unwrap().signal(), Some(libc::SIGKILL), "the group listed after it");
        groups().retain(|g| ![a, b].contains(g));
    }
}
