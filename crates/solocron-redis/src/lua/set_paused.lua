-- set_paused: ARGV job, '1' | '0', by, reason?, most actions kept. A pause of a paused job
-- without a reason leaves the switch as it is; the action is recorded either way.
handlers.set_paused = function(KEYS, ARGV)
  local job, paused, by, reason = ARGV[2], ARGV[3] == '1', ARGV[4], opt(ARGV[5])
  local key = ctl_key(job)
  local was_paused = redis.call('HGET', key, 'paused') == '1'
  if not (paused and was_paused and not reason) then
    redis.call('HSET', key, 'job', job, 'paused', ARGV[3], 'by', by, 'at', NOW_S)
    if reason then redis.call('HSET', key, 'reason', reason) else redis.call('HDEL', key, 'reason') end
    redis.call('SADD', CTLS, job)
  end
  -- The details of solocron_core::ActionRecord::pause_detail.
  local detail = ''
  if paused and was_paused then detail = 'already paused' end
  if not paused and not was_paused then detail = 'already running' end
  record_action(job, paused and 'pause' or 'resume', by, reason, detail, tonumber(ARGV[6]))
  return 1
end
