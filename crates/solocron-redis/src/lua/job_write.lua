-- job_write: ARGV job, spec? (none: a delete), by, expected revision? ('=0': the job must
-- not exist), most live jobs, most revisions kept. Writes (or deletes) the managed job as
-- the next value of the store's revision counter, appends that revision, drops the oldest
-- revisions beyond the kept bound, and wakes the request watches. Returns {'written', rev},
-- {'unchanged', rev or ''}, {'conflict', rev or ''} or {'full'}; only 'written' wrote.

-- Appends revision `rev` of `job` (`spec` nil: a delete) at NOW, and drops the oldest
-- revisions beyond `kept` (of any job) with their entries in their job's index.
local function append_revision(job, rev, spec, by, kept)
  local key = mrev_key(rev)
  redis.call('HSET', key, 'job', job, 'rev', rev, 'by', by, 'at', NOW_S)
  if spec then redis.call('HSET', key, 'spec', spec) end
  redis.call('ZADD', MREVS, rev, rev)
  redis.call('ZADD', mjob_revs(job), rev, rev)
  local excess = redis.call('ZCARD', MREVS) - kept
  if excess <= 0 then return end
  for _, old in ipairs(redis.call('ZRANGE', MREVS, 0, excess - 1)) do
    local old_job = redis.call('HGET', mrev_key(old), 'job')
    if old_job then redis.call('ZREM', mjob_revs(old_job), old) end
    redis.call('DEL', mrev_key(old))
  end
  redis.call('ZREMRANGEBYRANK', MREVS, 0, excess - 1)
end

handlers.job_write = function(KEYS, ARGV)
  local job, spec, by, expect = ARGV[2], opt(ARGV[3]), ARGV[4], opt(ARGV[5])
  local key = mjob_key(job)
  -- false (not nil) for a missing field.
  local found = redis.call('HMGET', key, 'rev', 'spec')
  local current, held = found[1], found[2]
  if expect and expect ~= (current or '0') then return {'conflict', current or ''} end
  if not spec and not current then return {'unchanged', ''} end
  if spec and held == spec then return {'unchanged', current} end
  if spec and not current and redis.call('ZCARD', MJOBS) >= tonumber(ARGV[6]) then return {'full'} end
  local rev = int(redis.call('INCR', MREVSEQ))
  if spec then
    redis.call('HSET', key, 'job', job, 'spec', spec, 'rev', rev, 'by', by, 'at', NOW_S)
    redis.call('ZADD', MJOBS, 0, job)
  else
    redis.call('DEL', key)
    redis.call('ZREM', MJOBS, job)
  end
  append_revision(job, rev, spec, by, tonumber(ARGV[7]))
  -- Nodes learn of the change through their request watch (see watch.rs); pcall as in
  -- request_run: the write is done, and an ACL denying the channel must not fail it.
  redis.pcall('PUBLISH', P .. 'requests', '')
  return {'written', rev}
end
