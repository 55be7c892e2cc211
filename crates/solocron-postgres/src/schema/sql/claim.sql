-- `{p}claim` as it stands: CURRENT, what a database at the crate's `SCHEMA_VERSION` runs.
-- Its text is that of `../migrations/v13_claim.sql`, which installed it (a test compares
-- them): to change it, edit it here and add a migration that carries the new text; never
-- edit a released one.
--
-- A claim batch, request by request, in one call (one round trip), as one transaction.
-- `{p}claim_set` hands it the requests it does not decide set-wise; builds before schema
-- version 12 call it directly. Its steps:
--
-- First the server's clock, before any lock (`v_asked_at`): a `schedule` request for a tick
-- more than 500 ms (`CLAIM_EARLY_MAX`) ahead of it answers `too-early` with that clock in
-- `o_claimed_at`, and takes no lock, no token and writes no record.
--
-- Then one upsert locks the fence rows of the other requests' jobs, in sorted order, and
-- reserves one token per request (`token + n` for a job with `n` requests; a token its
-- request does not win goes unused: tokens only need to grow). Claims of one job thus take
-- turns (closing the overlap race between nodes claiming *different* ticks of a job under
-- READ COMMITTED), and batches sharing jobs wait for each other in one global order, never
-- in a cycle. The clock is read again once the locks are held, so that a claim that waited
-- gets a later `claimed_at`, in step with its larger token.
--
-- Then, per request, in a snapshot of its own (READ COMMITTED takes one per statement, so a
-- claim that waited for a lock sees what the holder committed): one `INSERT … SELECT …
-- WHERE` the job is not paused and no run of it is running (a subquery per request, never a
-- join: see `schema::BY_KEY`) `ON CONFLICT DO NOTHING`. Only a request that does not win
-- reads why: its tick's record (`taken`; or, when that record is this node's running claim
-- under this request's nonce, its answer lost, `won` again: one update writes a fresh lease
-- and returns the run's own token), the pause or the overlap (`skipped`, recorded). If none
-- of these holds any more (the running run ended meanwhile: ends are not serialized by the
-- fence lock), the insert is tried again, at most ten times before the claim fails as a
-- serialization failure (retried).

CREATE OR REPLACE FUNCTION {p}claim(
    p_jobs TEXT[], p_ticks BIGINT[], p_triggers TEXT[], p_nodes TEXT[],
    p_leases BIGINT[], p_modes TEXT[], p_reasons TEXT[], p_nonces BIGINT[])
RETURNS TABLE (o_index INTEGER, o_outcome TEXT, o_reason TEXT, o_token BIGINT,
               o_claimed_at BIGINT, o_lease_until BIGINT)
LANGUAGE plpgsql VOLATILE AS $claim$
DECLARE
    v_asked_at BIGINT;
    v_now BIGINT;
    v_reason TEXT;
    v_found RECORD;
    v_tokens BIGINT[];
    v_rechecks INTEGER;
    v_mine BOOLEAN;
BEGIN
    IF coalesce(cardinality(p_jobs), 0) = 0 THEN
        RETURN;
    END IF;
    -- Read before any lock: a scheduled request for a tick more than 500 ms
    -- (CLAIM_EARLY_MAX) ahead of it is too early, and takes no lock nor token.
    v_asked_at := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    IF cardinality(p_jobs) = 1 THEN
        IF p_triggers[1] = 'schedule' AND p_ticks[1] > v_asked_at + 500 THEN
            o_index := 1; o_outcome := 'too-early'; o_reason := NULL; o_token := NULL;
            o_claimed_at := v_asked_at; o_lease_until := NULL;
            RETURN NEXT;
            RETURN;
        END IF;
        INSERT INTO {p}fences AS f (job, token) VALUES (p_jobs[1], 1)
            ON CONFLICT (job) DO UPDATE SET token = f.token + 1
            RETURNING ARRAY[f.token] INTO v_tokens;
    ELSE
        WITH requests AS (
            SELECT r.j, r.i, r.early,
                   row_number() OVER (PARTITION BY r.j, r.early ORDER BY r.i) AS k,
                   count(*) OVER (PARTITION BY r.j, r.early) AS n
            FROM (SELECT q.j, q.i, (q.t = 'schedule' AND q.s > v_asked_at + 500) AS early
                  FROM unnest(p_jobs, p_triggers, p_ticks) WITH ORDINALITY AS q(j, t, s, i)) AS r),
        reserved AS (
            INSERT INTO {p}fences AS f (job, token)
                SELECT j, count(*) FROM requests WHERE NOT early GROUP BY j ORDER BY j
                ON CONFLICT (job) DO UPDATE SET token = f.token + excluded.token
                RETURNING f.job, f.token)
        SELECT array_agg(CASE WHEN requests.early THEN NULL
                              ELSE reserved.token - requests.n + requests.k END ORDER BY requests.i)
            INTO v_tokens
            FROM requests LEFT JOIN reserved ON reserved.job = requests.j;
    END IF;
    -- The clock is read once the locks are held, so that a claim that waited for another
    -- gets a later claimed_at, in step with its larger fencing token.
    v_now := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    FOR i IN 1 .. cardinality(p_jobs) LOOP
        o_index := i;
        o_reason := NULL; o_token := NULL; o_claimed_at := NULL; o_lease_until := NULL;
        IF p_triggers[i] = 'schedule' AND p_ticks[i] > v_asked_at + 500 THEN
            o_outcome := 'too-early'; o_claimed_at := v_asked_at;
            RETURN NEXT;
            CONTINUE;
        END IF;
        v_rechecks := 0;
        LOOP
            v_reason := NULL;
            IF p_modes[i] = 'skip' THEN
                v_reason := p_reasons[i];
            ELSE
                INSERT INTO {p}runs (job, scheduled_at, attempt, "trigger", node, token, state, claimed_at,
                                     lease_until, nonce)
                    SELECT p_jobs[i], p_ticks[i], 1, p_triggers[i], p_nodes[i], v_tokens[i], 'running',
                           v_now, v_now + p_leases[i], nullif(p_nonces[i], 0)
                    WHERE (p_triggers[i] = 'manual'
                           OR NOT EXISTS (SELECT 1 FROM {p}jobs WHERE job = p_jobs[i] AND paused))
                      AND (p_modes[i] <> 'run-unless-running'
                           OR (SELECT 1 FROM {p}runs WHERE job = p_jobs[i] AND state = 'running' LIMIT 1) IS NULL)
                    ON CONFLICT (job, scheduled_at, attempt) DO NOTHING;
                IF FOUND THEN
                    o_outcome := 'won'; o_token := v_tokens[i];
                    o_claimed_at := v_now; o_lease_until := v_now + p_leases[i];
                    EXIT;
                END IF;
                SELECT state = 'running' AND node = p_nodes[i] AND nonce = p_nonces[i] INTO v_mine
                    FROM {p}runs WHERE job = p_jobs[i] AND scheduled_at = p_ticks[i] AND attempt = 1;
                IF FOUND THEN
                    o_outcome := 'taken';
                    -- Asked again for a claim whose answer was lost: granted again while its
                    -- run is untouched (the update re-checks it, after any recovery in flight).
                    IF v_mine AND p_nonces[i] <> 0 THEN
                        UPDATE {p}runs SET lease_until = v_now + p_leases[i]
                            WHERE job = p_jobs[i] AND scheduled_at = p_ticks[i] AND attempt = 1
                              AND state = 'running' AND node = p_nodes[i] AND nonce = p_nonces[i]
                            RETURNING token, claimed_at, lease_until INTO o_token, o_claimed_at, o_lease_until;
                        IF FOUND THEN
                            o_outcome := 'won';
                        END IF;
                    END IF;
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
