-- nodes: ARGV most nodes. Every node's hash, by id (the ids sort by bytes in `nodes`,
-- all scored 0).
handlers.nodes = function(KEYS, ARGV)
  return hashes(redis.call('ZRANGEBYLEX', NODES, '-', '+', 'LIMIT', 0, tonumber(ARGV[2])), node_key)
end
