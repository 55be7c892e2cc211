-- request_run: ARGV job, by, most slots tried, reason?, most actions kept. The manual
-- tick's instant (ms): now, or the next millisecond not yet requested for this job, never
-- on a whole second (scheduled ticks fall on whole seconds, so the two never share a
-- tick). The action is recorded with the manual run's name as its detail.
handlers.request_run = function(KEYS, ARGV)
  local job, by = ARGV[2], ARGV[3]
  local at = NOW
  if at % 1000 == 0 then at = at + 1 end
  for _ = 1, tonumber(ARGV[4]) do
    local member = int(at) .. ':' .. job
    if not redis.call('ZSCORE', REQ, member) then
      redis.call('ZADD', REQ, int(at), member)
      redis.call('ZADD', REQPEND, int(at), member)
      redis.call('HSET', REQBY, member, by)
      record_action(job, 'trigger', by, opt(ARGV[5]), run_name(job, at, 1), tonumber(ARGV[6]))
      -- Wakes the nodes' request watches (see watch.rs). pcall: the request is written, and a
      -- user whose ACL denies the channel must not get an error for it (and retry, making a
      -- second request); nodes then find it by their periodic read.
      redis.pcall('PUBLISH', P .. 'requests', '')
      return int(at)
    end
    at = at + 1
    if at % 1000 == 0 then at = at + 1 end
  end
  return redis.error_reply('ERR solocron: ' .. ARGV[4] .. ' manual runs of `' .. job ..
    '` already requested around this instant; try again')
end
