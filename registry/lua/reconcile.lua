-- reconcile.lua: the reaper's consistency pass over one pool, in one atomic
-- step. It frees expired leases, sets every worker's active count to the
-- number of live leases of its current registration, puts every worker in
-- exactly the indexes its figures call for, removes index entries, counters
-- and ring positions that belong to no record (orphans; a stale worker's
-- live command is kept for its comeback), makes lease_owner match the
-- leases, drops expired commands, and rebuilds the retiring set from the
-- records (draining, at the lifetime limit, or with a command). Bad
-- records are reported, not touched (Expire removes them).
--
-- KEYS: the pool keys (see common.lua).
-- ARGV: 1 now ms (0: TIME), 2 wakeup channel, 3 pool, 4 durations kept,
--       5 max expired leases to free.
-- Returns: {leases freed, counters fixed, orphans removed, {bad id, reason, ...}}
-- Complexity: O(N + L) reads for N workers and L leases, plus O(N V) when the
--   ring's size disagrees with the records; writes only what it fixes.
local now = now_ms(ARGV[1])
local keep = tonumber(ARGV[4])
local freed = expire_leases(now, tonumber(ARGV[5]), keep)
local cfg = load_cfg()

local workers, bad = {}, {}
for _, id in ipairs(redis.call('HKEYS', K_WORKERS)) do
  local w, err = load_worker(id)
  if w then
    workers[id] = w
  else
    bad[#bad + 1] = id
    bad[#bad + 1] = err
    workers[id] = false
  end
end

-- Live leases per worker of its current generation.
local counts = {}
local lease_ids = redis.call('HKEYS', K_LEASES)
for _, lid in ipairs(lease_ids) do
  local ok, l = pcall(cjson.decode, redis.call('HGET', K_LEASES, lid) or '')
  if ok and type(l) == 'table' and type(l.worker) == 'string' then
    local w = workers[l.worker]
    if w and w.gen == l.gen then counts[l.worker] = (counts[l.worker] or 0) + 1 end
  end
end

local fixed, orphans = 0, 0
orphans = orphans + owner_repair(lease_ids)
local want_ring = 0
for id, w in pairs(workers) do
  if w then
    local n = counts[id] or 0
    if w.active ~= n then
      w.active = n
      redis.call('HSET', K_ACTIVE, id, fmt(n))
      fixed = fixed + 1
      reindex(id, w, cfg, now)
    elseif indexed(w, cfg) then
      if not redis.call('ZSCORE', K_LF, id) then
        fixed = fixed + 1
        reindex(id, w, cfg, now)
      end
    elseif redis.call('ZSCORE', K_LF, id) then
      fixed = fixed + 1
      unindex(id)
    end
    if indexed(w, cfg) then
      want_ring = want_ring + #ring_members(id)
    end
  end
end
if freed > 0 or fixed > 0 then wake() end

-- Index entries of workers that are gone or not indexed.
local function indexed_id(id)
  local w = workers[id]
  return w and indexed(w, cfg)
end
for _, k in ipairs({ K_LF, K_FSI, K_FSB, K_FSP }) do
  for _, id in ipairs(redis.call('ZRANGE', k, 0, -1)) do
    if not indexed_id(id) then
      redis.call('ZREM', k, id)
      orphans = orphans + 1
    end
  end
end
if redis.call('ZCARD', K_RING) ~= want_ring then
  local valid = {}
  for id, w in pairs(workers) do
    if w and indexed(w, cfg) then
      for _, m in ipairs(ring_members(id)) do valid[m] = true end
    end
  end
  for _, m in ipairs(redis.call('ZRANGE', K_RING, 0, -1)) do
    if not valid[m] then
      redis.call('ZREM', K_RING, m)
      orphans = orphans + 1
    end
  end
  for id, w in pairs(workers) do
    if w and indexed(w, cfg) then ring_add(id) end
  end
end

-- Per-worker fields whose record is gone.
for _, k in ipairs({ K_ACTIVE, K_LIFETIME, K_DUR, K_CMD, K_VPOS }) do
  for _, id in ipairs(redis.call('HKEYS', k)) do
    -- (a live command of a stale worker waits for its comeback: expire.lua)
    if workers[id] == nil and not (k == K_CMD and live_command(id, now)) then
      redis.call('HDEL', k, id)
      orphans = orphans + 1
    end
  end
end
for _, id in ipairs(redis.call('HKEYS', K_CMD)) do pending_command(id, now) end

-- The retiring set, from the records. A member taken out may have held a
-- last session back (StaggerDrains): wake the waiters.
local want = {}
for id, w in pairs(workers) do
  if w and (may_retire(w, cfg) or redis.call('HEXISTS', K_CMD, id) == 1) then want[id] = true end
end
local dropped = false
for _, id in ipairs(redis.call('SMEMBERS', K_RET)) do
  if want[id] then
    want[id] = nil
  else
    redis.call('SREM', K_RET, id)
    dropped = true
    if workers[id] == nil then orphans = orphans + 1 else fixed = fixed + 1 end
  end
end
for id in pairs(want) do
  redis.call('SADD', K_RET, id)
  fixed = fixed + 1
end
if dropped then wake() end

return { freed, fixed, orphans, bad }
