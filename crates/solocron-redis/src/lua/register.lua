-- register: ARGV node, number of jobs, stage, then (stage '') 5 per job: job, schedule,
-- timezone, definition hash, summary. A long list comes staged instead (stage: the id
-- `register_stage` filled, see register_stage.lua), read here and deleted, so that no call
-- carries every definition. The node runs exactly these jobs: upserts each (job, node),
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

-- The staged definitions, taken out of the stage. A stage that expired, or lost a part,
-- is an error (registering a part of the list would remove the node's other jobs).
local function staged(node, stage, count)
  local key = reg_stage(node, stage)
  local defs = redis.call('LRANGE', key, 0, -1)
  redis.call('DEL', key)
  if #defs ~= count * 5 then
    return nil, 'ERR solocron: the staged job list of ' .. node .. ' has ' .. #defs .. ' values, not ' .. count * 5
  end
  return defs
end

handlers.register = function(KEYS, ARGV)
  local node = ARGV[2]
  local count = tonumber(ARGV[3])
  local defs, first = ARGV, 5
  if ARGV[4] ~= '' then
    local err
    defs, err = staged(node, ARGV[4], count)
    if not defs then return redis.error_reply(err) end
    first = 1
  end
  local index = node_regs(node)
  local known, complete = known_ids(node, index)
  local indexed = {}
  if complete then
    for _, id in ipairs(known) do indexed[id] = true end
  end
  local listed, added = {}, {}
  for i = 0, count - 1 do
    local b = first + i * 5
    local job = defs[b]
    local id = reg_id(job, node)
    local key = reg_key(id)
    redis.call('HSETNX', key, 'first', NOW_S)
    redis.call('HSET', key, 'job', job, 'node', node, 'schedule', defs[b + 1], 'tz', defs[b + 2],
      'hash', defs[b + 3], 'summary', defs[b + 4], 'last', NOW_S)
    redis.call('ZADD', REGS, NOW_S, id)
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
