-- taken: ARGV[2] = number of ticks, then each tick's job and scheduled_at (ms). One flag per
-- tick, in order, in one string: '1' its attempt 1 has a record (a claim of it answers
-- 'taken', see claim.lua), '0' not. Reads only.
handlers.taken = function(KEYS, ARGV)
  local mismatch = schema_mismatch()
  if mismatch then return redis.error_reply(mismatch) end
  local n = tonumber(ARGV[2])
  if not n or #ARGV ~= 2 + n * 2 then
    return redis.error_reply('taken: ' .. #ARGV .. ' arguments for ' .. tostring(ARGV[2]) .. ' ticks')
  end
  local flags = {}
  for i = 1, n do
    flags[i] = redis.call('EXISTS', run_key(run_id(ARGV[1 + i * 2], ARGV[2 + i * 2], 1))) == 1 and '1' or '0'
  end
  return table.concat(flags)
end
