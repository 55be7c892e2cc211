-- Schema version 2's `{p}claim_taken_first`, as released. FROZEN: never edit it, databases
-- were upgraded through this very text (a test fingerprints it). The current
-- `{p}claim_taken_first` is `../sql/claim_taken_first.sql`.
--
-- The claim of a large batch (the same answers as `v01_claim.sql`) in two steps. First,
-- without locks, one read finds the requests whose tick has a record: they are `taken` for
-- good (a record is never deleted while its tick can be claimed: the retention floor is a
-- day). Only the rest go to `{p}claim`, which locks their jobs' fence rows and decides them.
-- Nodes racing for one herd claim its chunks in different orders (see the engine's
-- `chunk_order`), so a node reaching a chunk another node already claimed answers it from
-- one index read per tick, without waiting for that node's locks or repeating its pause and
-- overlap checks. For a short batch the extra read and call cost more than they save (one
-- tick: claim / raw 1.36 → 1.8), so short batches call `{p}claim`.

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
$claim$
