-- goodbye: ARGV node. Marks a known node gone at NOW.
handlers.goodbye = function(KEYS, ARGV)
  local key = node_key(ARGV[2])
  if redis.call('EXISTS', key) == 1 then redis.call('HSET', key, 'left', NOW_S) end
  return 1
end
