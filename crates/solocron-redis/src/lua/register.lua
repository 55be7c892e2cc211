-- register: ARGV node, number of jobs, then 5 per job: job, schedule, timezone,
-- definition hash, summary. Upserts (job, node); first_seen only on creation.
handlers.register = function(KEYS, ARGV)
  local node = ARGV[2]
  for i = 0, tonumber(ARGV[3]) - 1 do
    local b = 4 + i * 5
    local job = ARGV[b]
    -- Length-prefixed, so that no (job, node) pair can spell another's id.
    local id = #job .. ':' .. job .. ':' .. node
    local key = reg_key(id)
    redis.call('HSETNX', key, 'first', int(NOW))
    redis.call('HSET', key, 'job', job, 'node', node, 'schedule', ARGV[b + 1], 'tz', ARGV[b + 2],
      'hash', ARGV[b + 3], 'summary', ARGV[b + 4], 'last', int(NOW))
    redis.call('ZADD', REGS, int(NOW), id)
  end
  return 1
end
