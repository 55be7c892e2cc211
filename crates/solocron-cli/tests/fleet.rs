//! Real `solocron run` processes racing on one SQLite file, with SIGKILL, SIGSTOP and
//! SIGTERM. What the jobs themselves wrote is the evidence, not only solocron's history.
#![forbid(unsafe_code)]

mod common;

use std::time::{Duration, Instant};

use common::*;
use nix::sys::signal::Signal;

/// A 6-field cron expression that fires once, `secs_from_now` seconds from now (UTC).
fn once_in(secs_from_now: i64) -> String {
    let t = chrono::Utc::now() + chrono::Duration::seconds(secs_from_now);
    format!("{} {} {} * * *", t.format("%-S"), t.format("%-M"), t.format("%-H"))
}

/// Fields of a line `scheduled_at node token attempt ...` written by a job.
fn fields(line: &str) -> Vec<String> {
    line.split_whitespace().map(str::to_owned).collect()
}

const RECORD: &str =
    r#"echo "$SOLOCRON_SCHEDULED_AT $SOLOCRON_NODE_ID $SOLOCRON_FENCING_TOKEN $SOLOCRON_ATTEMPT $SOLOCRON_RUN_ID""#;

#[test]
fn three_nodes_run_every_tick_exactly_once() {
    three_nodes_exactly_once(None, 22);
}

/// A run of 4 s whose end is written by a process the job started (a grandchild of the
/// node): a SIGKILLed node must take it down too, or it would finish beside the retry.
fn long_job(on_crash: &str) -> String {
    format!(
        r#"
[[jobs]]
name = "long"
schedule = "{}"
lease = "2s"
on_crash = "{on_crash}"
max_attempts = 3
command = ["/bin/sh", "-c", "{} >> $DIR/starts.txt; (sleep 4; {} >> $DIR/ends.txt) & wait"]
"#,
        once_in(3),
        RECORD.replace('"', "\\\""),
        RECORD.replace('"', "\\\"")
    )
}

/// Starts 3 nodes, waits for the single run to start, SIGKILLs its node.
fn kill_the_holder(f: &mut Fleet) -> (Vec<String>, Instant) {
    for id in ["n1", "n2", "n3"] {
        f.start(id);
    }
    let first =
        wait_for(Duration::from_secs(15), || f.lines("starts.txt").first().cloned()).expect("the job never started");
    let v = fields(&first);
    let holder = f.nodes.iter().position(|n| n.id == v[1]).unwrap();
    // At once: the job's process announced its group to the guardian before its program
    // started, so no moment after the first line is written finds it unguarded.
    f.signal(holder, Signal::SIGKILL);
    (v, Instant::now())
}

#[test]
fn sigkill_of_the_holder_is_retried_elsewhere_with_a_larger_token() {
    let mut f = Fleet::new(&long_job("retry"));
    let (first, killed_at) = kill_the_holder(&mut f);
    let second = wait_for(Duration::from_secs(10), || f.lines("starts.txt").get(1).cloned()).expect("no retry");
    let took = killed_at.elapsed();
    let second = fields(&second);
    assert_eq!(second[0], first[0], "the retry is the same tick");
    assert_ne!(second[1], first[1], "another node retries");
    assert!(second[2].parse::<u64>().unwrap() > first[2].parse::<u64>().unwrap(), "larger token");
    assert_eq!(second[3], "2", "attempt 2");
    // lease (2 s) + one heartbeat (667 ms), plus slack for a loaded 2-core machine.
    println!("retry started {took:?} after SIGKILL");
    assert!(took < Duration::from_millis(2000 + 667 + 1500), "retry took {took:?}");
    let ended = wait_for(Duration::from_secs(10), || f.lines("ends.txt").first().cloned()).expect("retry never ended");
    assert_eq!(fields(&ended)[1], second[1], "only the retry finished; the killed node's job died with it");
    std::thread::sleep(Duration::from_millis(500));
    f.stop_all();
    let hist = f.history("long");
    assert_eq!(hist.len(), 2, "{hist:#?}");
    assert_eq!((state(&hist[0]), hist[0]["attempt"].as_u64()), ("succeeded", Some(2)));
    assert_eq!((state(&hist[1]), hist[1]["attempt"].as_u64()), ("lost", Some(1)));
    assert_eq!(f.lines("ends.txt").len(), 1);
}

#[test]
fn sigkill_of_the_holder_with_abandon_is_recorded_and_not_rerun() {
    let mut f = Fleet::new(&long_job("abandon"));
    let (first, _) = kill_the_holder(&mut f);
    let abandoned =
        wait_for(Duration::from_secs(10), || f.history("long").into_iter().find(|r| state(r) == "abandoned"))
            .expect("the run was never recorded abandoned");
    assert_eq!(abandoned["node"].as_str(), Some(first[1].as_str()));
    std::thread::sleep(Duration::from_secs(3));
    f.stop_all();
    assert_eq!(f.lines("starts.txt").len(), 1, "abandoned runs are not re-run");
    assert_eq!(f.lines("ends.txt"), Vec::<String>::new(), "what the killed node's job started died with it");
    assert_eq!(f.history("long").len(), 1);
}

const FENCED_SINK: &str = r#"#!/bin/sh
# A downstream store that refuses writes carrying a fencing token older than the newest seen;
# every write tried is logged in `attempts`, in the order the store saw them.
i=0
while [ $i -lt 24 ]; do
  flock "$1/sink.lock" sh -c '
    max=$(cat "$1/max" 2>/dev/null || echo 0)
    echo "$SOLOCRON_FENCING_TOKEN $SOLOCRON_NODE_ID" >> "$1/attempts"
    if [ "$SOLOCRON_FENCING_TOKEN" -ge "$max" ]; then
      echo "$SOLOCRON_FENCING_TOKEN" > "$1/max"
      echo "$SOLOCRON_FENCING_TOKEN $SOLOCRON_NODE_ID" >> "$1/sink"
    else
      echo "$SOLOCRON_FENCING_TOKEN $SOLOCRON_NODE_ID" >> "$1/rejected"
    fi' _ "$1"
  i=$((i+1))
  sleep 0.25
done
"#;

#[test]
fn sigstop_past_the_lease_stops_the_job_as_lost_and_tokens_only_rise() {
    let mut f = Fleet::new(&format!(
        r#"
[[jobs]]
name = "fenced"
schedule = "{}"
lease = "2s"
on_crash = "retry"
kill_grace = "800ms"
command = ["/bin/sh", "$DIR/fenced.sh", "$DIR"]
"#,
        once_in(3)
    ));
    std::fs::write(f.path("fenced.sh"), FENCED_SINK).unwrap();
    for id in ["n1", "n2"] {
        f.start(id);
    }
    let first = wait_for(Duration::from_secs(15), || f.lines("sink").first().cloned()).expect("job never wrote");
    let a_id = fields(&first)[1].clone();
    let a = f.nodes.iter().position(|n| n.id == a_id).unwrap();
    f.signal(a, Signal::SIGSTOP);
    // The other node takes the tick over once the stopped node's lease expires.
    if wait_for(Duration::from_secs(10), || f.lines("sink").iter().find(|l| !l.ends_with(&a_id)).cloned()).is_none() {
        let logs: Vec<String> = f.nodes.iter().map(|n| format!("--- {} ---\n{}", n.id, f.log(&n.id))).collect();
        panic!("no takeover while the holder was stopped\nsink: {:?}\n{}", f.lines("sink"), logs.join("\n"));
    }
    std::thread::sleep(Duration::from_millis(1500));
    f.signal(a, Signal::SIGCONT);
    // The woken node sees its lease deadline passed and stops its job.
    std::thread::sleep(Duration::from_secs(3));
    let from_a =
        |f: &Fleet| f.lines("sink").iter().chain(f.lines("rejected").iter()).filter(|l| l.ends_with(&a_id)).count();
    let before = from_a(&f);
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(from_a(&f), before, "the stalled node's job still writes after it woke");
    // What solocron guarantees, read from every write tried (not only the accepted ones):
    // the holder that took over writes with a token larger than any the stalled holder
    // wrote with, so the downstream store can tell them apart.
    let attempts: Vec<(u64, String)> =
        f.lines("attempts").iter().map(|l| fields(l)).map(|w| (w[0].parse().unwrap(), w[1].clone())).collect();
    let stalled = attempts.iter().filter(|(_, n)| *n == a_id).map(|(t, _)| *t).max().expect("the holder wrote");
    let taker = attempts.iter().filter(|(_, n)| *n != a_id).map(|(t, _)| *t).min().expect("the taker wrote");
    assert!(taker > stalled, "the takeover's token {taker} is not above the stalled holder's {stalled}: {attempts:?}");
    // The stalled holder did write after the takeover (it could not stop while stopped),
    // and the fence refused exactly those writes.
    let after_takeover = attempts.iter().skip_while(|(t, _)| *t < taker).filter(|(t, _)| *t < taker).count();
    assert!(after_takeover > 0, "the stale holder never wrote after the takeover: {attempts:?}");
    assert_eq!(f.lines("rejected").len(), after_takeover, "every stale write, and only those, was refused");
    let log = f.log(&a_id);
    assert!(log.contains("lease lost"), "node {a_id} did not notice it lost its lease:\n{log}");
    f.stop_all();
    let hist = f.history("fenced");
    let first_attempt = hist.iter().find(|r| r["attempt"].as_u64() == Some(1)).unwrap();
    assert_eq!(state(first_attempt), "lost", "{hist:#?}");
    assert!(hist.iter().all(|r| state(r) != "running"), "every claimed run has an end: {hist:#?}");
}

#[test]
fn sigterm_drains_running_jobs_and_claims_nothing_new() {
    let mut f = Fleet::new(&format!(
        r#"
[[jobs]]
name = "slow"
schedule = "{}"
command = ["/bin/sh", "-c", "echo started >> $DIR/slow.txt; sleep 2; echo done >> $DIR/slow.txt"]
[[jobs]]
name = "frequent"
schedule = "* * * * * *"
command = ["/bin/true"]
"#,
        once_in(3)
    ));
    f.start("n1");
    wait_for(Duration::from_secs(15), || f.lines("slow.txt").first().cloned()).expect("slow job never started");
    let signalled = chrono::Utc::now();
    let status = f.stop(0, Duration::from_secs(10)).expect("node did not exit within the grace");
    assert!(status.success(), "exit status {status:?}");
    assert_eq!(f.lines("slow.txt"), vec!["started", "done"], "the running job finished");
    let slow = f.history("slow");
    assert_eq!(state(&slow[0]), "succeeded");
    for r in f.history("frequent") {
        let claimed: chrono::DateTime<chrono::Utc> = r["claimed_at"].as_str().unwrap().parse().unwrap();
        assert!(claimed <= signalled + chrono::Duration::milliseconds(100), "claimed after SIGTERM: {r}");
        assert_ne!(state(&r), "running");
    }
}

#[test]
fn a_job_outliving_the_shutdown_grace_is_stopped_and_recorded_interrupted() {
    let mut f = Fleet::new(&format!(
        r#"
[[jobs]]
name = "endless"
schedule = "{}"
kill_grace = "1s"
command = ["/bin/sh", "-c", "echo started >> $DIR/e.txt; exec sleep 60"]
"#,
        once_in(3)
    ));
    f.start("n1");
    wait_for(Duration::from_secs(15), || f.lines("e.txt").first().cloned()).expect("never started");
    let t = Instant::now();
    let status = f.stop(0, Duration::from_secs(15)).expect("node did not exit");
    assert!(status.success());
    // grace 5 s (Fleet's config) + kill grace 1 s, with slack.
    assert!(t.elapsed() < Duration::from_secs(9), "{:?}", t.elapsed());
    let hist = f.history("endless");
    assert_eq!(state(&hist[0]), "interrupted", "{hist:#?}");
}

/// `on_crash = "retry"` gives a tick `max_attempts` tries in all: when the holder of the
/// last one dies too, the tick is abandoned with the reason, and no attempt beyond the
/// limit is ever made. Each attempt ran on another node, with a larger token.
#[test]
fn a_tick_whose_holder_dies_on_every_attempt_is_abandoned_at_max_attempts() {
    let mut f = Fleet::new(&format!(
        r#"
[[jobs]]
name = "doomed"
schedule = "{}"
lease = "2s"
on_crash = "retry"
max_attempts = 2
command = ["/bin/sh", "-c", "{} >> $DIR/starts.txt; exec sleep 60"]
"#,
        once_in(3),
        RECORD.replace('"', "\\\"")
    ));
    let (first, _) = kill_the_holder(&mut f);
    let second =
        fields(&wait_for(Duration::from_secs(10), || f.lines("starts.txt").get(1).cloned()).expect("no retry"));
    let holder = f.nodes.iter().position(|n| n.id == second[1]).expect("the retry runs on a live node");
    f.signal(holder, Signal::SIGKILL);
    let abandoned =
        wait_for(Duration::from_secs(10), || f.history("doomed").into_iter().find(|r| state(r) == "abandoned"))
            .unwrap_or_else(|| {
                panic!("the last attempt was never recorded abandoned; starts: {:?}", f.lines("starts.txt"))
            });
    // Long enough for a third attempt to start if recovery wrongly retried: lease (2 s),
    // a recovery scan, and slack for a loaded machine.
    std::thread::sleep(Duration::from_secs(4));
    f.stop_all();
    let starts: Vec<Vec<String>> = f.lines("starts.txt").iter().map(|l| fields(l)).collect();
    assert_eq!(starts.len(), 2, "exactly max_attempts (2) starts: {starts:?}");
    assert_eq!((first[0].as_str(), first[3].as_str()), (starts[0][0].as_str(), "1"));
    assert_eq!((second[0].as_str(), second[3].as_str()), (first[0].as_str(), "2"), "attempt 2 is the same tick");
    assert_ne!(second[1], first[1], "the retry ran on another node");
    let mut hist = f.history("doomed");
    hist.reverse(); // oldest first
    let summary: Vec<_> = hist.iter().map(|r| (r["attempt"].as_u64(), state(r).to_owned())).collect();
    assert_eq!(summary, [(Some(1), "lost".to_owned()), (Some(2), "abandoned".to_owned())], "{hist:#?}");
    assert_eq!(hist[1], abandoned, "nothing changed after the abandon");
    for (record, start) in hist.iter().zip(&starts) {
        assert_eq!(record["node"].as_str(), Some(start[1].as_str()), "each attempt's record names its node");
        assert_eq!(record["fencing_token"].to_string(), start[2], "each attempt's record has the token its job saw");
        assert_eq!(record["scheduled_at"], hist[0]["scheduled_at"], "one tick");
    }
    let tokens: Vec<u64> = starts.iter().map(|s| s[2].parse().unwrap()).collect();
    assert!(tokens[1] > tokens[0], "the retry's token is larger: {tokens:?}");
    let reason = abandoned["reason"].as_str().unwrap_or_default();
    assert_eq!(reason, format!("lease of node {} expired; max_attempts (2) reached", second[1]), "{abandoned:#}");
}
