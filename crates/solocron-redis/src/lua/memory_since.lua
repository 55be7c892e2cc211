-- memory_since: the instant (ms) the present memory began. Marked now if it is not marked:
-- a Redis with no epoch key has forgotten everything, so its memory begins now.
handlers.memory_since = function(KEYS, ARGV)
  local mismatch = schema_mismatch()
  if mismatch then return redis.error_reply(mismatch) end
  remember()
  return redis.call('GET', EPOCH)
end
