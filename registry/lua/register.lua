-- register.lua: write (or rewrite) a worker's record with counters at zero,
-- status available, its ring positions, and put it in the selection indexes
-- the pool's stored config says it belongs in. A rewrite first removes what
-- the previous registration wrote (its old positions may differ) and starts
-- a new generation, so leases of the old registration no longer move the
-- new counters.
--
-- KEYS: the pool keys (see common.lua).
-- ARGV: 1 now ms (0: TIME), 2 wakeup channel, 3 pool,
--       4 id, 5 browser, 6 addr, 7 path, 8 capacity, 9 V, 10 ttl ms,
--       11 generation (random, from Go), 12 ring positions (hex, space separated),
--       13 signature (hex HMAC made by the agent; '' for none: the record has no sig).
-- Returns: 1.
-- Complexity: O(V log N).
local now = now_ms(ARGV[1])
local id = ARGV[4]
unindex(id)
local w = {
  id = id, browser = ARGV[5], addr = ARGV[6], path = ARGV[7], status = 'available', gen = ARGV[11],
  capacity = tonumber(ARGV[8]), vnodes = tonumber(ARGV[9]), heartbeat = now, registered = now,
  expires = now + tonumber(ARGV[10]), suspect_until = 0, predicted_end = 0,
  active = 0, lifetime = 0, durations = {},
}
if ARGV[13] and ARGV[13] ~= '' then w.sig = ARGV[13] end
store(id, w)
redis.call('HSET', K_ACTIVE, id, 0)
redis.call('HSET', K_LIFETIME, id, 0)
redis.call('HDEL', K_DUR, id)
redis.call('HDEL', K_CMD, id)
redis.call('HSET', K_VPOS, id, ARGV[12])
reindex(id, w, load_cfg(), now)
wake()
return 1
