-- Schema version 13's `{p}renew_all`, as released. FROZEN: never edit it, databases were
-- upgraded through this very text (a test fingerprints it). The current `{p}renew_all` is
-- `../sql/renew_all.sql`.
--
-- Extends a batch of live leases held by their owners: the positions (`p_i`) of those
-- extended. `{by_key}` as in `v13_finish_all.sql`.

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
