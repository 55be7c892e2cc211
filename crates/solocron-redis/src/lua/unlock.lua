-- unlock: ARGV job, by, reason ('' for none), most actions kept, most runs named in the
-- detail. Ends every running run of the job as abandoned, recorded `unlocked by <by>[:
-- <reason>]`, and records the action (the details of
-- solocron_core::ActionRecord::unlock_detail); the ended runs' ids, oldest first.
handlers.unlock = function(KEYS, ARGV)
  local job, by, reason = ARGV[2], ARGV[3], ARGV[4]
  local why = 'unlocked by ' .. by
  if reason ~= '' then why = why .. ': ' .. reason end
  local ended, names, named_max = {}, {}, tonumber(ARGV[6])
  for _, id in ipairs(redis.call('ZRANGE', job_running(job), 0, -1)) do
    if redis.call('HGET', run_key(id), 'state') == 'running' then
      end_run(id, job, 'abandoned', why)
      ended[#ended + 1] = id
      if #names < named_max then
        local _, at, attempt = split_id(id)
        names[#names + 1] = run_name(job, at, attempt)
      end
    else
      unindex_running(id, job)
    end
  end
  local detail = 'nothing running'
  if #ended > 0 then detail = table.concat(names, ', ') end
  if #ended > #names then detail = detail .. ' and ' .. (#ended - #names) .. ' more' end
  if reason == '' then reason = nil end
  record_action(job, 'unlock', by, reason, detail, tonumber(ARGV[5]))
  return ended
end
