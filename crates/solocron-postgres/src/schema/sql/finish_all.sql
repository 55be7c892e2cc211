-- `{p}finish_all` as it stands: CURRENT, what a database at the crate's `SCHEMA_VERSION`
-- runs. Its text is that of `../migrations/v13_finish_all.sql`, which installed it (a test
-- compares them): to change it, edit it here and add a migration that carries the new text;
-- never edit a released one.
--
-- Records a batch of ends (see `runs.rs`): the positions (`p_i`) of the runs it ended, each
-- the owner's running run under its token. `claimed_at + NULL` is NULL: never started.
-- `{by_key}` is filled in at migrate time with the planner settings of `schema::BY_KEY`
-- (hash and merge joins off), and the state is checked `IS NOT DISTINCT FROM`, so that each
-- run is found by its key.

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
$finish$
