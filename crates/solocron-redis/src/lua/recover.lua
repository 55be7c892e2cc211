-- recover: ARGV job, scheduled_at, attempt, action ('abandon' | 'retry'), reason (abandon)
-- or node (retry), lease ms (retry). Acts only on a running run whose lease passed.
handlers.recover = function(KEYS, ARGV)
  local job, at, attempt = ARGV[2], ARGV[3], tonumber(ARGV[4])
  local id = run_id(job, at, attempt)
  if not lapsed(run_key(id)) then return {'not_needed'} end
  if ARGV[5] == 'abandon' then
    end_run(id, job, 'abandoned', ARGV[6])
    return {'abandoned'}
  end
  -- Checked before any write: a script's writes are not undone when it stops early.
  local next_attempt = attempt + 1
  if redis.call('EXISTS', run_key(run_id(job, at, next_attempt))) == 1 then return {'not_needed'} end
  local node = ARGV[6]
  end_run(id, job, 'lost', 'lease expired; retried as attempt ' .. int(next_attempt) .. ' by ' .. node)
  return start_run(job, at, next_attempt, 'retry', node, ARGV[7])
end
