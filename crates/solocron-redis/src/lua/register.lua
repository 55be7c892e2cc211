-- register: ARGV node, number of jobs, then 5 per job: job, schedule, timezone,
-- definition hash, summary. The node runs exactly these jobs: upserts each (job, node),
-- first_seen only on creation, and deletes the node's registrations of jobs not listed.
--
-- The node's registration ids are kept in its `node_regs` set, so that finding its
-- unlisted jobs reads its own ids, not the whole registry. The set is trusted only once it
-- holds NODE_REGS_COMPLETE: before (a node new to this code, or whose set prune dropped),
-- the node's ids are looked for in the whole registry once, which also finds the
-- registrations written by builds that kept no such set.

-- The node's registration ids, from its set if complete, else from the whole registry.
local function known_ids(node, index)
  if redis.call('SISMEMBER', index, NODE_REGS_COMPLETE) == 1 then
    return redis.call('SMEMBERS', index), true
  end
  local suffix = ':' .. node
  local found = redis.call('SMEMBERS', index)
  for _, id in ipairs(redis.call('ZRANGE', REGS, 0, -1)) do
    -- The suffix is a cheap first filter; the length prefix decides.
    if string.sub(id, -#suffix) == suffix and reg_node(id) == node then found[#found + 1] = id end
  end
  return found, false
end

-- Adds `ids` to the set in batches (one call per id would cost more than the upserts).
local function add_all(index, ids)
  for first = 1, #ids, 1000 do
    redis.call('SADD', index, unpack(ids, first, math.min(first + 999, #ids)))
  end
end

handlers.register = function(KEYS, ARGV)
  local node = ARGV[2]
  local index = node_regs(node)
  local known, complete = known_ids(node, index)
  local indexed = {}
  if complete then
    for _, id in ipairs(known) do indexed[id] = true end
  end
  local listed, added = {}, {}
  for i = 0, tonumber(ARGV[3]) - 1 do
    local b = 4 + i * 5
    local job = ARGV[b]
    local id = reg_id(job, node)
    local key = reg_key(id)
    redis.call('HSETNX', key, 'first', int(NOW))
    redis.call('HSET', key, 'job', job, 'node', node, 'schedule', ARGV[b + 1], 'tz', ARGV[b + 2],
      'hash', ARGV[b + 3], 'summary', ARGV[b + 4], 'last', int(NOW))
    redis.call('ZADD', REGS, int(NOW), id)
    if not indexed[id] and not listed[id] then added[#added + 1] = id end
    listed[id] = true
  end
  for _, id in ipairs(known) do
    if id ~= NODE_REGS_COMPLETE and not listed[id] then
      redis.call('DEL', reg_key(id))
      redis.call('ZREM', REGS, id)
      redis.call('SREM', index, id)
    end
  end
  if not complete then added[#added + 1] = NODE_REGS_COMPLETE end
  add_all(index, added)
  return 1
end
