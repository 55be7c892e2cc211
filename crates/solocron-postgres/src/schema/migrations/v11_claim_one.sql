-- Schema version 11's `{p}claim_one`, as released. FROZEN: never edit it, databases were
-- upgraded through this very text (a test fingerprints it). The current `{p}claim_one` is
-- `../sql/claim_one.sql`.
--
-- `v08_claim_one.sql` refusing a scheduled claim made too early: the one-tick twin of
-- `v11_claim.sql`, with the same answers. Its first step reads the server's clock (one more
-- read of it, no more statements); a `schedule` request whose tick is more than 500 ms ahead
-- of it answers `too-early` with that clock in `o_claimed_at`, before the fence row's
-- upsert: no lock, no token, no record.

CREATE OR REPLACE FUNCTION {p}claim_one(
    p_job TEXT, p_tick BIGINT, p_trigger TEXT, p_node TEXT, p_lease BIGINT, p_mode TEXT, p_reason TEXT,
    p_nonce BIGINT,
    OUT o_index INTEGER, OUT o_outcome TEXT, OUT o_reason TEXT, OUT o_token BIGINT,
    OUT o_claimed_at BIGINT, OUT o_lease_until BIGINT)
LANGUAGE plpgsql VOLATILE AS $claim$
DECLARE
    v_now BIGINT;
    v_reason TEXT;
    v_found RECORD;
    v_token BIGINT;
    v_rechecks INTEGER := 0;
    v_mine BOOLEAN;
BEGIN
    o_index := 1;
    -- Read before the lock: a scheduled request for a tick more than 500 ms
    -- (CLAIM_EARLY_MAX) ahead of it is too early, and takes no lock nor token.
    v_now := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    IF p_trigger = 'schedule' AND p_tick > v_now + 500 THEN
        o_outcome := 'too-early'; o_claimed_at := v_now;
        RETURN;
    END IF;
    INSERT INTO {p}fences AS f (job, token) VALUES (p_job, 1)
        ON CONFLICT (job) DO UPDATE SET token = f.token + 1
        RETURNING f.token INTO v_token;
    -- The clock is read again once the lock is held, as in {p}claim.
    v_now := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    LOOP
        v_reason := NULL;
        IF p_mode = 'skip' THEN
            v_reason := p_reason;
        ELSE
            INSERT INTO {p}runs (job, scheduled_at, attempt, "trigger", node, token, state, claimed_at,
                                 lease_until, nonce)
                SELECT p_job, p_tick, 1, p_trigger, p_node, v_token, 'running', v_now, v_now + p_lease,
                       nullif(p_nonce, 0)
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
            SELECT state = 'running' AND node = p_node AND nonce = p_nonce INTO v_mine
                FROM {p}runs WHERE job = p_job AND scheduled_at = p_tick AND attempt = 1;
            IF FOUND THEN
                o_outcome := 'taken';
                -- Asked again for a claim whose answer was lost: granted again while its run
                -- is untouched (the update re-checks it, after any recovery in flight).
                IF v_mine AND p_nonce <> 0 THEN
                    UPDATE {p}runs SET lease_until = v_now + p_lease
                        WHERE job = p_job AND scheduled_at = p_tick AND attempt = 1
                          AND state = 'running' AND node = p_node AND nonce = p_nonce
                        RETURNING token, claimed_at, lease_until INTO o_token, o_claimed_at, o_lease_until;
                    IF FOUND THEN
                        o_outcome := 'won';
                    END IF;
                END IF;
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
