-- set_paused: ARGV job, '1' | '0', by, reason?.
handlers.set_paused = function(KEYS, ARGV)
  local job, reason = ARGV[2], opt(ARGV[5])
  local key = ctl_key(job)
  redis.call('HSET', key, 'job', job, 'paused', ARGV[3], 'by', ARGV[4], 'at', int(NOW))
  if reason then redis.call('HSET', key, 'reason', reason) else redis.call('HDEL', key, 'reason') end
  redis.call('SADD', CTLS, job)
  return 1
end
