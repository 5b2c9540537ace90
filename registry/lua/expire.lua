-- expire.lua: remove a worker and everything its registration wrote (record,
-- counters, durations, command, ring positions, index entries) in one step,
-- so no selector sees half a worker (the vnode design's expire invariant). With a
-- stale threshold it first re-checks the heartbeat and keeps a fresh worker
-- (the vnode design's skip_if_fresh), so a heartbeat that lands between a
-- selector's observation and this call wins. Leases of the worker stay:
-- they belong to live sessions (their holders renew them) and count again
-- if the same registration comes back (register.lua); abandoned ones lapse
-- by their TTL. A stale worker's live shutdown command stays too, and its
-- lifetime waits for its comeback in lapsed (common.lua). Removing
-- a retiring worker wakes the pool's waiters: a last session StaggerDrains
-- held back may now be granted.
--
-- KEYS: the pool keys (see common.lua).
-- ARGV: 1 now ms (0: TIME), 2 wakeup channel, 3 pool, 4 id,
--       5 stale threshold ms (0: only the record's TTL counts),
--       6 '1' to keep a fresh worker (skip_if_fresh), '0' to remove it anyway.
-- Returns: 1 when something was removed, 0 otherwise.
-- Complexity: O(V log N).
local now = now_ms(ARGV[1])
local id = ARGV[4]
local stale = tonumber(ARGV[5])
local w = nil
if ARGV[6] == '1' then
  w = decode(redis.call('HGET', K_WORKERS, id))
  -- A record that does not parse cannot prove it is fresh: it goes.
  if w and fresh(w, now, stale) then return 0 end
end
local had = redis.call('ZSCORE', K_LF, id)
local retiring = redis.call('SISMEMBER', K_RET, id) == 1
-- A stale worker may come back (its agent paused, not dead): its live
-- shutdown command and the lifetime it served wait for its next
-- registration (register.lua); a deregistration keeps nothing (but a
-- session released after it keeps its lifetime a while: lease_free).
local n = expire_worker(id, w, now, ARGV[6] == '1')
if retiring then wake() end
if n > 0 or had then return 1 end
return 0
