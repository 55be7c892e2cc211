//! Decoding the scripts' replies into solocron's types. Anything unexpected is
//! [`StoreError::Invalid`], naming what could not be read.

use std::collections::HashMap;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use redis::{FromRedisValue, Value};
use solocron_core::{
    ActionRecord, ClaimOutcome, JobControl, JobDefinition, JobRevision, JobWrite, Lease, ManagedJob, NodeBeat,
    NodeRecord, Registration, RunId, RunRecord, RunState, StoreError, Tick,
};

/// A reply of the wrong shape.
pub(crate) fn invalid(what: &str, detail: impl std::fmt::Display) -> StoreError {
    StoreError::Invalid(format!("unreadable {what} in Redis: {detail}"))
}

/// A reply converted with [`FromRedisValue`], or `Invalid` naming `what`.
pub(crate) fn convert<T: FromRedisValue>(value: Value, what: &str) -> Result<T, StoreError> {
    T::from_redis_value(value).map_err(|e| invalid(what, e))
}

/// The field → value pairs of a hash, as `HGETALL` lists them.
pub(crate) struct Fields {
    what: &'static str,
    map: HashMap<String, String>,
}

impl Fields {
    /// The hash of `what` (a run record, a registration, ...) from an `HGETALL` reply.
    pub(crate) fn new(value: Value, what: &'static str) -> Result<Fields, StoreError> {
        let flat: Vec<String> = convert(value, what)?;
        let pairs = flat.chunks_exact(2);
        if !pairs.remainder().is_empty() {
            return Err(invalid(what, format!("odd number of hash elements: {flat:?}")));
        }
        let map = pairs.map(|pair| (pair[0].clone(), pair[1].clone())).collect();
        Ok(Fields { what, map })
    }

    fn optional(&self, field: &str) -> Option<&str> {
        self.map.get(field).map(String::as_str)
    }

    fn text(&self, field: &str) -> Result<String, StoreError> {
        self.optional(field).map(str::to_owned).ok_or_else(|| invalid(self.what, format!("no field `{field}`")))
    }

    fn parse_optional<T: FromStr>(&self, field: &str) -> Result<Option<T>, StoreError>
    where
        T::Err: std::fmt::Display,
    {
        self.optional(field)
            .map(|s| s.parse::<T>().map_err(|e| invalid(self.what, format!("field `{field}` = {s:?}: {e}"))))
            .transpose()
    }

    fn parse<T: FromStr>(&self, field: &str) -> Result<T, StoreError>
    where
        T::Err: std::fmt::Display,
    {
        self.parse_optional(field)?.ok_or_else(|| invalid(self.what, format!("no field `{field}`")))
    }

    fn instant_optional(&self, field: &str) -> Result<Option<DateTime<Utc>>, StoreError> {
        self.parse_optional::<i64>(field)?.map(instant).transpose()
    }

    fn instant(&self, field: &str) -> Result<DateTime<Utc>, StoreError> {
        instant(self.parse(field)?)
    }
}

/// An instant from milliseconds since the epoch.
pub(crate) fn instant(ms: i64) -> Result<DateTime<Utc>, StoreError> {
    DateTime::from_timestamp_millis(ms).ok_or_else(|| invalid("instant", format!("{ms} ms is out of range")))
}

/// A run record from its hash (see the crate's data layout).
pub(crate) fn record(value: Value) -> Result<RunRecord, StoreError> {
    let f = Fields::new(value, "run record")?;
    let attempt: u32 = f.parse("att")?;
    if attempt == 0 {
        return Err(invalid("run record", "attempt 0"));
    }
    let state: RunState = f.parse("state")?;
    // An ended record keeps its last lease's field (nothing deletes it): not a lease.
    let lease_until = if state.is_terminal() { None } else { f.instant_optional("lease")? };
    Ok(RunRecord {
        id: RunId { tick: Tick::new(f.text("job")?, f.instant("at")?), attempt },
        trigger: f.parse("trig")?,
        node: f.text("node")?,
        fencing_token: f.parse_optional("tok")?,
        state,
        reason: f.optional("reason").map(str::to_owned),
        claimed_at: f.instant("claimed")?,
        started_at: f.instant_optional("started")?,
        finished_at: f.instant_optional("finished")?,
        lease_until,
        exit_code: f.parse_optional("exit")?,
        output: f.text("out")?,
    })
}

/// Each element of an array reply decoded by `decode`, separately (so that the caller may
/// skip one that cannot be read).
pub(crate) fn each<T>(
    value: Value,
    what: &str,
    decode: impl Fn(Value) -> Result<T, StoreError>,
) -> Result<Vec<Result<T, StoreError>>, StoreError> {
    let items: Vec<Value> = convert(value, what)?;
    Ok(items.into_iter().map(decode).collect())
}

/// A run id as the scripts spell it: `<scheduled_at ms>:<attempt>:<job>`.
pub(crate) fn run_id(id: &str) -> Result<RunId, StoreError> {
    let parse = || {
        let (at, rest) = id.split_once(':')?;
        let (attempt, job) = rest.split_once(':')?;
        let attempt: u32 = attempt.parse().ok().filter(|a| *a >= 1)?;
        let at = DateTime::from_timestamp_millis(at.parse().ok()?)?;
        Some(RunId { tick: Tick::new(job, at), attempt })
    };
    parse().ok_or_else(|| invalid("run id", id))
}

/// `{'won', token, claimed_at, lease_until}` as the lease of `run` held by `owner`.
pub(crate) fn won<S: AsRef<str>>(parts: &[S], run: RunId, owner: &str) -> Result<Lease, StoreError> {
    let number = |i: usize| -> Result<i64, StoreError> {
        let s = parts.get(i).map(AsRef::as_ref).ok_or_else(|| invalid("lease", format!("{} parts", parts.len())))?;
        s.parse().map_err(|e| invalid("lease", format!("{s:?}: {e}")))
    };
    lease(run, owner, [number(1)?, number(2)?, number(3)?])
}

/// The lease of `run` held by `owner` from its token, `claimed_at` and `lease_until`.
fn lease(run: RunId, owner: &str, [token, claimed_at, lease_until]: [i64; 3]) -> Result<Lease, StoreError> {
    Ok(Lease {
        run,
        owner: owner.to_owned(),
        fencing_token: u64::try_from(token).map_err(|e| invalid("fencing token", e))?,
        claimed_at: instant(claimed_at)?,
        lease_until: instant(lease_until)?,
    })
}

/// The three integers of a won outcome's `token:claimed_at:lease_until`, read in one pass
/// over its bytes (every won tick's path: splitting and parsing each part was a tenth of a
/// claim's client time); `None` unless exactly three unsigned decimals that fit an `i64`.
fn three_numbers(text: &str) -> Option<[i64; 3]> {
    let mut numbers = [0i64; 3];
    let mut fields = text.as_bytes().split(|b| *b == b':');
    for number in &mut numbers {
        let field = fields.next().filter(|f| !f.is_empty())?;
        for &digit in field {
            if !digit.is_ascii_digit() {
                return None;
            }
            *number = number.checked_mul(10)?.checked_add(i64::from(digit - b'0'))?;
        }
    }
    fields.next().is_none().then_some(numbers)
}

/// One flag per item (`'1'` done, `'0'` not), `count` of them, as one string.
pub(crate) fn flags(flags: &[u8], count: usize) -> Result<Vec<bool>, StoreError> {
    if flags.len() != count {
        return Err(invalid("flags", format!("{} flags for {count} items", flags.len())));
    }
    flags
        .iter()
        .map(|f| match f {
            b'1' => Ok(true),
            b'0' => Ok(false),
            other => Err(invalid("flags", format!("flag {:?}", *other as char))),
        })
        .collect()
}

/// One claim outcome as `claim` answers it, its parts joined by `:` in one string
/// (`won:token:claimed_at:lease_until`, `skipped:reason`, `taken`, `early:store_now ms`):
/// one string per outcome, not an array, is what keeps a reply of thousands cheap to read.
pub(crate) fn claim_outcome_text(text: &str, run: RunId, owner: &str) -> Result<ClaimOutcome, StoreError> {
    let (kind, rest) = text.split_once(':').unwrap_or((text, ""));
    match kind {
        "won" => {
            let numbers = three_numbers(rest).ok_or_else(|| invalid("claim outcome", text))?;
            Ok(ClaimOutcome::Won(lease(run, owner, numbers)?))
        }
        "skipped" if text.len() > kind.len() => Ok(ClaimOutcome::Skipped { reason: rest.to_owned() }),
        "taken" => Ok(ClaimOutcome::Taken),
        "early" => {
            let ms: i64 = rest.parse().map_err(|e| invalid("claim outcome", format!("{text:?}: {e}")))?;
            Ok(ClaimOutcome::TooEarly { store_now: instant(ms)? })
        }
        _ => Err(invalid("claim outcome", text)),
    }
}

/// A registration from its hash.
pub(crate) fn registration(value: Value) -> Result<Registration, StoreError> {
    let f = Fields::new(value, "registration")?;
    Ok(Registration {
        definition: JobDefinition {
            job: f.text("job")?,
            schedule: f.text("schedule")?,
            timezone: f.text("tz")?,
            definition_hash: f.text("hash")?,
            summary: f.text("summary")?,
        },
        node: f.text("node")?,
        first_seen: f.instant("first")?,
        last_seen: f.instant("last")?,
    })
}

/// A job's switches from its hash.
pub(crate) fn control(value: Value) -> Result<JobControl, StoreError> {
    let f = Fields::new(value, "job control")?;
    Ok(JobControl {
        job: f.text("job")?,
        paused: f.text("paused")? == "1",
        changed_by: f.text("by")?,
        reason: f.optional("reason").map(str::to_owned),
        changed_at: f.instant("at")?,
    })
}

/// A node from its hash (`lua/heartbeat.lua`).
pub(crate) fn node(value: Value) -> Result<NodeRecord, StoreError> {
    let f = Fields::new(value, "node")?;
    Ok(NodeRecord {
        beat: NodeBeat {
            node: f.text("node")?,
            version: f.text("ver")?,
            jobs: f.parse("jobs")?,
            running: f.parse("running")?,
        },
        started_at: f.instant("started")?,
        last_seen: f.instant("last")?,
        left_at: f.instant_optional("left")?,
    })
}

/// An operator's action from its hash (the head's `record_action`).
pub(crate) fn action(value: Value) -> Result<ActionRecord, StoreError> {
    let f = Fields::new(value, "action")?;
    Ok(ActionRecord {
        job: f.text("job")?,
        kind: f.parse("kind")?,
        by: f.text("by")?,
        reason: f.optional("reason").map(str::to_owned),
        at: f.instant("at")?,
        detail: f.text("detail")?,
    })
}

/// A managed job from its hash (`lua/job_write.lua`).
pub(crate) fn managed_job(value: Value) -> Result<ManagedJob, StoreError> {
    let f = Fields::new(value, "managed job")?;
    Ok(ManagedJob {
        job: f.text("job")?,
        spec: f.text("spec")?,
        revision: f.parse("rev")?,
        changed_by: f.text("by")?,
        changed_at: f.instant("at")?,
    })
}

/// A revision of a managed job from its hash (no `spec`: a delete).
pub(crate) fn job_revision(value: Value) -> Result<JobRevision, StoreError> {
    let f = Fields::new(value, "job revision")?;
    Ok(JobRevision {
        job: f.text("job")?,
        revision: f.parse("rev")?,
        spec: f.optional("spec").map(str::to_owned),
        changed_by: f.text("by")?,
        changed_at: f.instant("at")?,
    })
}

/// What `lua/job_write.lua` did: `{'written', rev}`, `{'unchanged', rev or ''}`,
/// `{'conflict', rev or ''}` or `{'full'}`.
pub(crate) fn job_write(parts: &[String]) -> Result<JobWrite, StoreError> {
    let bad = || invalid("job write reply", format!("{parts:?}"));
    let revision = || -> Result<Option<u64>, StoreError> {
        match parts.get(1).map(String::as_str) {
            Some("") => Ok(None),
            Some(r) => r.parse().map(Some).map_err(|_| bad()),
            None => Err(bad()),
        }
    };
    match (parts.first().map(String::as_str), parts.len()) {
        (Some("written"), 2) => Ok(JobWrite::Written(revision()?.ok_or_else(bad)?)),
        (Some("unchanged"), 2) => Ok(JobWrite::Unchanged(revision()?)),
        (Some("conflict"), 2) => Ok(JobWrite::Conflict(revision()?)),
        (Some("full"), 1) => Ok(JobWrite::Full),
        _ => Err(bad()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(items: &[&str]) -> Value {
        Value::Array(items.iter().map(|s| Value::BulkString(s.as_bytes().to_vec())).collect())
    }

    #[test]
    fn run_ids_keep_colons_in_job_names() {
        let id = run_id("1577836800000:0000000002:a:b").unwrap();
        assert_eq!(id.to_string(), "a:b@2020-01-01T00:00:00.000Z#2");
        assert!(run_id("x:1:job").is_err());
        assert!(run_id("5:0000000000:job").is_err(), "attempt 0");
    }

    #[test]
    fn records_decode_with_and_without_optional_fields() {
        let skipped = bulk(&[
            "job", "j", "at", "1000", "att", "1", "trig", "catchup", "node", "n", "state", "skipped", "reason",
            "missed", "claimed", "5", "finished", "5", "out", "",
        ]);
        let r = record(skipped).unwrap();
        assert_eq!((r.fencing_token, r.lease_until, r.reason.as_deref()), (None, None, Some("missed")));
        let broken = bulk(&["job", "j", "at", "x"]);
        assert!(matches!(record(broken), Err(StoreError::Invalid(_))));
    }

    #[test]
    fn claim_refusals_decode_with_the_stores_now_and_odd_ones_are_refused() {
        let reply = |text: &str| claim_outcome_text(text, run_id("1000:0000000001:j").unwrap(), "n");
        let store_now = DateTime::from_timestamp_millis(1_790_000_000_123).unwrap();
        assert_eq!(reply("early:1790000000123").unwrap(), ClaimOutcome::TooEarly { store_now });
        assert_eq!(reply("taken").unwrap(), ClaimOutcome::Taken);
        let won = reply("won:7:1000:6000").unwrap();
        assert!(
            matches!(&won, ClaimOutcome::Won(l) if l.fencing_token == 7 && l.lease_until.timestamp_millis() == 6000 && l.owner == "n")
        );
        // A reason keeps its colons.
        assert_eq!(
            reply("skipped:paused by ops: a: b").unwrap(),
            ClaimOutcome::Skipped { reason: "paused by ops: a: b".into() }
        );
        let odd_wins =
            ["won:1:2", "won:1:2:3:4", "won:1::3", "won:-1:2:3", "won:1:2:3x", "won:99999999999999999999:2:3"];
        for odd in ["early", "early:x", "early:1:2", "later", "skipped", ""].into_iter().chain(odd_wins) {
            assert!(matches!(reply(odd), Err(StoreError::Invalid(_))), "{odd:?}");
        }
    }

    #[test]
    fn flags_decode_one_per_item_and_odd_ones_are_refused() {
        assert_eq!(flags(b"101", 3).unwrap(), vec![true, false, true]);
        assert!(flags(b"10", 3).is_err());
        assert!(flags(b"1x1", 3).is_err());
        assert_eq!(flags(b"", 0).unwrap(), Vec::<bool>::new());
    }

    #[test]
    fn job_write_replies_decode_and_odd_ones_are_refused() {
        let reply = |parts: &[&str]| job_write(&parts.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(reply(&["written", "7"]).unwrap(), JobWrite::Written(7));
        assert_eq!(reply(&["unchanged", ""]).unwrap(), JobWrite::Unchanged(None));
        assert_eq!(reply(&["conflict", "3"]).unwrap(), JobWrite::Conflict(Some(3)));
        assert_eq!(reply(&["full"]).unwrap(), JobWrite::Full);
        for odd in [&["written", ""][..], &["written"], &["conflict", "x"], &["full", "1"], &[]] {
            assert!(matches!(reply(odd), Err(StoreError::Invalid(_))), "{odd:?}");
        }
    }
}
