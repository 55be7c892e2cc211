-- Schema version 1's `{p}claim`, as released. FROZEN: never edit it, databases were upgraded
-- through this very text (a test fingerprints it). The current `{p}claim` is
-- `../sql/claim.sql`.
--
-- One whole claim batch in one server-side call (so one round trip), as one transaction.
--
-- It first locks the fence rows of every job in the batch, in sorted order: claims of the
-- same job then take turns (closing the overlap race between nodes claiming *different*
-- ticks of a job under READ COMMITTED), and two batches sharing jobs wait for each other in
-- one global order, never in a cycle. Under READ COMMITTED each statement of a PL/pgSQL
-- function takes a fresh snapshot, so a claim that waited for a lock sees what the holder
-- committed. Then, for each request in order: paused, overlap, insert-if-absent, token.
-- Outcomes are `won` (with token and instants), `skipped` (with reason) or `taken`.

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
BEGIN
    INSERT INTO {p}fences (job, token)
        SELECT DISTINCT j, 0 FROM unnest(p_jobs) AS j ORDER BY 1
        ON CONFLICT (job) DO NOTHING;
    PERFORM 1 FROM {p}fences WHERE job = ANY (p_jobs) ORDER BY job FOR UPDATE;
    -- The clock is read once the locks are held, so that a claim that waited for another
    -- gets a later claimed_at, in step with its larger fencing token.
    v_now := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    FOR i IN 1 .. coalesce(array_length(p_jobs, 1), 0) LOOP
        o_index := i;
        o_reason := NULL; o_token := NULL; o_claimed_at := NULL; o_lease_until := NULL;
        v_reason := NULL;
        IF p_modes[i] = 'skip' THEN
            v_reason := p_reasons[i];
        ELSE
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
        ELSE
            -- The fence row is locked, so reading its token here and storing the next one
            -- below cannot interleave with another claim of the job.
            INSERT INTO {p}runs (job, scheduled_at, attempt, "trigger", node, token, state, claimed_at, lease_until)
                SELECT p_jobs[i], p_ticks[i], 1, p_triggers[i], p_nodes[i], f.token + 1, 'running',
                       v_now, v_now + p_leases[i]
                FROM {p}fences f WHERE f.job = p_jobs[i]
                ON CONFLICT (job, scheduled_at, attempt) DO NOTHING
                RETURNING token INTO o_token;
            IF FOUND THEN
                UPDATE {p}fences SET token = o_token WHERE job = p_jobs[i];
                o_outcome := 'won'; o_claimed_at := v_now; o_lease_until := v_now + p_leases[i];
            ELSE
                o_outcome := 'taken';
            END IF;
        END IF;
        RETURN NEXT;
    END LOOP;
END
$claim$
