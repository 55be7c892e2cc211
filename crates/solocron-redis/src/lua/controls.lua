-- controls: every job's switches hash (the caller sorts them by job).
handlers.controls = function(KEYS, ARGV)
  return hashes(redis.call('SMEMBERS', CTLS), ctl_key)
end
