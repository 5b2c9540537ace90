-- expire_stale.lua: expire.lua for a batch of workers, each re-checked
-- (skip_if_fresh): remove every listed worker whose heartbeat is older than
-- the stale threshold or whose record TTL has passed, or whose record does
-- not parse, with everything its registration wrote (remove_worker). A
-- fresh one is kept: a heartbeat that landed since it was seen stale wins.
-- Claims hand it the stale workers they walked past and the reaper its
-- candidates, up to expireBatch (registry.go) ids per call, so thousands of
-- stale records go in a few calls, each bounded.
--
-- KEYS: the pool keys (see common.lua).
-- ARGV: 1 now ms (0: TIME), 2 wakeup channel, 3 pool,
--       4 stale threshold ms (0: only the record's TTL counts), 5.. ids.
-- Returns: the ids removed.
-- Complexity: O(M V log N) for M ids.
local now = now_ms(ARGV[1])
local stale = tonumber(ARGV[4])
local removed = {}
local woke = false
for i = 5, #ARGV do
  local id = ARGV[i]
  local w = decode(redis.call('HGET', K_WORKERS, id))
  if not (w and fresh(w, now, stale)) then
    local had = redis.call('ZSCORE', K_LF, id)
    local retiring = redis.call('SISMEMBER', K_RET, id) == 1
    -- As in expire.lua: a stale worker may come back (its agent paused,
    -- not dead); what its comeback needs stays (expire_worker).
    local n = expire_worker(id, w, now, true)
    if retiring then woke = true end
    if n > 0 or had then removed[#removed + 1] = id end
  end
end
-- Wake the pool's waiters when anything went: a claim refused after
-- walking max_scan stale workers finds the next ones at its retry.
if woke or #removed > 0 then wake() end
return removed
