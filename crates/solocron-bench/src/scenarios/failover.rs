//! Scenario 5, failover: the holder of a running job killed; how long until another node
//! starts its retry.

use std::sync::mpsc;
use std::time::Duration;

use chrono::Utc;

use super::{node_args, Ctx};
use crate::fleet::{fresh, instant_in, once_at, reports, spawn, Proc};
use crate::raw::cleanup;
use crate::stats::{mmm, table};

/// 5. Failover: SIGKILL the node running a job (retry, lease 3 s); time until the retry starts.
pub fn failover(c: &Ctx) -> anyhow::Result<String> {
    let mut took = vec![];
    for round in 0..c.rounds.min(3) {
        let (url, prefix) = fresh(&c.store, &c.dir, "failover");
        let at = instant_in(3);
        let (tx, rx) = mpsc::channel();
        let mut procs: Vec<_> = (0..3)
            .map(|n| {
                let mut a = node_args(c, &url, &prefix, &format!("f{round}n{n}"));
                a.mode = "sleep".into();
                a.schedule = once_at(at);
                a.lease_ms = 3000;
                a.retry = true;
                a.announce = true;
                a.seconds = 15;
                spawn(&a, Some(tx.clone()))
            })
            .collect();
        let first = rx.recv_timeout(Duration::from_secs(15))?;
        let holder = first.split_whitespace().nth(3).unwrap_or("").to_owned();
        let victim = procs.iter_mut().find(|p| p.id == holder).ok_or_else(|| anyhow::anyhow!("no node {holder}"))?;
        let killed = Utc::now().timestamp_millis();
        victim.child.kill()?;
        let second = rx.recv_timeout(Duration::from_secs(15))?;
        let f: Vec<&str> = second.split_whitespace().collect();
        anyhow::ensure!(f.get(2) == Some(&"2") && f.get(3) != Some(&holder.as_str()), "unexpected start: {second}");
        took.push((f[4].parse::<i64>()? - killed) as f64);
        procs.iter().for_each(Proc::stop);
        let _ = reports(procs, Duration::from_secs(20));
        let rt = tokio::runtime::Handle::current();
        std::thread::scope(|s| s.spawn(|| rt.block_on(cleanup(&url, &prefix))).join()).ok();
    }
    let rows = vec![vec![mmm(&took, " ms"), "≤ 4200 ms (lease + lease/3 + 200 ms)".into()]];
    Ok(format!(
        "## 5. Failover (3 nodes, lease 3 s, SIGKILL the holder)\n\n{}",
        table(&["SIGKILL → retry started", "target"], &rows)
    ))
}
