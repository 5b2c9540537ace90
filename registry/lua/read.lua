-- read.lua: raw figures of one worker, or of one chunk of the pool's
-- workers, for Worker and Inspect (decoded and checked in Go). The pool is
-- read in chunks (HSCAN with a COUNT) so that no call blocks Redis for
-- long at any pool size; Go calls again with the returned cursor until it
-- is '0'. Each chunk is atomic, the whole is not: a worker registered or
-- removed meanwhile may or may not appear, one present throughout appears
-- (possibly twice: Go keeps one).
--
-- KEYS: the pool keys (see common.lua).
-- ARGV: 1 now ms (0: TIME), 2 wakeup channel, 3 pool, 4 id ('' = the pool),
--       5 cursor ('0' to start), 6 chunk size (HSCAN COUNT).
-- Returns: {now, leases, config (flat HGETALL), rows, retiring, cursor} where
--   rows is a flat list of {id, record, active, lifetime, durations, command}
--   per worker (false -> '' for a missing value), retiring the members of
--   the retiring set (first chunk of a pool only) and cursor the next one
--   ('0': done).
-- Complexity: O(1) for one worker; O(C) per chunk of C workers, plus O(R)
--   for R members of the retiring set in the first chunk.
local now = now_ms(ARGV[1])
local function s(v)
  if v then return v end
  return ''
end
local rows = {}
local function row(id, rec)
  rows[#rows + 1] = id
  rows[#rows + 1] = s(rec)
  rows[#rows + 1] = s(redis.call('HGET', K_ACTIVE, id))
  rows[#rows + 1] = s(redis.call('HGET', K_LIFETIME, id))
  rows[#rows + 1] = s(redis.call('HGET', K_DUR, id))
  rows[#rows + 1] = s(redis.call('HGET', K_CMD, id))
end
local cursor, retiring = '0', {}
if ARGV[4] ~= '' then
  local rec = redis.call('HGET', K_WORKERS, ARGV[4])
  if rec then row(ARGV[4], rec) end
else
  local res = redis.call('HSCAN', K_WORKERS, ARGV[5], 'COUNT', tonumber(ARGV[6]))
  cursor = res[1]
  local kv = res[2]
  for i = 1, #kv, 2 do row(kv[i], kv[i + 1]) end
  if ARGV[5] == '0' then retiring = redis.call('SMEMBERS', K_RET) end
end
return { now, redis.call('HLEN', K_LEASES), redis.call('HGETALL', K_CFG), rows, retiring, cursor }
