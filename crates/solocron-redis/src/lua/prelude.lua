-- Shared head of every solocron script: per-call state, key names, the clock, the run
-- life helpers, and `handlers`, the table each method's file adds its handler to. The crate
-- loads the head and every method's file as one Redis Functions library (Redis 7+), or,
-- where the server cannot, sends the head, one method's file and its call as one script
-- (see scripts.rs). Either way `begin` runs first in every call.
--
-- KEYS[1] is the epoch key: declared so that a cluster-aware client or proxy routes the
-- call to the slot of the prefix's hash tag; every other key is derived from the prefix
-- (ARGV[1]) and so shares that tag and slot.
--
-- Instants are integer milliseconds since the Unix epoch, always from Redis's own clock,
-- read once per call: one call is one atomic step with one "now".
local SCHEMA_VERSION = '1'

-- Set by `begin` at the start of each call (a library's functions run one at a time, so
-- one call's values are never seen by another).
local P, NOW_US, NOW, NOW_S
local EPOCH, SCHEMA, HIST, EXPIRY, FENCES, CTLS, REGS, REQ, REQBY, REQPEND
local NODES, NODESEEN, ACTS, ACTSEQ
local MJOBS, MREVS, MREVSEQ, FORGOT
-- Whether this call found the layout version in place (see `remember`).
local schema_found
-- The writes this call gathers (see `gathering`), or nil: written at once.
local gather
-- Lease ends of this call by lease length (see `lease_end`).
local lease_ends

local function begin(argv)
  P = argv[1]
  local clock = redis.call('TIME')
  NOW_US = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
  NOW = math.floor(NOW_US / 1000)
  NOW_S = string.format('%d', NOW)
  EPOCH, SCHEMA, FORGOT = P .. 'epoch', P .. 'schema', P .. 'forgot'
  HIST, EXPIRY, FENCES = P .. 'hist', P .. 'expiry', P .. 'fences'
  CTLS, REGS = P .. 'ctls', P .. 'regs'
  REQ, REQBY, REQPEND = P .. 'req', P .. 'reqby', P .. 'reqpend'
  NODES, NODESEEN = P .. 'nodes', P .. 'nodeseen'
  ACTS, ACTSEQ = P .. 'acts', P .. 'actseq'
  MJOBS, MREVS, MREVSEQ = P .. 'mjobs', P .. 'mrevs', P .. 'mrevseq'
  schema_found = false
  gather = nil
  lease_ends = {}
end

-- Method name -> function(KEYS, ARGV), added by each method's file.
local handlers = {}

local function run_key(id) return P .. 'run:' .. id end
local function job_hist(job) return P .. 'jhist:' .. job end
local function job_running(job) return P .. 'jrun:' .. job end
local function ctl_key(job) return P .. 'ctl:' .. job end
local function reg_key(id) return P .. 'reg:' .. id end
-- A node's registration ids, with NODE_REGS_COMPLETE once they are all in it (see
-- register.lua).
local function node_regs(node) return P .. 'nregs:' .. node end
-- The definitions of a long job list, staged by `register_stage` for one `register` (see
-- register.lua); `stage` is the registering process's own id for that registration.
local function reg_stage(node, stage) return P .. 'regstage:' .. #node .. ':' .. node .. ':' .. stage end
-- How long a staged list outlives its last staging call: one `register` comes right after
-- it, so only a list whose node failed in between is left to expire.
local REG_STAGE_TTL_MS = 60000
local function node_key(node) return P .. 'node:' .. node end
local function act_key(id) return P .. 'act:' .. id end
local function mjob_key(job) return P .. 'mjob:' .. job end
local function mrev_key(rev) return P .. 'mrev:' .. rev end
local function mjob_revs(job) return P .. 'mjrevs:' .. job end

-- The hash at key_of(id) of each id, in order, leaving out ids whose hash is gone.
local function hashes(ids, key_of)
  local out = {}
  for _, id in ipairs(ids) do
    local h = redis.call('HGETALL', key_of(id))
    if #h > 0 then out[#out + 1] = h end
  end
  return out
end

-- A registration's id: length-prefixed, so that no (job, node) pair can spell another's.
local function reg_id(job, node) return #job .. ':' .. job .. ':' .. node end

-- The node of a registration id made by `reg_id`.
local function reg_node(id)
  local length, rest = string.match(id, '^(%d+):(.*)$')
  return string.sub(rest, tonumber(length) + 2)
end

-- The member of a node's `node_regs` set that says every registration of the node is in
-- it. Never an id: ids start with a digit.
local NODE_REGS_COMPLETE = ''

-- Integers as exact decimal strings: Lua numbers are doubles, and tostring() would print
-- 1.7953577417e+15 for a microsecond token. Every value stored or returned goes through this.
local function int(n) return string.format('%d', n) end

-- NOW plus `ms` (a decimal string), as a decimal string; computed once per length a call.
local function lease_end(ms)
  local found = lease_ends[ms]
  if not found then
    found = int(NOW + tonumber(ms))
    lease_ends[ms] = found
  end
  return found
end

-- Optional arguments arrive as '' (none) or '=' followed by the value.
local function opt(s)
  if s == '' then return nil end
  return string.sub(s, 2)
end

-- A run's id: "<scheduled_at ms>:<attempt, 10 digits>:<job>". The job comes last, so no
-- job name can make two ids equal; the padded attempt makes ids of one tick sort by attempt.
local function run_id(job, at, attempt)
  return at .. ':' .. (attempt == 1 and '0000000001' or string.format('%010d', attempt)) .. ':' .. job
end

-- An instant (ms) as RunId's Display spells it: 2026-01-01T00:00:00.000Z (UTC; the civil
-- date from days since the epoch by H. Hinnant's algorithm).
local function iso(ms)
  local days = math.floor(ms / 86400000)
  local rem = ms - days * 86400000
  local z = days + 719468
  local era = math.floor(z / 146097)
  local doe = z - era * 146097
  local yoe = math.floor((doe - math.floor(doe / 1460) + math.floor(doe / 36524) - math.floor(doe / 146096)) / 365)
  local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
  local mp = math.floor((5 * doy + 2) / 153)
  local d = doy - math.floor((153 * mp + 2) / 5) + 1
  local m = mp < 10 and mp + 3 or mp - 9
  local y = yoe + era * 400 + (m <= 2 and 1 or 0)
  return string.format('%04d-%02d-%02dT%02d:%02d:%02d.%03dZ', y, m, d, math.floor(rem / 3600000),
    math.floor(rem / 60000) % 60, math.floor(rem / 1000) % 60, rem % 1000)
end

-- A run's name as RunId's Display spells it: job@2026-01-01T00:00:00.000Z#1.
local function run_name(job, at, attempt)
  return job .. '@' .. iso(tonumber(at)) .. '#' .. int(attempt)
end

local function split_id(id)
  local at, attempt, job = string.match(id, '^(-?%d+):(%d+):(.*)$')
  return job, at, tonumber(attempt)
end

-- The job of a manual request's member, "<ms>:<job>".
local function request_job(member)
  return string.match(member, '^-?%d+:(.*)$')
end

-- The namespace of the job whose full name is `job`: the part before its first '/', or
-- 'default' when it has none (as solocron_core::namespace_of reads it).
local function namespace_of(job)
  return string.match(job, '^([^/]*)/') or 'default'
end

-- The namespaces named by the arguments from `first` on, as a set; nil, meaning every
-- namespace, when there are none (a node always serves at least one, so no list is "all").
local function namespaces_from(argv, first)
  if #argv < first then return nil end
  local set = {}
  for i = first, #argv do set[argv[i]] = true end
  return set
end

-- Whether the job `job` is in `namespaces` (a set of `namespaces_from`; nil: every one).
-- A job that could not be read from its key (nil) is in none of a list.
local function serves(namespaces, job)
  return namespaces == nil or (job ~= nil and namespaces[namespace_of(job)] == true)
end

-- Members one `scan` reads per ZRANGE.
local SCAN_PAGE = 1000

-- The first `want` members, lowest score first, that `keep(member)` accepts among those of
-- the sorted set `key` scored below `before` (a ZCOUNT bound: '(<ms>', or '+inf' for all),
-- examining at most `examine_max` members; and true if it stopped at that bound with
-- members below `before` left unexamined (a later match may be missing). Pages by rank,
-- each page O(log n + page), and only reads: a caller deletes what it found afterwards.
local function scan(key, before, want, examine_max, keep)
  local found, rank = {}, 0
  local candidates = redis.call('ZCOUNT', key, '-inf', before)
  local last = math.min(candidates, examine_max)
  while #found < want and rank < last do
    local page = redis.call('ZRANGE', key, rank, math.min(rank + SCAN_PAGE, last) - 1)
    if #page == 0 then break end
    for _, member in ipairs(page) do
      rank = rank + 1
      if keep(member) then
        found[#found + 1] = member
        if #found >= want then break end
      end
    end
  end
  return found, #found < want and rank >= examine_max and candidates > examine_max
end

-- An error message if the prefix holds a layout this code does not understand.
local function schema_mismatch()
  local version = redis.call('GET', SCHEMA)
  schema_found = version == SCHEMA_VERSION
  if version and version ~= SCHEMA_VERSION then
    return 'ERR solocron: the keys under ' .. P .. ' have layout version ' .. version ..
      '; this solocron understands version ' .. SCHEMA_VERSION
  end
  return nil
end

-- Marks when the present memory began, unless it is already marked. After a restart that
-- lost every key, the first call that writes marks the restart's instant. The two keys are
-- only ever written together, here, so a layout version found by `schema_mismatch` in
-- this call means the epoch is there too.
-- Any call but `migrate` that finds the keys gone also marks that the memory began by
-- forgetting (`FORGOT`, the epoch): the claims of ticks before it are then recorded skipped,
-- not run, since they may have run before (see claim.lua).
local function remember(by_migrate)
  if schema_found then return end
  redis.call('SET', SCHEMA, SCHEMA_VERSION, 'NX')
  redis.call('SET', EPOCH, NOW_S, 'NX')
  if not by_migrate then redis.call('SET', FORGOT, NOW_S, 'NX') end
end

-- Members one command adds or removes at most, when gathered writes are made.
local GATHERED_PER_COMMAND = 1000

-- Adds `member` to the sorted set `key` with `score`, now, or at the end of the call when
-- it gathers its writes.
local function zadd(key, score, member)
  if not gather then return redis.call('ZADD', key, score, member) end
  assert(not gather.zrem[key], 'solocron: a call gathers adds and removes of one key')
  local pairs_ = gather.zadd[key]
  if not pairs_ then pairs_ = {}; gather.zadd[key] = pairs_ end
  pairs_[#pairs_ + 1] = score
  pairs_[#pairs_ + 1] = member
end

-- Removes `member` from the sorted set `key`, now or with the call's gathered writes.
local function zrem(key, member)
  if not gather then return redis.call('ZREM', key, member) end
  assert(not gather.zadd[key], 'solocron: a call gathers adds and removes of one key')
  local members = gather.zrem[key]
  if not members then members = {}; gather.zrem[key] = members end
  members[#members + 1] = member
end

-- Makes the gathered writes: one command per key and per GATHERED_PER_COMMAND members.
local function flush(g)
  for key, args in pairs(g.zadd) do
    for first = 1, #args, 2 * GATHERED_PER_COMMAND do
      redis.call('ZADD', key, unpack(args, first, math.min(first + 2 * GATHERED_PER_COMMAND - 1, #args)))
    end
  end
  for key, members in pairs(g.zrem) do
    for first = 1, #members, GATHERED_PER_COMMAND do
      redis.call('ZREM', key, unpack(members, first, math.min(first + GATHERED_PER_COMMAND - 1, #members)))
    end
  end
  local fences = {}
  for job, token in pairs(g.fences_set) do
    fences[#fences + 1] = job
    fences[#fences + 1] = token
  end
  for first = 1, #fences, 2 * GATHERED_PER_COMMAND do
    redis.call('HSET', FENCES, unpack(fences, first, math.min(first + 2 * GATHERED_PER_COMMAND - 1, #fences)))
  end
end

-- Runs `fn` (which returns one value) with the writes to the prefix-wide indexes and the
-- fences gathered, and makes them at its end, one command per key instead of one per run:
-- a claim or a batch of ends of a thousand runs pays each command's own cost (lookup, ACL
-- check, argument objects) once, not a thousand times. Only for a handler that never
-- reads what it gathers (claim, finish_all). The gathered writes are made also when `fn`
-- fails part way, so a record it wrote is never left out of its indexes (`expiry`: else
-- a lapsed run would never be recovered).
local function gathering(fn)
  gather = {zadd = {}, zrem = {}, fences = {}, fences_set = {}}
  local ok, result = pcall(fn)
  local g = gather
  gather = nil
  flush(g)
  if not ok then error(result, 0) end
  return result
end

-- Reads the fences of `jobs` into the gathered call's cache (one HMGET per
-- GATHERED_PER_COMMAND jobs, instead of an HGET per token taken).
local function read_fences(jobs)
  assert(gather, 'solocron: fences are read ahead only in a gathering call')
  for first = 1, #jobs, GATHERED_PER_COMMAND do
    local last = math.min(first + GATHERED_PER_COMMAND - 1, #jobs)
    local values = redis.call('HMGET', FENCES, unpack(jobs, first, last))
    for i = first, last do gather.fences[jobs[i]] = tonumber(values[i - first + 1]) or 0 end
  end
end

-- Adds a new record to the history indexes; a record of the tick ends its manual request
-- (only manual ticks have one: their instants never fall on a whole second).
local function index(id, job, at)
  zadd(HIST, at, id)
  redis.call('ZADD', job_hist(job), at, id)
  if tonumber(at) % 1000 ~= 0 then redis.call('ZREM', REQPEND, at .. ':' .. job) end
end

local function unindex_running(id, job)
  zrem(EXPIRY, id)
  redis.call('ZREM', job_running(job), id)
end

-- The job's next fencing token: its counter plus one, but never less than the server's
-- clock in microseconds. Tokens never run ahead of the clock (as long as no job takes more
-- than one token per microsecond on average), so a later clock reading is larger than
-- every token handed out before, even where the counter lags behind them (a Redis
-- restarted with its data lost or rolled back to a snapshot, a promoted replica that
-- missed the last increments), provided the clock did not go back by more than the outage
-- lasted. The counter keeps tokens rising when the clock steps back on a server that lost
-- nothing. Tokens stay below 2^53, exact in Lua's doubles, until the year 2255.
-- A gathering call keeps the fences it read or took in `gather.fences`, and writes those it
-- took at its end.
local function next_token(job)
  local last = gather and gather.fences[job]
  if last == nil then last = tonumber(redis.call('HGET', FENCES, job)) or 0 end
  local n = math.max(last + 1, NOW_US)
  local token = int(n)
  if gather then
    gather.fences[job] = n
    gather.fences_set[job] = token
  else
    redis.call('HSET', FENCES, job, token)
  end
  return token
end

-- Creates attempt `attempt` of the tick as running for `node`, unless it exists: its token
-- and lease end (claimed at NOW_S), or nil. `nonce`: the claim's (decimal, '0' or nil =
-- none), kept so that the claim asked again is recognized (see claim.lua). `id` and
-- `key`: the run's, when the caller has them.
local function start_run(job, at, attempt, trigger, node, lease_ms, known_absent, nonce, id, key)
  id = id or run_id(job, at, attempt)
  key = key or run_key(id)
  if not known_absent and redis.call('EXISTS', key) == 1 then return nil end
  local token = next_token(job)
  local lease_until = lease_end(lease_ms)
  redis.call('HSET', key, 'job', job, 'at', at, 'att', attempt == 1 and '1' or int(attempt), 'trig', trigger,
    'node', node, 'tok', token, 'state', 'running', 'claimed', NOW_S, 'lease', lease_until, 'out', '',
    'nonce', nonce or '0')
  index(id, job, at)
  zadd(EXPIRY, lease_until, id)
  redis.call('ZADD', job_running(job), at, id)
  return token, lease_until
end

-- Ends a running run for someone other than its owner (recovery, unlock), or a waiting
-- retry (recovery). An ended record keeps its last `lease` (one command less a run):
-- every reader of `lease` reads it only while the state is `running` or `waiting`.
local function end_run(id, job, state, reason)
  local key = run_key(id)
  redis.call('HSET', key, 'state', state, 'reason', reason, 'finished', NOW_S)
  unindex_running(id, job)
end

-- The record's state if someone must act on it by Redis's clock: 'running' with its lease
-- passed, or 'waiting' with its not-before passed (both in `lease`); else nil.
local function due(key)
  local r = redis.call('HMGET', key, 'state', 'lease')
  local lease_until = tonumber(r[2])
  if (r[1] == 'running' or r[1] == 'waiting') and lease_until ~= nil and lease_until < NOW then return r[1] end
  return nil
end

-- The run ARGV[o+2..o+6] (job, scheduled_at, attempt, owner, token; `o`: where one end's
-- arguments start in a batch, 0 for one end) names, if it is that owner's running run
-- under that token: its id, key and `claimed` instant; else nil. Reads only. No expiry
-- check: a run whose lease lapsed but that nobody recovered records its true end.
local function held_run(argv, o)
  local attempt = argv[o + 4]
  local id = argv[o + 3] .. ':' .. (attempt == '1' and '0000000001' or string.format('%010d', tonumber(attempt))) ..
    ':' .. argv[o + 2]
  local key = run_key(id)
  local r = redis.call('HMGET', key, 'state', 'node', 'tok', 'claimed')
  if r[1] ~= 'running' or r[2] ~= argv[o + 5] or r[3] ~= argv[o + 6] then return nil end
  return id, key, r[4]
end

-- Records the owner's end ARGV[o+7..o+11] (state, reason?, exit code?, output, started
-- after ms?) on the held run `id` (at `key`) of `job` claimed at `claimed`, and takes it
-- out of the running indexes.
local function record_end(id, key, job, claimed, argv, o)
  local fields = {'state', argv[o + 7], 'finished', NOW_S, 'out', argv[o + 10]}
  local n = 6
  local reason, exit_code, started_after = opt(argv[o + 8]), opt(argv[o + 9]), opt(argv[o + 11])
  if reason then fields[n + 1], fields[n + 2], n = 'reason', reason, n + 2 end
  if exit_code then fields[n + 1], fields[n + 2], n = 'exit', exit_code, n + 2 end
  if started_after then
    fields[n + 1], fields[n + 2] = 'started', int(tonumber(claimed) + tonumber(started_after))
  end
  redis.call('HSET', key, unpack(fields))
  unindex_running(id, job)
end

-- Appends an operator's action to the audit log at NOW, within the call that does it, and
-- drops the oldest beyond `kept`. Ids are a counter's values, zero-padded so that actions
-- of one millisecond (equal scores) sort in the order appended.
local function record_action(job, kind, by, reason, detail, kept)
  local id = string.format('%020d', redis.call('INCR', ACTSEQ))
  local key = act_key(id)
  redis.call('HSET', key, 'job', job, 'kind', kind, 'by', by, 'at', NOW_S, 'detail', detail)
  if reason then redis.call('HSET', key, 'reason', reason) end
  redis.call('ZADD', ACTS, NOW_S, id)
  local excess = redis.call('ZCARD', ACTS) - kept
  if excess > 0 then
    for _, old in ipairs(redis.call('ZRANGE', ACTS, 0, excess - 1)) do redis.call('DEL', act_key(old)) end
    redis.call('ZREMRANGEBYRANK', ACTS, 0, excess - 1)
  end
end
