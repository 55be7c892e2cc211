-- expired: ARGV limit. Records of running runs whose lease passed, oldest lease first.
local ids = redis.call('ZRANGEBYSCORE', EXPIRY, '-inf', '(' .. int(NOW), 'LIMIT', 0, tonumber(ARGV[2]))
local records = {}
for _, id in ipairs(ids) do
  local record = redis.call('HGETALL', run_key(id))
  if #record > 0 then records[#records + 1] = record end
end
return records
