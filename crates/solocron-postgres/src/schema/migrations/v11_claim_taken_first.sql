-- Schema version 11's `{p}claim_taken_first`, as released. FROZEN: never edit it, databases
-- were upgraded through this very text (a test fingerprints it). The current
-- `{p}claim_taken_first` is `../sql/claim_taken_first.sql`.
--
-- `v08_claim_taken_first.sql` with the early check first, like `v11_claim.sql`: its
-- lock-free read answers `taken` only the requests that are not too early by the server's
-- clock read at its start; a `schedule` request for a tick more than 500 ms ahead of it goes
-- to `{p}claim`, which refuses it (or, a request at the very bound, decides it by its own
-- later clock), even if its tick has a record. Still current: no later version replaced it.

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
