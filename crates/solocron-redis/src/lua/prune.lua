-- prune: ARGV older than ms, most run records deleted, most requests, registrations,
-- actions and nodes deleted, ms after which a silent node is forgotten, most history
-- entries and most requests examined, then the namespaces (none: every one). Deletes ended
-- records of ticks before now - older, oldest first (never a running or waiting one), and
-- requests as old, of jobs in those namespaces only; and, whatever the namespaces, actions
-- as old, registrations not refreshed since then, and nodes not heard from within the
-- fifth argument (with their sets of registration ids: a node registering again rebuilds
-- its set from the registry). Returns {the number of run records deleted, 1 if a scan of
-- records or requests stopped at its bound with old entries left unexamined else 0}.
handlers.prune = function(KEYS, ARGV)
  local cutoff = '(' .. int(NOW - tonumber(ARGV[2]))
  local batch, others = tonumber(ARGV[3]), tonumber(ARGV[4])
  local namespaces = namespaces_from(ARGV, 8)
  -- Running and waiting records, and other namespaces', stay in the index: the scan
  -- passes over them, and only reads, so what it found is deleted afterwards.
  local ids, records_bounded = scan(HIST, cutoff, batch, tonumber(ARGV[6]), function(id)
    if not serves(namespaces, (split_id(id))) then return false end
    local state = redis.call('HGET', run_key(id), 'state')
    return state ~= 'running' and state ~= 'waiting'
  end)
  for _, id in ipairs(ids) do
    redis.call('DEL', run_key(id))
    redis.call('ZREM', HIST, id)
    redis.call('ZREM', job_hist(split_id(id)), id)
  end
  local members, requests_bounded = scan(REQ, cutoff, others, tonumber(ARGV[7]), function(member)
    return serves(namespaces, request_job(member))
  end)
  for _, member in ipairs(members) do
    redis.call('ZREM', REQ, member)
    redis.call('ZREM', REQPEND, member)
    redis.call('HDEL', REQBY, member)
  end
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', REGS, '-inf', cutoff, 'LIMIT', 0, others)) do
    redis.call('DEL', reg_key(id))
    redis.call('ZREM', REGS, id)
    -- Out of its node's set too; a set left with its mark alone goes (absent, it is
    -- rebuilt by the node's next registration).
    local index = node_regs(reg_node(id))
    redis.call('SREM', index, id)
    if redis.call('SCARD', index) <= 1 then redis.call('DEL', index) end
  end
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', ACTS, '-inf', cutoff, 'LIMIT', 0, others)) do
    redis.call('DEL', act_key(id))
    redis.call('ZREM', ACTS, id)
  end
  local silent = '(' .. int(NOW - tonumber(ARGV[5]))
  for _, node in ipairs(redis.call('ZRANGEBYSCORE', NODESEEN, '-inf', silent, 'LIMIT', 0, others)) do
    redis.call('DEL', node_key(node))
    redis.call('DEL', node_regs(node))
    redis.call('ZREM', NODES, node)
    redis.call('ZREM', NODESEEN, node)
  end
  return {#ids, (records_bounded or requests_bounded) and 1 or 0}
end
