//! The fleet the server shows: the store filled through its public steps only
//! (`register`, `heartbeat`, batched `claim`, `finish_all`), and the metrics a node's
//! engine records, in this process's recorder.

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use solocron_core::{
    ClaimMode, ClaimOutcome, ClaimRequest, Ending, JobDefinition, NodeBeat, RunEnd, RunState, Store, Tick, Trigger,
    CLAIM_BATCH_MAX, FINISH_BATCH_MAX,
};

use super::Filled;

/// Node ids that register every job (and send heartbeats).
pub(super) const NODES: usize = 3;
/// The records' ticks are spread over this many days before now.
pub(super) const HISTORY_DAYS: i64 = 30;
/// Each job's newest ticks, this many per job, are claimed to run and finished (succeeded,
/// some failed); older ticks are recorded skipped (`ClaimMode::Skip`), the cheapest record
/// a claim makes, so that a million records are written in minutes.
pub(super) const RUN_ROUNDS: usize = 10;
/// Every this many jobs, one has its newest run left `running` (the fleet's runs in progress).
const RUNNING_EVERY_JOBS: usize = 500;
/// The lease of a claimed run: longer than the scenario, so a run left running stays so.
const RUN_LEASE: Duration = Duration::from_secs(3600);

fn node(n: usize) -> String {
    format!("bench-node-{n}")
}

/// `job-0` … `job-{jobs-1}`, unpadded, so that a search for `job-77` matches 111 names.
pub(super) fn job(j: usize) -> String {
    format!("job-{j}")
}

/// Node `n`'s definitions of every job: a few schedule shapes and zones; every 1,000th job
/// defined differently by the last node (drift, as a fleet in a rolling deploy shows).
fn definitions(jobs: usize, n: usize) -> Vec<JobDefinition> {
    const ZONES: [&str; 3] = ["UTC", "Europe/Berlin", "America/New_York"];
    (0..jobs)
        .map(|j| {
            let schedule = match j % 4 {
                0 => format!("{} * * * *", j % 60),
                1 => format!("{} {} * * *", j % 60, j % 24),
                2 => "*/5 * * * *".to_owned(),
                _ => format!("0 {} * * 1-5", j % 24),
            };
            let drift = n == NODES - 1 && j.is_multiple_of(1000);
            JobDefinition {
                job: job(j),
                timezone: ZONES[j % ZONES.len()].to_owned(),
                definition_hash: format!("{:016x}", j as u64 * 0x9e37_79b9 + u64::from(drift)),
                summary: "lease 30s, overlap skip, misfire skip, catchup 0s, on_crash abandon".to_owned(),
                schedule,
            }
        })
        .collect()
}

/// Sends each node's heartbeat; the store's refusal (a store without heartbeats yet) is
/// returned as a note, not an error: the pages are still measured, with stale nodes.
pub(super) async fn beat(store: &dyn Store, jobs: usize) -> Option<String> {
    for n in 0..NODES {
        let b = NodeBeat { node: node(n), version: env!("CARGO_PKG_VERSION").into(), jobs: jobs as u32, running: 0 };
        if let Err(e) = store.heartbeat(&b).await {
            return Some(format!("no heartbeats (the store refused one: {e})"));
        }
    }
    None
}

/// Registers `jobs` jobs from [`NODES`] nodes, sends their heartbeats, and writes `rows`
/// run records (rows / jobs per job, spread over [`HISTORY_DAYS`]) through batched claims.
pub(super) async fn populate(store: &dyn Store, jobs: usize, rows: usize) -> anyhow::Result<Filled> {
    let started = Instant::now();
    for n in 0..NODES {
        store.register(&node(n), &definitions(jobs, n)).await?;
    }
    let heartbeat = beat(store, jobs).await;
    let per_job = (rows / jobs).max(1);
    let interval_s = HISTORY_DAYS * 86_400 / per_job as i64;
    let now = store.now().await?;
    let first = DateTime::from_timestamp(now.timestamp() - HISTORY_DAYS * 86_400, 0).expect("in range");
    let mut filled = Filled {
        records: 0,
        took: Duration::ZERO,
        claim_calls: 0,
        claims_took: Duration::ZERO,
        finish_calls: 0,
        finishes_took: Duration::ZERO,
        heartbeat,
    };
    for round in 0..per_job {
        let run = round + RUN_ROUNDS >= per_job;
        let newest = round + 1 == per_job;
        let ids: Vec<usize> = (0..jobs).collect();
        for chunk in ids.chunks(CLAIM_BATCH_MAX) {
            // Each job's ticks are `interval_s` apart; jobs are offset within the interval,
            // so that no two records share an instant (the runs page's cursor stays simple).
            let at = |j: usize| {
                first + chrono::Duration::seconds(round as i64 * interval_s + j as i64 * interval_s / jobs as i64)
            };
            let requests: Vec<ClaimRequest> = chunk.iter().map(|&j| claim_request(j, at(j), run)).collect();
            let endings = claim_batch(store, &requests, &mut filled).await?;
            let endings: Vec<Ending> = endings
                .into_iter()
                .filter(|e| !(newest && job_index(&e.lease.run.tick.job).is_multiple_of(RUNNING_EVERY_JOBS)))
                .collect();
            finish_batches(store, &endings, &mut filled).await?;
        }
    }
    filled.took = started.elapsed();
    Ok(filled)
}

fn job_index(name: &str) -> usize {
    name.trim_start_matches("job-").parse().expect("the benchmark's job names")
}

fn claim_request(j: usize, at: DateTime<Utc>, run: bool) -> ClaimRequest {
    ClaimRequest {
        tick: Tick::new(job(j), at),
        trigger: Trigger::Schedule,
        node: node(j % NODES),
        lease: RUN_LEASE,
        mode: if run {
            ClaimMode::Run { skip_if_running: false }
        } else {
            ClaimMode::Skip { reason: "missed (misfire = skip)".into() }
        },
        nonce: 0,
    }
}

/// One claim call; every tick is new, so each must be won (to run) or recorded skipped.
/// Returns the endings of the runs won (every 7th failed).
async fn claim_batch(store: &dyn Store, requests: &[ClaimRequest], filled: &mut Filled) -> anyhow::Result<Vec<Ending>> {
    let t0 = Instant::now();
    let outcomes = store.claim(requests).await?;
    filled.claims_took += t0.elapsed();
    filled.claim_calls += 1;
    anyhow::ensure!(
        outcomes.len() == requests.len(),
        "a claim of {} ticks answered {}",
        requests.len(),
        outcomes.len()
    );
    let mut endings = Vec::new();
    for (i, outcome) in outcomes.into_iter().enumerate() {
        match outcome {
            ClaimOutcome::Won(lease) => {
                let failed = i.is_multiple_of(7);
                let end = RunEnd {
                    state: if failed { RunState::Failed } else { RunState::Succeeded },
                    reason: failed.then(|| "exit code 1".to_owned()),
                    exit_code: Some(i32::from(failed)),
                    output: if failed { "error: upstream timed out\n" } else { "done\n" }.to_owned(),
                    started_after: Some(Duration::ZERO),
                };
                endings.push(Ending { lease, end });
            }
            ClaimOutcome::Skipped { .. } => {}
            ClaimOutcome::Taken => anyhow::bail!("tick {:?} of a fresh namespace was taken", requests[i].tick),
            ClaimOutcome::TooEarly { .. } => {
                anyhow::bail!("tick {:?} (in the past) was refused as early", requests[i].tick)
            }
        }
        filled.records += 1;
    }
    Ok(endings)
}

async fn finish_batches(store: &dyn Store, endings: &[Ending], filled: &mut Filled) -> anyhow::Result<()> {
    for batch in endings.chunks(FINISH_BATCH_MAX) {
        let t0 = Instant::now();
        let answers = store.finish_all(batch).await?;
        filled.finishes_took += t0.elapsed();
        filled.finish_calls += 1;
        anyhow::ensure!(answers.iter().all(|&a| a), "a run just won could not be finished");
    }
    Ok(())
}

/// Records what a node's engine records for each job, through the `metrics` facade under
/// the engine's own names (`solocron::metrics`; its recording functions are the crate's
/// own): a run's end (`tick_ended`: the ticks counter and the last success), and the node's
/// start lateness. With `every_series`, also every other series a job can have (12 per
/// job, the bound `solocron::metrics` states).
pub(super) fn record_metrics(jobs: usize, every_series: bool) {
    use solocron::metrics::*;
    describe();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    for j in 0..jobs {
        let name = job(j);
        if !every_series {
            metrics::counter!(TICKS_TOTAL, "job" => name.clone(), "outcome" => "succeeded").increment(100);
            metrics::gauge!(LAST_SUCCESS_TIMESTAMP_SECONDS, "job" => name).set(now.as_secs_f64());
            metrics::histogram!(START_LATENESS_SECONDS).record(0.002);
            continue;
        }
        for outcome in ["failed", "timed_out", "lost", "abandoned", "interrupted", "missed"] {
            metrics::counter!(TICKS_TOTAL, "job" => name.clone(), "outcome" => outcome).increment(1);
        }
        for reason in ["overlap", "paused", "other"] {
            metrics::counter!(TICKS_TOTAL, "job" => name.clone(), "outcome" => "skipped", "reason" => reason)
                .increment(1);
        }
        metrics::counter!(LEASES_LOST_TOTAL, "job" => name).increment(1);
    }
    metrics::gauge!(JOBS).set(jobs as f64);
    metrics::histogram!(CLAIM_ROUND_DURATION_SECONDS).record(0.003);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{JOBS, SEARCH};

    #[test]
    fn the_fleet_drifts_only_where_meant_and_the_search_matches_111_of_10000() {
        let first = definitions(JOBS, 0);
        let last = definitions(JOBS, NODES - 1);
        let drifted: Vec<&str> = first.iter().zip(&last).filter(|(a, b)| a != b).map(|(a, _)| a.job.as_str()).collect();
        assert_eq!(drifted.len(), JOBS / 1000);
        assert!(drifted.iter().all(|j| job_index(j).is_multiple_of(1000)), "{drifted:?}");
        for d in &first {
            solocron_core::Schedule::parse(&d.schedule, &d.timezone).expect("every benchmark schedule parses");
        }
        assert_eq!((0..JOBS).filter(|&j| job(j).contains(SEARCH)).count(), 111);
    }
}
