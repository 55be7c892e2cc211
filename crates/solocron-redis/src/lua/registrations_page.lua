-- registrations_page: ARGV cursor (of `ZSCAN` over the registry's ids; '0' to start),
-- about how many. One `ZSCAN` step: its next cursor ('0': the scan is done) and the
-- registration hashes of the ids it returned. A scan returns every id present from its
-- first step to its last at least once, and may return one twice (see
-- `Store::registrations_page`); each step costs about `count` ids, not the registry's size.
handlers.registrations_page = function(KEYS, ARGV)
  local step = redis.call('ZSCAN', REGS, ARGV[2], 'COUNT', ARGV[3])
  local ids = {}
  -- Members and scores alternate.
  for i = 1, #step[2], 2 do ids[#ids + 1] = step[2][i] end
  return {step[1], hashes(ids, reg_key)}
end
