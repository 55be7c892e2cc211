//! CPU time from /proc: of a store's server processes over a window (found by name, as they
//! run as other users and come and go), and the server's CPU per raw insert-if-absent, the
//! baseline its CPU per tick is compared with.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use solocron_core::Prefix;

use crate::raw::Raw;

/// Linux reports /proc times in USER_HZ, which is 100 on every mainstream build: 10 ms
/// resolution, which is why the windows below last seconds.
const USER_HZ: u64 = 100;

/// The processes /proc lists at most that a sample reads (pid_max's default is 4 Mi; a
/// test machine runs a few hundred).
const PROCS_MAX: usize = 1 << 16;

/// The keys of one raw batch: a node claims about a second's ticks (1,000) per call.
pub const RAW_BATCH: usize = 1000;

/// Raw inserts one at a time, at most, per measurement (also bounded in time).
const RAW_SINGLE_MAX: usize = 100_000;

/// Raw batches of [`RAW_BATCH`], at most, per measurement (also bounded in time): 100,000
/// keys, some 10 MB in Redis until they are unlinked, as many revisions in etcd's history.
const RAW_BATCHES_MAX: usize = 100;

/// The command names (`/proc/PID/comm`) of the server processes of the store at `url`;
/// none for SQLite, which runs inside the node (its CPU is the node's).
pub fn server_names(url: &str) -> &'static [&'static str] {
    if url.starts_with("postgres") {
        // Every backend, the postmaster and its background workers keep the binary's name
        // (the process titles PostgreSQL sets change the command line, not `comm`).
        &["postgres", "postmaster"]
    } else if url.starts_with("mysql") || url.starts_with("mariadb") {
        &["mariadbd", "mysqld"]
    } else if url.starts_with("redis") {
        &["redis-server"]
    } else if url.starts_with("etcd") {
        &["etcd"]
    } else {
        &[]
    }
}

/// (utime + stime in clock ticks, start time in clock ticks since boot) from the text of
/// a /proc/PID/stat. The command name may hold spaces and parentheses: fields are counted
/// from the last `)`.
pub fn parse_stat(stat: &str) -> Option<(u64, u64)> {
    let f: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    // After the name, field 3 (state) is at index 0: utime (14), stime (15), starttime (22).
    let field = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok());
    Some((field(11)? + field(12)?, field(19)?))
}

/// Clock ticks to ms.
pub fn ticks_ms(ticks: u64) -> u64 {
    ticks * 1000 / USER_HZ
}

/// CPU ticks of every process named one of `names`, by (pid, start time): a pid reused by
/// a new process between two samples is another key.
#[derive(Debug, Default, Clone)]
pub struct Sample(pub HashMap<(u32, u64), u64>);

/// What a store's server used between two samples.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Usage {
    /// CPU ms of the processes alive at the second sample (those born in between counted
    /// from their start).
    pub ms: u64,
    /// Processes alive at both samples.
    pub kept: usize,
    /// Processes born between the samples (counted whole).
    pub born: usize,
    /// Processes gone by the second sample: their CPU since the first is missed.
    pub ended: usize,
}

impl Sample {
    /// Reads /proc now. A process that ends while it is read is left out.
    pub fn take(names: &[&str]) -> Sample {
        let mut out = Sample::default();
        let Ok(dir) = std::fs::read_dir("/proc") else { return out };
        for entry in dir.flatten().take(PROCS_MAX) {
            let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            if !names.contains(&comm.trim_end()) {
                continue;
            }
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            if let Some((ticks, start)) = parse_stat(&stat) {
                out.0.insert((pid, start), ticks);
            }
        }
        out
    }

    /// The CPU used from `earlier` to this sample.
    pub fn since(&self, earlier: &Sample) -> Usage {
        let mut u = Usage { ms: 0, kept: 0, born: 0, ended: 0 };
        let mut ticks = 0;
        for (key, now) in &self.0 {
            match earlier.0.get(key) {
                Some(then) => {
                    u.kept += 1;
                    ticks += now.saturating_sub(*then);
                }
                None => {
                    u.born += 1;
                    ticks += now;
                }
            }
        }
        u.ended = earlier.0.keys().filter(|k| !self.0.contains_key(k)).count();
        u.ms = ticks_ms(ticks);
        u
    }
}

/// The server's CPU per raw insert-if-absent: one at a time, then batched.
#[derive(Debug, Clone, Copy)]
pub struct RawCpu {
    /// Server CPU µs per insert, one round trip each.
    pub single_us: f64,
    /// Inserts made one at a time.
    pub single_ops: usize,
    /// Server CPU µs per insert, [`RAW_BATCH`] per statement or pipeline.
    pub batched_us: f64,
    /// Inserts made in batches.
    pub batched_ops: usize,
    /// PostgreSQL's write-ahead log per insert in batches, bytes (see [`wal_position`]);
    /// none on other stores.
    pub batched_wal: Option<f64>,
}

/// Where PostgreSQL's write-ahead log stands, in bytes since it began: what a window wrote
/// is the difference of two readings. Unlike CPU time on a shared machine, it does not
/// depend on what else runs there (only on what the server wrote, its background work
/// included).
pub async fn wal_position(pool: &sqlx::PgPool) -> anyhow::Result<u64> {
    let at: i64 = sqlx::query_scalar("SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint").fetch_one(pool).await?;
    Ok(u64::try_from(at)?)
}

/// Measures the raw insert-if-absent of the store at `url` in its own table or keys of
/// `prefix` (removed after): for at most `phase` (or [`RAW_SINGLE_MAX`]) one at a time, then
/// for at most `phase` (or [`RAW_BATCHES_MAX`] batches) in batches of [`RAW_BATCH`], the
/// server's CPU (the processes named `names`) read before and after each.
pub async fn raw_cpu(
    url: &str,
    prefix: &Prefix,
    names: &'static [&'static str],
    phase: Duration,
) -> anyhow::Result<RawCpu> {
    let raw = Raw::connect(url, prefix).await?;
    let measured = raw_phases(&raw, names, phase).await;
    let removed = raw.remove().await;
    let (out, keys) = measured?;
    raw.unlink(&keys).await?;
    removed?;
    Ok(out)
}

/// Both phases of [`raw_cpu`], and the keys they inserted.
async fn raw_phases(
    raw: &Raw,
    names: &'static [&'static str],
    phase: Duration,
) -> anyhow::Result<(RawCpu, Vec<String>)> {
    let mut keys = vec![];
    let before = Sample::take(names);
    let t0 = Instant::now();
    while keys.len() < RAW_SINGLE_MAX && t0.elapsed() < phase {
        let k = format!("s{}", keys.len());
        raw.insert(&k).await?;
        keys.push(k);
    }
    let single = Sample::take(names).since(&before);
    let single_ops = keys.len();
    let wal_pool = if let Raw::Postgres(pool, _) = raw { Some(pool) } else { None };
    let wal_before = match wal_pool {
        Some(pool) => Some(wal_position(pool).await?),
        None => None,
    };
    let before = Sample::take(names);
    let t0 = Instant::now();
    let mut batches = 0;
    while batches < RAW_BATCHES_MAX && t0.elapsed() < phase {
        let batch: Vec<String> = (0..RAW_BATCH).map(|i| format!("b{batches}-{i}")).collect();
        raw.insert_batch(&batch).await?;
        keys.extend(batch);
        batches += 1;
    }
    let batched = Sample::take(names).since(&before);
    let batched_ops = batches * RAW_BATCH;
    let batched_wal = match (wal_pool, wal_before) {
        (Some(pool), Some(from)) => {
            Some(wal_position(pool).await?.saturating_sub(from) as f64 / batched_ops.max(1) as f64)
        }
        _ => None,
    };
    let per_op = |ms: u64, ops: usize| ms as f64 * 1000.0 / ops.max(1) as f64;
    let out = RawCpu {
        single_us: per_op(single.ms, single_ops),
        single_ops,
        batched_us: per_op(batched.ms, batched_ops),
        batched_ops,
        batched_wal,
    };
    Ok((out, keys))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_line_is_read_after_the_last_parenthesis_of_the_name() {
        let stat = "42 (a) b (c)) S 1 42 42 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 3 0 12345 1000 10";
        assert_eq!(parse_stat(stat), Some((325, 12345)));
        assert_eq!(parse_stat("42 (truncated"), None);
        assert_eq!(ticks_ms(325), 3250);
    }

    #[test]
    fn usage_counts_newborns_whole_and_misses_the_ended_and_a_reused_pid_is_new() {
        let earlier = Sample([((1, 10), 100), ((2, 10), 50), ((3, 10), 7)].into_iter().collect());
        // Pid 1 went on (+20 ticks), pid 2 ended, pid 3 was reused by a process born later
        // (5 ticks since its birth), pid 4 was born (3 ticks).
        let later = Sample([((1, 10), 120), ((3, 99), 5), ((4, 99), 3)].into_iter().collect());
        assert_eq!(later.since(&earlier), Usage { ms: 280, kept: 1, born: 2, ended: 2 });
    }

    #[test]
    fn a_sample_finds_a_running_process_by_its_command_name() {
        let comm = std::fs::read_to_string("/proc/self/comm").unwrap();
        let me = Sample::take(&[comm.trim_end()]);
        assert!(me.0.keys().any(|(pid, _)| *pid == std::process::id()), "own process not found by `{comm}`");
        assert!(Sample::take(&["no-such-process-name"]).0.is_empty());
    }

    #[test]
    fn sqlite_has_no_server_and_each_server_store_its_names() {
        assert!(server_names("sqlite:///tmp/x.db").is_empty());
        assert_eq!(server_names("redis://127.0.0.1:6379"), ["redis-server"]);
        assert!(server_names("mariadb://root@127.0.0.1/test").contains(&"mariadbd"));
        assert!(server_names("postgres://postgres@127.0.0.1/test").contains(&"postgres"));
        assert_eq!(server_names("etcd://127.0.0.1:2379"), ["etcd"]);
    }
}
