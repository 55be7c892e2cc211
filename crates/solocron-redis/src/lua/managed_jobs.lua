-- managed_jobs: ARGV most jobs. Every managed job's hash, by name (the names sort by bytes
-- in `mjobs`, all scored 0).
handlers.managed_jobs = function(KEYS, ARGV)
  return hashes(redis.call('ZRANGEBYLEX', MJOBS, '-', '+', 'LIMIT', 0, tonumber(ARGV[2])), mjob_key)
end
