//! The released migrations: FROZEN. Each schema version's step exactly as it was released,
//! listed by the version it brings the schema to. Never edit one: databases were upgraded
//! through these very texts (a test fingerprints each step). A change to the schema is a
//! new version appended to [`MIGRATIONS`], its text copied here, never included from
//! `sql/`, so that editing the current files never changes a release; the same change goes
//! into `sql/` (a test checks that the migrations leave `sql/`'s routines installed).
//!
//! Short statements are inline; each stored routine a step creates is a file under
//! `migrations/`, named by the version that created it (`v04_claim.sql`: `{p}claim` as
//! version 4 created it), its history in its header.

/// The statement of a frozen file under `migrations/` (see [`statement`](super::statement)).
macro_rules! released {
    ($file:literal) => {
        super::statement(include_str!(concat!("migrations/", $file)))
    };
}

/// The migrations, by the version each one brings the schema to. Later versions append
/// here; a released step is never edited.
pub(super) const MIGRATIONS: &[(i32, &[&str])] = &[
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

/// Version 1: the runs, the fences, the pauses, the registry, the manual requests, and
/// `{p}claim` (`v01_claim.sql`).
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
    released!("v01_claim.sql"),
];

/// Version 2: `{p}claim_taken_first`, for large batches (`v02_claim_taken_first.sql`).
const V2: &[&str] = &[released!("v02_claim_taken_first.sql")];

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

/// Version 4: `{p}claim` in fewer statements (`v04_claim.sql`).
const V4: &[&str] = &[released!("v04_claim.sql")];

/// Version 5: `{p}claim_one`, the claim of one tick (`v05_claim_one.sql`).
const V5: &[&str] = &[released!("v05_claim_one.sql")];

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
/// each request's nonce (`v08_claim.sql`, `v08_claim_one.sql`, `v08_claim_taken_first.sql`).
/// A nullable column without a default is added without rewriting the table. The
/// functions of earlier versions are dropped rather than left as overloads, so that each
/// name keeps one function (`uninstall` drops them by name); a node of an older build
/// still running then fails its claims until it is upgraded, as its `migrate` would refuse
/// this version.
const V8: &[&str] = &[
    "ALTER TABLE {p}runs ADD COLUMN IF NOT EXISTS nonce BIGINT NULL",
    "DROP FUNCTION IF EXISTS {p}claim_taken_first(TEXT[], BIGINT[], TEXT[], TEXT[], BIGINT[], TEXT[], TEXT[])",
    "DROP FUNCTION IF EXISTS {p}claim_one(TEXT, BIGINT, TEXT, TEXT, BIGINT, TEXT, TEXT)",
    "DROP FUNCTION IF EXISTS {p}claim(TEXT[], BIGINT[], TEXT[], TEXT[], BIGINT[], TEXT[], TEXT[])",
    released!("v08_claim.sql"),
    released!("v08_claim_one.sql"),
    released!("v08_claim_taken_first.sql"),
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

/// Version 11: the claim functions refuse a scheduled claim made too early
/// (`v11_claim.sql`, `v11_claim_one.sql`, `v11_claim_taken_first.sql`). Their arguments and
/// columns are those of version 8, so each is replaced in place (no drop, no overload) and
/// builds of version 10 keep claiming beside it, with one difference: a claim of theirs too
/// early (their clock more than ~350 ms ahead of the server's) fails as invalid (they do
/// not know the answer `too-early`) where it was won before. Upgrade every node.
const V11: &[&str] =
    &[released!("v11_claim.sql"), released!("v11_claim_one.sql"), released!("v11_claim_taken_first.sql")];

/// Version 12: `{p}claim_set`, the claim of a batch in a few set-based statements where it
/// can (`v12_claim_set.sql`). Builds of version 11 keep calling `{p}claim` and
/// `{p}claim_taken_first`, unchanged, beside it.
const V12: &[&str] = &[released!("v12_claim_set.sql")];

/// Version 13: no statement that looks runs up by job or by key reads every running run,
/// whatever the statistics say (see [`BY_KEY`](super::BY_KEY)). `{p}finish_all` and
/// `{p}renew_all`, a batch of ends or of lease renewals as one `UPDATE` that finds each run
/// by its key (`v13_finish_all.sql`, `v13_renew_all.sql`); the claim functions of versions
/// 11 and 12 again, their overlap check, a `NOT EXISTS` the planner made a join, written as
/// a subquery per request (`v13_claim_set.sql`, `v13_claim.sql`, `v13_claim_one.sql`: the
/// same arguments and answers); and `{p}runs_expiry` only for statements that bound the
/// lease (its predicate adds `lease_until IS NOT NULL`), rebuilt inside the migration's
/// transaction (one scan of the table). Builds of version 12 keep working beside it.
const V13: &[&str] = &[
    released!("v13_finish_all.sql"),
    released!("v13_renew_all.sql"),
    released!("v13_claim_set.sql"),
    released!("v13_claim.sql"),
    released!("v13_claim_one.sql"),
    "DROP INDEX IF EXISTS {p}runs_expiry",
    "CREATE INDEX IF NOT EXISTS {p}runs_expiry ON {p}runs (lease_until) WHERE state = 'running' AND lease_until IS NOT NULL",
];
