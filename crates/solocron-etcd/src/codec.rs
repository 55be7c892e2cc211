//! The values stored under the keys of [`crate::keys`], as JSON, and their conversions to
//! the vocabulary of `solocron_core`. Instants are integer milliseconds since the epoch.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use solocron_core::{
    output_tail, ActionRecord, JobControl, Lease, NodeBeat, Registration, RunEnd, RunId, RunRecord, RunState, Tick,
    Trigger,
};

use crate::StoreError;

/// A run record as stored under `{p}run/...`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct StoredRun {
    pub job: String,
    pub scheduled_at: i64,
    pub attempt: u32,
    pub trigger: String,
    pub node: String,
    pub token: Option<u64>,
    pub state: String,
    pub reason: Option<String>,
    pub claimed_at: i64,
    pub started_at: Option<i64>,
    pub finished_at: Option<i64>,
    /// An estimate (claim or renewal time on the client's clock + the lease's length):
    /// expiry itself is judged by etcd's lease TTL, never by this. For a `waiting` retry,
    /// its not-before (the client's clock at its finish + the backoff), which decides when
    /// it is due.
    pub lease_until: Option<i64>,
    pub exit_code: Option<i32>,
    pub output: String,
    /// The etcd lease the run's alive key is attached to, while running.
    pub lease_id: Option<i64>,
    /// The whole seconds of TTL asked of etcd for that lease.
    pub ttl: Option<i64>,
    /// The nonce of the claim that created this record (attempt 1), if it carried one: a
    /// `Run` request of the same node asking again with it is granted the run again while
    /// it is still running (see `claim.rs`). Absent in records written before nonces (and
    /// in retries, which no claim created): those are never granted again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nonce: Option<u64>,
}

impl StoredRun {
    /// The run this record is of.
    pub(crate) fn id(&self) -> Result<RunId, StoreError> {
        Ok(RunId { tick: Tick::new(self.job.clone(), instant(self.scheduled_at)?), attempt: self.attempt })
    }

    /// True while the run is `running`.
    pub(crate) fn is_running(&self) -> bool {
        self.state == RunState::Running.as_str()
    }

    /// True while the run is a `waiting` retry (see `retry.rs`).
    pub(crate) fn is_waiting(&self) -> bool {
        self.state == RunState::Waiting.as_str()
    }

    /// True if this is the running first attempt that `node`'s claim with `nonce` (not
    /// 0) created: the one record a claim asked again with its nonce is granted again.
    pub(crate) fn claimed_with(&self, node: &str, nonce: u64) -> bool {
        nonce != 0 && self.attempt == 1 && self.is_running() && self.node == node && self.nonce == Some(nonce)
    }

    /// True if the run is running and held by `owner` with `token`.
    pub(crate) fn held_by(&self, owner: &str, token: u64) -> bool {
        self.is_running() && self.node == owner && self.token == Some(token)
    }

    /// Ends the record: terminal `state`, lease fields cleared.
    pub(crate) fn end(&mut self, state: RunState, reason: Option<String>, now: i64) {
        self.state = state.as_str().to_owned();
        self.reason = reason;
        self.finished_at = Some(now);
        self.lease_until = None;
        self.lease_id = None;
        self.ttl = None;
    }

    /// The record as the trait returns it.
    pub(crate) fn to_record(&self) -> Result<RunRecord, StoreError> {
        let name_err = |e: String| StoreError::Invalid(format!("run record of {}: {e}", self.job));
        Ok(RunRecord {
            id: self.id()?,
            trigger: self.trigger.parse::<Trigger>().map_err(name_err)?,
            node: self.node.clone(),
            fencing_token: self.token,
            state: self.state.parse::<RunState>().map_err(name_err)?,
            reason: self.reason.clone(),
            claimed_at: instant(self.claimed_at)?,
            started_at: self.started_at.map(instant).transpose()?,
            finished_at: self.finished_at.map(instant).transpose()?,
            lease_until: self.lease_until.map(instant).transpose()?,
            exit_code: self.exit_code,
            output: self.output.clone(),
        })
    }
}

/// A run of a job named in its guard: `(scheduled_at ms, attempt)`.
pub(crate) type RunRef = (i64, u32);

/// The per-job guard under `{p}job/{job}`: every claim, end, recovery and unlock of the job
/// compares its revision, so decisions about the job (overlap, tokens) are serialized.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Guard {
    pub job: String,
    /// The last fencing token handed out for the job (0: none yet).
    pub token: u64,
    /// The job's `running` runs, sorted.
    pub running: Vec<RunRef>,
}

impl Guard {
    /// A guard for a job never claimed.
    pub(crate) fn new(job: &str) -> Guard {
        Guard { job: job.to_owned(), ..Guard::default() }
    }

    /// The runs listed as running.
    pub(crate) fn running_ids(&self) -> Result<Vec<RunId>, StoreError> {
        self.running.iter().map(|r| run_id(&self.job, *r)).collect()
    }

    /// The newest running run, if any.
    pub(crate) fn newest_running(&self) -> Result<Option<RunId>, StoreError> {
        self.running.iter().max().map(|r| run_id(&self.job, *r)).transpose()
    }

    pub(crate) fn add(&mut self, run: &RunId) {
        self.running.push(run_ref(run));
        self.running.sort_unstable();
    }

    pub(crate) fn remove(&mut self, run: &RunId) {
        let r = run_ref(run);
        self.running.retain(|x| *x != r);
    }
}

fn run_ref(run: &RunId) -> RunRef {
    (run.tick.scheduled_at.timestamp_millis(), run.attempt)
}

fn run_id(job: &str, (at, attempt): RunRef) -> Result<RunId, StoreError> {
    Ok(RunId { tick: Tick::new(job, instant(at)?), attempt })
}

/// A job's pause switch under `{p}control/{job}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct StoredControl {
    pub job: String,
    pub paused: bool,
    pub changed_by: String,
    pub reason: Option<String>,
    pub changed_at: i64,
}

impl StoredControl {
    /// The reason a paused job's ticks are skipped with, or `None` if it is not paused.
    pub(crate) fn pause_reason(&self) -> Option<String> {
        self.paused.then(|| match &self.reason {
            Some(reason) => format!("paused by {}: {reason}", self.changed_by),
            None => format!("paused by {}", self.changed_by),
        })
    }

    pub(crate) fn to_control(&self) -> Result<JobControl, StoreError> {
        Ok(JobControl {
            job: self.job.clone(),
            paused: self.paused,
            changed_by: self.changed_by.clone(),
            reason: self.reason.clone(),
            changed_at: instant(self.changed_at)?,
        })
    }
}

/// A registration under `{p}registry/{node}/{job}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct StoredRegistration {
    pub job: String,
    pub node: String,
    pub schedule: String,
    pub timezone: String,
    pub definition_hash: String,
    pub summary: String,
    pub first_seen: i64,
    pub last_seen: i64,
}

impl StoredRegistration {
    pub(crate) fn to_registration(&self) -> Result<Registration, StoreError> {
        Ok(Registration {
            definition: solocron_core::JobDefinition {
                job: self.job.clone(),
                schedule: self.schedule.clone(),
                timezone: self.timezone.clone(),
                definition_hash: self.definition_hash.clone(),
                summary: self.summary.clone(),
            },
            node: self.node.clone(),
            first_seen: instant(self.first_seen)?,
            last_seen: instant(self.last_seen)?,
        })
    }
}

/// A manual run request under `{p}request/{at}/{job}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct StoredRequest {
    pub job: String,
    pub requested_at: i64,
    pub requested_by: String,
}

/// What a node said in its last heartbeat, under `{p}node/{node}/beat`, and when (this
/// process's clock: etcd has none).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct StoredBeat {
    pub node: String,
    pub version: String,
    pub jobs: u32,
    pub running: u32,
    pub last_seen: i64,
}

impl StoredBeat {
    pub(crate) fn new(beat: &NodeBeat, now: i64) -> StoredBeat {
        StoredBeat {
            node: beat.node.clone(),
            version: beat.version.clone(),
            jobs: beat.jobs,
            running: beat.running,
            last_seen: now,
        }
    }

    pub(crate) fn to_beat(&self) -> NodeBeat {
        NodeBeat { node: self.node.clone(), version: self.version.clone(), jobs: self.jobs, running: self.running }
    }
}

/// An operator's action under `{p}action/{at↓}/{tag}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct StoredAction {
    pub job: String,
    pub kind: String,
    pub by: String,
    pub reason: Option<String>,
    pub at: i64,
    pub detail: String,
}

impl StoredAction {
    pub(crate) fn to_record(&self) -> Result<ActionRecord, StoreError> {
        Ok(ActionRecord {
            job: self.job.clone(),
            kind: self.kind.parse().map_err(|e: String| StoreError::Invalid(format!("action of {}: {e}", self.job)))?,
            by: self.by.clone(),
            reason: self.reason.clone(),
            at: instant(self.at)?,
            detail: self.detail.clone(),
        })
    }
}

/// Who wrote a managed job's definition or revision, and when (this process's clock: etcd
/// has none); the first part of its value (see [`encode_job`]). Its revision is the key's
/// `mod_revision`, so it is not stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct JobHeader {
    pub job: String,
    pub changed_by: String,
    pub changed_at: i64,
}

/// A managed job's definition (or a revision) as stored under `{p}managed/...`: the
/// header as one line of JSON, then, unless the revision deleted the job, a newline and the
/// definition as given. The definition stays out of the JSON, whose escaping could make it
/// up to six times longer: a value is at most the definition plus its header, which keeps
/// the pages of reads of them under the client's message limit.
pub(crate) fn encode_job(header: &JobHeader, spec: Option<&str>) -> Vec<u8> {
    let mut value = encode(header);
    if let Some(spec) = spec {
        value.push(b'\n');
        value.extend_from_slice(spec.as_bytes());
    }
    value
}

/// A value made by [`encode_job`]; `what` names it in the error.
pub(crate) fn decode_job(bytes: &[u8], what: &str) -> Result<(JobHeader, Option<String>), StoreError> {
    // Compact JSON never holds a raw newline: the first one ends the header.
    let (header, spec) = match bytes.iter().position(|b| *b == b'\n') {
        Some(at) => (&bytes[..at], Some(&bytes[at + 1..])),
        None => (bytes, None),
    };
    let spec = spec
        .map(|s| String::from_utf8(s.to_vec()))
        .transpose()
        .map_err(|e| StoreError::Invalid(format!("unreadable {what}: {e}")))?;
    Ok((decode(header, what)?, spec))
}

/// An instant from stored milliseconds.
pub(crate) fn instant(ms: i64) -> Result<DateTime<Utc>, StoreError> {
    DateTime::from_timestamp_millis(ms)
        .ok_or_else(|| StoreError::Invalid(format!("stored instant {ms} ms is out of range")))
}

/// A value as stored.
pub(crate) fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).expect("plain structs always serialize")
}

/// A stored value read back; `what` names it in the error.
pub(crate) fn decode<T: DeserializeOwned>(bytes: &[u8], what: &str) -> Result<T, StoreError> {
    serde_json::from_slice(bytes).map_err(|e| StoreError::Invalid(format!("unreadable {what}: {e}")))
}

/// A duration in milliseconds, saturated.
pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// The lease a running record stands for.
pub(crate) fn to_lease(record: &StoredRun) -> Result<Lease, StoreError> {
    let r = record.to_record()?;
    Ok(Lease {
        run: r.id,
        owner: r.node,
        fencing_token: r.fencing_token.ok_or_else(|| StoreError::Invalid("a running record has no token".into()))?,
        claimed_at: r.claimed_at,
        lease_until: r.lease_until.ok_or_else(|| StoreError::Invalid("a running record has no lease".into()))?,
    })
}

/// Writes the owner's `end` into its run's record.
pub(crate) fn end_record(record: &mut StoredRun, end: &RunEnd, now: i64) {
    record.end(end.state, end.reason.clone(), now);
    record.exit_code = end.exit_code;
    record.output = output_tail(&end.output).to_owned();
    record.started_at = end.started_after.map(|d| record.claimed_at.saturating_add(millis(d)));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_records_nonce_is_kept_and_a_record_without_one_reads_as_none() {
        let old = br#"{"job":"j","scheduled_at":0,"attempt":1,"trigger":"schedule","node":"a","token":1,
            "state":"running","reason":null,"claimed_at":0,"started_at":null,"finished_at":null,
            "lease_until":5,"exit_code":null,"output":"","lease_id":9,"ttl":5}"#;
        let mut record: StoredRun = decode(old, "run record").unwrap();
        assert_eq!(record.nonce, None);
        assert!(!record.claimed_with("a", 7), "a record from before nonces is never granted again");
        assert!(!String::from_utf8(encode(&record)).unwrap().contains("nonce"), "none is not written");
        record.nonce = Some(u64::MAX);
        let back: StoredRun = decode(&encode(&record), "run record").unwrap();
        assert_eq!(back, record);
        assert!(back.claimed_with("a", u64::MAX));
        assert!(!back.claimed_with("b", u64::MAX) && !back.claimed_with("a", 7));
        record.end(RunState::Succeeded, None, 6);
        assert!(!record.claimed_with("a", u64::MAX), "an ended run is not granted again");
    }

    #[test]
    fn a_job_value_keeps_its_definition_byte_for_byte_and_tells_a_delete_apart() {
        let header = JobHeader { job: "a\nb".into(), changed_by: "ann".into(), changed_at: 5 };
        let spec = "{\"x\": \"line\nbreak \\\" \u{1}\"}";
        let value = encode_job(&header, Some(spec));
        assert_eq!(value.len(), encode(&header).len() + 1 + spec.len(), "the definition is not escaped");
        assert_eq!(decode_job(&value, "job").unwrap(), (header.clone(), Some(spec.to_owned())));
        assert_eq!(decode_job(&encode_job(&header, None), "job").unwrap(), (header, None));
        assert!(decode_job(b"{\"job\":1}\n{}", "job").is_err());
    }
}
