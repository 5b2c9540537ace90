-- lease.lua: everything done to leases after a claim.
--   'release' ends a session: active -1, its duration recorded.
--   'undo'    gives a claim back: active -1, lifetime -1, a shutdown
--             command this claim set withdrawn, the worker suspect.
--   'renew'   extends live leases; returns those that are gone.
--   'expire'  frees up to N leases whose expiry has passed.
-- Counters move only for a lease of the worker's current registration;
-- an unknown lease is a no-op. Wakes the pool's waiters when a slot frees.
--
-- KEYS: the pool keys (see common.lua).
-- ARGV: 1 now ms (0: TIME), 2 wakeup channel, 3 pool, 4 op, 5 durations kept,
--   release: 6 lease id
--   undo:    6 lease id, 7 suspect ms
--   renew:   6 ttl ms, 7.. lease ids
--   expire:  6 max leases
-- Returns: release/undo: 1 when the lease existed, else 0; renew: the ids
--   that no longer exist; expire: how many leases were freed.
-- Complexity: O(V log N) per lease freed (V only when a worker re-enters the
--   indexes); renew O(M log L) for M ids.
local now = now_ms(ARGV[1])
local op = ARGV[4]
local keep = tonumber(ARGV[5])
if op == 'release' or op == 'undo' then
  local ok = lease_free(ARGV[6], now, op, tonumber(ARGV[7]) or 0, keep)
  if ok then
    wake()
    return 1
  end
  return 0
elseif op == 'renew' then
  local exp = fmt(now + tonumber(ARGV[6]))
  local gone = {}
  for i = 7, #ARGV do
    local lid = ARGV[i]
    if redis.call('HEXISTS', K_LEASES, lid) == 1 then
      redis.call('ZADD', K_LEXP, exp, lid)
    else
      gone[#gone + 1] = lid
    end
  end
  return gone
elseif op == 'expire' then
  local n = expire_leases(now, tonumber(ARGV[6]), keep)
  if n > 0 then wake() end
  return n
end
return redis.error_reply('unknown lease op ' .. tostring(op))
