-- read.lua: raw figures of one worker or of the whole pool, in one atomic
-- read, for Worker and Inspect (decoded and checked in Go).
--
-- KEYS: the pool keys (see common.lua).
-- ARGV: 1 now ms (0: TIME), 2 wakeup channel, 3 pool, 4 id ('' = every worker).
-- Returns: {now, leases, config (flat HGETALL), rows, retiring} where rows is
--   a flat list of {id, record, active, lifetime, durations, command} per
--   worker (false -> '' for a missing value) and retiring the members of the
--   retiring set (empty for one worker).
-- Complexity: O(1) for one worker, O(N) for the pool.
local now = now_ms(ARGV[1])
local function s(v)
  if v then return v end
  return ''
end
local ids
if ARGV[4] ~= '' then
  ids = { ARGV[4] }
else
  ids = redis.call('HKEYS', K_WORKERS)
end
local rows = {}
for _, id in ipairs(ids) do
  local rec = redis.call('HGET', K_WORKERS, id)
  if rec or ARGV[4] == '' then
    rows[#rows + 1] = id
    rows[#rows + 1] = s(rec)
    rows[#rows + 1] = s(redis.call('HGET', K_ACTIVE, id))
    rows[#rows + 1] = s(redis.call('HGET', K_LIFETIME, id))
    rows[#rows + 1] = s(redis.call('HGET', K_DUR, id))
    rows[#rows + 1] = s(redis.call('HGET', K_CMD, id))
  end
end
local retiring = {}
if ARGV[4] == '' then retiring = redis.call('SMEMBERS', K_RET) end
return { now, redis.call('HLEN', K_LEASES), redis.call('HGETALL', K_CFG), rows, retiring }
