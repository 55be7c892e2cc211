-- history: ARGV job?, state?, node?, since ms?, until ms?, limit, most records examined,
-- then the namespace (none: every one). Returns {1 if the examination stopped at its bound
-- before the oldest candidate else 0, records newest first}. Records of other namespaces
-- are examined (their ids only: the job is the last part of the id) and passed over.
handlers.history = function(KEYS, ARGV)
  local job, state, node = opt(ARGV[2]), opt(ARGV[3]), opt(ARGV[4])
  local since, before = tonumber(opt(ARGV[5])), opt(ARGV[6])
  local limit, examine_max = tonumber(ARGV[7]), tonumber(ARGV[8])
  local namespaces = namespaces_from(ARGV, 9)
  local source = job and job_hist(job) or HIST
  -- Rank of the newest record scheduled before `until` (ranks count from the newest).
  local rank = 0
  if before then rank = redis.call('ZCOUNT', source, before, '+inf') end
  local records, examined, PAGE = {}, 0, 1000
  while #records < limit do
    local page = redis.call('ZREVRANGE', source, rank, rank + PAGE - 1, 'WITHSCORES')
    if #page == 0 then break end
    for i = 1, #page, 2 do
      if since and tonumber(page[i + 1]) < since then return {0, records} end
      if examined >= examine_max then return {1, records} end
      examined = examined + 1
      if serves(namespaces, (split_id(page[i]))) then
        local key = run_key(page[i])
        local r = redis.call('HMGET', key, 'state', 'node')
        if r[1] and (not state or r[1] == state) and (not node or r[2] == node) then
          records[#records + 1] = redis.call('HGETALL', key)
          if #records >= limit then break end
        end
      end
    end
    rank = rank + PAGE
  end
  return {0, records}
end
