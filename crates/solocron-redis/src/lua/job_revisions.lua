-- job_revisions: ARGV job?, limit. The revisions' hashes, newest first, of one job or all.
handlers.job_revisions = function(KEYS, ARGV)
  local job, limit = opt(ARGV[2]), tonumber(ARGV[3])
  local source = job and mjob_revs(job) or MREVS
  return hashes(redis.call('ZREVRANGE', source, 0, limit - 1), mrev_key)
end
