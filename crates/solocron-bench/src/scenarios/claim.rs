//! Scenario 1, claim overhead: a claim through solocron against the store's raw
//! insert-if-absent.

use std::time::{Duration, Instant};

use chrono::Utc;
use solocron_core::{ClaimMode, ClaimRequest, Tick, Trigger};

use super::Ctx;
use crate::fleet::fresh;
use crate::raw::{cleanup, Raw};
use crate::stats::{mmm, quantile, table};

/// 1. Time per claim through solocron vs the store's raw insert-if-absent, interleaved.
///
/// Two kinds of claim, each of one of 10 jobs whose earlier runs have ended (every run won
/// is finished right after its claim, outside the timing): what a job with the default
/// policy sends (`overlap = skip`: the store also looks for a running run of the job), and
/// one with `overlap = allow` (no such look).
pub async fn claim_overhead(c: &Ctx) -> anyhow::Result<String> {
    let (url, prefix) = fresh(&c.store, &c.dir, "claim");
    let store = solocron_stores::open(&url, &prefix).await?;
    store.migrate().await?;
    let raw = Raw::connect(&url, &prefix).await?;
    let ops = if c.quick { 50 } else { 1000 };
    assert!(
        solocron_core::JobPolicy::default().overlap == solocron_core::Overlap::Skip,
        "the default is measured first"
    );
    let end = solocron_core::RunEnd {
        state: solocron_core::RunState::Succeeded,
        reason: None,
        exit_code: Some(0),
        output: String::new(),
        started_after: Some(Duration::ZERO),
    };
    // Per round: the medians of the raw insert, the default claim and the allow claim.
    let mut medians: [Vec<f64>; 3] = Default::default();
    // Every tick in the past: a scheduled claim of a future one is refused as too early.
    let base = Utc::now() - chrono::Duration::seconds((c.rounds * ops) as i64 + 3600);
    for r in 0..c.rounds {
        let mut times: [Vec<f64>; 3] = Default::default();
        for i in 0..ops {
            let t0 = Instant::now();
            raw.insert(&format!("r{r}-{i}")).await?;
            times[0].push(t0.elapsed().as_secs_f64() * 1e6);
            for (k, skip_if_running) in [(1, true), (2, false)] {
                let req = ClaimRequest {
                    tick: Tick::new(
                        format!("job{k}-{}", i % 10),
                        base + chrono::Duration::seconds((r * ops + i) as i64),
                    ),
                    trigger: Trigger::Schedule,
                    node: "bench".into(),
                    lease: Duration::from_secs(30),
                    mode: ClaimMode::Run { skip_if_running },
                    // As the engine asks: every request carries a nonce.
                    nonce: (r * ops + i) as u64 + 1,
                };
                let t0 = Instant::now();
                let outcome = store.claim(&[req]).await?.remove(0);
                times[k].push(t0.elapsed().as_secs_f64() * 1e6);
                let solocron_core::ClaimOutcome::Won(lease) = outcome else {
                    anyhow::bail!(
                        "claim {i} of round {r} was not won: {outcome:?} (each claims a new tick of an idle job)"
                    );
                };
                anyhow::ensure!(store.finish(&lease, &end).await?, "the run just won could not be finished");
            }
        }
        for (m, t) in medians.iter_mut().zip(&times) {
            m.push(quantile(t, 0.5));
        }
    }
    raw.remove().await?;
    cleanup(&url, &prefix).await;
    Ok(claim_section(c.rounds, ops, &medians))
}

/// Scenario 1's table from the per-round medians of the raw insert, the default claim and
/// the `overlap = allow` claim.
fn claim_section(rounds: usize, ops: usize, medians: &[Vec<f64>; 3]) -> String {
    let ratio = |k: usize| -> Vec<f64> { medians[k].iter().zip(&medians[0]).map(|(s, r)| s / r).collect() };
    let rows = vec![vec![
        mmm(&medians[0], " µs"),
        mmm(&medians[1], " µs"),
        mmm(&ratio(1), ""),
        mmm(&medians[2], " µs"),
        mmm(&ratio(2), ""),
        "≤ 1.25".into(),
    ]];
    format!(
        "## 1. Claim overhead ({rounds} rounds × {ops} of each, interleaved; per-round medians; runs finished between claims)\n\n{}",
        table(
            &[
                "raw insert-if-absent",
                "claim, default policy (overlap = skip)",
                "default / raw",
                "claim, overlap = allow",
                "allow / raw",
                "target",
            ],
            &rows
        )
    )
}
