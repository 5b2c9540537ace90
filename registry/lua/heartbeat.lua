-- heartbeat.lua: renew a worker's heartbeat and record TTL and return its
-- pending command in the same round trip. Also frees a few expired leases
-- of the pool, so active counts heal even when no claims arrive.
--
-- KEYS: the pool keys (see common.lua).
-- ARGV: 1 now ms (0: TIME), 2 wakeup channel, 3 pool, 4 id, 5 ttl ms,
--       6 max leases to expire, 7 durations kept.
-- Returns: {1, command, lifetime, active} when renewed (the agent keeps the
--          lifetime, to re-assert it if the record is lost); {0, reason}
--          when the record is gone ('missing'), past its TTL ('expired') or
--          does not parse (the reason).
-- Complexity: O(log N) plus O(log N) per lease expired.
local now = now_ms(ARGV[1])
local id = ARGV[4]
local freed = expire_leases(now, tonumber(ARGV[6]), tonumber(ARGV[7]))
if freed > 0 then wake() end
local w, err = decode(redis.call('HGET', K_WORKERS, id))
if not w then return { 0, err } end
if w.expires < now then return { 0, 'expired' } end
w.heartbeat = now
w.expires = now + tonumber(ARGV[5])
store(id, w)
return { 1, pending_command(id, now), count(redis.call('HGET', K_LIFETIME, id)) or 0,
  count(redis.call('HGET', K_ACTIVE, id)) or 0 }
