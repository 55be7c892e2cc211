-- registrations: every registration hash (the caller sorts them by job, node).
handlers.registrations = function(KEYS, ARGV)
  return hashes(redis.call('ZRANGE', REGS, 0, -1), reg_key)
end
