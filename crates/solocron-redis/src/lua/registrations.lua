-- registrations: every registration hash (the caller sorts them by job, node).
local ids = redis.call('ZRANGE', REGS, 0, -1)
local out = {}
for _, id in ipairs(ids) do
  local r = redis.call('HGETALL', reg_key(id))
  if #r > 0 then out[#out + 1] = r end
end
return out
