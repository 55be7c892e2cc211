-- expired: ARGV limit. Records someone must act on, oldest `lease` first: running runs
-- whose lease passed and waiting retries whose not-before passed (both in the expiry set,
-- scored by `lease`).
handlers.expired = function(KEYS, ARGV)
  return hashes(redis.call('ZRANGEBYSCORE', EXPIRY, '-inf', '(' .. int(NOW), 'LIMIT', 0, tonumber(ARGV[2])), run_key)
end
