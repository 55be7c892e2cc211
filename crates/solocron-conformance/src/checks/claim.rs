//! Claims: one winner per tick, batches answered in order, fencing tokens, misfire
//! bookkeeping and overlap.

use std::collections::HashMap;

use solocron_core::{ClaimOutcome, ClaimRequest, Lease, RecoverAction, RecoverOutcome, RunState, Tick, Trigger};

use super::support::{
    all, assert_between, claim, ended, find, first, now, race, run, skip, stores, succeeded, tick, timing, won, Handle,
    LENGTH_SLACK, LONG_LEASE,
};
use crate::StoreFactory;

/// How many separate stores race for the same ticks.
const CLAIMERS: usize = 8;

/// Eight separate stores claiming the same tick at the same instant: exactly one wins, the
/// others find it taken; then the same with batches of three ticks listed in a different
/// order by each claimer (nodes whose configurations list jobs differently).
pub async fn exactly_one_of_many_concurrent_claimers_wins_each_tick(f: &impl StoreFactory) {
    let stores = stores(f, CLAIMERS).await;
    let outcomes = race(&stores, |i, store| async move {
        store.claim(&[run(tick("backup", 0), &format!("node-{i}"), LONG_LEASE, false)]).await.expect("claim")
    })
    .await;
    let winners = winners_by_tick(&outcomes.concat());
    assert_eq!(winners.len(), 1, "exactly one winner: {outcomes:?}");
    let records = all(&stores[0]).await;
    assert_eq!(records.len(), 1, "one record of the tick: {records:?}");
    let lease = &winners[&tick("backup", 0)];
    assert_eq!((records[0].state, records[0].fencing_token), (RunState::Running, Some(lease.fencing_token)));
    assert_eq!(records[0].node, lease.owner);

    let ticks = [tick("backup", 1), tick("report", 1), tick("sync", 1)];
    let outcomes = race(&stores, |i, store| {
        let ticks = ticks.clone();
        async move {
            let mut batch: Vec<ClaimRequest> =
                ticks.iter().map(|t| run(t.clone(), &format!("node-{i}"), LONG_LEASE, false)).collect();
            batch.rotate_left(i % 3);
            let outcomes = store.claim(&batch).await.expect("claim");
            assert_in_request_order(&batch, &outcomes);
            outcomes
        }
    })
    .await;
    let winners = winners_by_tick(&outcomes.concat());
    assert_eq!(winners.len(), 3, "one winner per tick: {outcomes:?}");
    assert_eq!(all(&stores[0]).await.len(), 4);
}

/// The winning lease of each tick; panics if a tick has two winners.
fn winners_by_tick(outcomes: &[ClaimOutcome]) -> HashMap<Tick, Lease> {
    let mut winners = HashMap::new();
    for outcome in outcomes {
        match outcome {
            ClaimOutcome::Won(lease) => {
                let earlier = winners.insert(lease.run.tick.clone(), lease.clone());
                assert!(earlier.is_none(), "{} won twice: {earlier:?} and {lease:?}", lease.run);
            }
            ClaimOutcome::Taken => {}
            other => panic!("nothing asked to skip: {other:?}"),
        }
    }
    winners
}

/// Asserts there is one outcome per request and each win names its own request's tick.
fn assert_in_request_order(batch: &[ClaimRequest], outcomes: &[ClaimOutcome]) {
    assert_eq!(outcomes.len(), batch.len(), "one outcome per request: {outcomes:?}");
    for (request, outcome) in batch.iter().zip(outcomes) {
        if let ClaimOutcome::Won(lease) = outcome {
            assert_eq!(lease.run, first(request.tick.clone()), "outcomes out of request order: {outcomes:?}");
            assert_eq!(lease.owner, request.node);
        }
    }
}

/// A batch gets one outcome per request, in request order, each request seeing the effect
/// of the earlier ones: a duplicate tick is taken, a second tick of the same job is won
/// with a larger token, an overlap check sees the batch's own running runs.
pub async fn a_batch_claim_answers_each_request_in_request_order(f: &impl StoreFactory) {
    let store = f.open().await;
    let batch = vec![
        run(tick("backup", 0), "a", LONG_LEASE, false),
        skip(tick("report", 0), "a", "missed"),
        run(tick("backup", 0), "a", LONG_LEASE, false),
        run(tick("sync", 0), "a", LONG_LEASE, false),
        run(tick("backup", 1), "a", LONG_LEASE, false),
        run(tick("backup", 2), "a", LONG_LEASE, true),
    ];
    let outcomes = store.claim(&batch).await.expect("claim");
    assert_in_request_order(&batch, &outcomes);
    let [ClaimOutcome::Won(b0), skipped, taken, ClaimOutcome::Won(s0), ClaimOutcome::Won(b1), overlap] = &outcomes[..]
    else {
        panic!("expected Won, Skipped, Taken, Won, Won, Skipped; got {outcomes:?}")
    };
    assert_eq!(*skipped, ClaimOutcome::Skipped { reason: "missed".into() });
    assert_eq!(*taken, ClaimOutcome::Taken, "the batch's own earlier claim holds the tick");
    assert!(b1.fencing_token > b0.fencing_token, "{b0:?} then {b1:?}");
    assert_eq!(s0.owner, "a");
    assert!(b0.lease_until >= b0.claimed_at + chrono::Duration::seconds(60), "{b0:?}");
    assert_overlap_reason(overlap);

    let again = store.claim(&batch).await.expect("claim");
    assert_eq!(again, vec![ClaimOutcome::Taken; batch.len()], "every tick of the batch has a record");
    assert_eq!(all(&store).await.len(), 5);
    assert!(store.claim(&[]).await.expect("empty claim").is_empty());
}

/// Asserts an outcome is an overlap skip naming some run of `backup`.
fn assert_overlap_reason(outcome: &ClaimOutcome) {
    let ClaimOutcome::Skipped { reason } = outcome else { panic!("expected an overlap skip, got {outcome:?}") };
    assert!(reason.starts_with("overlap: previous run backup@") && reason.ends_with(" still running"), "{reason}");
}

/// Fencing tokens grow strictly per job across claims by different nodes, a crash retry
/// and the pruning of the records that held earlier tokens, and another job's claims in
/// between change nothing to that. Tokens need not be dense: the contract is "larger than
/// every earlier token of the job" (MySQL leaves gaps for lost claims; Redis floors its
/// tokens at its clock in microseconds).
pub async fn fencing_tokens_strictly_increase_per_job_across_claims_and_recoveries(f: &impl StoreFactory) {
    let t = timing(f);
    let [a, b] = <[Handle; 2]>::try_from(stores(f, 2).await).ok().expect("two stores");
    let first = won(&a, run(tick("backup", 0), "a", LONG_LEASE, false)).await;
    assert!(a.finish(&first, &succeeded("")).await.expect("finish"));
    let sync_first = won(&a, run(tick("sync", 0), "a", LONG_LEASE, false)).await;
    let second = won(&b, run(tick("backup", 1), "b", t.short, false)).await;

    tokio::time::sleep(t.past).await;
    let retry = RecoverAction::Retry { node: "a".into(), lease: LONG_LEASE };
    let RecoverOutcome::Retried(retried) = a.recover(&second.run, &retry).await.expect("recover") else {
        panic!("the expired run should be retried")
    };
    let third = won(&b, run(tick("backup", 2), "b", LONG_LEASE, false)).await;
    assert!(b.finish(&third, &succeeded("")).await.expect("finish"));
    // Tokens live in their own counter: deleting every ended record must not reset it.
    b.prune(std::time::Duration::ZERO, 1000, &solocron_core::Namespaces::ALL).await.expect("prune");
    assert!(all(&a).await.iter().all(|r| r.state == RunState::Running), "prune left only running runs");
    let fourth = won(&a, run(tick("backup", 3), "a", LONG_LEASE, false)).await;

    let tokens = [first.fencing_token, second.fencing_token, retried.fencing_token, third.fencing_token];
    let tokens = [&tokens[..], &[fourth.fencing_token]].concat();
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "backup's tokens: {tokens:?}");
    assert_eq!(find(&a, &retried.run).await.fencing_token, Some(retried.fencing_token));
    let sync_next = won(&b, run(tick("sync", 1), "b", LONG_LEASE, false)).await;
    assert!(sync_next.fencing_token > sync_first.fencing_token, "sync's tokens: {sync_first:?} then {sync_next:?}");
}

/// A misfire skip records the tick `skipped` with its reason and trigger (no token, no
/// lease, ended when claimed) only if the tick has no record; otherwise it is `Taken` and
/// the existing record is untouched.
pub async fn a_skip_claim_records_the_tick_skipped_with_its_reason_only_if_absent(f: &impl StoreFactory) {
    let store = f.open().await;
    let outcome = claim(&store, skip(tick("report", 0), "a", "missed by 2h")).await;
    assert_eq!(outcome, ClaimOutcome::Skipped { reason: "missed by 2h".into() });
    let record = find(&store, &first(tick("report", 0))).await;
    assert_eq!((record.state, record.trigger, record.node.as_str()), (RunState::Skipped, Trigger::Catchup, "a"));
    assert_eq!(record.reason.as_deref(), Some("missed by 2h"));
    assert_eq!((record.fencing_token, record.lease_until, record.started_at), (None, None, None));
    let finished_at = record.finished_at.expect("a skipped record is ended");
    assert_between(finished_at, record.claimed_at, record.claimed_at + LENGTH_SLACK, "finished when claimed");

    assert_eq!(claim(&store, skip(tick("report", 0), "b", "other reason")).await, ClaimOutcome::Taken);
    assert_eq!(claim(&store, run(tick("report", 0), "b", LONG_LEASE, false)).await, ClaimOutcome::Taken);
    assert_eq!(find(&store, &first(tick("report", 0))).await, record, "the first record stands");

    let lease = won(&store, run(tick("report", 1), "a", LONG_LEASE, false)).await;
    assert_eq!(claim(&store, skip(tick("report", 1), "b", "missed")).await, ClaimOutcome::Taken);
    let running = find(&store, &lease.run).await;
    assert_eq!((running.state, running.reason), (RunState::Running, None), "a skip never overwrites a run");
    assert_eq!(all(&store).await.len(), 2);
}

/// With `skip_if_running`, a tick is recorded skipped (naming the running run) while any
/// run of the same job is `running`, even one whose lease expired, and runs once all ended.
pub async fn overlap_skips_while_any_run_of_the_job_is_running_even_expired(f: &impl StoreFactory) {
    let t = timing(f);
    let store = f.open().await;
    let first_run = won(&store, run(tick("backup", 0), "a", t.short, false)).await;
    let outcome = claim(&store, run(tick("backup", 1), "b", LONG_LEASE, true)).await;
    let expected = format!("overlap: previous run {} still running", first_run.run);
    assert_eq!(outcome, ClaimOutcome::Skipped { reason: expected.clone() });
    let skipped = find(&store, &first(tick("backup", 1))).await;
    assert_eq!((skipped.state, skipped.reason, skipped.node), (RunState::Skipped, Some(expected), "b".into()));
    assert_eq!((skipped.fencing_token, skipped.trigger), (None, Trigger::Schedule));

    // Overlap looks at the same job only, and only when asked to.
    won(&store, run(tick("sync", 1), "b", LONG_LEASE, true)).await;
    let second_run = won(&store, run(tick("backup", 2), "b", t.short, false)).await;

    // An expired run awaiting recovery still blocks: nobody can say it stopped.
    tokio::time::sleep(t.past).await;
    assert_overlap_reason(&claim(&store, run(tick("backup", 3), "b", LONG_LEASE, true)).await);
    let abandon = RecoverAction::Abandon { reason: "owner vanished".into() };
    assert_eq!(store.recover(&first_run.run, &abandon).await.expect("recover"), RecoverOutcome::Abandoned);
    let outcome = claim(&store, run(tick("backup", 4), "b", LONG_LEASE, true)).await;
    let expected = format!("overlap: previous run {} still running", second_run.run);
    assert_eq!(outcome, ClaimOutcome::Skipped { reason: expected }, "one running run is enough to skip");

    assert!(store.finish(&second_run, &succeeded("")).await.expect("finish"), "a lapsed run may still finish");
    won(&store, run(tick("backup", 5), "b", LONG_LEASE, true)).await;
}

/// In one batch of many jobs (more than a store may look at together), an overlap check
/// sees the runs that were running before the batch and those the batch itself started
/// earlier, wherever they sit in it; the other jobs' ticks run.
pub async fn a_batch_claim_checks_overlap_against_runs_from_before_and_from_the_batch(f: &impl StoreFactory) {
    let store = f.open().await;
    let job = |i: usize| format!("job-{i:03}");
    let before = won(&store, run(tick(&job(150), 0), "a", LONG_LEASE, false)).await;
    // 250 jobs' ticks at second 1, then job 7's and job 240's ticks at second 2.
    let mut batch: Vec<ClaimRequest> = (0..250).map(|i| run(tick(&job(i), 1), "b", LONG_LEASE, true)).collect();
    batch.push(run(tick(&job(7), 2), "b", LONG_LEASE, true));
    batch.insert(3, run(tick(&job(240), 2), "b", LONG_LEASE, true));
    let outcomes = store.claim(&batch).await.expect("claim");
    // Job 240's tick at minute 2 comes before its tick at minute 1 in the batch: it runs,
    // and the later one is the overlap.
    let overlapped_in_batch = [tick(&job(7), 2), tick(&job(240), 1)];
    let won_in_batch = |name: &str| {
        batch.iter().zip(&outcomes).find_map(|(r, o)| match o {
            ClaimOutcome::Won(lease) if r.tick.job == name => Some(lease.run.clone()),
            _ => None,
        })
    };
    for (request, outcome) in batch.iter().zip(&outcomes) {
        let name = request.tick.job.as_str();
        let previous = if name == job(150) {
            Some(before.run.clone())
        } else if overlapped_in_batch.contains(&request.tick) {
            Some(won_in_batch(name).expect("the job's other tick of the batch ran"))
        } else {
            None
        };
        match (previous, outcome) {
            (Some(previous), ClaimOutcome::Skipped { reason }) => {
                assert_eq!(reason, &format!("overlap: previous run {previous} still running"), "{:?}", request.tick);
            }
            (None, ClaimOutcome::Won(lease)) => assert_eq!(lease.run.tick, request.tick),
            (previous, other) => panic!("{:?} (previous run {previous:?}): {other:?}", request.tick),
        }
    }
}

/// A batch in which every job appears once (a node's batch of an instant) answers every
/// kind of request as a claim of that request alone would: a free tick is won; a taken
/// tick is taken, also for a skip; a paused job's tick is skipped naming the pause, but a
/// manual run of it wins; a tick of a job with a run from before is skipped for overlap;
/// a skip is recorded; a scheduled tick too far ahead is refused (stores with a clock);
/// a claim asked again with its nonce is won again with its first token.
pub async fn a_batch_of_distinct_jobs_answers_every_kind_of_request_as_one_claim_would(f: &impl StoreFactory) {
    let store = f.open().await;
    let taken = won(&store, run(tick("taken", 0), "a", LONG_LEASE, false)).await;
    won(&store, run(tick("taken-skip", 0), "a", LONG_LEASE, false)).await;
    let running = won(&store, run(tick("overlap", 0), "a", LONG_LEASE, false)).await;
    let asked = ClaimRequest { nonce: 7, ..run(tick("nonce", 0), "a", LONG_LEASE, false) };
    let first_grant = won(&store, asked.clone()).await;
    store.set_paused("paused", true, "ann", Some("disk")).await.expect("pause");
    store.set_paused("manual", true, "ann", None).await.expect("pause");
    let far = Tick::new("early", now(&store).await + chrono::Duration::seconds(60));
    let far =
        Tick::new("early", chrono::DateTime::from_timestamp_millis(far.scheduled_at.timestamp_millis()).expect("ms"));
    let batch = vec![
        run(tick("free-a", 1), "b", LONG_LEASE, true),
        run(tick("taken", 0), "b", LONG_LEASE, true),
        skip(tick("taken-skip", 0), "b", "missed"),
        run(tick("paused", 1), "b", LONG_LEASE, true),
        ClaimRequest { trigger: Trigger::Manual, ..run(tick("manual", 1), "b", LONG_LEASE, true) },
        run(tick("overlap", 1), "b", LONG_LEASE, true),
        skip(tick("skipped", 1), "b", "missed by 2h"),
        run(far.clone(), "b", LONG_LEASE, true),
        asked.clone(),
        run(tick("free-b", 1), "b", LONG_LEASE, false),
    ];
    let outcomes = store.claim(&batch).await.expect("claim");
    assert_in_request_order(&batch, &outcomes);
    let [free_a, taken_o, taken_skip, paused, manual, overlap, skipped, early, again, free_b] = &outcomes[..] else {
        panic!("one outcome per request: {outcomes:?}")
    };
    assert!(matches!(free_a, ClaimOutcome::Won(_)) && matches!(free_b, ClaimOutcome::Won(_)), "{outcomes:?}");
    assert_eq!((taken_o, taken_skip), (&ClaimOutcome::Taken, &ClaimOutcome::Taken));
    assert_eq!(*paused, ClaimOutcome::Skipped { reason: "paused by ann: disk".into() });
    assert!(matches!(manual, ClaimOutcome::Won(_)), "a manual run ignores the pause: {manual:?}");
    let expected = format!("overlap: previous run {} still running", running.run);
    assert_eq!(*overlap, ClaimOutcome::Skipped { reason: expected });
    assert_eq!(*skipped, ClaimOutcome::Skipped { reason: "missed by 2h".into() });
    if f.has_clock() {
        assert!(matches!(early, ClaimOutcome::TooEarly { .. }), "{early:?}");
        assert!(all(&store).await.iter().all(|r| r.id.tick != far), "a refused tick has no record");
    } else {
        assert!(matches!(early, ClaimOutcome::Won(_)), "{early:?}");
    }
    let ClaimOutcome::Won(again) = again else { panic!("asked again with its nonce: {again:?}") };
    assert_eq!((&again.run, again.fencing_token), (&first_grant.run, first_grant.fencing_token));
    assert_eq!(find(&store, &taken.run).await.node, "a", "the taken tick's record stands");
}

/// A claim whose answer was lost, asked again with the same nonce by the same node, is won
/// again while its record is still that claim's `running` attempt: the same run and token,
/// the first `claimed_at`, a lease from the store's now (even after the first one lapsed,
/// as long as nobody recovered the run), in a batch beside other ticks. Everything else
/// finds the tick taken: another nonce, no nonce, another node, a skip claim, and the same
/// nonce once the run ended or was recovered.
pub async fn a_claim_asked_again_with_its_nonce_is_won_again_only_while_its_run_is_untouched(f: &impl StoreFactory) {
    let t = timing(f);
    let stores = stores(f, 2).await;
    let (store, other) = (&stores[0], &stores[1]);
    let with_nonce = |tick: Tick, node: &str, nonce: u64, lease| ClaimRequest { nonce, ..run(tick, node, lease, true) };

    let first_lease = won(store, with_nonce(tick("backup", 0), "a", 7, t.short)).await;
    let before = store.now().await.expect("now");
    let batch = [with_nonce(tick("backup", 0), "a", 7, LONG_LEASE), with_nonce(tick("backup", 1), "a", 8, LONG_LEASE)];
    let outcomes = store.claim(&batch).await.expect("claim");
    let ClaimOutcome::Won(again) = &outcomes[0] else { panic!("asked again with its nonce: {outcomes:?}") };
    assert_eq!((&again.run, &again.owner), (&first_lease.run, &first_lease.owner));
    assert_eq!(again.fencing_token, first_lease.fencing_token, "the same attempt keeps its token");
    assert_eq!(again.claimed_at, first_lease.claimed_at, "the first claim's instant stays");
    assert_between(
        again.lease_until - chrono::Duration::from_std(LONG_LEASE).expect("small"),
        before,
        now(store).await,
        "a fresh lease",
    );
    assert!(matches!(&outcomes[1], ClaimOutcome::Skipped { reason } if reason.starts_with("overlap")), "{outcomes:?}");
    let record = find(store, &first_lease.run).await;
    assert_eq!(
        (record.state, record.lease_until, record.fencing_token),
        (RunState::Running, Some(again.lease_until), Some(again.fencing_token))
    );
    assert_eq!(all(store).await.iter().filter(|r| r.id.tick == tick("backup", 0)).count(), 1, "no second record");

    for (request, what) in [
        (with_nonce(tick("backup", 0), "a", 9, LONG_LEASE), "another nonce"),
        (with_nonce(tick("backup", 0), "a", 0, LONG_LEASE), "no nonce"),
        (with_nonce(tick("backup", 0), "b", 7, LONG_LEASE), "another node"),
        (ClaimRequest { nonce: 7, ..skip(tick("backup", 0), "a", "missed") }, "a skip claim"),
    ] {
        assert_eq!(claim(other, request).await, ClaimOutcome::Taken, "{what}");
    }
    assert_eq!(
        find(store, &first_lease.run).await.lease_until,
        Some(again.lease_until),
        "a taken claim changes nothing"
    );
    assert!(store.finish(again, &succeeded("once")).await.expect("finish"));
    assert_eq!(claim(store, with_nonce(tick("backup", 0), "a", 7, LONG_LEASE)).await, ClaimOutcome::Taken, "ended");

    // A lapsed lease nobody recovered is granted again; once recovered, it is not.
    let lapsed = won(store, with_nonce(tick("report", 0), "a", 11, t.short)).await;
    tokio::time::sleep(t.past).await;
    let ClaimOutcome::Won(renewed) = claim(other, with_nonce(tick("report", 0), "a", 11, t.short)).await else {
        panic!("a lapsed claim nobody recovered is granted again");
    };
    assert_eq!(renewed.fencing_token, lapsed.fencing_token);
    let early = store.recover(&lapsed.run, &RecoverAction::Abandon { reason: "x".into() }).await.expect("recover");
    assert_eq!(early, RecoverOutcome::NotNeeded, "the lease granted again is live");
    tokio::time::sleep(t.past).await;
    let retry = RecoverAction::Retry { node: "b".into(), lease: LONG_LEASE };
    let RecoverOutcome::Retried(attempt_2) = store.recover(&lapsed.run, &retry).await.expect("recover") else {
        panic!("the lapsed run is retried");
    };
    assert_eq!(
        claim(store, with_nonce(tick("report", 0), "a", 11, LONG_LEASE)).await,
        ClaimOutcome::Taken,
        "recovered"
    );
    assert!(store.finish(&attempt_2, &succeeded("retried")).await.expect("finish"), "the job is idle again");
    let abandoned = won(store, with_nonce(tick("report", 1), "a", 12, t.short)).await;
    tokio::time::sleep(t.past).await;
    let abandon = RecoverAction::Abandon { reason: "owner vanished".into() };
    assert_eq!(store.recover(&abandoned.run, &abandon).await.expect("recover"), RecoverOutcome::Abandoned);
    assert_eq!(
        claim(store, with_nonce(tick("report", 1), "a", 12, LONG_LEASE)).await,
        ClaimOutcome::Taken,
        "abandoned"
    );
}

/// A scheduled claim for a tick more than `CLAIM_EARLY_MAX` ahead of the store's clock is
/// refused with the store's now (a node whose clock runs fast), alone and inside a batch
/// whose other requests are decided as usual, and writes nothing: the tick is won later by
/// whoever claims it in time. A tick within the bound is won; so is a manual or catch-up
/// request, whatever its instant (the store chose a manual tick's instant, and catch-ups
/// are of past ticks). A store without a clock (etcd) refuses nothing.
pub async fn a_scheduled_claim_too_far_ahead_of_the_store_clock_is_refused_and_writes_nothing(f: &impl StoreFactory) {
    use solocron_core::CLAIM_EARLY_MAX;
    let store = &stores(f, 1).await[0];
    let before = now(store).await;
    // Whole milliseconds, as every store keeps instants.
    let at = |ahead_ms: i64| {
        let t = before + chrono::Duration::milliseconds(ahead_ms);
        chrono::DateTime::from_timestamp_millis(t.timestamp_millis()).expect("in range")
    };
    let far = Tick::new("early", at(5_000));
    let outcome = claim(store, run(far.clone(), "fast", LONG_LEASE, false)).await;
    let after = now(store).await;
    if !f.has_clock() {
        assert!(matches!(outcome, ClaimOutcome::Won(_)), "a store without a clock refuses nothing: {outcome:?}");
        return;
    }
    let ClaimOutcome::TooEarly { store_now } = outcome else {
        panic!("a tick 5 s ahead must be refused as too early, got {outcome:?}")
    };
    assert_between(store_now, before, after, "the refusal's store_now");
    assert!(all(store).await.is_empty(), "a refused claim wrote a record");

    let margin = CLAIM_EARLY_MAX.as_millis() as i64;
    let near = Tick::new("early", at(margin / 4));
    let manual =
        ClaimRequest { trigger: Trigger::Manual, ..run(Tick::new("manual", at(5_000)), "fast", LONG_LEASE, false) };
    let batch = [
        run(far.clone(), "fast", LONG_LEASE, false),
        run(near.clone(), "fast", LONG_LEASE, false),
        manual,
        run(tick("past", 0), "fast", LONG_LEASE, false),
    ];
    let outcomes = store.claim(&batch).await.expect("claim");
    assert!(matches!(outcomes[0], ClaimOutcome::TooEarly { .. }), "{outcomes:?}");
    for (k, o) in outcomes.iter().enumerate().skip(1) {
        assert!(matches!(o, ClaimOutcome::Won(_)), "request {k} of the batch: {o:?}");
    }
    let ids: Vec<Tick> = all(store).await.into_iter().map(|r| r.id.tick).collect();
    assert_eq!(ids.len(), 3, "three records, none of the refused tick: {ids:?}");
    assert!(!ids.contains(&far));

    // In time, the refused tick is claimed like any other.
    let in_time = (far.scheduled_at - now(store).await - chrono::Duration::milliseconds(margin / 4)).to_std();
    tokio::time::sleep(in_time.unwrap_or_default()).await;
    assert!(matches!(claim(store, run(far, "fast", LONG_LEASE, false)).await, ClaimOutcome::Won(_)));
}

/// `taken_ticks` answers exactly the ticks a claim would find taken (attempt 1 recorded:
/// running, ended or recorded skipped), of any job name, and never one without a record:
/// a node claims its backups by it. A store that cannot tell (`None`) passes.
pub async fn taken_ticks_answers_exactly_the_ticks_a_claim_would_find_taken(f: &impl StoreFactory) {
    let store = f.open().await;
    let Some(none) = store.taken_ticks(&[]).await.expect("taken_ticks") else { return };
    assert!(none.is_empty(), "nothing asked, nothing taken: {none:?}");
    won(&store, run(tick("backup", 0), "a", LONG_LEASE, false)).await;
    ended(&store, run(tick("backup", 1), "a", LONG_LEASE, false)).await;
    claim(&store, skip(tick("report", 0), "a", "missed")).await;
    won(&store, run(tick("ns/odd:name.1", 0), "a", LONG_LEASE, false)).await;
    let taken = [tick("backup", 0), tick("backup", 1), tick("report", 0), tick("ns/odd:name.1", 0)];
    // Free: never claimed, though their jobs or instants have records.
    let free = [tick("backup", 2), tick("report", 1), tick("sync", 0), tick("ns/odd:name", 0), tick("odd:name.1", 0)];
    let asked: Vec<Tick> = free.iter().chain(&taken).cloned().collect();
    let mut answer = store.taken_ticks(&asked).await.expect("taken_ticks").expect("answered before");
    answer.sort();
    let mut expected = taken.to_vec();
    expected.sort();
    assert_eq!(answer, expected, "exactly the claimed ticks are taken");
    for t in &free {
        assert!(matches!(claim(&store, run(t.clone(), "b", LONG_LEASE, false)).await, ClaimOutcome::Won(_)));
    }
    for t in &taken {
        assert_eq!(claim(&store, run(t.clone(), "b", LONG_LEASE, false)).await, ClaimOutcome::Taken);
    }
    let answer = store.taken_ticks(&free).await.expect("taken_ticks").expect("answered before");
    assert_eq!(answer.len(), free.len(), "claimed since: taken now: {answer:?}");
}
