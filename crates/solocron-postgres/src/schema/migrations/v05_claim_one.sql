-- Schema version 5's `{p}claim_one`, as released. FROZEN: never edit it, databases were
-- upgraded through this very text (a test fingerprints it). The current `{p}claim_one` is
-- `../sql/claim_one.sql`.
--
-- `v04_claim.sql` for a batch of one, with the same answers, taking scalars and answering
-- one row (`o_index` 1) instead of taking arrays and returning a set: the arrays' decoding
-- and the set's tuple store were ~30 µs of a one-tick claim's ~360 µs here
-- (benchmarks/2026-11-25-fair-raw-insert-claim-functions-46f38a3.md). Most claims are of one
-- tick (a job's own schedule); batches keep `{p}claim`. Its steps are those of the batch's,
-- for one request: the upsert that locks the fence row and reserves a token, one insert that
-- checks the pause and the overlap in a snapshot taken after the lock, and only if it did
-- not win, why.

CREATE OR REPLACE FUNCTION {p}claim_one(
    p_job TEXT, p_tick BIGINT, p_trigger TEXT, p_node TEXT, p_lease BIGINT, p_mode TEXT, p_reason TEXT,
    OUT o_index INTEGER, OUT o_outcome TEXT, OUT o_reason TEXT, OUT o_token BIGINT,
    OUT o_claimed_at BIGINT, OUT o_lease_until BIGINT)
LANGUAGE plpgsql VOLATILE AS $claim$
DECLARE
    v_now BIGINT;
    v_reason TEXT;
    v_found RECORD;
    v_token BIGINT;
    v_rechecks INTEGER := 0;
BEGIN
    o_index := 1;
    INSERT INTO {p}fences AS f (job, token) VALUES (p_job, 1)
        ON CONFLICT (job) DO UPDATE SET token = f.token + 1
        RETURNING f.token INTO v_token;
    -- The clock is read once the lock is held, as in {p}claim.
    v_now := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    LOOP
        v_reason := NULL;
        IF p_mode = 'skip' THEN
            v_reason := p_reason;
        ELSE
            INSERT INTO {p}runs (job, scheduled_at, attempt, "trigger", node, token, state, claimed_at, lease_until)
                SELECT p_job, p_tick, 1, p_trigger, p_node, v_token, 'running', v_now, v_now + p_lease
                WHERE (p_trigger = 'manual'
                       OR NOT EXISTS (SELECT 1 FROM {p}jobs WHERE job = p_job AND paused))
                  AND (p_mode <> 'run-unless-running'
                       OR NOT EXISTS (SELECT 1 FROM {p}runs WHERE job = p_job AND state = 'running'))
                ON CONFLICT (job, scheduled_at, attempt) DO NOTHING;
            IF FOUND THEN
                o_outcome := 'won'; o_token := v_token;
                o_claimed_at := v_now; o_lease_until := v_now + p_lease;
                RETURN;
            END IF;
            PERFORM 1 FROM {p}runs WHERE job = p_job AND scheduled_at = p_tick AND attempt = 1;
            IF FOUND THEN
                o_outcome := 'taken';
                RETURN;
            END IF;
            IF p_trigger <> 'manual' THEN
                SELECT changed_by, reason INTO v_found FROM {p}jobs WHERE job = p_job AND paused;
                IF FOUND THEN
                    v_reason := 'paused by ' || v_found.changed_by || coalesce(': ' || v_found.reason, '');
                END IF;
            END IF;
            IF v_reason IS NULL AND p_mode = 'run-unless-running' THEN
                -- Any running run counts, even one whose lease expired: it awaits recovery.
                SELECT job, scheduled_at, attempt INTO v_found FROM {p}runs
                    WHERE job = p_job AND state = 'running'
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
                VALUES (p_job, p_tick, 1, p_trigger, p_node, 'skipped', v_reason, v_now, v_now)
                ON CONFLICT (job, scheduled_at, attempt) DO NOTHING;
            IF FOUND THEN
                o_outcome := 'skipped'; o_reason := v_reason;
            ELSE
                o_outcome := 'taken';
            END IF;
            RETURN;
        END IF;
        -- What kept the run from being inserted is gone (the running run ended, the job
        -- was resumed): try again.
        v_rechecks := v_rechecks + 1;
        IF v_rechecks >= 10 THEN
            RAISE EXCEPTION 'the claim of % kept changing under it', p_job USING ERRCODE = '40001';
        END IF;
    END LOOP;
END
$claim$
