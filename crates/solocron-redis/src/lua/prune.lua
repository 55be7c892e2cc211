-- prune: ARGV older than ms, most run records deleted, most requests, registrations,
-- actions and nodes deleted, ms after which a silent node is forgotten. Deletes ended
-- records of ticks before now - older, oldest first (never a running or waiting one),
-- requests and actions as old, registrations not refreshed since then, and nodes not heard
-- from within the last argument (with their sets of registration ids: a node registering again rebuilds
-- its set from the registry); returns the number of run records deleted.
handlers.prune = function(KEYS, ARGV)
  local cutoff = '(' .. int(NOW - tonumber(ARGV[2]))
  local batch, others = tonumber(ARGV[3]), tonumber(ARGV[4])
  local deleted, skipped = 0, 0
  while deleted < batch do
    -- Running and waiting records stay in the index, so the next page starts after the
    -- ones skipped.
    local ids = redis.call('ZRANGEBYSCORE', HIST, '-inf', cutoff, 'LIMIT', skipped, batch - deleted)
    if #ids == 0 then break end
    for _, id in ipairs(ids) do
      local key = run_key(id)
      local state = redis.call('HGET', key, 'state')
      if state == 'running' or state == 'waiting' then
        skipped = skipped + 1
      else
        redis.call('DEL', key)
        redis.call('ZREM', HIST, id)
        redis.call('ZREM', job_hist(split_id(id)), id)
        deleted = deleted + 1
      end
    end
  end
  for _, member in ipairs(redis.call('ZRANGEBYSCORE', REQ, '-inf', cutoff, 'LIMIT', 0, others)) do
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
  return deleted
end
