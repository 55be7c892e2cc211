-- Schema version 12's `{p}claim_set`, as released. FROZEN: never edit it, databases were
-- upgraded through this very text (a test fingerprints it). The current `{p}claim_set` is
-- `../sql/claim_set.sql`.
--
-- A batch claim with the answers of `v11_claim.sql` in a few statements instead of one or
-- more per request, for a batch in which no job appears twice (one tick per job: a node's
-- batch of an instant). Its requests are then independent of one another (pause, overlap,
-- the tick's record and the token are all per job), so one snapshot can decide them all: the
-- server's clock is read (`too-early` as in `{p}claim`), the fence rows of the requests that
-- may win are locked in sorted order with one token reserved each, the clock is read again
-- once they are held, and one `INSERT … SELECT … WHERE NOT EXISTS (pause) AND NOT EXISTS
-- (overlap) ON CONFLICT DO NOTHING` writes every run that wins. When every request won (the
-- common batch) that is the answer. Otherwise, of the others, a request not too early whose
-- tick has a record is `taken` (unless it carries a nonce and may be its own claim asked
-- again); every other request that did not win (too early, a skip, paused, overlapping, a
-- nonce's grant again) is decided by `{p}claim`, with the same answers as before, in the
-- same transaction. A batch of one, or one in which a job appears twice, goes to `{p}claim`
-- whole. The token reserved for a request that does not win goes unused (tokens only need to
-- grow).

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
$claim$
