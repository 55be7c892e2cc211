-- unlock: ARGV job, reason. Ends every running run of the job as abandoned; their ids.
handlers.unlock = function(KEYS, ARGV)
  local job = ARGV[2]
  local ended = {}
  for _, id in ipairs(redis.call('ZRANGE', job_running(job), 0, -1)) do
    if redis.call('HGET', run_key(id), 'state') == 'running' then
      end_run(id, job, 'abandoned', ARGV[3])
      ended[#ended + 1] = id
    else
      unindex_running(id, job)
    end
  end
  return ended
end
