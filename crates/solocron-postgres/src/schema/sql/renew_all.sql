-- `{p}renew_all` as it stands: CURRENT, what a database at the crate's `SCHEMA_VERSION`
-- runs. Its text is that of `../migrations/v13_renew_all.sql`, which installed it (a test
-- compares them): to change it, edit it here and add a migration that carries the new text;
-- never edit a released one.
--
-- Extends a batch of live leases held by their owners (see `runs.rs`): the positions (`p_i`)
-- of those extended. `{by_key}` as in `finish_all.sql`.

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
$renew$
