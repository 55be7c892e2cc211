-- controls: every job's switches hash (the caller sorts them by job).
local out = {}
for _, job in ipairs(redis.call('SMEMBERS', CTLS)) do
  local c = redis.call('HGETALL', ctl_key(job))
  if #c > 0 then out[#out + 1] = c end
end
return out
