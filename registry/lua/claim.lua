-- claim.lua: select and claim a worker atomically (or only select: Pick).
--
-- Before selecting it frees a bounded number of expired leases (so counts
-- are true) and settles the limits in force: the newest configuration's
-- (see below; no rebuild when they change). Then the policy walks its index
-- in preference order, as the selection package does over a snapshot
-- (selection/limits.go and the policies):
--   lifetime_first: idx:lifetime by score (lifetime DESC, active ASC, id ASC),
--     primary phase above the margin edge, then the fallback phase.
--   vnode: for each of K pivots, idx:ring from the pivot (ZRANGEBYLEX), then
--     from the start (wrap); power-of-K on active + jitter, random tiebreak.
--   fair_share: a merge of idx:fair_idle (key now + estimate) and
--     idx:fair_busy (key predicted end + estimate), key ASC then id ASC.
-- Every walked entry that is not usable (missing, stale, suspect, held back
-- or bad) costs one unit of the max_scan budget; index debris (a worker not
-- indexed under the limits in force) costs none but is removed, at most 128
-- per claim. The lifetime-first walk never reaches workers at or past
-- max_lifetime (its fallback range stops at lifetime max_lifetime - 1).
-- Stale and missing ones are reported for expiry, bad ones reported and
-- dropped from the indexes.
-- The chosen worker gets active +1, lifetime +1, a new predicted end, a lease
-- with a TTL and, at the lifetime limit, a shutdown command (and joins the
-- retiring set).
--
-- StaggerDrains (selection.Limits.StaggerDrains, with max_lifetime > 0):
-- before walking, the claim reads the retiring set (usually 0 or 1 members)
-- and asks whether one member is retiring now: fresh, and draining, at the
-- lifetime limit, or holding a live shutdown command. If so, a worker whose
-- next session would bring it to the limit (lifetime + 1 >= max_lifetime)
-- is not usable: walked past at one unit of budget, like a suspect one
-- (selection's HeldBack). Stale members do not count (they are dead) and
-- are returned for expiry; members that no longer qualify are dropped.
--
-- KEYS: the pool keys (see common.lua).
-- ARGV: 1 now ms (0: TIME), 2 wakeup channel, 3 pool,
--       4 policy (lifetime_first | vnode | fair_share), 5 dry (1: select only),
--       6 max_concurrent, 7 max_lifetime, 8 stale_after ms, 9 max_scan,
--       10 fair-share window, 11 median (0/1), 12 default estimate ms
--          (10-12 are stored only by fair_share claims),
--       13 lease id, 14 lease ttl ms, 15 holder, 16 command ttl ms,
--       17 durations kept, 18 max expired leases to free first,
--       19 stagger drains (0/1),
--       20 configuration time ms (when the caller's limits were configured; 0: now),
--       21 the dataset epoch the caller last saw ('' none), 22 a fresh epoch token,
--       23 K, then K pivots (32 hex), K jitters, K tiebreaks (tiebreak mod m for m = 1..K),
--       then (CB = 24 + 3K) CB the client's hash ('' none), CB+1 the client's
--          limit of live sessions (0 none).
-- Returns (a replay of an existing lease id: {-2, id, record, active,
--   lifetime, durations, drain, now}; a cancelled lease id: {-1, 'cancelled'};
--   an epoch the caller saw that Redis no longer has: {-3, epoch};
--   a client at its limit: {-4, its live sessions}):
--   {ok, id, record, active, lifetime, durations, drain, scanned,
--           {stale ids}, {bad id, reason, ...}, wraps, effective, dedupes, tied, now,
--           retiring (0/1: StaggerDrains held last sessions back), {stale retiring ids},
--           overridden (0/1: the claim's limits lost to newer stored ones), then the
--           limits in force: max_concurrent, max_lifetime, stagger (0/1),
--           fs window, fs median (0/1), fs default ms, the dataset epoch}
-- Complexity: O(log N + S) for S entries walked (S <= max_scan + K);
--   vnode O(K (log NV + S)); plus O(R) for R members of the retiring set
--   (StaggerDrains only; R is 1 or 0 while the rule holds, plus dead
--   workers not yet expired); plus amortised O(log N) index upkeep, plus
--   O(D V log N) for D <= 128 debris entries removed after a change of limits.
local now = now_ms(ARGV[1])
local policy = ARGV[4]
local dry = ARGV[5] == '1'
local mc, ml = tonumber(ARGV[6]), tonumber(ARGV[7])
local stale, maxscan = tonumber(ARGV[8]), tonumber(ARGV[9])
local keep = tonumber(ARGV[17])
local stagger = ARGV[19] == '1'
-- VB is where the vnode arguments start.
local VB = 23

-- A claim is keyed by its lease id (chosen by the caller): run again (a
-- client retry, or a caller repeating a claim whose reply it lost) it
-- returns the claim it made, and after its caller cancelled it, nothing.
if not dry then
  local replay = claim_replay(ARGV[13], now)
  if replay then return replay end
end

-- The dataset's epoch: a random token the pool's config hash keeps from
-- its first claim on. A claimer passes the epoch it last saw (ARGV 21);
-- when Redis no longer has it (restarted empty, or a failover to a replica
-- without it), the leases that claimer holds may be gone too, so it is
-- told to re-assert them (renewal) before anything is granted to it:
-- {-3, epoch}. ARGV 22 is a fresh token, stored when the pool has none.
local epoch = redis.call('HGET', K_CFG, 'epoch')
if not epoch then
  epoch = ARGV[22]
  if not dry then redis.call('HSET', K_CFG, 'epoch', epoch) end
end
if not dry and ARGV[21] ~= '' and ARGV[21] ~= epoch then
  return { -3, epoch }
end

local freed = expire_leases(now, tonumber(ARGV[18]), keep)
if freed > 0 then wake() end

-- Per-client limit (see common.lua, "Clients"): counted after expired
-- leases are freed, so a crashed holder's sessions stop counting once
-- their leases lapse; refused before any walk, so nothing is claimed.
local CB = VB + 1 + 3 * (tonumber(ARGV[VB]) or 0)
local client = ARGV[CB] or ''
if not dry then
  local live = client_over(client, tonumber(ARGV[CB + 1]))
  if live then return { -4, live } end
end

-- Which limits win (issue 9): the newest configuration. The pool's config
-- hash holds the limits in force and set_at, the time of the configuration
-- that brought them. A claim whose limits differ stores them when its
-- configuration time (ARGV 20, 0: now) is not older than set_at; otherwise
-- it runs under the stored limits and says so (overridden). Nothing is
-- rebuilt when they change: the indexes converge worker by worker (see
-- common.lua's invariant), so the change costs O(1) here.
local cfg = load_cfg()
local cfg_time = tonumber(ARGV[20])
if cfg_time == 0 then cfg_time = now end
local want_fs = policy == 'fair_share'
local win, med, def = tonumber(ARGV[10]), ARGV[11] == '1', tonumber(ARGV[12])
local differ = cfg.set_at == nil or cfg.mc ~= mc or cfg.ml ~= ml or cfg.stagger ~= stagger
if want_fs and (cfg.win ~= win or cfg.med ~= med or cfg.def ~= def) then differ = true end
local overridden = 0
if differ then
  if cfg.set_at == nil or cfg_time >= cfg.set_at then
    -- A Pick (dry) uses its limits but stores nothing: an admin's preview
    -- must not change what the pool runs under.
    if not dry then
      redis.call('HSET', K_CFG, 'max_concurrent', fmt(mc), 'max_lifetime', fmt(ml), 'stagger_drains', ARGV[19],
        'set_at', fmt(cfg_time))
      if want_fs then
        redis.call('HSET', K_CFG, 'fs_window', fmt(win), 'fs_median', ARGV[11], 'fs_default_ms', fmt(def))
      end
    end
    cfg.mc, cfg.ml, cfg.stagger, cfg.set_at = mc, ml, stagger, cfg_time
    if want_fs then cfg.win, cfg.med, cfg.def = win, med, def end
  else
    overridden = 1
  end
end
mc, ml, stagger = cfg.mc, cfg.ml, cfg.stagger
-- Kept for Inspect and for heartbeat's freshness test (no index depends on them).
if not dry and (cfg.stale ~= stale or tonumber(redis.call('HGET', K_CFG, 'max_scan')) ~= maxscan) then
  redis.call('HSET', K_CFG, 'stale_after_ms', fmt(stale), 'max_scan', fmt(maxscan))
end

local bad, bad_seen = {}, {}
local function add_bad(id, why)
  if not bad_seen[id] then
    bad_seen[id] = true
    bad[#bad + 1] = id
    bad[#bad + 1] = why
  end
end

-- The walk's bookkeeping.
local budget = maxscan
if budget == 0 then budget = -1 end
local scanned = 0
local stale_ids, stale_seen = {}, {}
-- Debris (entries of workers not indexed under the limits in force, left
-- by a change of limits) costs no max_scan budget: it is removed as it is
-- met, so it is paid for once. DEBRIS_MAX bounds what one claim removes.
local debris = {}
local DEBRIS_MAX = 128
local loaded = {}

local function get(id)
  local c = loaded[id]
  if c == nil then
    local w, err = load_worker(id)
    c = { w = w, err = err }
    loaded[id] = c
  end
  return c.w, c.err
end

-- StaggerDrains: is some fresh worker of the pool retiring? Only the
-- retiring set's members can be (common.lua's second invariant), so this
-- reads R records, not the pool. The first fresh retiring member settles it.
local retiring = false
local retired_stale = {}
if stagger and ml > 0 then
  -- Workers at or past max_lifetime still in idx:lifetime (the limit was
  -- lowered, or first stored over a used pool) are retiring although no
  -- script has put them in the set yet: move up to 8 per claim there (and
  -- out of the indexes), as their heartbeats would. O(log N) when none.
  local over = redis.call('ZRANGEBYSCORE', K_LF, '-inf', '(' .. fmt(-(ml - 1) * LF_SCALE), 'LIMIT', 0, 8)
  for _, id in ipairs(over) do
    local w = get(id)
    if w and fresh(w, now, stale) and may_retire(w, cfg) then retiring = true end
    if not dry then
      if w then reindex(id, w, cfg, now) else unindex(id) end
    end
  end
  local prune = {}
  for _, id in ipairs(redis.call('SMEMBERS', K_RET)) do
    local w, err = get(id)
    if not w then
      -- a bad record is not part of the snapshot: it holds nothing back
      if err == 'missing' then prune[#prune + 1] = id end
    elseif not fresh(w, now, stale) then
      retired_stale[#retired_stale + 1] = id
    elseif may_retire(w, cfg) or live_command(id, now) then
      retiring = true
      break
    else
      prune[#prune + 1] = id
    end
  end
  if not dry and #prune > 0 then redis.call('SREM', K_RET, unpack(prune)) end
end

-- examine returns the worker when it is eligible; otherwise charges the
-- budget and records why.
local function examine(id)
  scanned = scanned + 1
  local w, err = get(id)
  if not w then
    if err == 'missing' then
      if not stale_seen[id] then
        stale_seen[id] = true
        stale_ids[#stale_ids + 1] = id
      end
    else
      add_bad(id, err)
    end
  elseif not fresh(w, now, stale) then
    if not stale_seen[id] then
      stale_seen[id] = true
      stale_ids[#stale_ids + 1] = id
    end
  elseif not indexed(w, cfg) then
    debris[#debris + 1] = id
    return nil
  elseif retiring and w.lifetime + 1 >= ml then
    -- held back (StaggerDrains): its last session waits for the retiring one
  elseif w.suspect_until > 0 and now < w.suspect_until then
    -- suspect: walked past
  else
    return w
  end
  if budget > 0 then budget = budget - 1 end
  return nil
end

local function exhausted()
  return budget == 0 or #debris >= DEBRIS_MAX
end

local BATCH = 32

-- index_walk walks a sorted-set index in batches between min and max with
-- cmd (ZRANGEBYSCORE or ZRANGEBYLEX), turning each member into a worker id
-- with id_of; returns id, worker for the first usable one, or nil, stopped
-- (stopped: the scan budget ran out).
local function index_walk(cmd, key, min, max, id_of)
  local off = 0
  while true do
    local batch = redis.call(cmd, key, min, max, 'LIMIT', off, BATCH)
    for _, m in ipairs(batch) do
      local id = id_of(m)
      local w = examine(id)
      if w then return id, w end
      if exhausted() then return nil, true end
    end
    if #batch < BATCH then return nil, false end
    off = off + #batch
  end
end

-- lf_walk walks idx:lifetime between two scores.
local function lf_walk(min, max)
  return index_walk('ZRANGEBYSCORE', K_LF, min, max, function(m) return m end)
end

-- ring_walk walks idx:ring between two lex bounds (members are
-- '<32 hex>:<id>').
local function ring_walk(min, max)
  return index_walk('ZRANGEBYLEX', K_RING, min, max, function(m) return string.sub(m, 34) end)
end

local chosen, cw
local wraps, effective, dedupes, tied = 0, 0, 0, 0

if policy == 'lifetime_first' then
  if ml == 0 then
    chosen, cw = lf_walk('-inf', '+inf')
  else
    local total = redis.call('HLEN', K_WORKERS)
    local margin = 1
    if total > 0 then margin = math.max(1, math.floor(ml / total)) end
    local edge = fmt(-(ml - margin - 1) * LF_SCALE)
    local id, r = lf_walk(edge, '+inf')
    if id then
      chosen, cw = id, r
    elseif not r then
      -- Never walk workers at or past max_lifetime (left in the index by
      -- a lowered limit): lifetime <= ml - 1 means score >= -(ml-1) * 2^21.
      chosen, cw = lf_walk(fmt(-(ml - 1) * LF_SCALE), '(' .. edge)
    end
  end
elseif policy == 'vnode' then
  local k = tonumber(ARGV[VB])
  local cands = {}
  local cand_seen = {}
  for i = 1, k do
    local piv = ARGV[VB + i]
    local id, r = ring_walk('[' .. piv, '+')
    if not id and not r then
      wraps = wraps + 1
      id, r = ring_walk('-', '(' .. piv)
    end
    if id then
      if cand_seen[id] then
        dedupes = dedupes + 1
      else
        cand_seen[id] = true
        cands[#cands + 1] = { id = id, w = r, slots = r.active + tonumber(ARGV[VB + k + i]) }
      end
    end
    if not id and r then break end
  end
  effective = #cands
  if #cands > 0 then
    if k == 1 then
      chosen, cw = cands[1].id, cands[1].w
    else
      local min = cands[1].slots
      for _, c in ipairs(cands) do
        if c.slots < min then min = c.slots end
      end
      local ties = {}
      for _, c in ipairs(cands) do
        if c.slots == min then ties[#ties + 1] = c end
      end
      if #ties >= 2 then tied = 1 end
      local pick = ties[tonumber(ARGV[VB + 2 * k + #ties]) + 1]
      chosen, cw = pick.id, pick.w
    end
  end
elseif policy == 'fair_share' then
  fs_migrate(now)
  local ib, ii, ioff, idone = {}, 1, 0, false
  local bb, bi, boff, bdone = {}, 1, 0, false
  while true do
    if ii > #ib and not idone then
      ib = redis.call('ZRANGEBYSCORE', K_FSI, '-inf', '+inf', 'WITHSCORES', 'LIMIT', ioff, BATCH)
      ioff, ii = ioff + #ib / 2, 1
      if #ib == 0 then idone = true end
    end
    if bi > #bb and not bdone then
      bb = redis.call('ZRANGEBYSCORE', K_FSB, '-inf', '+inf', 'WITHSCORES', 'LIMIT', boff, BATCH)
      boff, bi = boff + #bb / 2, 1
      if #bb == 0 then bdone = true end
    end
    local iid, ikey, bid, bkey
    if ii <= #ib then iid, ikey = ib[ii], now + tonumber(ib[ii + 1]) end
    if bi <= #bb then bid, bkey = bb[bi], tonumber(bb[bi + 1]) end
    local id
    if iid and bid then
      if ikey < bkey or (ikey == bkey and bytes_less(iid, bid)) then
        id, ii = iid, ii + 2
      else
        id, bi = bid, bi + 2
      end
    elseif iid then
      id, ii = iid, ii + 2
    elseif bid then
      id, bi = bid, bi + 2
    else
      break
    end
    local w = examine(id)
    if w then
      chosen, cw = id, w
      break
    end
    if exhausted() then break end
  end
else
  return redis.error_reply('unknown policy ' .. tostring(policy))
end

-- Upkeep after the decision: drop bad records and index debris (entries of
-- workers that are not indexed) from every index.
if not dry then
  for i = 1, #bad, 2 do unindex(bad[i]) end
  for _, id in ipairs(debris) do unindex(id) end
end

local drain = 0
local record, durations = '', ''
local active, lifetime = 0, 0
if chosen then
  if not dry then
    cw.active = owner_add(chosen, cw.gen, ARGV[13])
    cw.lifetime = cw.lifetime + 1
    redis.call('HSET', K_ACTIVE, chosen, fmt(cw.active))
    redis.call('HSET', K_LIFETIME, chosen, fmt(cw.lifetime))
    local est = estimate(cw.durations, cfg)
    cw.predicted_end = math.max(now, cw.predicted_end) + est
    store(chosen, cw)
    reindex(chosen, cw, cfg, now)
    if cfg.ml > 0 and cw.lifetime >= cfg.ml then
      drain = 1
      redis.call('HSET', K_CMD, chosen, 'shutdown|' .. fmt(now + tonumber(ARGV[16])))
    end
    local lid = ARGV[13]
    local lease = {
      worker = chosen, gen = cw.gen, claimed = now, est = est, drain = drain, holder = ARGV[15],
      life = cw.lifetime,
    }
    if client ~= '' then lease.client = client end
    redis.call('HSET', K_LEASES, lid, cjson.encode(lease))
    redis.call('ZADD', K_LEXP, fmt(now + tonumber(ARGV[14])), lid)
    client_add(client, lid)
  end
  record = redis.call('HGET', K_WORKERS, chosen)
  durations = redis.call('HGET', K_DUR, chosen) or ''
  active, lifetime = cw.active, cw.lifetime
else
  chosen = ''
end

local ok = 0
if chosen ~= '' then ok = 1 end
local held = 0
if retiring then held = 1 end
local med_out = 0
if cfg.med then med_out = 1 end
local stagger_out = 0
if cfg.stagger then stagger_out = 1 end
return { ok, chosen, record, active, lifetime, durations, drain, scanned, stale_ids, bad,
  wraps, effective, dedupes, tied, now, held, retired_stale,
  overridden, cfg.mc, cfg.ml, stagger_out, cfg.win, med_out, cfg.def, epoch }
