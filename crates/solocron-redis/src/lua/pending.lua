-- pending_requests: ARGV limit. {member, requested_by, ...} oldest first; a member is
-- "<ms>:<job>", and leaves the pending set when a record of its tick is created.
handlers.pending = function(KEYS, ARGV)
  local members = redis.call('ZRANGE', REQPEND, 0, tonumber(ARGV[2]) - 1)
  local out = {}
  for _, member in ipairs(members) do
    out[#out + 1] = member
    out[#out + 1] = redis.call('HGET', REQBY, member) or ''
  end
  return out
end
