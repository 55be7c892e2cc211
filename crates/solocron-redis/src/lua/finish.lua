-- finish: ARGV job, scheduled_at, attempt, owner, token, state, reason?, exit code?,
-- output, started after ms?. 1 if recorded; 0 if the run is not this owner's running run.
-- No expiry check: a run whose lease lapsed but that nobody recovered records its true end.
handlers.finish = function(KEYS, ARGV)
  local job = ARGV[2]
  local id = run_id(job, ARGV[3], tonumber(ARGV[4]))
  local key = run_key(id)
  local r = redis.call('HMGET', key, 'state', 'node', 'tok', 'claimed')
  if r[1] ~= 'running' or r[2] ~= ARGV[5] or r[3] ~= ARGV[6] then return 0 end
  local fields = {'state', ARGV[7], 'finished', int(NOW), 'out', ARGV[10]}
  local reason, exit_code, started_after = opt(ARGV[8]), opt(ARGV[9]), opt(ARGV[11])
  if reason then table.insert(fields, 'reason'); table.insert(fields, reason) end
  if exit_code then table.insert(fields, 'exit'); table.insert(fields, exit_code) end
  if started_after then
    table.insert(fields, 'started')
    table.insert(fields, int(tonumber(r[4]) + tonumber(started_after)))
  end
  redis.call('HSET', key, unpack(fields))
  redis.call('HDEL', key, 'lease')
  unindex_running(id, job)
  return 1
end
