-- migrate: checks the layout version and marks it, and when the present memory began.
handlers.migrate = function(KEYS, ARGV)
  local mismatch = schema_mismatch()
  if mismatch then return redis.error_reply(mismatch) end
  remember(true)
  return 1
end
