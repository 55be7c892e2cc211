-- The tables and indexes as they stand: CURRENT, what a database at the crate's
-- `SCHEMA_VERSION` holds. Nothing runs this file: a database gets its tables through the
-- released migrations (`../migrations.rs`), and a test builds this file on a fresh prefix
-- and compares the catalog (columns, constraints, indexes) with a migrated one. To change
-- a table, add a migration and change it here the same way.
--
-- `{p}` is the table prefix. Instants are integer milliseconds since the epoch by the
-- server's clock.

-- Every attempt of every tick. Attempt 1 of a tick is created once (the primary key), and
-- the primary key also serves per-job history newest first (a backward scan of one job's
-- entries). `nonce` is the nonce of the claim that created a run (schema version 8):
-- `NULL` on records of earlier versions and on attempts after the first.
CREATE TABLE {p}runs (
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
    nonce BIGINT NULL,
    PRIMARY KEY (job, scheduled_at, attempt)
);
-- Serves `expired`: running runs by lease expiry, oldest first. Partial, so it holds only
-- the few running runs however long the history grows; its predicate names the lease, so
-- only statements that bound the lease can use it (see `schema::BY_KEY`).
CREATE INDEX {p}runs_expiry ON {p}runs (lease_until) WHERE state = 'running' AND lease_until IS NOT NULL;
-- Waiting retries (state `waiting`, their not-before in `lease_until`) by not-before, which
-- serves `expired` beside `{p}runs_expiry`.
CREATE INDEX {p}runs_waiting ON {p}runs (lease_until) WHERE state = 'waiting';
-- Serves the claim's overlap check (is a run of this job running?) and `unlock` (every
-- running run of a job). Ordered like the primary key so the overlap check reads its
-- answer first.
CREATE INDEX {p}runs_running ON {p}runs (job, scheduled_at, attempt) WHERE state = 'running';
-- Serves `history` across jobs (newest first, a backward scan) and `prune` (oldest first
-- below the cutoff). It holds the job too, so that a lookup of one run by its key is exact
-- whichever index the planner picks.
CREATE INDEX {p}runs_scheduled_job ON {p}runs (scheduled_at, attempt, job);

-- Per-job fencing counters, kept apart from the runs so that a token is never reused after
-- records are pruned. Its rows are also the per-job locks that serialize claims.
CREATE TABLE {p}fences (job TEXT PRIMARY KEY, token BIGINT NOT NULL);

-- The fleet-wide switches (pause) an operator left on a job.
CREATE TABLE {p}jobs (
    job TEXT PRIMARY KEY,
    paused BOOLEAN NOT NULL,
    changed_by TEXT NOT NULL,
    reason TEXT NULL,
    changed_at BIGINT NOT NULL
);

-- Which node runs which job, as defined; the primary key serves `registrations`' order.
CREATE TABLE {p}registry (
    job TEXT NOT NULL,
    node TEXT NOT NULL,
    schedule TEXT NOT NULL,
    timezone TEXT NOT NULL,
    definition_hash TEXT NOT NULL,
    summary TEXT NOT NULL,
    first_seen BIGINT NOT NULL,
    last_seen BIGINT NOT NULL,
    PRIMARY KEY (job, node)
);
-- Serves `register`'s removal of the jobs a node no longer lists.
CREATE INDEX {p}registry_node ON {p}registry (node, job);

-- Manual run requests; the key is the manual tick, so one instant is asked for once.
CREATE TABLE {p}requests (
    job TEXT NOT NULL,
    requested_at BIGINT NOT NULL,
    requested_by TEXT NOT NULL,
    PRIMARY KEY (job, requested_at)
);
-- Serves `pending_requests` (oldest first) and `prune`'s deletion of old requests.
CREATE INDEX {p}requests_oldest ON {p}requests (requested_at);

-- Each node's last heartbeat: one row per node, few rows, read whole.
CREATE TABLE {p}nodes (
    node TEXT PRIMARY KEY,
    version TEXT NOT NULL,
    jobs BIGINT NOT NULL,
    running BIGINT NOT NULL,
    started_at BIGINT NOT NULL,
    last_seen BIGINT NOT NULL,
    left_at BIGINT NULL
);

-- The audit log of operators' actions; its indexes serve `actions` newest first (across
-- jobs, per job) and `prune` (oldest first below the cutoff).
CREATE TABLE {p}actions (
    id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job TEXT NOT NULL,
    kind TEXT NOT NULL,
    done_by TEXT NOT NULL,
    reason TEXT NULL,
    done_at BIGINT NOT NULL,
    detail TEXT NOT NULL
);
CREATE INDEX {p}actions_newest ON {p}actions (done_at, id);
CREATE INDEX {p}actions_job ON {p}actions (job, done_at, id);

-- Managed jobs (`managed.rs`): one row per live job.
CREATE TABLE {p}managed (
    job TEXT PRIMARY KEY,
    spec TEXT NOT NULL,
    revision BIGINT NOT NULL,
    changed_by TEXT NOT NULL,
    changed_at BIGINT NOT NULL
);
-- One row per change of a managed job; the index serves a job's revisions newest first.
CREATE TABLE {p}job_revisions (
    revision BIGINT PRIMARY KEY,
    job TEXT NOT NULL,
    spec TEXT NULL,
    changed_by TEXT NOT NULL,
    changed_at BIGINT NOT NULL
);
CREATE INDEX {p}job_revisions_job ON {p}job_revisions (job, revision);
-- The store-wide revision counter: one row, whose lock orders the writers.
CREATE TABLE {p}managed_version (
    id SMALLINT PRIMARY KEY CHECK (id = 1),
    revision BIGINT NOT NULL
);
INSERT INTO {p}managed_version (id, revision) VALUES (1, 0);

-- The schema's version (one row), created by `migrate` itself before any step.
CREATE TABLE {p}schema (version INTEGER NOT NULL);
