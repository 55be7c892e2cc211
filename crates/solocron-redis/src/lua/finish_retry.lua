-- finish_retry: ARGV as finish's, then the backoff in ms. Records the end as finish does
-- and, only then, creates the tick's next attempt as 'waiting' (trigger 'retry', the same
-- node, no token, `lease` = now + backoff: its not-before), indexed in the history and in
-- the expiry set by its not-before (so that `expired` lists it once due), never in the
-- job's running set. 1 if recorded; 0 (nothing written) if the run is not this owner's
-- running run.
handlers.finish_retry = function(KEYS, ARGV)
  local id, key, claimed = held_run(ARGV, 0)
  if not id then return 0 end
  local job, at, next_attempt = ARGV[2], ARGV[3], tonumber(ARGV[4]) + 1
  local next_id = run_id(job, at, next_attempt)
  local next_key = run_key(next_id)
  -- Checked before any write: a script's writes are not undone when it stops early.
  if redis.call('EXISTS', next_key) == 1 then
    return redis.error_reply('ERR solocron: run ' .. run_name(job, at, next_attempt) .. ' exists already while ' ..
      run_name(job, at, next_attempt - 1) .. ' is running')
  end
  record_end(id, key, job, claimed, ARGV, 0)
  local not_before = int(NOW + tonumber(ARGV[12]))
  redis.call('HSET', next_key, 'job', job, 'at', at, 'att', int(next_attempt), 'trig', 'retry', 'node', ARGV[5],
    'state', 'waiting', 'claimed', NOW_S, 'lease', not_before, 'out', '', 'nonce', '0')
  index(next_id, job, at)
  redis.call('ZADD', EXPIRY, not_before, next_id)
  return 1
end
