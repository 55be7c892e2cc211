-- actions: ARGV job?, limit, most actions examined. The actions' hashes, newest first, of
-- one job or all. The log holds at most the kept bound, which bounds the examination.
handlers.actions = function(KEYS, ARGV)
  local job, limit, examine_max = opt(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
  local out, rank, PAGE = {}, 0, 500
  while #out < limit and rank < examine_max do
    local ids = redis.call('ZREVRANGE', ACTS, rank, rank + PAGE - 1)
    if #ids == 0 then break end
    for _, id in ipairs(ids) do
      local key = act_key(id)
      if not job or redis.call('HGET', key, 'job') == job then
        out[#out + 1] = redis.call('HGETALL', key)
        if #out >= limit then break end
      end
    end
    rank = rank + PAGE
  end
  return out
end
