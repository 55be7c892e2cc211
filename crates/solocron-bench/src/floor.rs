//! The machine's own cost of starting many processes at one instant, without solocron: the
//! floor that command jobs' start lateness is shown beside.

use std::ffi::CString;
use std::io::Read as _;
use std::os::fd::AsRawFd as _;
use std::time::Duration;

use chrono::Utc;

/// Sleeps until the next whole second of the wall clock; that second in ms.
fn next_second() -> i64 {
    let next = (Utc::now().timestamp_millis() / 1000 + 1) * 1000;
    std::thread::sleep(Duration::from_millis((next - Utc::now().timestamp_millis()).max(0) as u64));
    next
}

/// ms from `second` to the instant a `date +%s%N` printed (its output).
fn late(output: &[u8], second: i64) -> anyhow::Result<f64> {
    let ns: i64 = String::from_utf8_lossy(output).trim().parse()?;
    Ok((ns / 1000) as f64 / 1000.0 - second as f64)
}

/// `rounds` times, at a whole second, spawns `n` `/bin/date +%s%N` at once from this process
/// and returns each one's lateness (ms from the second to the moment `date` read the clock).
pub fn spawn_floor(n: usize, rounds: usize) -> anyhow::Result<Vec<f64>> {
    let mut lateness = Vec::with_capacity(n * rounds);
    for _ in 0..rounds {
        let second = next_second();
        let children = (0..n)
            .map(|_| std::process::Command::new("/bin/date").arg("+%s%N").stdout(std::process::Stdio::piped()).spawn())
            .collect::<Result<Vec<_>, _>>()?;
        for child in children {
            lateness.push(late(&child.wait_with_output()?.stdout, second)?);
        }
    }
    Ok(lateness)
}

/// Like [`spawn_floor`], but with every fork done before the second: `n` children forked
/// ahead wait on a pipe, which is closed at the second, and then only exec `/bin/date`.
/// What is left is the cost of `n` execs (and the programs' own start) at one instant: a
/// floor that no spawning strategy can go below on this machine.
pub fn exec_floor(n: usize, rounds: usize) -> anyhow::Result<Vec<f64>> {
    let path = CString::new("/bin/date")?;
    let args = [CString::new("date")?, CString::new("+%s%N")?];
    let argv = [args[0].as_ptr(), args[1].as_ptr(), std::ptr::null()];
    let mut lateness = Vec::with_capacity(n * rounds);
    for _ in 0..rounds {
        let (gate_r, gate_w) = std::io::pipe()?; // close-on-exec, both ends
        let mut children: Vec<(nix::unistd::Pid, std::io::PipeReader)> = Vec::with_capacity(n);
        for _ in 0..n {
            let (out_r, out_w) = std::io::pipe()?;
            // SAFETY: the child makes only async-signal-safe calls (close, read, dup2,
            // execv, _exit) on values prepared before the fork, so the other threads'
            // locks it inherited never matter.
            match unsafe { nix::unistd::fork() }? {
                nix::unistd::ForkResult::Child => unsafe {
                    libc::close(gate_w.as_raw_fd());
                    let mut byte = 0u8;
                    libc::read(gate_r.as_raw_fd(), (&raw mut byte).cast(), 1);
                    libc::dup2(out_w.as_raw_fd(), 1);
                    libc::execv(path.as_ptr(), argv.as_ptr());
                    libc::_exit(127);
                },
                nix::unistd::ForkResult::Parent { child } => children.push((child, out_r)),
            }
            drop(out_w);
        }
        drop(gate_r);
        let second = next_second();
        drop(gate_w); // end of file: every child execs now
        for (pid, mut out) in children {
            let mut output = String::new();
            out.read_to_string(&mut output)?;
            nix::sys::wait::waitpid(pid, None)?;
            lateness.push(late(output.as_bytes(), second)?);
        }
    }
    Ok(lateness)
}
