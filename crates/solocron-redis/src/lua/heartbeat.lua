-- heartbeat: ARGV node, version, jobs, running. Upserts the node's hash at NOW; its start
-- is kept unless it said goodbye since (or is new).
handlers.heartbeat = function(KEYS, ARGV)
  local node = ARGV[2]
  local key = node_key(node)
  local known = redis.call('HMGET', key, 'started', 'left')
  local started = known[1]
  if not started or known[2] then started = NOW_S end
  redis.call('HSET', key, 'node', node, 'ver', ARGV[3], 'jobs', ARGV[4], 'running', ARGV[5],
    'started', started, 'last', NOW_S)
  redis.call('HDEL', key, 'left')
  redis.call('ZADD', NODES, 0, node)
  redis.call('ZADD', NODESEEN, NOW_S, node)
  return 1
end
