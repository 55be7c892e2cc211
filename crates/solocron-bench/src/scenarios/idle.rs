//! Scenario 4, idle cost: what a node (and `solocron run`) costs while its jobs wait.

use std::time::{Duration, Instant};

use solocron_core::Prefix;

use super::{clean, node_args, Ctx};
use crate::fleet::{cpu_ms, fresh, reports, spawn};
use crate::node::rss_kb;
use crate::stats::{fmt, table};

/// Idle cost (scenario 4): one node with J jobs whose next fire is far away (the library
/// embedded), then `solocron run` itself with J command jobs in its configuration, when
/// the `solocron` binary was built beside this one.
pub fn idle(c: &Ctx) -> anyhow::Result<String> {
    let counts: &[usize] = if c.quick { &[1000] } else { &[10_000, 100_000] };
    let measure = if c.quick { 3 } else { 60 };
    let mut rows = vec![];
    for &jobs in counts {
        let (url, prefix) = fresh(&c.store, &c.dir, "idle");
        let mut a = node_args(c, &url, &prefix, "idle");
        a.jobs = jobs;
        a.schedule = FAR.into();
        a.seconds = settle_max(jobs) + measure + 5;
        let p = spawn(&a, None);
        let m = idle_of(p.child.id(), jobs, measure);
        p.stop();
        let _ = reports(vec![p], Duration::from_secs(30));
        clean(&url, &prefix);
        rows.push(m.row("node (library)", jobs));
    }
    let daemon = std::env::current_exe()?.with_file_name("solocron");
    let jobs = counts[0];
    if daemon.exists() {
        let (url, prefix) = fresh(&c.store, &c.dir, "idle-daemon");
        let config = c.dir.join(format!("idle-daemon-{}.toml", prefix.as_str()));
        std::fs::write(&config, daemon_config(&url, &prefix, jobs))?;
        let mut child = std::process::Command::new(&daemon)
            .args(["run", "--config"])
            .arg(&config)
            .env("RUST_LOG", "error")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()?;
        let m = idle_of(child.id(), jobs, measure);
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let status = child.wait()?;
        clean(&url, &prefix);
        anyhow::ensure!(status.success(), "`solocron run` with {jobs} idle jobs exited with {status}");
        rows.push(m.row("`solocron run`, command jobs in its configuration", jobs));
    } else {
        let mut row = vec![format!("`solocron run`: not measured ({} not built)", daemon.display()), jobs.to_string()];
        row.resize(7, "—".into());
        rows.push(row);
    }
    Ok(format!(
        "## 4. Idle cost (after start-up settles; CPU over {measure} s scaled to a minute, 10 ms resolution; RSS then, and peak including start-up)\n\n{}",
        table(&["process", "jobs", "start-up settled after", "CPU per minute", "RSS", "peak RSS", "target"], &rows)
    ))
}

/// A schedule whose next fire is far away: idle jobs.
const FAR: &str = "0 0 0 1 1 *";

/// How long start-up (migration, registering every definition) may take before idle is
/// measured anyway.
fn settle_max(jobs: usize) -> u64 {
    10 + (jobs / 1000) as u64
}

/// What an idle process cost.
struct Idle {
    settled: Duration,
    cpu_per_min_ms: f64,
    rss_mib: f64,
    peak_mib: f64,
}

impl Idle {
    fn row(&self, process: &str, jobs: usize) -> Vec<String> {
        vec![
            process.to_owned(),
            jobs.to_string(),
            format!("{:.1} s", self.settled.as_secs_f64()),
            format!("{} ms", fmt(self.cpu_per_min_ms)),
            format!("{} MiB", fmt(self.rss_mib)),
            format!("{} MiB", fmt(self.peak_mib)),
            "≤ 50 ms CPU/min; ≤ 20 MiB (10,000 jobs)".into(),
        ]
    }
}

/// Watches process `pid` of `jobs` idle jobs: start-up is not idle, so the measurement
/// begins once a whole second passed with under 2% of a core used (within a bound), then
/// lasts `measure` seconds.
fn idle_of(pid: u32, jobs: usize, measure: u64) -> Idle {
    let launched = Instant::now();
    let mut last = cpu_ms(pid);
    loop {
        std::thread::sleep(Duration::from_secs(1));
        let now = cpu_ms(pid);
        if now - last < 20 || launched.elapsed() >= Duration::from_secs(settle_max(jobs)) {
            break;
        }
        last = now;
    }
    let settled = launched.elapsed();
    let cpu0 = cpu_ms(pid);
    std::thread::sleep(Duration::from_secs(measure));
    let cpu1 = cpu_ms(pid);
    Idle {
        settled,
        cpu_per_min_ms: (cpu1 - cpu0) as f64 * 60.0 / measure as f64,
        rss_mib: rss_kb(pid, "VmRSS") as f64 / 1024.0,
        peak_mib: rss_kb(pid, "VmHWM") as f64 / 1024.0,
    }
}

/// A daemon's configuration with `jobs` idle command jobs on `url` under `prefix`.
fn daemon_config(url: &str, prefix: &Prefix, jobs: usize) -> String {
    let mut s = format!("[store]\nurl = {url:?}\nprefix = {:?}\n[node]\nid = \"idle-daemon\"\n", prefix.as_str());
    for i in 0..jobs {
        s += &format!("[[jobs]]\nname = \"job-{i:06}\"\nschedule = {FAR:?}\ncommand = [\"/bin/true\"]\n");
    }
    s
}
