-- Schema version 4's `{p}claim`, as released. FROZEN: never edit it, databases were upgraded
-- through this very text (a test fingerprints it). The current `{p}claim` is
-- `../sql/claim.sql`.
--
-- `v01_claim.sql` with the same answers in fewer statements: a one-tick claim was six
-- (create the fence row if absent, lock it, read the pause, read the overlap, insert the
-- run, store the token) and is two. One upsert both locks the batch's fence rows (in sorted
-- order, as before) and reserves one token per request (`token + n` for a job with `n`
-- requests; a request that does not win leaves its token unused: tokens only need to grow).
-- Then one `INSERT … SELECT … WHERE NOT EXISTS (pause) AND NOT EXISTS (overlap)` per
-- request, in its own snapshot taken after the locks, as before. Only a request that does
-- not win reads why: its tick's record (`taken`), the pause, the overlap (`skipped`); if
-- none of these holds any more (the running run ended meanwhile: its end is not serialized
-- by the fence lock), the insert is tried again, at most ten times before the claim fails as
-- a serialization failure (retried).

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
$claim$
