-- `{p}claim_taken_first` as it stands: CURRENT, what a database at the crate's
-- `SCHEMA_VERSION` runs. Its text is that of `../migrations/v11_claim_taken_first.sql`,
-- which installed it (a test compares them): to change it, edit it here and add a migration
-- that carries the new text; never edit a released one.
--
-- The claim of a large batch in two steps, as builds before schema version 12 call it (this
-- build calls `{p}claim_set`): kept so that they claim beside it. First, without locks, one
-- read finds the requests whose tick has a record: they are `taken` for good (a record is
-- never deleted while its tick can be claimed: the retention floor is a day), except those
-- too early by the server's clock read at its start and those a nonce may grant again (a
-- `run` request with a nonce, its tick's attempt 1 running as this node's claim under that
-- nonce). Only the rest go to `{p}claim`, which locks their jobs' fence rows and decides
-- them. A record never comes to match later (its node and nonce are fixed, and a run that
-- ended does not run again), so the lock-free read cannot answer `taken` wrongly.

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
$claim$
