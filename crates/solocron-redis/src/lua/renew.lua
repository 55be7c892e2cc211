-- renew: ARGV job, scheduled_at, attempt, owner, token, length ms. 1 if extended, else 0.
handlers.renew = function(KEYS, ARGV)
  local id = run_id(ARGV[2], ARGV[3], tonumber(ARGV[4]))
  local key = run_key(id)
  local r = redis.call('HMGET', key, 'state', 'node', 'tok', 'lease')
  local lease_until = tonumber(r[4])
  if r[1] ~= 'running' or r[2] ~= ARGV[5] or r[3] ~= ARGV[6] or lease_until == nil or lease_until <= NOW then
    return 0
  end
  lease_until = int(NOW + tonumber(ARGV[7]))
  redis.call('HSET', key, 'lease', lease_until)
  redis.call('ZADD', EXPIRY, lease_until, id)
  return 1
end
