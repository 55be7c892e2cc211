//! Leases: renewal, expiry by the store's clock, and how runs end.

use std::time::Duration;

use chrono::{DateTime, Utc};
use solocron_core::{
    output_tail, ClaimOutcome, ClaimRequest, Ending, Lease, RecoverAction, RecoverOutcome, Renewal, RunEnd, RunId,
    RunState, Tick, Trigger, FINISH_BATCH_MAX, RENEW_BATCH_MAX,
};

use super::support::{
    all, assert_between, claim, find, ids, now, run, succeeded, tick, timing, won, Handle, LENGTH_SLACK, LONG_LEASE, MS,
};
use crate::StoreFactory;

/// Renewal succeeds only for the owner presenting its token, only while the run is
/// `running` and its lease live; it extends the lease from the store's now.
pub async fn only_the_owner_with_its_token_renews_and_only_before_expiry(f: &impl StoreFactory) {
    let t = timing(f);
    let store = f.open().await;
    let lease = won(&store, run(tick("backup", 0), "a", LONG_LEASE, false)).await;
    let stranger = Lease { owner: "b".into(), ..lease.clone() };
    let stale = Lease { fencing_token: lease.fencing_token + 1, ..lease.clone() };
    let elsewhere = Lease { run: RunId { attempt: 2, ..lease.run.clone() }, ..lease.clone() };
    for wrong in [&stranger, &stale, &elsewhere] {
        assert!(!store.renew(wrong, LONG_LEASE).await.expect("renew"), "renewed with {wrong:?}");
    }
    assert_eq!(find(&store, &lease.run).await.lease_until, Some(lease.lease_until));

    let before = now(&store).await;
    assert!(store.renew(&lease, Duration::from_secs(5)).await.expect("renew"));
    let after = now(&store).await;
    let renewed = find(&store, &lease.run).await.lease_until.expect("a running run has a lease");
    let five = chrono::Duration::seconds(5);
    assert_between(renewed, before + five, after + five + LENGTH_SLACK, "renewed lease_until = store now + 5 s");

    let short = won(&store, run(tick("backup", 1), "a", t.short, false)).await;
    tokio::time::sleep(t.past).await;
    assert!(!store.renew(&short, LONG_LEASE).await.expect("renew"), "an expired lease cannot be renewed");
    assert!(store.finish(&lease, &succeeded("")).await.expect("finish"));
    assert!(!store.renew(&lease, LONG_LEASE).await.expect("renew"), "an ended run cannot be renewed");
}

/// Leases are lengths the store adds to its own clock: claims of ticks far in the past and
/// future (the node's idea of time) get the same lease from the store's now; a lease
/// expires when the store's clock passes it, as the store's `now()` tells, and not before.
pub async fn leases_are_judged_by_the_store_clock_not_the_nodes(f: &impl StoreFactory) {
    let t = timing(f);
    let store = f.open().await;
    let hour = Duration::from_secs(3600);
    let mut live = Vec::new();
    for (n, at) in ["2000-01-01T00:00:00Z", "2100-01-01T00:00:00Z"].into_iter().enumerate() {
        let tick = Tick::new(format!("job-{n}"), at.parse().expect("instant"));
        let before = now(&store).await;
        // A catch-up: a scheduled claim of a future tick would be refused as too early.
        let request = ClaimRequest { trigger: Trigger::Catchup, ..run(tick, "a", hour, false) };
        let lease = won(&store, request).await;
        assert_between(lease.claimed_at, before, now(&store).await, "claimed_at is the store's now");
        assert_length(&lease, hour);
        live.push(lease);
    }
    let short = won(&store, run(tick("backup", 0), "a", t.short, false)).await;
    assert_length(&short, t.short);
    assert!(
        store.expired(10, &solocron_core::Namespaces::ALL).await.expect("expired").is_empty(),
        "nothing expired yet"
    );

    wait_for_store_clock(&store, short.lease_until).await;
    // A store with coarse leases (etcd) notices the end a little after it.
    tokio::time::sleep(f.lease_resolution() / 2).await;
    assert_eq!(expired_ids(&store, 10).await, std::slice::from_ref(&short.run), "only the short lease expired");
    let abandon = RecoverAction::Abandon { reason: "owner vanished".into() };
    for lease in &live {
        assert_eq!(store.recover(&lease.run, &abandon).await.expect("recover"), RecoverOutcome::NotNeeded);
        assert!(store.renew(lease, hour).await.expect("renew"), "an hour lease is live");
    }
    assert_eq!(store.recover(&short.run, &abandon).await.expect("recover"), RecoverOutcome::Abandoned);
}

/// Asserts the lease lasts `length` from its claim.
fn assert_length(lease: &Lease, length: Duration) {
    let asked = chrono::Duration::from_std(length).expect("short");
    let got = lease.lease_until - lease.claimed_at;
    assert!(asked - LENGTH_SLACK <= got && got <= asked + LENGTH_SLACK, "lease of {got} for {asked}: {lease:?}");
}

/// Sleeps until the store's clock (not this process's) is past `instant`, briefly.
async fn wait_for_store_clock(store: &Handle, instant: DateTime<Utc>) {
    for _ in 0..100 {
        if now(store).await > instant + MS {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the store's clock did not pass {instant} within 5 s");
}

/// `expired` lists running runs whose lease passed, oldest lease first, at most `limit`,
/// and never a live or ended one.
pub async fn expired_lists_oldest_lease_first_up_to_the_limit(f: &impl StoreFactory) {
    let t = timing(f);
    let store = f.open().await;
    let first = won(&store, run(tick("a", 5), "n", t.short, false)).await;
    let second = won(&store, run(tick("b", 0), "n", t.short + t.step, false)).await;
    let ended = won(&store, run(tick("d", 0), "n", t.short, false)).await;
    assert!(store.finish(&ended, &succeeded("")).await.expect("finish"));
    won(&store, run(tick("c", 0), "n", LONG_LEASE, false)).await;
    tokio::time::sleep(t.past).await;
    assert_eq!(expired_ids(&store, 10).await, [first.run.clone(), second.run]);
    assert_eq!(expired_ids(&store, 1).await, [first.run]);
}

/// The runs `expired` lists.
async fn expired_ids(store: &Handle, limit: usize) -> Vec<RunId> {
    store.expired(limit, &solocron_core::Namespaces::ALL).await.expect("expired").into_iter().map(|r| r.id).collect()
}

/// The owner's finish records the end it reports: state, reason, exit code, the output's
/// tail, `started_at` = claim + start delay (none if it never started), `finished_at`; a
/// wrong token or a second finish changes nothing.
pub async fn the_owner_finishes_once_with_its_end_output_tail_and_start(f: &impl StoreFactory) {
    let store = f.open().await;
    let lease = won(&store, run(tick("backup", 0), "a", LONG_LEASE, false)).await;
    // Multi-byte characters around the cut: the tail must be cut on a character boundary.
    let output = format!("{}the end", "é".repeat(5_000));
    let end = RunEnd {
        state: RunState::Failed,
        reason: Some("exit code 3".into()),
        exit_code: Some(3),
        output: output.clone(),
        started_after: Some(Duration::from_millis(1500)),
    };
    let stale = Lease { fencing_token: lease.fencing_token + 1, ..lease.clone() };
    let stranger = Lease { owner: "b".into(), ..lease.clone() };
    assert!(!store.finish(&stale, &end).await.expect("finish"));
    assert!(!store.finish(&stranger, &end).await.expect("finish"));
    let before = now(&store).await;
    assert!(store.finish(&lease, &end).await.expect("finish"));

    let record = find(&store, &lease.run).await;
    assert_eq!((record.state, record.exit_code), (RunState::Failed, Some(3)));
    assert_eq!((record.reason.as_deref(), record.lease_until), (Some("exit code 3"), None));
    assert_eq!(record.output, output_tail(&output));
    assert_eq!(record.started_at, Some(lease.claimed_at + chrono::Duration::milliseconds(1500)));
    assert_between(record.finished_at.expect("finished_at"), before, now(&store).await, "finished_at");

    assert!(!store.finish(&lease, &succeeded("again")).await.expect("finish"), "the first end stands");
    assert_eq!(find(&store, &lease.run).await, record);

    let never_started = won(&store, run(tick("backup", 1), "a", LONG_LEASE, false)).await;
    let end = RunEnd { state: RunState::Interrupted, started_after: None, ..succeeded("") };
    assert!(store.finish(&never_started, &end).await.expect("finish"));
    let record = find(&store, &never_started.run).await;
    assert_eq!((record.state, record.started_at), (RunState::Interrupted, None));
}

/// An end whose output and reason hold a NUL byte (a command's output may) is recorded,
/// alone and in a batch, with the text around the NUL kept.
pub async fn an_end_with_a_nul_byte_in_its_output_is_recorded(f: &impl StoreFactory) {
    let store = f.open().await;
    let alone = won(&store, run(tick("backup", 0), "a", LONG_LEASE, false)).await;
    let batched = won(&store, run(tick("backup", 1), "a", LONG_LEASE, false)).await;
    let end = RunEnd { reason: Some("bad\0reason".into()), ..succeeded("before\0after") };
    assert!(store.finish(&alone, &end).await.expect("finish"));
    let ending = Ending { lease: batched.clone(), end: end.clone() };
    assert_eq!(store.finish_all(&[ending]).await.expect("finish_all"), [true]);
    for lease in [&alone, &batched] {
        let record = find(&store, &lease.run).await;
        assert_eq!(record.state, RunState::Succeeded);
        assert!(record.output.starts_with("before") && record.output.ends_with("after"), "{:?}", record.output);
        let reason = record.reason.expect("reason");
        assert!(reason.starts_with("bad") && reason.ends_with("reason"), "{reason:?}");
    }
}

/// A batch of ends (`finish_all`) answers and records each one as `finish` would, in
/// order: held runs end with their own state, output and start, while a stale token, a
/// run already ended and a run of another owner change nothing; two runs of one job may
/// end in the same batch, and a full batch of [`FINISH_BATCH_MAX`] ends every run in it.
pub async fn a_batch_of_ends_records_each_as_finish_would(f: &impl StoreFactory) {
    let store = f.open().await;
    assert!(store.finish_all(&[]).await.expect("finish_all").is_empty());
    let first = won(&store, run(tick("backup", 0), "a", LONG_LEASE, false)).await;
    let second = won(&store, run(tick("backup", 1), "a", LONG_LEASE, false)).await;
    let never_started = won(&store, run(tick("report", 0), "a", LONG_LEASE, false)).await;
    let ended = won(&store, run(tick("report", 1), "a", LONG_LEASE, false)).await;
    let other = won(&store, run(tick("cleanup", 0), "b", LONG_LEASE, false)).await;
    assert!(store.finish(&ended, &succeeded("first")).await.expect("finish"));
    let failed = RunEnd {
        state: RunState::Failed,
        reason: Some("exit code 3".into()),
        exit_code: Some(3),
        output: "broke".into(),
        started_after: Some(Duration::from_millis(1500)),
    };
    let interrupted = RunEnd { state: RunState::Interrupted, started_after: None, ..succeeded("") };
    let endings = [
        Ending { lease: first.clone(), end: succeeded("one") },
        Ending { lease: Lease { fencing_token: other.fencing_token + 1, ..other.clone() }, end: succeeded("stale") },
        Ending { lease: second.clone(), end: failed },
        Ending { lease: ended.clone(), end: succeeded("again") },
        Ending { lease: Lease { owner: "a".into(), ..other.clone() }, end: succeeded("stranger") },
        Ending { lease: never_started.clone(), end: interrupted },
    ];
    let before = now(&store).await;
    let answers = store.finish_all(&endings).await.expect("finish_all");
    let after = now(&store).await;
    assert_eq!(answers, [true, false, true, false, false, true], "one answer per ending, in order");

    let record = find(&store, &first.run).await;
    assert_eq!((record.state, record.output.as_str(), record.lease_until), (RunState::Succeeded, "one", None));
    assert_eq!(record.started_at, Some(first.claimed_at + chrono::Duration::milliseconds(250)));
    assert_between(record.finished_at.expect("finished_at"), before, after, "finished_at");
    let record = find(&store, &second.run).await;
    assert_eq!((record.state, record.exit_code, record.output.as_str()), (RunState::Failed, Some(3), "broke"));
    assert_eq!(record.reason.as_deref(), Some("exit code 3"));
    assert_eq!(record.started_at, Some(second.claimed_at + chrono::Duration::milliseconds(1500)));
    let record = find(&store, &never_started.run).await;
    assert_eq!((record.state, record.started_at), (RunState::Interrupted, None));
    assert_eq!(find(&store, &ended.run).await.output, "first", "the first end stands");
    let record = find(&store, &other.run).await;
    assert_eq!((record.state, record.lease_until), (RunState::Running, Some(other.lease_until)), "untouched");
    assert!(store.renew(&other, LONG_LEASE).await.expect("renew"), "its holder still holds it");

    // A full batch: half as many jobs as runs, so every job ends two runs at once.
    let requests: Vec<_> = (0..FINISH_BATCH_MAX)
        .map(|i| run(tick(&format!("herd-{}", i / 2), i as u32 % 2), "c", LONG_LEASE, false))
        .collect();
    let leases = won_all(&store, &requests).await;
    let endings: Vec<_> = leases.iter().map(|l| Ending { lease: l.clone(), end: succeeded("herd") }).collect();
    let answers = store.finish_all(&endings).await.expect("finish_all");
    assert_eq!(answers, vec![true; FINISH_BATCH_MAX], "every held run of a full batch ends");
    let running: Vec<_> = all(&store).await.into_iter().filter(|r| r.state == RunState::Running).collect();
    assert_eq!(ids(&running), [other.run.to_string()], "only the other owner's run is still running");
}

/// Claims `requests` in one call; every one must be won.
async fn won_all(store: &Handle, requests: &[solocron_core::ClaimRequest]) -> Vec<Lease> {
    let outcomes = store.claim(requests).await.expect("claim");
    outcomes
        .into_iter()
        .map(|o| match o {
            ClaimOutcome::Won(lease) => lease,
            other => panic!("expected Won, got {other:?}"),
        })
        .collect()
}

/// A batch of renewals (`renew_all`) answers and extends each lease as `renew` would, in
/// order: a held live lease is extended by its own length from the store's now (also when
/// it is sent twice in one batch, as a renewal re-sent while the first was queued is),
/// while a stale token, another owner's run, an expired lease and an ended run change
/// nothing; a full batch of [`RENEW_BATCH_MAX`] renewals extends every lease in it.
pub async fn a_batch_of_renewals_extends_each_lease_as_renew_would(f: &impl StoreFactory) {
    let t = timing(f);
    let store = f.open().await;
    assert!(store.renew_all(&[]).await.expect("renew_all").is_empty());
    let first = won(&store, run(tick("backup", 0), "a", LONG_LEASE, false)).await;
    let second = won(&store, run(tick("backup", 1), "a", LONG_LEASE, false)).await;
    let other = won(&store, run(tick("cleanup", 0), "b", LONG_LEASE, false)).await;
    let ended = won(&store, run(tick("report", 0), "a", LONG_LEASE, false)).await;
    assert!(store.finish(&ended, &succeeded("")).await.expect("finish"));
    let short = won(&store, run(tick("report", 1), "a", t.short, false)).await;
    tokio::time::sleep(t.past).await;
    let (five, nine) = (Duration::from_secs(5), Duration::from_secs(9));
    let renewals = [
        Renewal { lease: first.clone(), length: five },
        Renewal { lease: Lease { fencing_token: other.fencing_token + 1, ..other.clone() }, length: five },
        Renewal { lease: second.clone(), length: nine },
        Renewal { lease: ended.clone(), length: five },
        Renewal { lease: Lease { owner: "a".into(), ..other.clone() }, length: five },
        Renewal { lease: short.clone(), length: five },
        Renewal { lease: first.clone(), length: five },
    ];
    let before = now(&store).await;
    let answers = store.renew_all(&renewals).await.expect("renew_all");
    let after = now(&store).await;
    assert_eq!(answers, [true, false, true, false, false, false, true], "one answer per renewal, in order");
    for (lease, length) in [(&first, five), (&second, nine)] {
        let until = find(&store, &lease.run).await.lease_until.expect("a running run has a lease");
        let length = chrono::Duration::from_std(length).expect("short");
        assert_between(until, before + length, after + length + LENGTH_SLACK, "lease_until = store now + its length");
    }
    assert_eq!(find(&store, &other.run).await.lease_until, Some(other.lease_until), "another owner's lease untouched");
    assert_eq!(find(&store, &short.run).await.lease_until, Some(short.lease_until), "an expired lease stays expired");
    assert_eq!(find(&store, &ended.run).await.state, RunState::Succeeded);

    // A full batch: half as many jobs as runs, so every job renews two runs at once.
    let requests: Vec<_> = (0..RENEW_BATCH_MAX)
        .map(|i| run(tick(&format!("herd-{}", i / 2), i as u32 % 2), "c", LONG_LEASE, false))
        .collect();
    let renewals: Vec<_> =
        won_all(&store, &requests).await.into_iter().map(|lease| Renewal { lease, length: five }).collect();
    let answers = store.renew_all(&renewals).await.expect("renew_all");
    assert_eq!(answers, vec![true; RENEW_BATCH_MAX], "every held lease of a full batch is renewed");
}

/// A batch of ends racing another node's claims of the same jobs ends every run it holds
/// and nothing else: afterwards only the other node's runs count as running (an overlap
/// check skips for them and, once they end, runs again).
pub async fn a_batch_of_ends_racing_claims_of_the_same_jobs_leaves_only_live_runs_running(f: &impl StoreFactory) {
    let (a, b) = (f.open().await, f.open().await);
    const JOBS: usize = 60;
    let job = |i: usize| format!("job-{i:02}");
    let requests: Vec<_> = (0..JOBS).map(|i| run(tick(&job(i), 0), "a", LONG_LEASE, false)).collect();
    let mut held = Vec::new();
    for outcome in a.claim(&requests).await.expect("claim") {
        match outcome {
            ClaimOutcome::Won(lease) => held.push(Ending { lease, end: succeeded("a") }),
            other => panic!("expected Won, got {other:?}"),
        }
    }
    let claims = async {
        let mut leases = Vec::new();
        for i in 0..JOBS {
            leases.push(won(&b, run(tick(&job(i), 1), "b", LONG_LEASE, false)).await);
        }
        leases
    };
    let (answers, b_leases) = tokio::join!(a.finish_all(&held), claims);
    assert_eq!(answers.expect("finish_all"), vec![true; JOBS], "every held run ends");
    let running: Vec<_> = all(&a).await.into_iter().filter(|r| r.state == RunState::Running).collect();
    let b_runs: Vec<String> = b_leases.iter().rev().map(|l| l.run.to_string()).collect();
    let mut running = ids(&running);
    running.sort();
    let mut expected = b_runs.clone();
    expected.sort();
    assert_eq!(running, expected, "only b's runs are running");
    for (i, lease) in b_leases.iter().enumerate() {
        let overlap = claim(&a, run(tick(&job(i), 2), "a", LONG_LEASE, true)).await;
        assert!(matches!(overlap, ClaimOutcome::Skipped { .. }), "{} overlaps b's run: {overlap:?}", job(i));
        assert!(b.finish(lease, &succeeded("b")).await.expect("finish"));
        won(&a, run(tick(&job(i), 3), "a", LONG_LEASE, true)).await;
    }
}

/// A run whose lease lapsed but that nobody recovered yet still records its true end, and
/// is then no longer expired nor recoverable.
pub async fn a_lapsed_run_nobody_recovered_still_records_its_end(f: &impl StoreFactory) {
    let t = timing(f);
    let store = f.open().await;
    let lease = won(&store, run(tick("backup", 0), "a", t.short, false)).await;
    tokio::time::sleep(t.past).await;
    assert_eq!(store.expired(10, &solocron_core::Namespaces::ALL).await.expect("expired").len(), 1);
    assert!(store.finish(&lease, &succeeded("done")).await.expect("finish"));
    assert!(store.expired(10, &solocron_core::Namespaces::ALL).await.expect("expired").is_empty());
    let abandon = RecoverAction::Abandon { reason: "owner vanished".into() };
    assert_eq!(store.recover(&lease.run, &abandon).await.expect("recover"), RecoverOutcome::NotNeeded);
    let record = find(&store, &lease.run).await;
    assert_eq!((record.state, record.output.as_str()), (RunState::Succeeded, "done"));
}
