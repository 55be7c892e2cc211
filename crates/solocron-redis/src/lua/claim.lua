-- claim: ARGV[2] = number of requests, ARGV[3] = how far ahead of NOW (ms) a scheduled
-- tick may be claimed (CLAIM_EARLY_MAX), then 8 arguments per request: job, scheduled_at,
-- trigger, node, lease ms, mode ('run', 'exclusive' = run unless another run of the job is
-- running, 'skip'), skip reason, nonce (a u64 in decimal, '0' = none). One outcome per
-- request, in order, each one string (see `joined`).

-- Howard Hinnant's days-to-civil: the proleptic Gregorian date of a day since 1970-01-01.
local function civil(days)
  local z = days + 719468
  local era = math.floor(z / 146097)
  local doe = z - era * 146097
  local yoe = math.floor((doe - math.floor(doe / 1460) + math.floor(doe / 36524) - math.floor(doe / 146096)) / 365)
  local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
  local mp = math.floor((5 * doy + 2) / 153)
  local day = doy - math.floor((153 * mp + 2) / 5) + 1
  local month = mp < 10 and mp + 3 or mp - 9
  local year = yoe + era * 400
  if month <= 2 then year = year + 1 end
  return year, month, day
end

-- A run as RunId's Display writes it: job@2026-01-01T00:00:00.000Z#1 (years 0-9999).
local function display(id)
  local job, at, attempt = split_id(id)
  local ms = tonumber(at)
  local milli = ms % 1000
  local secs = (ms - milli) / 1000
  local sod = secs % 86400
  local year, month, day = civil((secs - sod) / 86400)
  return string.format('%s@%04d-%02d-%02dT%02d:%02d:%02d.%03dZ#%d', job, year, month, day,
    math.floor(sod / 3600), math.floor((sod % 3600) / 60), sod % 60, milli, attempt)
end

local function paused_reason(job)
  local c = redis.call('HMGET', ctl_key(job), 'paused', 'by', 'reason')
  if c[1] ~= '1' then return nil end
  if c[3] then return 'paused by ' .. c[2] .. ': ' .. c[3] end
  return 'paused by ' .. c[2]
end

local function record_skip(job, at, trigger, node, reason)
  local id = run_id(job, at, 1)
  redis.call('HSET', run_key(id), 'job', job, 'at', at, 'att', '1', 'trig', trigger, 'node', node,
    'state', 'skipped', 'reason', reason, 'claimed', NOW_S, 'finished', NOW_S, 'out', '')
  index(id, job, at)
  return 'skipped:' .. reason
end

-- The tick's existing record (`id` at `key`) granted again to a request that asks again
-- for its own claim (its answer may have been lost): attempt 1 still running, this node's,
-- created under this nonce. Nonces are compared as the decimal strings they are stored as:
-- a u64 does not fit in Lua's doubles. The same token and claimed_at, a fresh lease by NOW
-- (even past a lapsed one: nobody recovered the run). A 'won' outcome, or nil.
local function regrant(id, key, node, lease_ms, nonce)
  local r = redis.call('HMGET', key, 'state', 'node', 'nonce', 'tok', 'claimed')
  if r[1] ~= 'running' or r[2] ~= node or r[3] ~= nonce then return nil end
  local lease_until = lease_end(lease_ms)
  redis.call('HSET', key, 'lease', lease_until)
  -- Still in the job's running set: later 'exclusive' requests see it as running.
  zadd(EXPIRY, lease_until, id)
  return 'won:' .. r[4] .. ':' .. r[5] .. ':' .. lease_until
end

-- One request's outcome, its parts in one string joined by ':' (a reason, last, may hold
-- colons): thousands of strings are cheaper to read than thousands of arrays.
-- `any_ctl`: some job of the prefix has switches (CTLS is never emptied but with the
-- prefix): when none has, no job is paused and the pause is not read per tick.
-- `none_running`: no run of the job was running when the call began (see `idle_groups`);
-- `started`: the jobs this call started a run of.
local function claim_one(job, at, trigger, node, lease_ms, mode, reason, nonce, early_ms, forgot, any_ctl,
                         none_running, started)
  local at_ms = tonumber(at)
  -- A scheduled tick too far ahead of Redis's clock (the node's clock runs fast): refused
  -- with NOW before anything is read or written (no record, no token taken). Decided
  -- first, so a nonce's re-grant of such a tick is refused too; its tick is near in practice.
  if trigger == 'schedule' and at_ms > NOW + early_ms then return 'early:' .. NOW_S end
  -- The tick's record is attempt 1; whatever it says, the tick is taken, unless this is
  -- the request that created it, asked again (checked only then: the common path, no
  -- record yet, costs one EXISTS as before).
  local id = at .. ':0000000001:' .. job
  local key = run_key(id)
  if redis.call('EXISTS', key) == 1 then
    if mode ~= 'skip' and nonce ~= '0' then
      return regrant(id, key, node, lease_ms, nonce) or 'taken'
    end
    return 'taken'
  end
  if mode == 'skip' then return record_skip(job, at, trigger, node, reason) end
  -- A tick before this Redis's memory began by forgetting (a restart without persistence)
  -- may have been claimed, and run, before: never run again, and said so in its record.
  if forgot and trigger ~= 'manual' and at_ms < forgot then
    return record_skip(job, at, trigger, node,
      'the store forgot its data (Redis restarted without persistence?) after this tick; it may have run, so it is not run again')
  end
  -- An operator's manual run is the way to run a paused job once: it ignores the pause.
  if trigger ~= 'manual' and any_ctl then
    local why = paused_reason(job)
    if why then return record_skip(job, at, trigger, node, why) end
  end
  if mode == 'exclusive' and not (none_running and not started[job]) then
    -- The newest running run (highest tick, then attempt), its lease live or not.
    local running = redis.call('ZREVRANGE', job_running(job), 0, 0)[1]
    if running then
      return record_skip(job, at, trigger, node, 'overlap: previous run ' .. display(running) .. ' still running')
    end
  end
  -- Checked absent at the top (and nothing above wrote it).
  local token, lease_until = start_run(job, at, 1, trigger, node, lease_ms, true, nonce, id, key)
  started[job] = true
  return 'won:' .. token .. ':' .. NOW_S .. ':' .. lease_until
end

-- Requests asked about together by `idle_groups`.
local GROUP = 100

-- For each group of GROUP requests (group g: requests g * GROUP + 1 ...), true when no job
-- of its 'exclusive' requests had a running run as the call began: one EXISTS of their
-- running sets per group, instead of a ZREVRANGE per request (most jobs have none running
-- when their next tick is claimed).
local function idle_groups(ARGV, count)
  local idle = {}
  for g = 0, math.ceil(count / GROUP) - 1 do
    local sets = {}
    for i = g * GROUP, math.min(count, (g + 1) * GROUP) - 1 do
      if ARGV[9 + i * 8] == 'exclusive' then sets[#sets + 1] = job_running(ARGV[4 + i * 8]) end
    end
    idle[g] = #sets == 0 or redis.call('EXISTS', unpack(sets)) == 0
  end
  return idle
end

handlers.claim = function(KEYS, ARGV)
  local mismatch = schema_mismatch()
  if mismatch then return redis.error_reply(mismatch) end
  remember()
  local count = tonumber(ARGV[2])
  local early_ms = tonumber(ARGV[3])
  local forgot = tonumber(redis.call('GET', FORGOT))
  local any_ctl = redis.call('SCARD', CTLS) > 0
  return gathering(function()
    -- The fences of the jobs that may take a token, read at once.
    local jobs = {}
    for i = 0, count - 1 do
      if ARGV[9 + i * 8] ~= 'skip' then jobs[#jobs + 1] = ARGV[4 + i * 8] end
    end
    read_fences(jobs)
    local idle, started = idle_groups(ARGV, count), {}
    local outcomes = {}
    for i = 0, count - 1 do
      local b = 4 + i * 8
      outcomes[i + 1] = claim_one(ARGV[b], ARGV[b + 1], ARGV[b + 2], ARGV[b + 3], ARGV[b + 4], ARGV[b + 5],
        ARGV[b + 6], ARGV[b + 7], early_ms, forgot, any_ctl, idle[math.floor(i / GROUP)], started)
    end
    return outcomes
  end)
end
