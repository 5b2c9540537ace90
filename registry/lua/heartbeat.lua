-- heartbeat.lua: renew a worker's heartbeat and record TTL and return its
-- pending command in the same round trip. Also frees a few expired leases
-- of the pool, so active counts heal even when no claims arrive.
-- It reindexes the worker under the pool's stored limits (they may have
-- changed since a claim or release last touched it: see common.lua's
-- invariant), and tells a worker at or past the stored max_lifetime to
-- drain, a lowered limit included: it sets the shutdown command (returned
-- in this reply) unless StaggerDrains is stored and another fresh worker
-- is restarting (restart_turn); then it waits in the retiring set for a
-- later heartbeat. It rewrites the record (with copies of the hot figures,
-- common.lua's "Hot figures") and stores the hot figures when the worker
-- has none or its durations had to be counted again.
--
-- KEYS: the pool keys (see common.lua).
-- ARGV: 1 now ms (0: TIME), 2 wakeup channel, 3 pool, 4 id, 5 ttl ms,
--       6 max leases to expire, 7 durations kept, 8 command ttl ms.
-- Returns: {1, command, lifetime, active} when renewed (the agent keeps the
--          lifetime, to re-assert it if the record is lost); {0, reason}
--          when the record is gone ('missing'), past its TTL ('expired') or
--          does not parse (the reason).
-- Complexity: O(log N) plus O(log N) per lease expired, plus O(V log N)
--   when the worker re-enters the indexes, plus O(R) for R members of the
--   retiring set when the worker is at the limit under StaggerDrains.
local now = now_ms(ARGV[1])
local id = ARGV[4]
local _, back = expire_leases(now, tonumber(ARGV[6]), tonumber(ARGV[7]))
wake_if(back)
-- One read of the worker (record, counters, durations) serves the renewal,
-- the reindex and the reply.
local w, err = load_worker(id)
if not w and err ~= 'missing' then
  -- the record parses but a counter does not: renew the record anyway
  -- (as before: only the record decides), and reindex nothing
  w, err = decode(redis.call('HGET', K_WORKERS, id))
  if not w then return { 0, err } end
  if w.expires < now then return { 0, 'expired' } end
  w.heartbeat = now
  w.expires = now + tonumber(ARGV[5])
  store(id, w)
  return { 1, pending_command(id, now), count(redis.call('HGET', K_LIFETIME, id)) or 0,
    count(redis.call('HGET', K_ACTIVE, id)) or 0 }
end
if not w then return { 0, err } end
if w.expires < now then return { 0, 'expired' } end
w.heartbeat = now
w.expires = now + tonumber(ARGV[5])
store(id, w)
local cfg = load_cfg()
-- its live command (an expired or malformed one dropped); a worker told to
-- shut down is a member of the retiring set, so that reindex keeps it out
-- of the indexes
local cmd = pending_command(id, now)
if cmd == 'shutdown' then redis.call('SADD', K_RET, id) end
-- back in the indexes (a raised limit): waiting claims may take it
wake_if(reindex(id, w, cfg, now))
-- hot figures missing, or counted again (the list or the window changed):
-- store them, so the claims that follow need not count
if w.hot == '' or w.fs_counted then store_hot(id, w, cfg.win) end
if cfg.ml > 0 and w.lifetime >= cfg.ml and w.status == 'available' and cmd ~= 'shutdown'
    and (not cfg.stagger or restart_turn(id, now, cfg.stale)) then
  redis.call('HSET', K_CMD, id, 'shutdown|' .. fmt(now + tonumber(ARGV[8])))
  redis.call('SADD', K_RET, id)
  cmd = 'shutdown'
end
return { 1, cmd, w.lifetime, w.active }
