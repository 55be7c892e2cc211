-- recover: ARGV job, scheduled_at, attempt, action ('abandon' | 'retry'), reason (abandon)
-- or node (retry), lease ms (retry). Acts only on a running run whose lease passed
-- ({'abandoned'}, or {'won', ...} for its next attempt) or on a waiting retry whose
-- not-before passed ({'abandoned'}, or {'started', ...} for that same attempt); else
-- {'not_needed'}.

-- Starts the waiting retry `id` as running for `node`: the job's next token, a lease of
-- `lease_ms` from now, back in the job's running set; {'started', token, claimed_at,
-- lease_until}.
local function start_waiting(id, job, at, node, lease_ms)
  local token = next_token(job)
  local lease_until = int(NOW + tonumber(lease_ms))
  redis.call('HSET', run_key(id), 'state', 'running', 'node', node, 'tok', token, 'claimed', NOW_S,
    'lease', lease_until)
  redis.call('ZADD', EXPIRY, lease_until, id)
  redis.call('ZADD', job_running(job), at, id)
  return {'started', token, NOW_S, lease_until}
end

handlers.recover = function(KEYS, ARGV)
  local job, at, attempt = ARGV[2], ARGV[3], tonumber(ARGV[4])
  local id = run_id(job, at, attempt)
  local state = due(run_key(id))
  if not state then return {'not_needed'} end
  if ARGV[5] == 'abandon' then
    end_run(id, job, 'abandoned', ARGV[6])
    return {'abandoned'}
  end
  local node = ARGV[6]
  if state == 'waiting' then return start_waiting(id, job, at, node, ARGV[7]) end
  -- Checked before any write: a script's writes are not undone when it stops early.
  local next_attempt = attempt + 1
  if redis.call('EXISTS', run_key(run_id(job, at, next_attempt))) == 1 then return {'not_needed'} end
  end_run(id, job, 'lost', 'lease expired; retried as attempt ' .. int(next_attempt) .. ' by ' .. node)
  local token, lease_until = start_run(job, at, next_attempt, 'retry', node, ARGV[7])
  if not token then return {'not_needed'} end
  return {'won', token, NOW_S, lease_until}
end
