-- reconcile.lua: one bounded step of the reaper's consistency pass over a
-- pool. The pass (reconcile in registry.go) runs these stages, each in
-- calls of a bounded size, so that no call blocks Redis for long at any
-- pool size (cursor passes: HSCAN / ZSCAN / SSCAN with a COUNT):
--   'leases'   handles up to ARGV 6 due entries of lease_expiry (expired
--              leases freed, tombstones forgotten; see common.lua,
--              "Leases") and forgets up to as many due entries of the
--              cancelled set an older version wrote.
--   'workers'  one chunk of workers (HSCAN): each is put in exactly the
--              kept indexes its figures call for under the stored limits
--              (ring positions included), in the retiring set when draining, at
--              the lifetime limit or holding a command, and an expired
--              command is dropped. Returns each worker's generation,
--              lifetime and active count, for the count stage.
--   'count'    sets the active count of listed workers (those whose count
--              Go found to disagree with the leases it listed) to their
--              generation's entries in lease_owner, which is exact at that
--              moment; a worker whose generation changed is left alone.
--   'scan'     one chunk of one key: lease_owner made to match the
--              leases ('leases': missing entries added, and a tombstone
--              missing from lease_expiry put back there; 'owner': entries
--              of no lease removed; likewise lease_client: 'leases' adds
--              missing entries, 'client' removes those of no lease of
--              that client; the pass runs these first, so the
--              counts below agree with what claims and releases derive
--              from lease_owner), then index entries (idx:*, ring) of no
--              record or of a worker not indexed under the stored limits
--              (debris after a change of limits), per-worker fields of no
--              record (active, lifetime, durations, commands, vnodes, hot),
--              lapsed lifetimes forgotten or beside a record, and
--              retiring-set members that no longer qualify.
-- Bad records are reported, not touched (Expire removes them).
--
-- KEYS: the pool keys (see common.lua).
-- ARGV: 1 now ms (0: TIME), 2 wakeup channel, 3 pool, 4 stage,
--   leases:  5 durations kept, 6 max leases
--   workers: 5 cursor, 6 count
--   count:   5.. groups of: id, generation, lifetime, k, k lease ids
--   scan:    5 key name (leases owner client lf fsi fsb fsp ring active lifetime durations
--            commands vnodes hot lapsed retiring), 6 cursor, 7 count
-- Returns: leases: {leases freed, 1 when either key may hold more due
--   entries (Go calls again), else 0}; workers: {cursor, fixed, {bad id, reason, ...},
--   {id, gen, lifetime, active, ...}}; count: {fixed}; scan: {cursor,
--   fixed, orphans}.
-- Complexity: leases O(M V log N) for M <= max; workers O(C V log N) for a
--   chunk of C; count O(sum of k log L); scan O(C (V + log N)).

-- lease_client is shared by a pool's version groups (keys.go poolWide), so
-- a lease missing from this group's leases may be another group's: look in
-- the pool's own leases and every registered version's (same slot).
local function lease_in_pool(lid)
  local v = redis.call('HGET', K_LEASES, lid)
  if v then return v end
  local prefix = string.sub(K_CFG, 1, #K_CFG - #'config')
  local keys = { prefix .. 'leases' }
  for _, ver in ipairs(redis.call('ZRANGE', prefix .. 'versions', 0, -1)) do
    keys[#keys + 1] = prefix .. 'v=' .. ver .. ':leases'
  end
  for _, k in ipairs(keys) do
    if k ~= K_LEASES then
      v = redis.call('HGET', k, lid)
      if v then return v end
    end
  end
  return nil
end

local now = now_ms(ARGV[1])
local stage = ARGV[4]

if stage == 'leases' then
  local max = tonumber(ARGV[6])
  local freed, _, handled = expire_leases(now, max, tonumber(ARGV[5]))
  if freed > 0 then wake() end
  -- Rolling upgrade: a version before tombstones moved into leases kept
  -- them in cancelled, which nothing reads now (a lease id is only ever
  -- ended by the Caddy that claimed it, which runs one version); forget
  -- its due entries, so the key empties and goes once that version is gone.
  local old = redis.call('ZRANGEBYSCORE', K_TOMB, '-inf', '(' .. fmt(now), 'LIMIT', 0, max)
  if #old > 0 then redis.call('ZREM', K_TOMB, unpack(old)) end
  local more = 0
  if handled >= max or #old >= max then more = 1 end
  return { freed, more }
end

local cfg = load_cfg()

if stage == 'workers' then
  local res = redis.call('HSCAN', K_WORKERS, ARGV[5], 'COUNT', tonumber(ARGV[6]))
  local kv = res[2]
  local fixed, bad, rows = 0, {}, {}
  for i = 1, #kv, 2 do
    local id = kv[i]
    local w, err = load_worker(id)
    if not w then
      bad[#bad + 1] = id
      bad[#bad + 1] = err
    else
      -- (drops an expired or malformed command: what is left is live; a
      -- shutdown command holds the worker out of the indexes, retire_sync)
      local cmd = pending_command(id, now)
      local ix = indexed(w, cfg) and cmd ~= 'shutdown'
      local in_lf = redis.call('ZSCORE', K_LF, id)
      local fix = false
      if ix then
        if not in_lf then
          fix = true
        else
          -- (only the kept indexes: common.lua, "Kept indexes")
          if kept(cfg, 'ring') then
            for _, m in ipairs(ring_members(id)) do
              if not redis.call('ZSCORE', K_RING, m) then
                fix = true
                break
              end
            end
          end
          if kept(cfg, 'iwrr') and not redis.call('ZSCORE', K_IWRR, iwrr_member(id)) then fix = true end
          if kept(cfg, 'fair') and not redis.call('ZSCORE', K_FSI, id) and not redis.call('ZSCORE', K_FSB, id) then
            fix = true
          end
        end
      elseif in_lf then
        fix = true
      end
      local want_ret = may_retire(w, cfg) or cmd ~= ''
      if want_ret and redis.call('SISMEMBER', K_RET, id) == 0 then fix = true end
      if fix then
        fixed = fixed + 1
        if ix and in_lf then opt_add(id, cfg) end
        -- a member first: reindex keeps a commanded member out
        if want_ret then redis.call('SADD', K_RET, id) end
        reindex(id, w, cfg, now)
      end
      rows[#rows + 1] = id
      rows[#rows + 1] = w.gen
      rows[#rows + 1] = w.lifetime
      rows[#rows + 1] = w.active
    end
  end
  if fixed > 0 then wake() end
  return { res[1], fixed, bad, rows }
end

if stage == 'count' then
  local fixed = 0
  local i = 5
  while i <= #ARGV do
    local id, gen, life, k = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2]), tonumber(ARGV[i + 3])
    local w = load_worker(id)
    if w and w.gen == gen then
      -- lease_owner is exact (the scan stages repaired it first, and
      -- every script keeps it with the leases): count from it rather than
      -- from the leases Go listed, which a renewal may have re-created
      -- since (a stale list would under-count a full worker)
      local n = owner_count(id, gen)
      if w.active ~= n then
        w.active = n
        redis.call('HSET', K_ACTIVE, id, fmt(n))
        reindex(id, w, cfg, now)
        fixed = fixed + 1
      end
    end
    i = i + 4 + k
  end
  if fixed > 0 then wake() end
  return { fixed }
end

if stage == 'scan' then
  local which = ARGV[5]
  local zsets = { lf = K_LF, fsi = K_FSI, fsb = K_FSB, fsp = K_FSP, ring = K_RING, iwrr = K_IWRR }
  local hashes = { active = K_ACTIVE, lifetime = K_LIFETIME, durations = K_DUR, commands = K_CMD, vnodes = K_VPOS,
    hot = K_HOT, lapsed = K_LAPSED }
  local fixed, orphans = 0, 0
  local cursor
  local ws = {}
  local function worker(id)
    local c = ws[id]
    if c == nil then
      c = load_worker(id) or false
      ws[id] = c
    end
    return c
  end
  if zsets[which] then
    local key = zsets[which]
    -- an index entry costs a ZSCORE, an idx:lifetime one a worker read:
    -- a half and a quarter of a hash's chunk
    local share = 2
    if which == 'lf' then share = 4 end
    local res = redis.call('ZSCAN', key, ARGV[6], 'COUNT', math.max(1, math.floor(tonumber(ARGV[7]) / share)))
    cursor = res[1]
    local ms = res[2]
    for i = 1, #ms, 2 do
      local m = ms[i]
      local id, ok = m, true
      if which == 'ring' then id = string.sub(m, 34) end
      if which == 'iwrr' then id = string.sub(m, 8) end
      if which == 'lf' then
        local w = worker(id)
        ok = w and indexed(w, cfg) and not live_command(id, now)
      elseif not redis.call('ZSCORE', K_LF, id) then
        -- the workers stage made idx:lifetime exactly the indexed workers
        -- (what changed since, the scripts that changed it keep right)
        ok = false
      end
      -- (A ring entry of an indexed worker is one of its positions:
      -- register.lua removes the old positions before writing new ones.)
      if not ok then
        redis.call('ZREM', key, m)
        if redis.call('HEXISTS', K_WORKERS, id) == 1 then fixed = fixed + 1 else orphans = orphans + 1 end
      end
    end
  elseif hashes[which] then
    local key = hashes[which]
    local res = redis.call('HSCAN', key, ARGV[6], 'COUNT', tonumber(ARGV[7]))
    cursor = res[1]
    local kv = res[2]
    for i = 1, #kv, 2 do
      local gone
      if which == 'lapsed' then
        -- a lapsed lifetime waits for a comeback that has not happened
        -- (a registration takes it): debris once forgotten, or beside a
        -- record (a version without it registered)
        local g, _, t = lapsed_parse(kv[i + 1])
        gone = not g or t < now or redis.call('HEXISTS', K_WORKERS, kv[i]) == 1
      else
        -- (a live command of a stale worker waits for its comeback: expire.lua)
        gone = redis.call('HEXISTS', K_WORKERS, kv[i]) == 0
          and not (which == 'commands' and live_command(kv[i], now))
      end
      if gone then
        redis.call('HDEL', key, kv[i])
        orphans = orphans + 1
      end
    end
  elseif which == 'leases' then
    -- every lease has its lease_owner entry (leases written by a version
    -- without it, or after a partial loss)
    local res = redis.call('HSCAN', K_LEASES, ARGV[6], 'COUNT', tonumber(ARGV[7]))
    cursor = res[1]
    local kv = res[2]
    for i = 1, #kv, 2 do
      local till = tomb_until(kv[i + 1])
      local ok, l = false, nil
      if till then
        -- a tombstone: it has no owner or client entry, and its
        -- lease_expiry entry is what forgets it (lost with a partial loss:
        -- written again, else it would stay for ever)
        if not redis.call('ZSCORE', K_LEXP, kv[i]) then
          redis.call('ZADD', K_LEXP, fmt(till), kv[i])
          fixed = fixed + 1
        end
      else
        ok, l = pcall(cjson.decode, kv[i + 1])
      end
      if ok and type(l) == 'table' and type(l.worker) == 'string' and type(l.gen) == 'string' then
        local m = owner_member(l.worker, l.gen, kv[i])
        if not redis.call('ZSCORE', K_OWNER, m) then
          redis.call('ZADD', K_OWNER, 0, m)
          fixed = fixed + 1
        end
      end
      -- and its lease_client entry when it has a client
      if ok and type(l) == 'table' and type(l.client) == 'string' and l.client ~= ''
          and not redis.call('ZSCORE', K_CLIENT, l.client .. ' ' .. kv[i]) then
        client_add(l.client, kv[i])
        fixed = fixed + 1
      end
    end
  elseif which == 'client' then
    -- every lease_client entry names a lease of that client
    local res = redis.call('ZSCAN', K_CLIENT, ARGV[6], 'COUNT', math.max(1, math.floor(tonumber(ARGV[7]) / 2)))
    cursor = res[1]
    local ms = res[2]
    for i = 1, #ms, 2 do
      local m = ms[i]
      local c, lid = string.match(m, '^(%S+) (%S+)$')
      local keep = false
      if lid then
        local ok, l = pcall(cjson.decode, lease_in_pool(lid) or '')
        keep = ok and type(l) == 'table' and l.client == c
      end
      if not keep then
        redis.call('ZREM', K_CLIENT, m)
        orphans = orphans + 1
      end
    end
  elseif which == 'owner' then
    -- every lease_owner entry names a lease of that worker and generation
    local res = redis.call('ZSCAN', K_OWNER, ARGV[6], 'COUNT', math.max(1, math.floor(tonumber(ARGV[7]) / 2)))
    cursor = res[1]
    local ms = res[2]
    for i = 1, #ms, 2 do
      local m = ms[i]
      local id, gen, lid = string.match(m, '^(%S+) (%S+) (%S+)$')
      local keep = false
      if lid then
        local ok, l = pcall(cjson.decode, redis.call('HGET', K_LEASES, lid) or '')
        keep = ok and type(l) == 'table' and l.worker == id and l.gen == gen
      end
      if not keep then
        redis.call('ZREM', K_OWNER, m)
        orphans = orphans + 1
      end
    end
  elseif which == 'retiring' then
    local res = redis.call('SSCAN', K_RET, ARGV[6], 'COUNT', tonumber(ARGV[7]))
    cursor = res[1]
    for _, id in ipairs(res[2]) do
      local w = worker(id)
      if redis.call('HEXISTS', K_WORKERS, id) == 0 then
        redis.call('SREM', K_RET, id)
        orphans = orphans + 1
      elseif w and not (may_retire(w, cfg) or redis.call('HEXISTS', K_CMD, id) == 1) then
        redis.call('SREM', K_RET, id)
        cfg_del('drain_seen:' .. id) -- as retire_sync
        fixed = fixed + 1
      end
    end
    -- A member taken out may have held a last session back (StaggerDrains).
    if fixed + orphans > 0 then wake() end
  else
    return redis.error_reply('unknown reconcile key ' .. tostring(which))
  end
  return { cursor, fixed, orphans }
end

return redis.error_reply('unknown reconcile stage ' .. tostring(stage))
