-- expired: ARGV limit. Records of running runs whose lease passed, oldest lease first.
handlers.expired = function(KEYS, ARGV)
  return hashes(redis.call('ZRANGEBYSCORE', EXPIRY, '-inf', '(' .. int(NOW), 'LIMIT', 0, tonumber(ARGV[2])), run_key)
end
