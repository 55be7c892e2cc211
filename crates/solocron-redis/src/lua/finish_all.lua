-- finish_all: ARGV count, then for each end the ten arguments of `finish` (job,
-- scheduled_at, attempt, owner, token, state, reason?, exit code?, output, started after
-- ms?). One flag per end, in order, in one string: '1' recorded, '0' not the owner's
-- running run. Each end is decided as `finish` decides it, one after the other, in one
-- atomic step: one call and one reply for a whole batch, not one per end.
handlers.finish_all = function(KEYS, ARGV)
  local n = tonumber(ARGV[2])
  if not n or #ARGV ~= 2 + n * 10 then
    return redis.error_reply('finish_all: ' .. #ARGV .. ' arguments for ' .. tostring(ARGV[2]) .. ' ends')
  end
  return gathering(function()
    local flags = {}
    for i = 0, n - 1 do
      -- This end's arguments, as `finish` has them from ARGV[2]: ARGV[o + 2] on.
      local o = 1 + i * 10
      local id, key, claimed = held_run(ARGV, o)
      if id then
        record_end(id, key, ARGV[o + 2], claimed, ARGV, o)
        flags[i + 1] = '1'
      else
        flags[i + 1] = '0'
      end
    end
    return table.concat(flags)
  end)
end
