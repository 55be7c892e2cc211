//! The machine's own cost of starting many processes at one instant, without solocron: the
//! floor that command jobs' start lateness is shown beside.

use std::time::Duration;

use chrono::Utc;
use solocron_os::preforked::Gate;

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
    let mut lateness = Vec::with_capacity(n * rounds);
    for _ in 0..rounds {
        let gate = Gate::new()?;
        let children = (0..n).map(|_| gate.hold("/bin/date", &["date", "+%s%N"])).collect::<Result<Vec<_>, _>>()?;
        let second = next_second();
        gate.open(); // end of file: every child execs now
        for child in children {
            let (_, output) = child.wait_with_output()?;
            lateness.push(late(&output, second)?);
        }
    }
    Ok(lateness)
}
