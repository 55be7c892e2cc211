-- pending_requests: ARGV limit, most requests examined, then the namespaces (none: every
-- one). Returns {1 if the scan stopped at its bound with requests left unexamined else 0,
-- {member, requested_by, ...} oldest first} of jobs in those namespaces only; a member is
-- "<ms>:<job>", and leaves the pending set when a record of its tick is created.
handlers.pending = function(KEYS, ARGV)
  local namespaces = namespaces_from(ARGV, 4)
  local members, bounded = scan(REQPEND, '+inf', tonumber(ARGV[2]), tonumber(ARGV[3]), function(member)
    return serves(namespaces, request_job(member))
  end)
  local out = {}
  for _, member in ipairs(members) do
    out[#out + 1] = member
    out[#out + 1] = redis.call('HGET', REQBY, member) or ''
  end
  return {bounded and 1 or 0, out}
end
