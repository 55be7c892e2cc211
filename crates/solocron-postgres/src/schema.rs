//! The schema, as versioned migrations, and the server-side claim functions; `migrate`,
//! which applies what is missing, `schema`, which reads where it stands, and `uninstall`,
//! which drops it all.
//!
//! Every statement is a template: `{p}` stands for the table prefix (from a
//! [`Prefix`](solocron_core::Prefix): letters, digits and `_` only, so safe to splice) and
//! `{now}` for the server clock in milliseconds.

use std::borrow::Cow;

use solocron_core::{SchemaState, StoreError, CLAIM_EARLY_MAX};
use sqlx::PgConnection;

use crate::error::{retrying, Res};
use crate::PgStore;

/// The schema version this crate writes and understands.
pub(crate) const SCHEMA_VERSION: i32 = 13;

/// The store's "now" in SQL: the server clock, in integer milliseconds since the epoch.
/// `now()` is the start of the current transaction, so one statement (or one transaction)
/// sees a single instant however long it runs.
pub(crate) const NOW_MS: &str = "floor(extract(epoch FROM now()) * 1000)::bigint";

/// The migrations, by the version each one brings the schema to. Later versions append
/// here; a released step is never edited.
pub(crate) const MIGRATIONS: &[(i32, &[&str])] = &[
    (1, V1),
    (2, V2),
    (3, V3),
    (4, V4),
    (5, V5),
    (6, V6),
    (7, V7),
    (8, V8),
    (9, V9),
    (10, V10),
    (11, V11),
    (12, V12),
    (13, V13),
];

const V1: &[&str] = &[
    r#"CREATE TABLE IF NOT EXISTS {p}runs (
        job TEXT NOT NULL,
        scheduled_at BIGINT NOT NULL,
        attempt INTEGER NOT NULL CHECK (attempt >= 1),
        "trigger" TEXT NOT NULL,
        node TEXT NOT NULL,
        token BIGINT NULL,
        state TEXT NOT NULL,
        reason TEXT NULL,
        claimed_at BIGINT NOT NULL,
        started_at BIGINT NULL,
        finished_at BIGINT NULL,
        lease_until BIGINT NULL,
        exit_code INTEGER NULL,
        output TEXT NOT NULL DEFAULT '',
        -- Tick uniqueness (attempt 1 of a tick is created once), and per-job history
        -- newest first (a backward scan of one job's entries).
        PRIMARY KEY (job, scheduled_at, attempt)
    )"#,
    // Per-job fencing counters, kept apart from the runs so that a token is never reused
    // after records are pruned. Its rows are also the per-job locks that serialize claims.
    "CREATE TABLE IF NOT EXISTS {p}fences (job TEXT PRIMARY KEY, token BIGINT NOT NULL)",
    // The fleet-wide switches (pause) an operator left on a job.
    "CREATE TABLE IF NOT EXISTS {p}jobs (
        job TEXT PRIMARY KEY,
        paused BOOLEAN NOT NULL,
        changed_by TEXT NOT NULL,
        reason TEXT NULL,
        changed_at BIGINT NOT NULL
    )",
    // Which node runs which job, as defined; the primary key serves `registrations`' order.
    "CREATE TABLE IF NOT EXISTS {p}registry (
        job TEXT NOT NULL,
        node TEXT NOT NULL,
        schedule TEXT NOT NULL,
        timezone TEXT NOT NULL,
        definition_hash TEXT NOT NULL,
        summary TEXT NOT NULL,
        first_seen BIGINT NOT NULL,
        last_seen BIGINT NOT NULL,
        PRIMARY KEY (job, node)
    )",
    // Manual run requests; the key is the manual tick, so one instant is asked for once.
    "CREATE TABLE IF NOT EXISTS {p}requests (
        job TEXT NOT NULL,
        requested_at BIGINT NOT NULL,
        requested_by TEXT NOT NULL,
        PRIMARY KEY (job, requested_at)
    )",
    // Serves `expired`: running runs by lease expiry, oldest first. Partial, so it holds
    // only the few running runs, however long the history grows.
    "CREATE INDEX IF NOT EXISTS {p}runs_expiry ON {p}runs (lease_until) WHERE state = 'running'",
    // Serves claim's overlap check (the newest running run of a job) and `unlock` (every
    // running run of a job). Ordered like the primary key so the overlap check reads its
    // answer first; without that order the planner may prefer walking the job's whole
    // history backwards through the primary key to avoid a sort.
    "CREATE INDEX IF NOT EXISTS {p}runs_running ON {p}runs (job, scheduled_at, attempt) WHERE state = 'running'",
    // Serves `history` across jobs (newest first, a backward scan) and `prune` (oldest
    // first below the cutoff, a forward scan). Per-job history uses the primary key.
    "CREATE INDEX IF NOT EXISTS {p}runs_scheduled ON {p}runs (scheduled_at, attempt)",
    // Serves `pending_requests` (oldest first) and `prune`'s deletion of old requests.
    "CREATE INDEX IF NOT EXISTS {p}requests_oldest ON {p}requests (requested_at)",
    CLAIM_FUNCTION,
];

/// One whole claim batch in one server-side call (so one round trip), as one transaction.
///
/// It first locks the fence rows of every job in the batch, in sorted order: claims of the
/// same job then take turns (closing the overlap race between nodes claiming *different*
/// ticks of a job under READ COMMITTED), and two batches sharing jobs wait for each other
/// in one global order, never in a cycle. Under READ COMMITTED each statement of a PL/pgSQL
/// function takes a fresh snapshot, so a claim that waited for a lock sees what the holder
/// committed. Then, for each request in order: paused, overlap, insert-if-absent, token.
/// Outcomes are `won` (with token and instants), `skipped` (with reason) or `taken`.
const CLAIM_FUNCTION: &str = r#"
CREATE OR REPLACE FUNCTION {p}claim(
    p_jobs TEXT[], p_ticks BIGINT[], p_triggers TEXT[], p_nodes TEXT[],
    p_leases BIGINT[], p_modes TEXT[], p_reasons TEXT[])
RETURNS TABLE (o_index INTEGER, o_outcome TEXT, o_reason TEXT, o_token BIGINT,
               o_claimed_at BIGINT, o_lease_until BIGINT)
LANGUAGE plpgsql VOLATILE AS $claim$
DECLARE
    v_now BIGINT;
    v_reason TEXT;
    v_found RECORD;
BEGIN
    INSERT INTO {p}fences (job, token)
        SELECT DISTINCT j, 0 FROM unnest(p_jobs) AS j ORDER BY 1
        ON CONFLICT (job) DO NOTHING;
    PERFORM 1 FROM {p}fences WHERE job = ANY (p_jobs) ORDER BY job FOR UPDATE;
    -- The clock is read once the locks are held, so that a claim that waited for another
    -- gets a later claimed_at, in step with its larger fencing token.
    v_now := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    FOR i IN 1 .. coalesce(array_length(p_jobs, 1), 0) LOOP
        o_index := i;
        o_reason := NULL; o_token := NULL; o_claimed_at := NULL; o_lease_until := NULL;
        v_reason := NULL;
        IF p_modes[i] = 'skip' THEN
            v_reason := p_reasons[i];
        ELSE
            IF p_triggers[i] <> 'manual' THEN
                SELECT changed_by, reason INTO v_found FROM {p}jobs WHERE job = p_jobs[i] AND paused;
                IF FOUND THEN
                    v_reason := 'paused by ' || v_found.changed_by || coalesce(': ' || v_found.reason, '');
                END IF;
            END IF;
            IF v_reason IS NULL AND p_modes[i] = 'run-unless-running' THEN
                -- Any running run counts, even one whose lease expired: it awaits recovery.
                SELECT job, scheduled_at, attempt INTO v_found FROM {p}runs
                    WHERE job = p_jobs[i] AND state = 'running'
                    ORDER BY scheduled_at DESC, attempt DESC LIMIT 1;
                IF FOUND THEN
                    -- Spelled like RunId's Display: job@2026-01-01T00:00:00.000Z#1
                    v_reason := 'overlap: previous run ' || v_found.job || '@'
                        || to_char('epoch'::timestamp + v_found.scheduled_at * interval '1 millisecond',
                                   'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')
                        || '#' || v_found.attempt || ' still running';
                END IF;
            END IF;
        END IF;
        IF v_reason IS NOT NULL THEN
            INSERT INTO {p}runs (job, scheduled_at, attempt, "trigger", node, state, reason, claimed_at, finished_at)
                VALUES (p_jobs[i], p_ticks[i], 1, p_triggers[i], p_nodes[i], 'skipped', v_reason, v_now, v_now)
                ON CONFLICT (job, scheduled_at, attempt) DO NOTHING;
            IF FOUND THEN
                o_outcome := 'skipped'; o_reason := v_reason;
            ELSE
                o_outcome := 'taken';
            END IF;
        ELSE
            -- The fence row is locked, so reading its token here and storing the next one
            -- below cannot interleave with another claim of the job.
            INSERT INTO {p}runs (job, scheduled_at, attempt, "trigger", node, token, state, claimed_at, lease_until)
                SELECT p_jobs[i], p_ticks[i], 1, p_triggers[i], p_nodes[i], f.token + 1, 'running',
                       v_now, v_now + p_leases[i]
                FROM {p}fences f WHERE f.job = p_jobs[i]
                ON CONFLICT (job, scheduled_at, attempt) DO NOTHING
                RETURNING token INTO o_token;
            IF FOUND THEN
                UPDATE {p}fences SET token = o_token WHERE job = p_jobs[i];
                o_outcome := 'won'; o_claimed_at := v_now; o_lease_until := v_now + p_leases[i];
            ELSE
                o_outcome := 'taken';
            END IF;
        END IF;
        RETURN NEXT;
    END LOOP;
END
$claim$"#;

/// Version 2: `{p}claim_taken_first`, for large batches.
const V2: &[&str] = &[CLAIM_TAKEN_FIRST];

/// Version 3: the index of runs by instant also holds the job, so that every lookup of
/// one run (`job`, `scheduled_at`, `attempt`: renew, finish, the claim's checks) is exact
/// whichever index the planner picks. With `(scheduled_at, attempt)` alone, a herd's fresh
/// rows (all of one instant, not yet in the statistics) looked cheap to reach through it,
/// and each lookup scanned every run of the instant: a batch of 256 ends over a
/// 100,000-run herd took 818 ms instead of 3 ms. The index is rebuilt inside the migration's
/// transaction (writes to the runs wait meanwhile: seconds on millions of rows).
const V3: &[&str] = &[
    "DROP INDEX IF EXISTS {p}runs_scheduled",
    "CREATE INDEX IF NOT EXISTS {p}runs_scheduled_job ON {p}runs (scheduled_at, attempt, job)",
];

/// Version 4: `{p}claim` in fewer statements ([`CLAIM_FUNCTION_V4`]).
const V4: &[&str] = &[CLAIM_FUNCTION_V4];

/// [`CLAIM_FUNCTION`] with the same answers in fewer statements: a one-tick claim was six
/// (create the fence row if absent, lock it, read the pause, read the overlap, insert the
/// run, store the token) and is two. One upsert both locks the batch's fence rows (in sorted
/// order, as before) and reserves one token per request (`token + n` for a job with `n`
/// requests; a request that does not win leaves its token unused: tokens only need to
/// grow). Then one `INSERT … SELECT … WHERE NOT EXISTS (pause) AND NOT EXISTS (overlap)`
/// per request, in its own snapshot taken after the locks, as before. Only a request that
/// does not win reads why: its tick's record (`taken`), the pause, the overlap (`skipped`);
/// if none of these holds any more (the running run ended meanwhile: its end is not
/// serialized by the fence lock), the insert is tried again, at most
/// ten times before the claim fails as a serialization failure
/// (retried).
const CLAIM_FUNCTION_V4: &str = r#"
CREATE OR REPLACE FUNCTION {p}claim(
    p_jobs TEXT[], p_ticks BIGINT[], p_triggers TEXT[], p_nodes TEXT[],
    p_leases BIGINT[], p_modes TEXT[], p_reasons TEXT[])
RETURNS TABLE (o_index INTEGER, o_outcome TEXT, o_reason TEXT, o_token BIGINT,
               o_claimed_at BIGINT, o_lease_until BIGINT)
LANGUAGE plpgsql VOLATILE AS $claim$
DECLARE
    v_now BIGINT;
    v_reason TEXT;
    v_found RECORD;
    v_tokens BIGINT[];
    v_rechecks INTEGER;
BEGIN
    IF coalesce(cardinality(p_jobs), 0) = 0 THEN
        RETURN;
    ELSIF cardinality(p_jobs) = 1 THEN
        INSERT INTO {p}fences AS f (job, token) VALUES (p_jobs[1], 1)
            ON CONFLICT (job) DO UPDATE SET token = f.token + 1
            RETURNING ARRAY[f.token] INTO v_tokens;
    ELSE
        WITH reserved AS (
            INSERT INTO {p}fences AS f (job, token)
                SELECT j, count(*) FROM unnest(p_jobs) AS j GROUP BY j ORDER BY j
                ON CONFLICT (job) DO UPDATE SET token = f.token + excluded.token
                RETURNING f.job, f.token),
        requests AS (
            SELECT r.j, r.i, row_number() OVER (PARTITION BY r.j ORDER BY r.i) AS k,
                   count(*) OVER (PARTITION BY r.j) AS n
            FROM unnest(p_jobs) WITH ORDINALITY AS r(j, i))
        SELECT array_agg(reserved.token - requests.n + requests.k ORDER BY requests.i) INTO v_tokens
            FROM requests JOIN reserved ON reserved.job = requests.j;
    END IF;
    -- The clock is read once the locks are held, so that a claim that waited for another
    -- gets a later claimed_at, in step with its larger fencing token.
    v_now := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    FOR i IN 1 .. cardinality(p_jobs) LOOP
        o_index := i;
        o_reason := NULL; o_token := NULL; o_claimed_at := NULL; o_lease_until := NULL;
        v_rechecks := 0;
        LOOP
            v_reason := NULL;
            IF p_modes[i] = 'skip' THEN
                v_reason := p_reasons[i];
            ELSE
                INSERT INTO {p}runs (job, scheduled_at, attempt, "trigger", node, token, state, claimed_at, lease_until)
                    SELECT p_jobs[i], p_ticks[i], 1, p_triggers[i], p_nodes[i], v_tokens[i], 'running',
                           v_now, v_now + p_leases[i]
                    WHERE (p_triggers[i] = 'manual'
                           OR NOT EXISTS (SELECT 1 FROM {p}jobs WHERE job = p_jobs[i] AND paused))
                      AND (p_modes[i] <> 'run-unless-running'
                           OR NOT EXISTS (SELECT 1 FROM {p}runs WHERE job = p_jobs[i] AND state = 'running'))
                    ON CONFLICT (job, scheduled_at, attempt) DO NOTHING;
                IF FOUND THEN
                    o_outcome := 'won'; o_token := v_tokens[i];
                    o_claimed_at := v_now; o_lease_until := v_now + p_leases[i];
                    EXIT;
                END IF;
                PERFORM 1 FROM {p}runs WHERE job = p_jobs[i] AND scheduled_at = p_ticks[i] AND attempt = 1;
                IF FOUND THEN
                    o_outcome := 'taken';
                    EXIT;
                END IF;
                IF p_triggers[i] <> 'manual' THEN
                    SELECT changed_by, reason INTO v_found FROM {p}jobs WHERE job = p_jobs[i] AND paused;
                    IF FOUND THEN
                        v_reason := 'paused by ' || v_found.changed_by || coalesce(': ' || v_found.reason, '');
                    END IF;
                END IF;
                IF v_reason IS NULL AND p_modes[i] = 'run-unless-running' THEN
                    -- Any running run counts, even one whose lease expired: it awaits recovery.
                    SELECT job, scheduled_at, attempt INTO v_found FROM {p}runs
                        WHERE job = p_jobs[i] AND state = 'running'
                        ORDER BY scheduled_at DESC, attempt DESC LIMIT 1;
                    IF FOUND THEN
                        -- Spelled like RunId's Display: job@2026-01-01T00:00:00.000Z#1
                        v_reason := 'overlap: previous run ' || v_found.job || '@'
                            || to_char('epoch'::timestamp + v_found.scheduled_at * interval '1 millisecond',
                                       'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')
                            || '#' || v_found.attempt || ' still running';
                    END IF;
                END IF;
            END IF;
            IF v_reason IS NOT NULL THEN
                INSERT INTO {p}runs (job, scheduled_at, attempt, "trigger", node, state, reason, claimed_at, finished_at)
                    VALUES (p_jobs[i], p_ticks[i], 1, p_triggers[i], p_nodes[i], 'skipped', v_reason, v_now, v_now)
                    ON CONFLICT (job, scheduled_at, attempt) DO NOTHING;
                IF FOUND THEN
                    o_outcome := 'skipped'; o_reason := v_reason;
                ELSE
                    o_outcome := 'taken';
                END IF;
                EXIT;
            END IF;
            -- What kept the run from being inserted is gone (the running run ended, the
            -- job was resumed): try again.
            v_rechecks := v_rechecks + 1;
            IF v_rechecks >= 10 THEN
                RAISE EXCEPTION 'the claim of % kept changing under it', p_jobs[i] USING ERRCODE = '40001';
            END IF;
        END LOOP;
        RETURN NEXT;
    END LOOP;
END
$claim$"#;

/// Version 5: `{p}claim_one`, the claim of one tick ([`CLAIM_ONE_FUNCTION`]).
const V5: &[&str] = &[CLAIM_ONE_FUNCTION];

/// [`CLAIM_FUNCTION_V4`] for a batch of one, with the same answers, taking scalars and
/// answering one row (`o_index` 1) instead of taking arrays and returning a set: the
/// arrays' decoding and the set's tuple store were ~30 µs of a one-tick claim's ~360 µs
/// here (benchmarks/2026-11-25-fair-raw-insert-claim-functions-46f38a3.md). Most claims are of one tick (a job's own schedule);
/// batches keep `{p}claim`. Its steps are those of the batch's, for one request: the
/// upsert that locks the fence row and reserves a token, one insert that checks the pause
/// and the overlap in a snapshot taken after the lock, and only if it did not win, why.
const CLAIM_ONE_FUNCTION: &str = r#"
CREATE OR REPLACE FUNCTION {p}claim_one(
    p_job TEXT, p_tick BIGINT, p_trigger TEXT, p_node TEXT, p_lease BIGINT, p_mode TEXT, p_reason TEXT,
    OUT o_index INTEGER, OUT o_outcome TEXT, OUT o_reason TEXT, OUT o_token BIGINT,
    OUT o_claimed_at BIGINT, OUT o_lease_until BIGINT)
LANGUAGE plpgsql VOLATILE AS $claim$
DECLARE
    v_now BIGINT;
    v_reason TEXT;
    v_found RECORD;
    v_token BIGINT;
    v_rechecks INTEGER := 0;
BEGIN
    o_index := 1;
    INSERT INTO {p}fences AS f (job, token) VALUES (p_job, 1)
        ON CONFLICT (job) DO UPDATE SET token = f.token + 1
        RETURNING f.token INTO v_token;
    -- The clock is read once the lock is held, as in {p}claim.
    v_now := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    LOOP
        v_reason := NULL;
        IF p_mode = 'skip' THEN
            v_reason := p_reason;
        ELSE
            INSERT INTO {p}runs (job, scheduled_at, attempt, "trigger", node, token, state, claimed_at, lease_until)
                SELECT p_job, p_tick, 1, p_trigger, p_node, v_token, 'running', v_now, v_now + p_lease
                WHERE (p_trigger = 'manual'
                       OR NOT EXISTS (SELECT 1 FROM {p}jobs WHERE job = p_job AND paused))
                  AND (p_mode <> 'run-unless-running'
                       OR NOT EXISTS (SELECT 1 FROM {p}runs WHERE job = p_job AND state = 'running'))
                ON CONFLICT (job, scheduled_at, attempt) DO NOTHING;
            IF FOUND THEN
                o_outcome := 'won'; o_token := v_token;
                o_claimed_at := v_now; o_lease_until := v_now + p_lease;
                RETURN;
            END IF;
            PERFORM 1 FROM {p}runs WHERE job = p_job AND scheduled_at = p_tick AND attempt = 1;
            IF FOUND THEN
                o_outcome := 'taken';
                RETURN;
            END IF;
            IF p_trigger <> 'manual' THEN
                SELECT changed_by, reason INTO v_found FROM {p}jobs WHERE job = p_job AND paused;
                IF FOUND THEN
                    v_reason := 'paused by ' || v_found.changed_by || coalesce(': ' || v_found.reason, '');
                END IF;
            END IF;
            IF v_reason IS NULL AND p_mode = 'run-unless-running' THEN
                -- Any running run counts, even one whose lease expired: it awaits recovery.
                SELECT job, scheduled_at, attempt INTO v_found FROM {p}runs
                    WHERE job = p_job AND state = 'running'
                    ORDER BY scheduled_at DESC, attempt DESC LIMIT 1;
                IF FOUND THEN
                    -- Spelled like RunId's Display: job@2026-01-01T00:00:00.000Z#1
                    v_reason := 'overlap: previous run ' || v_found.job || '@'
                        || to_char('epoch'::timestamp + v_found.scheduled_at * interval '1 millisecond',
                                   'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')
                        || '#' || v_found.attempt || ' still running';
                END IF;
            END IF;
        END IF;
        IF v_reason IS NOT NULL THEN
            INSERT INTO {p}runs (job, scheduled_at, attempt, "trigger", node, state, reason, claimed_at, finished_at)
                VALUES (p_job, p_tick, 1, p_trigger, p_node, 'skipped', v_reason, v_now, v_now)
                ON CONFLICT (job, scheduled_at, attempt) DO NOTHING;
            IF FOUND THEN
                o_outcome := 'skipped'; o_reason := v_reason;
            ELSE
                o_outcome := 'taken';
            END IF;
            RETURN;
        END IF;
        -- What kept the run from being inserted is gone (the running run ended, the job
        -- was resumed): try again.
        v_rechecks := v_rechecks + 1;
        IF v_rechecks >= 10 THEN
            RAISE EXCEPTION 'the claim of % kept changing under it', p_job USING ERRCODE = '40001';
        END IF;
    END LOOP;
END
$claim$"#;

/// Version 6: each node's last heartbeat (one row per node: few rows, read whole) and the
/// audit log of operators' actions, with its indexes for `actions` newest first (across
/// jobs, per job) and for `prune` (oldest first below the cutoff).
const V6: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS {p}nodes (
        node TEXT PRIMARY KEY,
        version TEXT NOT NULL,
        jobs BIGINT NOT NULL,
        running BIGINT NOT NULL,
        started_at BIGINT NOT NULL,
        last_seen BIGINT NOT NULL,
        left_at BIGINT NULL
    )",
    "CREATE TABLE IF NOT EXISTS {p}actions (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        job TEXT NOT NULL,
        kind TEXT NOT NULL,
        done_by TEXT NOT NULL,
        reason TEXT NULL,
        done_at BIGINT NOT NULL,
        detail TEXT NOT NULL
    )",
    "CREATE INDEX IF NOT EXISTS {p}actions_newest ON {p}actions (done_at, id)",
    "CREATE INDEX IF NOT EXISTS {p}actions_job ON {p}actions (job, done_at, id)",
];

/// Version 7: managed jobs (`managed.rs`): one row per live job, one per change of one
/// (its index serves a job's revisions newest first), and the store-wide revision counter,
/// one row whose lock orders the writers.
const V7: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS {p}managed (
        job TEXT PRIMARY KEY,
        spec TEXT NOT NULL,
        revision BIGINT NOT NULL,
        changed_by TEXT NOT NULL,
        changed_at BIGINT NOT NULL
    )",
    "CREATE TABLE IF NOT EXISTS {p}job_revisions (
        revision BIGINT PRIMARY KEY,
        job TEXT NOT NULL,
        spec TEXT NULL,
        changed_by TEXT NOT NULL,
        changed_at BIGINT NOT NULL
    )",
    "CREATE INDEX IF NOT EXISTS {p}job_revisions_job ON {p}job_revisions (job, revision)",
    "CREATE TABLE IF NOT EXISTS {p}managed_version (
        id SMALLINT PRIMARY KEY CHECK (id = 1),
        revision BIGINT NOT NULL
    )",
    "INSERT INTO {p}managed_version (id, revision) VALUES (1, 0) ON CONFLICT (id) DO NOTHING",
];

/// Version 8: the nonce of the claim that created a run (`nonce`, `NULL` on the records
/// of earlier versions and of attempts after the first), and the claim functions taking
/// each request's nonce: [`CLAIM_FUNCTION_V8`], [`CLAIM_ONE_FUNCTION_V8`] and
/// [`CLAIM_TAKEN_FIRST_V8`]. A nullable column without a default is added without
/// rewriting the table. The functions of earlier versions are dropped rather than left as
/// overloads, so that each name keeps one function (`uninstall` drops them by name); a
/// node of an older build still running then fails its claims until it is upgraded, as
/// its `migrate` would refuse this version.
const V8: &[&str] = &[
    "ALTER TABLE {p}runs ADD COLUMN IF NOT EXISTS nonce BIGINT NULL",
    "DROP FUNCTION IF EXISTS {p}claim_taken_first(TEXT[], BIGINT[], TEXT[], TEXT[], BIGINT[], TEXT[], TEXT[])",
    "DROP FUNCTION IF EXISTS {p}claim_one(TEXT, BIGINT, TEXT, TEXT, BIGINT, TEXT, TEXT)",
    "DROP FUNCTION IF EXISTS {p}claim(TEXT[], BIGINT[], TEXT[], TEXT[], BIGINT[], TEXT[], TEXT[])",
    CLAIM_FUNCTION_V8,
    CLAIM_ONE_FUNCTION_V8,
    CLAIM_TAKEN_FIRST_V8,
];

/// Version 9: the registry by node, which serves `register`'s removal of the jobs a node
/// no longer lists (the primary key leads with the job, so without it that removal reads
/// every node's registrations). Builds of version 8 work beside it.
const V9: &[&str] = &["CREATE INDEX IF NOT EXISTS {p}registry_node ON {p}registry (node, job)"];

/// Version 10: waiting retries (state `waiting`, their not-before in `lease_until`) by
/// not-before, which serves `expired` beside `{p}runs_expiry`. Partial, so it holds only
/// the few waiting retries, however long the history grows; built inside the migration's
/// transaction (writes to the runs wait meanwhile: one scan of the table). Builds of
/// version 9 still running beside it neither list nor start waiting retries, and their
/// `prune` may delete old ones: upgrade every node.
const V10: &[&str] = &["CREATE INDEX IF NOT EXISTS {p}runs_waiting ON {p}runs (lease_until) WHERE state = 'waiting'"];

/// [`CLAIM_FUNCTION_V4`] with each request's nonce (`p_nonces`, `0`: none), stored on the
/// run it creates. A `run` or `run-unless-running` request that does not win and carries a
/// nonce is granted again when the tick's attempt 1 is still running as this node's claim
/// under this nonce (its answer was lost): one update of that row, which writes a fresh
/// lease from `v_now` and returns the run's own token and `claimed_at`; pause and overlap
/// do not apply (the running run is that very claim). Under READ COMMITTED the update waits
/// for a recovery of the row in flight and re-checks `state`, so a recovered run is not
/// granted again. The reserved token of such a request goes unused. The won path is
/// unchanged, and the taken one still reads the tick's record once (that read now also
/// tells whether it is this request's claim): only a grant again writes.
const CLAIM_FUNCTION_V8: &str = r#"
CREATE OR REPLACE FUNCTION {p}claim(
    p_jobs TEXT[], p_ticks BIGINT[], p_triggers TEXT[], p_nodes TEXT[],
    p_leases BIGINT[], p_modes TEXT[], p_reasons TEXT[], p_nonces BIGINT[])
RETURNS TABLE (o_index INTEGER, o_outcome TEXT, o_reason TEXT, o_token BIGINT,
               o_claimed_at BIGINT, o_lease_until BIGINT)
LANGUAGE plpgsql VOLATILE AS $claim$
DECLARE
    v_now BIGINT;
    v_reason TEXT;
    v_found RECORD;
    v_tokens BIGINT[];
    v_rechecks INTEGER;
    v_mine BOOLEAN;
BEGIN
    IF coalesce(cardinality(p_jobs), 0) = 0 THEN
        RETURN;
    ELSIF cardinality(p_jobs) = 1 THEN
        INSERT INTO {p}fences AS f (job, token) VALUES (p_jobs[1], 1)
            ON CONFLICT (job) DO UPDATE SET token = f.token + 1
            RETURNING ARRAY[f.token] INTO v_tokens;
    ELSE
        WITH reserved AS (
            INSERT INTO {p}fences AS f (job, token)
                SELECT j, count(*) FROM unnest(p_jobs) AS j GROUP BY j ORDER BY j
                ON CONFLICT (job) DO UPDATE SET token = f.token + excluded.token
                RETURNING f.job, f.token),
        requests AS (
            SELECT r.j, r.i, row_number() OVER (PARTITION BY r.j ORDER BY r.i) AS k,
                   count(*) OVER (PARTITION BY r.j) AS n
            FROM unnest(p_jobs) WITH ORDINALITY AS r(j, i))
        SELECT array_agg(reserved.token - requests.n + requests.k ORDER BY requests.i) INTO v_tokens
            FROM requests JOIN reserved ON reserved.job = requests.j;
    END IF;
    -- The clock is read once the locks are held, so that a claim that waited for another
    -- gets a later claimed_at, in step with its larger fencing token.
    v_now := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    FOR i IN 1 .. cardinality(p_jobs) LOOP
        o_index := i;
        o_reason := NULL; o_token := NULL; o_claimed_at := NULL; o_lease_until := NULL;
        v_rechecks := 0;
        LOOP
            v_reason := NULL;
            IF p_modes[i] = 'skip' THEN
                v_reason := p_reasons[i];
            ELSE
                INSERT INTO {p}runs (job, scheduled_at, attempt, "trigger", node, token, state, claimed_at,
                                     lease_until, nonce)
                    SELECT p_jobs[i], p_ticks[i], 1, p_triggers[i], p_nodes[i], v_tokens[i], 'running',
                           v_now, v_now + p_leases[i], nullif(p_nonces[i], 0)
                    WHERE (p_triggers[i] = 'manual'
                           OR NOT EXISTS (SELECT 1 FROM {p}jobs WHERE job = p_jobs[i] AND paused))
                      AND (p_modes[i] <> 'run-unless-running'
                           OR NOT EXISTS (SELECT 1 FROM {p}runs WHERE job = p_jobs[i] AND state = 'running'))
                    ON CONFLICT (job, scheduled_at, attempt) DO NOTHING;
                IF FOUND THEN
                    o_outcome := 'won'; o_token := v_tokens[i];
                    o_claimed_at := v_now; o_lease_until := v_now + p_leases[i];
                    EXIT;
                END IF;
                SELECT state = 'running' AND node = p_nodes[i] AND nonce = p_nonces[i] INTO v_mine
                    FROM {p}runs WHERE job = p_jobs[i] AND scheduled_at = p_ticks[i] AND attempt = 1;
                IF FOUND THEN
                    o_outcome := 'taken';
                    -- Asked again for a claim whose answer was lost: granted again while its
                    -- run is untouched (the update re-checks it, after any recovery in flight).
                    IF v_mine AND p_nonces[i] <> 0 THEN
                        UPDATE {p}runs SET lease_until = v_now + p_leases[i]
                            WHERE job = p_jobs[i] AND scheduled_at = p_ticks[i] AND attempt = 1
                              AND state = 'running' AND node = p_nodes[i] AND nonce = p_nonces[i]
                            RETURNING token, claimed_at, lease_until INTO o_token, o_claimed_at, o_lease_until;
                        IF FOUND THEN
                            o_outcome := 'won';
                        END IF;
                    END IF;
                    EXIT;
                END IF;
                IF p_triggers[i] <> 'manual' THEN
                    SELECT changed_by, reason INTO v_found FROM {p}jobs WHERE job = p_jobs[i] AND paused;
                    IF FOUND THEN
                        v_reason := 'paused by ' || v_found.changed_by || coalesce(': ' || v_found.reason, '');
                    END IF;
                END IF;
                IF v_reason IS NULL AND p_modes[i] = 'run-unless-running' THEN
                    -- Any running run counts, even one whose lease expired: it awaits recovery.
                    SELECT job, scheduled_at, attempt INTO v_found FROM {p}runs
                        WHERE job = p_jobs[i] AND state = 'running'
                        ORDER BY scheduled_at DESC, attempt DESC LIMIT 1;
                    IF FOUND THEN
                        -- Spelled like RunId's Display: job@2026-01-01T00:00:00.000Z#1
                        v_reason := 'overlap: previous run ' || v_found.job || '@'
                            || to_char('epoch'::timestamp + v_found.scheduled_at * interval '1 millisecond',
                                       'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')
                            || '#' || v_found.attempt || ' still running';
                    END IF;
                END IF;
            END IF;
            IF v_reason IS NOT NULL THEN
                INSERT INTO {p}runs (job, scheduled_at, attempt, "trigger", node, state, reason, claimed_at, finished_at)
                    VALUES (p_jobs[i], p_ticks[i], 1, p_triggers[i], p_nodes[i], 'skipped', v_reason, v_now, v_now)
                    ON CONFLICT (job, scheduled_at, attempt) DO NOTHING;
                IF FOUND THEN
                    o_outcome := 'skipped'; o_reason := v_reason;
                ELSE
                    o_outcome := 'taken';
                END IF;
                EXIT;
            END IF;
            -- What kept the run from being inserted is gone (the running run ended, the
            -- job was resumed): try again.
            v_rechecks := v_rechecks + 1;
            IF v_rechecks >= 10 THEN
                RAISE EXCEPTION 'the claim of % kept changing under it', p_jobs[i] USING ERRCODE = '40001';
            END IF;
        END LOOP;
        RETURN NEXT;
    END LOOP;
END
$claim$"#;

/// [`CLAIM_ONE_FUNCTION`] with the request's nonce (`p_nonce`, `0`: none): the one-tick
/// twin of [`CLAIM_FUNCTION_V8`], with the same answers, granting a claim asked again with
/// its nonce the same way.
const CLAIM_ONE_FUNCTION_V8: &str = r#"
CREATE OR REPLACE FUNCTION {p}claim_one(
    p_job TEXT, p_tick BIGINT, p_trigger TEXT, p_node TEXT, p_lease BIGINT, p_mode TEXT, p_reason TEXT,
    p_nonce BIGINT,
    OUT o_index INTEGER, OUT o_outcome TEXT, OUT o_reason TEXT, OUT o_token BIGINT,
    OUT o_claimed_at BIGINT, OUT o_lease_until BIGINT)
LANGUAGE plpgsql VOLATILE AS $claim$
DECLARE
    v_now BIGINT;
    v_reason TEXT;
    v_found RECORD;
    v_token BIGINT;
    v_rechecks INTEGER := 0;
    v_mine BOOLEAN;
BEGIN
    o_index := 1;
    INSERT INTO {p}fences AS f (job, token) VALUES (p_job, 1)
        ON CONFLICT (job) DO UPDATE SET token = f.token + 1
        RETURNING f.token INTO v_token;
    -- The clock is read once the lock is held, as in {p}claim.
    v_now := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    LOOP
        v_reason := NULL;
        IF p_mode = 'skip' THEN
            v_reason := p_reason;
        ELSE
            INSERT INTO {p}runs (job, scheduled_at, attempt, "trigger", node, token, state, claimed_at,
                                 lease_until, nonce)
                SELECT p_job, p_tick, 1, p_trigger, p_node, v_token, 'running', v_now, v_now + p_lease,
                       nullif(p_nonce, 0)
                WHERE (p_trigger = 'manual'
                       OR NOT EXISTS (SELECT 1 FROM {p}jobs WHERE job = p_job AND paused))
                  AND (p_mode <> 'run-unless-running'
                       OR NOT EXISTS (SELECT 1 FROM {p}runs WHERE job = p_job AND state = 'running'))
                ON CONFLICT (job, scheduled_at, attempt) DO NOTHING;
            IF FOUND THEN
                o_outcome := 'won'; o_token := v_token;
                o_claimed_at := v_now; o_lease_until := v_now + p_lease;
                RETURN;
            END IF;
            SELECT state = 'running' AND node = p_node AND nonce = p_nonce INTO v_mine
                FROM {p}runs WHERE job = p_job AND scheduled_at = p_tick AND attempt = 1;
            IF FOUND THEN
                o_outcome := 'taken';
                -- Asked again for a claim whose answer was lost: granted again while its run
                -- is untouched (the update re-checks it, after any recovery in flight).
                IF v_mine AND p_nonce <> 0 THEN
                    UPDATE {p}runs SET lease_until = v_now + p_lease
                        WHERE job = p_job AND scheduled_at = p_tick AND attempt = 1
                          AND state = 'running' AND node = p_node AND nonce = p_nonce
                        RETURNING token, claimed_at, lease_until INTO o_token, o_claimed_at, o_lease_until;
                    IF FOUND THEN
                        o_outcome := 'won';
                    END IF;
                END IF;
                RETURN;
            END IF;
            IF p_trigger <> 'manual' THEN
                SELECT changed_by, reason INTO v_found FROM {p}jobs WHERE job = p_job AND paused;
                IF FOUND THEN
                    v_reason := 'paused by ' || v_found.changed_by || coalesce(': ' || v_found.reason, '');
                END IF;
            END IF;
            IF v_reason IS NULL AND p_mode = 'run-unless-running' THEN
                -- Any running run counts, even one whose lease expired: it awaits recovery.
                SELECT job, scheduled_at, attempt INTO v_found FROM {p}runs
                    WHERE job = p_job AND state = 'running'
                    ORDER BY scheduled_at DESC, attempt DESC LIMIT 1;
                IF FOUND THEN
                    -- Spelled like RunId's Display: job@2026-01-01T00:00:00.000Z#1
                    v_reason := 'overlap: previous run ' || v_found.job || '@'
                        || to_char('epoch'::timestamp + v_found.scheduled_at * interval '1 millisecond',
                                   'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')
                        || '#' || v_found.attempt || ' still running';
                END IF;
            END IF;
        END IF;
        IF v_reason IS NOT NULL THEN
            INSERT INTO {p}runs (job, scheduled_at, attempt, "trigger", node, state, reason, claimed_at, finished_at)
                VALUES (p_job, p_tick, 1, p_trigger, p_node, 'skipped', v_reason, v_now, v_now)
                ON CONFLICT (job, scheduled_at, attempt) DO NOTHING;
            IF FOUND THEN
                o_outcome := 'skipped'; o_reason := v_reason;
            ELSE
                o_outcome := 'taken';
            END IF;
            RETURN;
        END IF;
        -- What kept the run from being inserted is gone (the running run ended, the job
        -- was resumed): try again.
        v_rechecks := v_rechecks + 1;
        IF v_rechecks >= 10 THEN
            RAISE EXCEPTION 'the claim of % kept changing under it', p_job USING ERRCODE = '40001';
        END IF;
    END LOOP;
END
$claim$"#;

/// [`CLAIM_TAKEN_FIRST`] with each request's nonce. Its first read answers `taken` only
/// the requests whose record no nonce can grant again; a request that may be granted again
/// (a `run` request with a nonce, its tick's attempt 1 running as this node's claim under
/// that nonce) goes to `{p}claim`, which decides it under the lock. A record never comes
/// to match later (its node and nonce are fixed, and a run that ended does not run again),
/// so the lock-free read cannot answer `taken` wrongly.
const CLAIM_TAKEN_FIRST_V8: &str = r#"
CREATE OR REPLACE FUNCTION {p}claim_taken_first(
    p_jobs TEXT[], p_ticks BIGINT[], p_triggers TEXT[], p_nodes TEXT[],
    p_leases BIGINT[], p_modes TEXT[], p_reasons TEXT[], p_nonces BIGINT[])
RETURNS TABLE (o_index INTEGER, o_outcome TEXT, o_reason TEXT, o_token BIGINT,
               o_claimed_at BIGINT, o_lease_until BIGINT)
LANGUAGE plpgsql VOLATILE AS $claim$
DECLARE
    v_open INTEGER[];
BEGIN
    v_open := ARRAY(
        SELECT i FROM generate_subscripts(p_jobs, 1) AS i
        WHERE NOT EXISTS (SELECT 1 FROM {p}runs r
                          WHERE r.job = p_jobs[i] AND r.scheduled_at = p_ticks[i] AND r.attempt = 1
                            AND NOT (p_nonces[i] <> 0 AND p_modes[i] <> 'skip' AND r.state = 'running'
                                     AND r.node = p_nodes[i] AND coalesce(r.nonce, 0) = p_nonces[i]))
        ORDER BY i);
    IF cardinality(v_open) = coalesce(cardinality(p_jobs), 0) THEN
        RETURN QUERY SELECT * FROM {p}claim(p_jobs, p_ticks, p_triggers, p_nodes, p_leases, p_modes, p_reasons,
                                            p_nonces);
        RETURN;
    END IF;
    RETURN QUERY
    WITH pending AS (SELECT u.i, u.k FROM unnest(v_open) WITH ORDINALITY AS u(i, k))
    SELECT v_open[d.o_index], d.o_outcome, d.o_reason, d.o_token, d.o_claimed_at, d.o_lease_until
    FROM {p}claim(
        ARRAY(SELECT p_jobs[i] FROM pending ORDER BY k), ARRAY(SELECT p_ticks[i] FROM pending ORDER BY k),
        ARRAY(SELECT p_triggers[i] FROM pending ORDER BY k), ARRAY(SELECT p_nodes[i] FROM pending ORDER BY k),
        ARRAY(SELECT p_leases[i] FROM pending ORDER BY k), ARRAY(SELECT p_modes[i] FROM pending ORDER BY k),
        ARRAY(SELECT p_reasons[i] FROM pending ORDER BY k), ARRAY(SELECT p_nonces[i] FROM pending ORDER BY k)) AS d
    UNION ALL
    SELECT t.i, 'taken', NULL, NULL, NULL, NULL
    FROM (SELECT i FROM generate_subscripts(p_jobs, 1) AS i EXCEPT SELECT unnest(v_open)) AS t
    ORDER BY 1;
END
$claim$"#;

/// The claim of a large batch (the same answers as [`CLAIM_FUNCTION`]) in two steps.
/// First, without locks, one read finds the requests whose tick has a record: they are
/// `taken` for good (a record is never deleted while its tick can be claimed: the retention
/// floor is a day). Only the rest go to `{p}claim`, which locks their jobs' fence rows and
/// decides them. Nodes racing for one herd claim its chunks in different orders (see the
/// engine's `chunk_order`), so a node reaching a chunk another node already claimed
/// answers it from one index read per tick, without waiting for that node's locks or
/// repeating its pause and overlap checks. For a short batch the extra read and call cost
/// more than they save (one tick: claim / raw 1.36 → 1.8), so short batches call `{p}claim`.
const CLAIM_TAKEN_FIRST: &str = r#"
CREATE OR REPLACE FUNCTION {p}claim_taken_first(
    p_jobs TEXT[], p_ticks BIGINT[], p_triggers TEXT[], p_nodes TEXT[],
    p_leases BIGINT[], p_modes TEXT[], p_reasons TEXT[])
RETURNS TABLE (o_index INTEGER, o_outcome TEXT, o_reason TEXT, o_token BIGINT,
               o_claimed_at BIGINT, o_lease_until BIGINT)
LANGUAGE plpgsql VOLATILE AS $claim$
DECLARE
    v_open INTEGER[];
BEGIN
    v_open := ARRAY(
        SELECT i FROM generate_subscripts(p_jobs, 1) AS i
        WHERE NOT EXISTS (SELECT 1 FROM {p}runs r
                          WHERE r.job = p_jobs[i] AND r.scheduled_at = p_ticks[i] AND r.attempt = 1)
        ORDER BY i);
    IF cardinality(v_open) = coalesce(cardinality(p_jobs), 0) THEN
        RETURN QUERY SELECT * FROM {p}claim(p_jobs, p_ticks, p_triggers, p_nodes, p_leases, p_modes, p_reasons);
        RETURN;
    END IF;
    RETURN QUERY
    WITH pending AS (SELECT u.i, u.k FROM unnest(v_open) WITH ORDINALITY AS u(i, k))
    SELECT v_open[d.o_index], d.o_outcome, d.o_reason, d.o_token, d.o_claimed_at, d.o_lease_until
    FROM {p}claim(
        ARRAY(SELECT p_jobs[i] FROM pending ORDER BY k), ARRAY(SELECT p_ticks[i] FROM pending ORDER BY k),
        ARRAY(SELECT p_triggers[i] FROM pending ORDER BY k), ARRAY(SELECT p_nodes[i] FROM pending ORDER BY k),
        ARRAY(SELECT p_leases[i] FROM pending ORDER BY k), ARRAY(SELECT p_modes[i] FROM pending ORDER BY k),
        ARRAY(SELECT p_reasons[i] FROM pending ORDER BY k)) AS d
    UNION ALL
    SELECT t.i, 'taken', NULL, NULL, NULL, NULL
    FROM (SELECT i FROM generate_subscripts(p_jobs, 1) AS i EXCEPT SELECT unnest(v_open)) AS t
    ORDER BY 1;
END
$claim$"#;

/// Version 11: the claim functions refuse a scheduled claim made too early
/// ([`CLAIM_FUNCTION_V11`], [`CLAIM_ONE_FUNCTION_V11`], [`CLAIM_TAKEN_FIRST_V11`]). Their
/// arguments and columns are those of version 8, so each is replaced in place (no drop, no
/// overload) and builds of version 10 keep claiming beside it, with one difference: a claim
/// of theirs too early (their clock more than ~350 ms ahead of the server's) fails as
/// invalid (they do not know the answer `too-early`) where it was won before. Upgrade every
/// node.
const V11: &[&str] = &[CLAIM_FUNCTION_V11, CLAIM_ONE_FUNCTION_V11, CLAIM_TAKEN_FIRST_V11];

/// [`CLAIM_EARLY_MAX`] as the claim functions of version 11 spell it, `500` (ms), in their
/// text. Another bound needs another version of the functions (a migration), not an edit.
const _: () = assert!(
    CLAIM_EARLY_MAX.as_millis() == 500,
    "CLAIM_EARLY_MAX changed: the claim functions of schema version 11 spell 500 ms; add a migration"
);

/// [`CLAIM_FUNCTION_V8`] refusing scheduled claims made too early. Before any lock or
/// write, it reads the server's clock once (`v_asked_at`): a `schedule` request (any mode)
/// whose tick is more than 500 ms ([`CLAIM_EARLY_MAX`]) ahead of it answers `too-early`,
/// with that clock in `o_claimed_at`, and neither locks its job's fence row nor reserves a
/// token nor writes a record; the batch's other requests are decided as before (with
/// tokens reserved for them alone). The check comes first, so a request too early is
/// refused even if its tick has a record (a claim asked again with its nonce is of a tick
/// near now, never too early in practice). The clock of the claims themselves is still
/// read once the locks are held.
const CLAIM_FUNCTION_V11: &str = r#"
CREATE OR REPLACE FUNCTION {p}claim(
    p_jobs TEXT[], p_ticks BIGINT[], p_triggers TEXT[], p_nodes TEXT[],
    p_leases BIGINT[], p_modes TEXT[], p_reasons TEXT[], p_nonces BIGINT[])
RETURNS TABLE (o_index INTEGER, o_outcome TEXT, o_reason TEXT, o_token BIGINT,
               o_claimed_at BIGINT, o_lease_until BIGINT)
LANGUAGE plpgsql VOLATILE AS $claim$
DECLARE
    v_asked_at BIGINT;
    v_now BIGINT;
    v_reason TEXT;
    v_found RECORD;
    v_tokens BIGINT[];
    v_rechecks INTEGER;
    v_mine BOOLEAN;
BEGIN
    IF coalesce(cardinality(p_jobs), 0) = 0 THEN
        RETURN;
    END IF;
    -- Read before any lock: a scheduled request for a tick more than 500 ms
    -- (CLAIM_EARLY_MAX) ahead of it is too early, and takes no lock nor token.
    v_asked_at := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    IF cardinality(p_jobs) = 1 THEN
        IF p_triggers[1] = 'schedule' AND p_ticks[1] > v_asked_at + 500 THEN
            o_index := 1; o_outcome := 'too-early'; o_reason := NULL; o_token := NULL;
            o_claimed_at := v_asked_at; o_lease_until := NULL;
            RETURN NEXT;
            RETURN;
        END IF;
        INSERT INTO {p}fences AS f (job, token) VALUES (p_jobs[1], 1)
            ON CONFLICT (job) DO UPDATE SET token = f.token + 1
            RETURNING ARRAY[f.token] INTO v_tokens;
    ELSE
        WITH requests AS (
            SELECT r.j, r.i, r.early,
                   row_number() OVER (PARTITION BY r.j, r.early ORDER BY r.i) AS k,
                   count(*) OVER (PARTITION BY r.j, r.early) AS n
            FROM (SELECT q.j, q.i, (q.t = 'schedule' AND q.s > v_asked_at + 500) AS early
                  FROM unnest(p_jobs, p_triggers, p_ticks) WITH ORDINALITY AS q(j, t, s, i)) AS r),
        reserved AS (
            INSERT INTO {p}fences AS f (job, token)
                SELECT j, count(*) FROM requests WHERE NOT early GROUP BY j ORDER BY j
                ON CONFLICT (job) DO UPDATE SET token = f.token + excluded.token
                RETURNING f.job, f.token)
        SELECT array_agg(CASE WHEN requests.early THEN NULL
                              ELSE reserved.token - requests.n + requests.k END ORDER BY requests.i)
            INTO v_tokens
            FROM requests LEFT JOIN reserved ON reserved.job = requests.j;
    END IF;
    -- The clock is read once the locks are held, so that a claim that waited for another
    -- gets a later claimed_at, in step with its larger fencing token.
    v_now := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    FOR i IN 1 .. cardinality(p_jobs) LOOP
        o_index := i;
        o_reason := NULL; o_token := NULL; o_claimed_at := NULL; o_lease_until := NULL;
        IF p_triggers[i] = 'schedule' AND p_ticks[i] > v_asked_at + 500 THEN
            o_outcome := 'too-early'; o_claimed_at := v_asked_at;
            RETURN NEXT;
            CONTINUE;
        END IF;
        v_rechecks := 0;
        LOOP
            v_reason := NULL;
            IF p_modes[i] = 'skip' THEN
                v_reason := p_reasons[i];
            ELSE
                INSERT INTO {p}runs (job, scheduled_at, attempt, "trigger", node, token, state, claimed_at,
                                     lease_until, nonce)
                    SELECT p_jobs[i], p_ticks[i], 1, p_triggers[i], p_nodes[i], v_tokens[i], 'running',
                           v_now, v_now + p_leases[i], nullif(p_nonces[i], 0)
                    WHERE (p_triggers[i] = 'manual'
                           OR NOT EXISTS (SELECT 1 FROM {p}jobs WHERE job = p_jobs[i] AND paused))
                      AND (p_modes[i] <> 'run-unless-running'
                           OR NOT EXISTS (SELECT 1 FROM {p}runs WHERE job = p_jobs[i] AND state = 'running'))
                    ON CONFLICT (job, scheduled_at, attempt) DO NOTHING;
                IF FOUND THEN
                    o_outcome := 'won'; o_token := v_tokens[i];
                    o_claimed_at := v_now; o_lease_until := v_now + p_leases[i];
                    EXIT;
                END IF;
                SELECT state = 'running' AND node = p_nodes[i] AND nonce = p_nonces[i] INTO v_mine
                    FROM {p}runs WHERE job = p_jobs[i] AND scheduled_at = p_ticks[i] AND attempt = 1;
                IF FOUND THEN
                    o_outcome := 'taken';
                    -- Asked again for a claim whose answer was lost: granted again while its
                    -- run is untouched (the update re-checks it, after any recovery in flight).
                    IF v_mine AND p_nonces[i] <> 0 THEN
                        UPDATE {p}runs SET lease_until = v_now + p_leases[i]
                            WHERE job = p_jobs[i] AND scheduled_at = p_ticks[i] AND attempt = 1
                              AND state = 'running' AND node = p_nodes[i] AND nonce = p_nonces[i]
                            RETURNING token, claimed_at, lease_until INTO o_token, o_claimed_at, o_lease_until;
                        IF FOUND THEN
                            o_outcome := 'won';
                        END IF;
                    END IF;
                    EXIT;
                END IF;
                IF p_triggers[i] <> 'manual' THEN
                    SELECT changed_by, reason INTO v_found FROM {p}jobs WHERE job = p_jobs[i] AND paused;
                    IF FOUND THEN
                        v_reason := 'paused by ' || v_found.changed_by || coalesce(': ' || v_found.reason, '');
                    END IF;
                END IF;
                IF v_reason IS NULL AND p_modes[i] = 'run-unless-running' THEN
                    -- Any running run counts, even one whose lease expired: it awaits recovery.
                    SELECT job, scheduled_at, attempt INTO v_found FROM {p}runs
                        WHERE job = p_jobs[i] AND state = 'running'
                        ORDER BY scheduled_at DESC, attempt DESC LIMIT 1;
                    IF FOUND THEN
                        -- Spelled like RunId's Display: job@2026-01-01T00:00:00.000Z#1
                        v_reason := 'overlap: previous run ' || v_found.job || '@'
                            || to_char('epoch'::timestamp + v_found.scheduled_at * interval '1 millisecond',
                                       'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')
                            || '#' || v_found.attempt || ' still running';
                    END IF;
                END IF;
            END IF;
            IF v_reason IS NOT NULL THEN
                INSERT INTO {p}runs (job, scheduled_at, attempt, "trigger", node, state, reason, claimed_at, finished_at)
                    VALUES (p_jobs[i], p_ticks[i], 1, p_triggers[i], p_nodes[i], 'skipped', v_reason, v_now, v_now)
                    ON CONFLICT (job, scheduled_at, attempt) DO NOTHING;
                IF FOUND THEN
                    o_outcome := 'skipped'; o_reason := v_reason;
                ELSE
                    o_outcome := 'taken';
                END IF;
                EXIT;
            END IF;
            -- What kept the run from being inserted is gone (the running run ended, the
            -- job was resumed): try again.
            v_rechecks := v_rechecks + 1;
            IF v_rechecks >= 10 THEN
                RAISE EXCEPTION 'the claim of % kept changing under it', p_jobs[i] USING ERRCODE = '40001';
            END IF;
        END LOOP;
        RETURN NEXT;
    END LOOP;
END
$claim$"#;

/// [`CLAIM_ONE_FUNCTION_V8`] refusing a scheduled claim made too early: the one-tick twin
/// of [`CLAIM_FUNCTION_V11`], with the same answers. Its first step reads the server's
/// clock (one more read of it, no more statements); a `schedule` request whose tick is more
/// than 500 ms ahead of it answers `too-early` with that clock in `o_claimed_at`, before
/// the fence row's upsert: no lock, no token, no record.
const CLAIM_ONE_FUNCTION_V11: &str = r#"
CREATE OR REPLACE FUNCTION {p}claim_one(
    p_job TEXT, p_tick BIGINT, p_trigger TEXT, p_node TEXT, p_lease BIGINT, p_mode TEXT, p_reason TEXT,
    p_nonce BIGINT,
    OUT o_index INTEGER, OUT o_outcome TEXT, OUT o_reason TEXT, OUT o_token BIGINT,
    OUT o_claimed_at BIGINT, OUT o_lease_until BIGINT)
LANGUAGE plpgsql VOLATILE AS $claim$
DECLARE
    v_now BIGINT;
    v_reason TEXT;
    v_found RECORD;
    v_token BIGINT;
    v_rechecks INTEGER := 0;
    v_mine BOOLEAN;
BEGIN
    o_index := 1;
    -- Read before the lock: a scheduled request for a tick more than 500 ms
    -- (CLAIM_EARLY_MAX) ahead of it is too early, and takes no lock nor token.
    v_now := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    IF p_trigger = 'schedule' AND p_tick > v_now + 500 THEN
        o_outcome := 'too-early'; o_claimed_at := v_now;
        RETURN;
    END IF;
    INSERT INTO {p}fences AS f (job, token) VALUES (p_job, 1)
        ON CONFLICT (job) DO UPDATE SET token = f.token + 1
        RETURNING f.token INTO v_token;
    -- The clock is read again once the lock is held, as in {p}claim.
    v_now := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    LOOP
        v_reason := NULL;
        IF p_mode = 'skip' THEN
            v_reason := p_reason;
        ELSE
            INSERT INTO {p}runs (job, scheduled_at, attempt, "trigger", node, token, state, claimed_at,
                                 lease_until, nonce)
                SELECT p_job, p_tick, 1, p_trigger, p_node, v_token, 'running', v_now, v_now + p_lease,
                       nullif(p_nonce, 0)
                WHERE (p_trigger = 'manual'
                       OR NOT EXISTS (SELECT 1 FROM {p}jobs WHERE job = p_job AND paused))
                  AND (p_mode <> 'run-unless-running'
                       OR NOT EXISTS (SELECT 1 FROM {p}runs WHERE job = p_job AND state = 'running'))
                ON CONFLICT (job, scheduled_at, attempt) DO NOTHING;
            IF FOUND THEN
                o_outcome := 'won'; o_token := v_token;
                o_claimed_at := v_now; o_lease_until := v_now + p_lease;
                RETURN;
            END IF;
            SELECT state = 'running' AND node = p_node AND nonce = p_nonce INTO v_mine
                FROM {p}runs WHERE job = p_job AND scheduled_at = p_tick AND attempt = 1;
            IF FOUND THEN
                o_outcome := 'taken';
                -- Asked again for a claim whose answer was lost: granted again while its run
                -- is untouched (the update re-checks it, after any recovery in flight).
                IF v_mine AND p_nonce <> 0 THEN
                    UPDATE {p}runs SET lease_until = v_now + p_lease
                        WHERE job = p_job AND scheduled_at = p_tick AND attempt = 1
                          AND state = 'running' AND node = p_node AND nonce = p_nonce
                        RETURNING token, claimed_at, lease_until INTO o_token, o_claimed_at, o_lease_until;
                    IF FOUND THEN
                        o_outcome := 'won';
                    END IF;
                END IF;
                RETURN;
            END IF;
            IF p_trigger <> 'manual' THEN
                SELECT changed_by, reason INTO v_found FROM {p}jobs WHERE job = p_job AND paused;
                IF FOUND THEN
                    v_reason := 'paused by ' || v_found.changed_by || coalesce(': ' || v_found.reason, '');
                END IF;
            END IF;
            IF v_reason IS NULL AND p_mode = 'run-unless-running' THEN
                -- Any running run counts, even one whose lease expired: it awaits recovery.
                SELECT job, scheduled_at, attempt INTO v_found FROM {p}runs
                    WHERE job = p_job AND state = 'running'
                    ORDER BY scheduled_at DESC, attempt DESC LIMIT 1;
                IF FOUND THEN
                    -- Spelled like RunId's Display: job@2026-01-01T00:00:00.000Z#1
                    v_reason := 'overlap: previous run ' || v_found.job || '@'
                        || to_char('epoch'::timestamp + v_found.scheduled_at * interval '1 millisecond',
                                   'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')
                        || '#' || v_found.attempt || ' still running';
                END IF;
            END IF;
        END IF;
        IF v_reason IS NOT NULL THEN
            INSERT INTO {p}runs (job, scheduled_at, attempt, "trigger", node, state, reason, claimed_at, finished_at)
                VALUES (p_job, p_tick, 1, p_trigger, p_node, 'skipped', v_reason, v_now, v_now)
                ON CONFLICT (job, scheduled_at, attempt) DO NOTHING;
            IF FOUND THEN
                o_outcome := 'skipped'; o_reason := v_reason;
            ELSE
                o_outcome := 'taken';
            END IF;
            RETURN;
        END IF;
        -- What kept the run from being inserted is gone (the running run ended, the job
        -- was resumed): try again.
        v_rechecks := v_rechecks + 1;
        IF v_rechecks >= 10 THEN
            RAISE EXCEPTION 'the claim of % kept changing under it', p_job USING ERRCODE = '40001';
        END IF;
    END LOOP;
END
$claim$"#;

/// [`CLAIM_TAKEN_FIRST_V8`] with the early check first, like [`CLAIM_FUNCTION_V11`]: its
/// lock-free read answers `taken` only the requests that are not too early by the server's
/// clock read at its start; a `schedule` request for a tick more than 500 ms ahead of it
/// goes to `{p}claim`, which refuses it (or, a request at the very bound, decides it by its
/// own later clock), even if its tick has a record.
const CLAIM_TAKEN_FIRST_V11: &str = r#"
CREATE OR REPLACE FUNCTION {p}claim_taken_first(
    p_jobs TEXT[], p_ticks BIGINT[], p_triggers TEXT[], p_nodes TEXT[],
    p_leases BIGINT[], p_modes TEXT[], p_reasons TEXT[], p_nonces BIGINT[])
RETURNS TABLE (o_index INTEGER, o_outcome TEXT, o_reason TEXT, o_token BIGINT,
               o_claimed_at BIGINT, o_lease_until BIGINT)
LANGUAGE plpgsql VOLATILE AS $claim$
DECLARE
    v_asked_at BIGINT;
    v_open INTEGER[];
BEGIN
    v_asked_at := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    v_open := ARRAY(
        SELECT i FROM generate_subscripts(p_jobs, 1) AS i
        WHERE (p_triggers[i] = 'schedule' AND p_ticks[i] > v_asked_at + 500)
           OR NOT EXISTS (SELECT 1 FROM {p}runs r
                          WHERE r.job = p_jobs[i] AND r.scheduled_at = p_ticks[i] AND r.attempt = 1
                            AND NOT (p_nonces[i] <> 0 AND p_modes[i] <> 'skip' AND r.state = 'running'
                                     AND r.node = p_nodes[i] AND coalesce(r.nonce, 0) = p_nonces[i]))
        ORDER BY i);
    IF cardinality(v_open) = coalesce(cardinality(p_jobs), 0) THEN
        RETURN QUERY SELECT * FROM {p}claim(p_jobs, p_ticks, p_triggers, p_nodes, p_leases, p_modes, p_reasons,
                                            p_nonces);
        RETURN;
    END IF;
    RETURN QUERY
    WITH pending AS (SELECT u.i, u.k FROM unnest(v_open) WITH ORDINALITY AS u(i, k))
    SELECT v_open[d.o_index], d.o_outcome, d.o_reason, d.o_token, d.o_claimed_at, d.o_lease_until
    FROM {p}claim(
        ARRAY(SELECT p_jobs[i] FROM pending ORDER BY k), ARRAY(SELECT p_ticks[i] FROM pending ORDER BY k),
        ARRAY(SELECT p_triggers[i] FROM pending ORDER BY k), ARRAY(SELECT p_nodes[i] FROM pending ORDER BY k),
        ARRAY(SELECT p_leases[i] FROM pending ORDER BY k), ARRAY(SELECT p_modes[i] FROM pending ORDER BY k),
        ARRAY(SELECT p_reasons[i] FROM pending ORDER BY k), ARRAY(SELECT p_nonces[i] FROM pending ORDER BY k)) AS d
    UNION ALL
    SELECT t.i, 'taken', NULL, NULL, NULL, NULL
    FROM (SELECT i FROM generate_subscripts(p_jobs, 1) AS i EXCEPT SELECT unnest(v_open)) AS t
    ORDER BY 1;
END
$claim$"#;

/// Version 12: `{p}claim_set`, the claim of a batch in a few set-based statements where it
/// can ([`CLAIM_SET_FUNCTION`]). Builds of version 11 keep calling `{p}claim` and
/// `{p}claim_taken_first`, unchanged, beside it.
const V12: &[&str] = &[CLAIM_SET_FUNCTION];

/// Version 13: no statement that looks runs up by job or by key reads every running run,
/// whatever the statistics say (see [`BY_KEY`]). `{p}finish_all` and `{p}renew_all`, a
/// batch of ends or of lease renewals as one `UPDATE` that finds each run by its key
/// ([`FINISH_ALL_FUNCTION`], [`RENEW_ALL_FUNCTION`]); the claim functions of versions 11
/// and 12 again, their overlap check made a subquery per request by [`overlap_by_job`]
/// (the same arguments and answers); and `{p}runs_expiry` only for statements that bound
/// the lease (its predicate adds `lease_until IS NOT NULL`), rebuilt inside the
/// migration's transaction (one scan of the table). Builds of version 12 keep working
/// beside it.
const V13: &[&str] = &[
    FINISH_ALL_FUNCTION,
    RENEW_ALL_FUNCTION,
    CLAIM_SET_FUNCTION,
    CLAIM_FUNCTION_V11,
    CLAIM_ONE_FUNCTION_V11,
    "DROP INDEX IF EXISTS {p}runs_expiry",
    "CREATE INDEX IF NOT EXISTS {p}runs_expiry ON {p}runs (lease_until) WHERE state = 'running' AND lease_until IS NOT NULL",
];

/// The one plan a batch's `UPDATE` of runs by their key may take, whatever the statistics
/// say: for each item of the batch, its run looked up by the primary key (a nested loop).
/// Left to itself the planner often preferred to read every running run, from the partial
/// index on running leases (`{p}runs_expiry`), which its statistics tend to believe nearly
/// empty (analyzed at a quiet moment), and to join them to the batch: by hash, every run
/// running at the time per batch; by nested loop (the prepared statement's generic plan,
/// after five calls on a connection), every running run per item: a batch of 1,000 ends
/// took 1 s with 1,000 runs running, 30 s with 30,000, against 25 ms by key. So the
/// functions (planned at each call) turn hash and merge joins off, and their check of the
/// state is written `IS NOT DISTINCT FROM`, which no partial index's predicate is proved
/// from: a nested loop by key is left as the only cheap plan.
///
/// A claim's overlap check (is a run of this job running?) had the same fault: as a join
/// (`NOT EXISTS`) the planner read every running run and hashed it per claim, or per
/// request once generic (4.4 s for 1,000 requests beside 30,000 running runs of other
/// jobs); as a subquery per request it still scanned `{p}runs_expiry` whole for each. It
/// is a subquery per request (never made a join), and `{p}runs_expiry`'s predicate names
/// the lease, so only statements that bound the lease can use it: each check is then one
/// probe of `{p}runs_running` by job (3.7 ms for those 1,000 requests).
///
/// Written where a migration step says `{by_key}` (only at migrate time: the store's own
/// statements never carry it).
const BY_KEY: &str = "SET enable_hashjoin = off SET enable_mergejoin = off";

/// Records a batch of ends: the positions (`p_i`) of the runs it ended, each the owner's
/// running run under its token. `claimed_at + NULL` is NULL: never started.
const FINISH_ALL_FUNCTION: &str = r#"
CREATE OR REPLACE FUNCTION {p}finish_all(
    p_i INTEGER[], p_jobs TEXT[], p_ticks BIGINT[], p_attempts INTEGER[], p_nodes TEXT[], p_tokens BIGINT[],
    p_states TEXT[], p_reasons TEXT[], p_exit_codes INTEGER[], p_outputs TEXT[], p_started_after BIGINT[])
RETURNS SETOF INTEGER LANGUAGE sql VOLATILE {by_key} AS $finish$
UPDATE {p}runs AS r SET state = e.state, reason = e.reason, exit_code = e.exit_code,
    output = e.output, finished_at = {now}, lease_until = NULL, started_at = r.claimed_at + e.started_after
FROM unnest(p_i, p_jobs, p_ticks, p_attempts, p_nodes, p_tokens, p_states, p_reasons, p_exit_codes, p_outputs,
            p_started_after)
    AS e(i, job, scheduled_at, attempt, node, token, state, reason, exit_code, output, started_after)
WHERE r.job = e.job AND r.scheduled_at = e.scheduled_at AND r.attempt = e.attempt
  AND r.node = e.node AND r.token = e.token AND r.state IS NOT DISTINCT FROM 'running'
RETURNING e.i
$finish$"#;

/// Extends a batch of live leases held by their owners: the positions (`p_i`) of those
/// extended.
const RENEW_ALL_FUNCTION: &str = r#"
CREATE OR REPLACE FUNCTION {p}renew_all(
    p_i INTEGER[], p_jobs TEXT[], p_ticks BIGINT[], p_attempts INTEGER[], p_nodes TEXT[], p_tokens BIGINT[],
    p_lengths BIGINT[])
RETURNS SETOF INTEGER LANGUAGE sql VOLATILE {by_key} AS $renew$
UPDATE {p}runs AS r SET lease_until = {now} + e.length
FROM unnest(p_i, p_jobs, p_ticks, p_attempts, p_nodes, p_tokens, p_lengths)
    AS e(i, job, scheduled_at, attempt, node, token, length)
WHERE r.job = e.job AND r.scheduled_at = e.scheduled_at AND r.attempt = e.attempt
  AND r.node = e.node AND r.token = e.token AND r.state IS NOT DISTINCT FROM 'running' AND r.lease_until > {now}
RETURNING e.i
$renew$"#;

/// A batch claim with the answers of [`CLAIM_FUNCTION_V11`] in a few statements instead of
/// one or more per request, for a batch in which no job appears twice (one tick per job:
/// a node's batch of an instant). Its requests are then independent of one another (pause,
/// overlap, the tick's record and the token are all per job), so one snapshot can decide
/// them all: the server's clock is read (`too-early` as in `{p}claim`), the fence rows of
/// the requests that may win are locked in sorted order with one token reserved each, the
/// clock is read again once they are held, and one `INSERT … SELECT … WHERE NOT EXISTS
/// (pause) AND NOT EXISTS (overlap) ON CONFLICT DO NOTHING` writes every run that wins.
/// When every request won (the common batch) that is the answer. Otherwise, of the others,
/// a request not too early whose tick has a record is `taken` (unless it carries a nonce
/// and may be its own claim asked again); every other request that did not win (too
/// early, a skip, paused, overlapping, a nonce's grant again) is decided by `{p}claim`,
/// with the same answers as before, in the same transaction. A batch of one, or one in
/// which a job appears twice, goes to `{p}claim` whole. The token reserved for a request
/// that does not win goes unused (tokens only need to grow).
const CLAIM_SET_FUNCTION: &str = r#"
CREATE OR REPLACE FUNCTION {p}claim_set(
    p_jobs TEXT[], p_ticks BIGINT[], p_triggers TEXT[], p_nodes TEXT[],
    p_leases BIGINT[], p_modes TEXT[], p_reasons TEXT[], p_nonces BIGINT[])
RETURNS TABLE (o_index INTEGER, o_outcome TEXT, o_reason TEXT, o_token BIGINT,
               o_claimed_at BIGINT, o_lease_until BIGINT)
LANGUAGE plpgsql VOLATILE AS $claim$
DECLARE
    v_asked_at BIGINT;
    v_now BIGINT;
    v_tokens BIGINT[];
    v_won INTEGER[];
    v_taken INTEGER[];
    v_rest INTEGER[];
BEGIN
    IF coalesce(cardinality(p_jobs), 0) < 2
       OR (SELECT count(DISTINCT j) FROM unnest(p_jobs) AS j) < cardinality(p_jobs) THEN
        RETURN QUERY SELECT * FROM {p}claim(p_jobs, p_ticks, p_triggers, p_nodes, p_leases, p_modes, p_reasons,
                                            p_nonces);
        RETURN;
    END IF;
    v_asked_at := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    -- One token for each request that may win (not a skip, not too early), its job's fence
    -- row locked: all of them in one upsert, in sorted order.
    WITH reserved AS (
        INSERT INTO {p}fences AS f (job, token)
            SELECT q.j, 1 FROM unnest(p_jobs, p_triggers, p_ticks, p_modes) AS q(j, t, s, m)
            WHERE q.m <> 'skip' AND NOT (q.t = 'schedule' AND q.s > v_asked_at + 500)
            ORDER BY q.j
            ON CONFLICT (job) DO UPDATE SET token = f.token + 1
            RETURNING f.job, f.token)
    SELECT array_agg(reserved.token ORDER BY u.i) INTO v_tokens
        FROM unnest(p_jobs) WITH ORDINALITY AS u(j, i) LEFT JOIN reserved ON reserved.job = u.j;
    -- Read once the locks are held, as in `{p}claim`.
    v_now := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    WITH inserted AS (
        INSERT INTO {p}runs (job, scheduled_at, attempt, "trigger", node, token, state, claimed_at,
                             lease_until, nonce)
            SELECT q.j, q.s, 1, q.t, q.n, v_tokens[q.i], 'running', v_now, v_now + q.l, nullif(q.nc, 0)
            FROM unnest(p_jobs, p_ticks, p_triggers, p_nodes, p_leases, p_modes, p_nonces)
                 WITH ORDINALITY AS q(j, s, t, n, l, m, nc, i)
            WHERE v_tokens[q.i] IS NOT NULL
              AND (q.t = 'manual' OR NOT EXISTS (SELECT 1 FROM {p}jobs WHERE job = q.j AND paused))
              AND (q.m <> 'run-unless-running'
                   OR NOT EXISTS (SELECT 1 FROM {p}runs WHERE job = q.j AND state = 'running'))
            ON CONFLICT (job, scheduled_at, attempt) DO NOTHING
            RETURNING job)
    SELECT array_agg(u.i::integer) INTO v_won
        FROM unnest(p_jobs) WITH ORDINALITY AS u(j, i) JOIN inserted ON inserted.job = u.j;
    v_won := coalesce(v_won, '{}');
    IF cardinality(v_won) = cardinality(p_jobs) THEN
        RETURN QUERY SELECT w.i, 'won'::text, NULL::text, v_tokens[w.i], v_now, v_now + p_leases[w.i]
            FROM unnest(v_won) AS w(i) ORDER BY 1;
        RETURN;
    END IF;
    v_rest := ARRAY(SELECT i FROM generate_subscripts(p_jobs, 1) AS i EXCEPT SELECT unnest(v_won));
    -- Taken: not too early, the tick has a record, and not a request that may be granted
    -- again (a nonce, not a skip): `{p}claim` decides those.
    v_taken := ARRAY(
        SELECT i FROM unnest(v_rest) AS i
        WHERE NOT (p_triggers[i] = 'schedule' AND p_ticks[i] > v_asked_at + 500)
          AND NOT (p_nonces[i] <> 0 AND p_modes[i] <> 'skip')
          AND EXISTS (SELECT 1 FROM {p}runs r
                      WHERE r.job = p_jobs[i] AND r.scheduled_at = p_ticks[i] AND r.attempt = 1));
    v_rest := ARRAY(SELECT i FROM unnest(v_rest) AS i EXCEPT SELECT unnest(v_taken) ORDER BY 1);
    RETURN QUERY
    WITH pending AS (SELECT u.i, u.k FROM unnest(v_rest) WITH ORDINALITY AS u(i, k))
    SELECT v_rest[d.o_index], d.o_outcome, d.o_reason, d.o_token, d.o_claimed_at, d.o_lease_until
    FROM {p}claim(
        ARRAY(SELECT p_jobs[i] FROM pending ORDER BY k), ARRAY(SELECT p_ticks[i] FROM pending ORDER BY k),
        ARRAY(SELECT p_triggers[i] FROM pending ORDER BY k), ARRAY(SELECT p_nodes[i] FROM pending ORDER BY k),
        ARRAY(SELECT p_leases[i] FROM pending ORDER BY k), ARRAY(SELECT p_modes[i] FROM pending ORDER BY k),
        ARRAY(SELECT p_reasons[i] FROM pending ORDER BY k), ARRAY(SELECT p_nonces[i] FROM pending ORDER BY k)) AS d
    UNION ALL
    SELECT w.i, 'won', NULL, v_tokens[w.i], v_now, v_now + p_leases[w.i] FROM unnest(v_won) AS w(i)
    UNION ALL
    SELECT t.i, 'taken', NULL, NULL, NULL, NULL FROM unnest(v_taken) AS t(i)
    ORDER BY 1;
END
$claim$"#;

/// The first version whose statements [`overlap_by_job`] rewrites.
const OVERLAP_BY_JOB_FROM: i32 = 13;

/// `template` (a released claim function) with its overlap check, a `NOT EXISTS` the
/// planner makes a join that reads every running run, written as a subquery per request
/// instead (see [`BY_KEY`]); any other statement unchanged. The released texts stay as
/// they were, as their versions ran them.
fn overlap_by_job(template: &str) -> Cow<'_, str> {
    let mut text = Cow::Borrowed(template);
    for job in ["q.j", "p_jobs[i]", "p_job"] {
        let join = format!("NOT EXISTS (SELECT 1 FROM {{p}}runs WHERE job = {job} AND state = 'running')");
        if text.contains(&join) {
            let probe = format!("(SELECT 1 FROM {{p}}runs WHERE job = {job} AND state = 'running' LIMIT 1) IS NULL");
            text = Cow::Owned(text.replace(&join, &probe));
        }
    }
    text
}

/// A statement template with the prefix and the clock filled in.
pub(crate) fn fill(template: &str, prefix: &str) -> String {
    template.replace("{p}", prefix).replace("{now}", NOW_MS)
}

/// The tables every version creates (each with its indexes), dropped by [`uninstall`].
const TABLES: [&str; 11] = [
    "runs",
    "fences",
    "jobs",
    "registry",
    "requests",
    "nodes",
    "actions",
    "managed",
    "job_revisions",
    "managed_version",
    "schema",
];

/// The functions the migrations create, dropped by [`uninstall`].
const FUNCTIONS: [&str; 6] = ["renew_all", "finish_all", "claim_set", "claim_taken_first", "claim_one", "claim"];

/// Creates or upgrades the schema, in one transaction.
pub(crate) async fn migrate(store: &PgStore) -> Result<(), StoreError> {
    migrate_to(store, SCHEMA_VERSION).await
}

/// Creates or upgrades the schema up to version `target` (the tests build a schema of an
/// earlier version with it), in one transaction.
async fn migrate_to(store: &PgStore, target: i32) -> Result<(), StoreError> {
    retrying("migrate", || async {
        // Nodes migrating at once take turns, each later one finds everything in place, and
        // a failure leaves nothing half-applied (PostgreSQL's DDL is transactional).
        let mut tx = store.pool.begin().await?;
        lock_schema(store, &mut tx).await?;
        migrate_locked(store, &mut tx, target).await?;
        tx.commit().await?;
        Ok(())
    })
    .await
}

/// Takes, until the end of the transaction on `conn`, the lock that migrations and
/// uninstalls of this schema and prefix hold: they take turns.
async fn lock_schema(store: &PgStore, conn: &mut PgConnection) -> Res<()> {
    sqlx::query(concat!(
        "SELECT pg_advisory_xact_lock(hashtextextended(",
        "'solocron migrate ' || coalesce(current_schema(), '') || '.' || $1, 0))"
    ))
    .bind(&store.tables)
    .execute(conn)
    .await?;
    Ok(())
}

/// Applies the migrations the schema lacks, up to version `target`; `conn` is in a
/// transaction holding the migration lock.
async fn migrate_locked(store: &PgStore, conn: &mut PgConnection, target: i32) -> Res<()> {
    // "relation already exists, skipping" notices are noise here.
    sqlx::query("SET LOCAL client_min_messages = warning").execute(&mut *conn).await?;
    sqlx::query(&store.sql("CREATE TABLE IF NOT EXISTS {p}schema (version INTEGER NOT NULL)"))
        .execute(&mut *conn)
        .await?;
    let version: Option<i32> =
        sqlx::query_scalar(&store.sql("SELECT max(version) FROM {p}schema")).fetch_one(&mut *conn).await?;
    let version = version.unwrap_or(0);
    if version > SCHEMA_VERSION {
        return Err(StoreError::Invalid(format!(
            "{} has schema version {version}; this solocron understands version {SCHEMA_VERSION}: upgrade it",
            store.description
        ))
        .into());
    }
    for (step, statements) in MIGRATIONS.iter().filter(|(step, _)| (version + 1..=target).contains(step)) {
        for statement in *statements {
            let template =
                if *step >= OVERLAP_BY_JOB_FROM { overlap_by_job(statement) } else { Cow::Borrowed(*statement) };
            let template = template.replace("{by_key}", BY_KEY);
            sqlx::query(&store.sql(&template)).execute(&mut *conn).await?;
        }
        sqlx::query(&store.sql("DELETE FROM {p}schema")).execute(&mut *conn).await?;
        sqlx::query(&store.sql("INSERT INTO {p}schema (version) VALUES ($1)")).bind(step).execute(&mut *conn).await?;
        tracing::info!(store = %store.description, version = step, "schema migrated");
    }
    Ok(())
}

/// Where the schema stands against this build, read only: no `{p}schema` table in the
/// current schema (where `migrate` creates it), or an empty one, is Missing.
pub(crate) async fn schema(store: &PgStore) -> Result<SchemaState, StoreError> {
    let found = retrying("schema", || async {
        let mut conn = store.pool.acquire().await?;
        let exists: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT FROM pg_tables WHERE schemaname = current_schema() AND tablename = $1)",
        )
        .bind(store.sql("{p}schema"))
        .fetch_one(&mut *conn)
        .await?;
        if !exists {
            return Ok(None);
        }
        let version: Option<i32> =
            sqlx::query_scalar(&store.sql("SELECT max(version) FROM {p}schema")).fetch_one(&mut *conn).await?;
        Ok(version)
    })
    .await?;
    let found = found
        .map(|v| {
            u32::try_from(v).map_err(|_| StoreError::Invalid(format!("{} has schema version {v}", store.description)))
        })
        .transpose()?;
    Ok(SchemaState::of(found, SCHEMA_VERSION as u32))
}

/// Drops every table (with its indexes) and function of the prefix, in one transaction
/// under the migration lock; what is already gone is skipped. Names are listed, never
/// matched by pattern: the tables of prefix `a` (`a_runs`) share their first letters with
/// those of prefix `a_b` (`a_b_runs`). No `CASCADE`: an object of the application's own
/// that depends on a table (a view, say) makes the uninstall fail and say so, rather than
/// vanish with it.
pub(crate) async fn uninstall(store: &PgStore) -> Result<(), StoreError> {
    let tables = TABLES.map(|t| format!("{}{t}", store.tables)).join(", ");
    let mut statements = vec![format!("DROP TABLE IF EXISTS {tables}")];
    statements.extend(FUNCTIONS.map(|f| format!("DROP FUNCTION IF EXISTS {}{f}", store.tables)));
    retrying("uninstall", || async {
        let mut tx = store.pool.begin().await?;
        lock_schema(store, &mut tx).await?;
        // "does not exist, skipping" notices are noise here.
        sqlx::query("SET LOCAL client_min_messages = warning").execute(&mut *tx).await?;
        for statement in &statements {
            sqlx::query(statement).execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(())
    })
    .await?;
    tracing::info!(store = %store.description, "schema uninstalled");
    Ok(())
}

#[cfg(test)]
mod tests {
    use async_trait::async_trait;
    use chrono::DateTime;
    use solocron_conformance::server::{self, Failure, Namespace, TestServer};
    use solocron_core::{ClaimMode, ClaimOutcome, ClaimRequest, ClaimStore, Prefix, StoreBase, Tick, Trigger};
    use std::time::Duration;

    use super::*;

    /// Version 13's claim functions: the released texts, each overlap check rewritten once.
    #[test]
    fn version_13_makes_every_claim_functions_overlap_check_a_subquery_per_request() {
        for function in [CLAIM_SET_FUNCTION, CLAIM_FUNCTION_V11, CLAIM_ONE_FUNCTION_V11] {
            let rewritten = overlap_by_job(function);
            assert!(!rewritten.contains("NOT EXISTS (SELECT 1 FROM {p}runs"), "{rewritten}");
            assert_eq!(rewritten.matches("state = 'running' LIMIT 1) IS NULL").count(), 1, "{rewritten}");
        }
        assert!(matches!(overlap_by_job(FINISH_ALL_FUNCTION), Cow::Borrowed(_)), "other statements unchanged");
    }

    /// The test server as `tests/common` describes it, which unit tests cannot reach.
    struct Postgres;

    #[async_trait]
    impl TestServer for Postgres {
        type Store = PgStore;
        const NAME: &'static str = server::POSTGRES.name;
        const URL_VAR: &'static str = server::POSTGRES.var;
        const URL_DEFAULT: &'static str = server::POSTGRES.default;

        async fn connect(url: &str, prefix: &Prefix) -> Result<PgStore, StoreError> {
            PgStore::connect(url, prefix).await
        }

        async fn names(url: &str, root: &str) -> Result<Vec<String>, Failure> {
            let pool = sqlx::PgPool::connect(url).await?;
            let names = sqlx::query_scalar(
                "SELECT tablename::text FROM pg_tables WHERE schemaname = current_schema()
                   AND left(tablename, length($1)) = $1
                 UNION
                 SELECT proname::text FROM pg_proc WHERE pronamespace = current_schema()::regnamespace
                   AND left(proname, length($1)) = $1",
            )
            .bind(root)
            .fetch_all(&pool)
            .await;
            pool.close().await;
            Ok(names?)
        }

        async fn close(store: PgStore) {
            store.close().await;
        }
    }

    /// A claim of `backup` at `minute` past 2026-01-01T00:00Z by node `a`, with `nonce`.
    fn backup(minute: i64, nonce: u64) -> ClaimRequest {
        let at = DateTime::from_timestamp_millis(1_767_225_600_000 + minute * 60_000).expect("in range");
        ClaimRequest {
            tick: Tick::new("backup", at),
            trigger: Trigger::Schedule,
            node: "a".into(),
            lease: Duration::from_secs(60),
            mode: ClaimMode::Run { skip_if_running: false },
            nonce,
        }
    }

    /// The token of a claim that must be won.
    async fn won(store: &PgStore, request: ClaimRequest) -> u64 {
        match store.claim(&[request]).await.expect("claim").remove(0) {
            ClaimOutcome::Won(lease) => lease.fencing_token,
            other => panic!("expected Won, got {other:?}"),
        }
    }

    /// A schema of version 7 holding a run claimed by a node of that version is brought to
    /// version 8 in place: the run has no nonce (asked again with one, it is taken), each
    /// claim function is replaced by the one taking nonces (no overload is left), and a
    /// claim asked again with its nonce is won again.
    #[tokio::test]
    async fn a_version_7_schema_gets_nonces_and_keeps_its_runs() {
        let Some(ns) = Namespace::<Postgres>::new().await else { return };
        let store = ns.store().await;
        migrate_to(&store, 7).await.expect("migrate to version 7");
        let old_claim = "SELECT o_outcome, o_token FROM {p}claim_one('backup', $1, 'schedule', 'a', 60000, 'run', '')";
        let old: (String, i64) = sqlx::query_as(&store.sql(old_claim))
            .bind(backup(0, 0).tick.scheduled_at.timestamp_millis())
            .fetch_one(&store.pool)
            .await
            .expect("a claim of version 7");
        assert_eq!(old, ("won".to_owned(), 1));

        migrate(&store).await.expect("migrate to the current version");
        let functions: Vec<(String, i16)> = sqlx::query_as(
            "SELECT proname::text, pronargs FROM pg_proc WHERE pronamespace = current_schema()::regnamespace
               AND left(proname, length($1)) = $1 ORDER BY 1",
        )
        .bind(&store.tables)
        .fetch_all(&store.pool)
        .await
        .expect("functions");
        let expected = [("claim", 8), ("claim_one", 8), ("claim_set", 8), ("claim_taken_first", 8)]
            .into_iter()
            .chain([("finish_all", 11), ("renew_all", 7)])
            .map(|(f, args)| (format!("{}{f}", store.tables), args))
            .collect::<Vec<_>>();
        assert_eq!(functions, expected);
        let without: i64 = sqlx::query_scalar(&store.sql("SELECT count(*) FROM {p}runs WHERE nonce IS NULL"))
            .fetch_one(&store.pool)
            .await
            .expect("count");
        assert_eq!(without, 1, "the run of version 7 has no nonce");

        assert_eq!(store.claim(&[backup(0, 5)]).await.expect("claim"), [ClaimOutcome::Taken]);
        assert_eq!(won(&store, backup(1, 5)).await, 3, "the taken claim left its reserved token unused");
        assert_eq!(won(&store, backup(1, 5)).await, 3, "asked again with its nonce");
        assert_eq!(store.claim(&[backup(1, 6)]).await.expect("claim"), [ClaimOutcome::Taken]);
    }

    /// The claim functions' names, argument counts and identities, in name order.
    async fn functions(store: &PgStore) -> Vec<(String, i16, i64)> {
        sqlx::query_as(
            "SELECT proname::text, pronargs, oid::bigint FROM pg_proc
              WHERE pronamespace = current_schema()::regnamespace AND left(proname, length($1)) = $1 ORDER BY 1",
        )
        .bind(&store.tables)
        .fetch_all(&store.pool)
        .await
        .expect("functions")
    }

    /// A schema of version 10 is brought to version 11 in place: each claim function is
    /// replaced under its one signature (the same function, no overload), so the call of a
    /// build of version 10 still works, and now refuses a scheduled claim made too early,
    /// which version 10 won, without touching the job's fencing counter.
    #[tokio::test]
    async fn a_version_10_schema_refuses_early_claims_once_migrated_in_place() {
        let Some(ns) = Namespace::<Postgres>::new().await else { return };
        let store = ns.store().await;
        migrate_to(&store, 10).await.expect("migrate to version 10");
        let before = functions(&store).await;
        let far = |job: &str, now: DateTime<chrono::Utc>| ClaimRequest {
            tick: Tick::new(job, now + chrono::Duration::seconds(60)),
            ..backup(0, 0)
        };
        let now = store.now().await.expect("now");
        assert!(matches!(store.claim(&[far("early", now)]).await.expect("claim")[..], [ClaimOutcome::Won(_)]));

        migrate_to(&store, 11).await.expect("migrate to version 11");
        assert_eq!(functions(&store).await, before, "replaced in place");
        let old_call =
            "SELECT o_outcome, o_claimed_at FROM {p}claim_one('early', $1, 'schedule', 'a', 60000, 'run', '', 0)";
        let tick = far("early", now).tick.scheduled_at.timestamp_millis() + 60_000;
        let (outcome, store_now): (String, i64) =
            sqlx::query_as(&store.sql(old_call)).bind(tick).fetch_one(&store.pool).await.expect("a call of version 10");
        assert_eq!(outcome, "too-early");
        assert!((now.timestamp_millis()..tick - 60_000).contains(&store_now), "the server's now: {store_now}");
        let outcome = store.claim(&[far("early", store.now().await.expect("now"))]).await.expect("claim").remove(0);
        assert!(matches!(outcome, ClaimOutcome::TooEarly { .. }), "{outcome:?}");
        let token: i64 = sqlx::query_scalar(&store.sql("SELECT token FROM {p}fences WHERE job = 'early'"))
            .fetch_one(&store.pool)
            .await
            .expect("the fence");
        assert_eq!(token, 1, "the refused claims left the counter alone");
    }

    /// A schema of version 11 is brought to version 12 in place: its claim functions stay
    /// (the same functions, so builds of version 11 keep claiming) and `claim_set` is
    /// added; a batch claimed by a build of version 11 and the same jobs' next batch
    /// claimed by this one give each job's tokens in order, and find the other's ticks taken.
    #[tokio::test]
    async fn a_version_11_schema_gains_the_set_claim_beside_its_functions() {
        let Some(ns) = Namespace::<Postgres>::new().await else { return };
        let store = ns.store().await;
        migrate_to(&store, 11).await.expect("migrate to version 11");
        let before = functions(&store).await;
        let batch = |minute: i64| -> Vec<ClaimRequest> {
            (0..3)
                .map(|j| ClaimRequest {
                    tick: Tick::new(
                        format!("job-{j}"),
                        backup(0, 0).tick.scheduled_at + chrono::Duration::minutes(minute),
                    ),
                    ..backup(0, 0)
                })
                .collect()
        };
        let tokens = |outcomes: Vec<ClaimOutcome>| -> Vec<u64> {
            outcomes
                .into_iter()
                .map(|o| match o {
                    ClaimOutcome::Won(lease) => lease.fencing_token,
                    other => panic!("expected Won, got {other:?}"),
                })
                .collect()
        };
        let first = batch(0);
        let row = crate::records::Batch::new(&first)
            .expect("a batch")
            .send(&store.pool, &store.sql(crate::records::claim_query!("claim")))
            .await
            .expect("a claim of version 11");
        let old = tokens(crate::records::outcomes(&first, &row).expect("outcomes"));

        migrate_to(&store, 12).await.expect("migrate to version 12");
        let after = functions(&store).await;
        assert_eq!(after.iter().filter(|f| !f.0.ends_with("claim_set")).cloned().collect::<Vec<_>>(), before);
        assert_eq!(after.len(), before.len() + 1, "claim_set added: {after:?}");
        for (j, (old, new)) in old.iter().zip(tokens(store.claim(&batch(1)).await.expect("claim"))).enumerate() {
            assert!(new > *old, "job-{j}: {old} then {new}");
        }
        let old_call = "SELECT array_agg(o_outcome) FROM {p}claim_taken_first($1, $2, $3, $4, $5, $6, $7, $8)";
        let requests = batch(1);
        let b = crate::records::Batch::new(&requests).expect("a batch");
        let row = b.send(&store.pool, &store.sql(old_call)).await.expect("a call of version 11");
        let outcomes: Vec<String> = sqlx::Row::get(&row, 0);
        assert_eq!(outcomes, ["taken"; 3]);
    }
}
