-- managed_version: the newest revision of any managed job (the counter), 0 if none.
handlers.managed_version = function(KEYS, ARGV)
  return tonumber(redis.call('GET', MREVSEQ) or '0')
end
