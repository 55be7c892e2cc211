-- register_stage: ARGV node, stage (the registering process's id for this registration),
-- then 5 per job as `register` takes them. Appends them to the stage that the `register`
-- call right after reads whole (see register.lua): a long job list reaches Redis in
-- several calls, so that no call, and no buffer of the node's, holds every definition.
-- Nothing is registered until that call; a stage it never reads expires.
handlers.register_stage = function(KEYS, ARGV)
  local key = reg_stage(ARGV[2], ARGV[3])
  -- In slices: `unpack` of a whole call's arguments could pass Lua's stack limit.
  for first = 4, #ARGV, 1000 do
    redis.call('RPUSH', key, unpack(ARGV, first, math.min(first + 999, #ARGV)))
  end
  redis.call('PEXPIRE', key, REG_STAGE_TTL_MS)
  return 1
end
