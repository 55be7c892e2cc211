-- finish: ARGV job, scheduled_at, attempt, owner, token, state, reason?, exit code?,
-- output, started after ms?. 1 if recorded; 0 if the run is not this owner's running run.
handlers.finish = function(KEYS, ARGV)
  local id, key, claimed = held_run(ARGV, 0)
  if not id then return 0 end
  record_end(id, key, ARGV[2], claimed, ARGV, 0)
  return 1
end
