-- claim.lua: select and claim a worker atomically (or, dry, only select:
-- Pick, which writes nothing and runs read-only, FCALL_RO, so it may go
-- to a replica).
--
-- Before selecting it frees a bounded number of expired leases (so counts
-- are true) and settles the limits in force: the newest configuration's
-- (see below; no rebuild when they change). Then the pool's policy walks
-- its index in preference order, as the selection package does over a
-- snapshot (selection/limits.go and the policies). Each policy's walk is
-- its own file, lua/walk_<policy>.lua (registry/policy.go's table lists
-- them), part of lua/walk.lua: the walks and their machinery are created
-- once, when the library loads, and a claim passes them its walk state.
-- Every walked entry that is not usable (missing, stale, suspect, avoided, held back
-- or bad) costs one unit of the max_scan budget; index debris (a worker not
-- indexed under the limits in force) costs none but is removed, at most 128
-- per claim. Stale and missing ones are reported for expiry, bad ones
-- reported and dropped from the indexes.
-- The chosen worker gets active +1, lifetime +1, a new predicted end, a lease
-- with a TTL and, at the lifetime limit, a shutdown command (and joins the
-- retiring set).
--
-- StaggerDrains (selection.Limits.StaggerDrains, with max_lifetime > 0):
-- before walking, the claim reads the retiring set (usually 0 or 1 members)
-- and asks whether one member is retiring now: fresh, and draining, at the
-- lifetime limit, or holding a live shutdown command (a member retiring
-- with a session left counts for drain_hold_ms only; see the loop). If
-- so, a worker whose next session would bring it to the limit
-- (lifetime + 1 >= max_lifetime) is not usable: walked past at one unit
-- of budget, like a suspect one (selection's HeldBack). Stale members do
-- not count (they are dead) and are returned for expiry; members that no
-- longer qualify are dropped.
--
-- KEYS: the pool keys (see common.lua).
-- ARGV: the common three (see common.lua), then the fields registry/contract.go
--   names in claimArgs, read as ARGV[REQ.<name>], then the policy's own,
--   read by its walk as PARG(i).
-- Returns: reply{...} with contract.go's claimReply fields when it decided;
--   otherwise a code and one value: {-1, 'cancelled'} (a cancelled lease
--   id), {-2, ...} (a replay of an existing lease id, claimReplayReply),
--   {-3, epoch} (an epoch the caller saw that Redis no longer has),
--   {-4, live sessions} (a client at its limit).
-- Complexity: O(log N + S) for S entries walked (S <= max_scan + K);
--   vnode O(K (log NV + S)); plus O(R) for R members of the retiring set
--   (StaggerDrains only; R is 1 or 0 while the rule holds, plus dead
--   workers not yet expired); plus amortised O(log N) index upkeep, plus
--   O(D V log N) for D <= 128 debris entries removed after a change of limits.
local now = now_ms(ARGV[1])
local policy = ARGV[REQ.policy]
local dry = ARGV[REQ.dry] == '1'
local mc, ml = tonumber(ARGV[REQ.max_concurrent]), tonumber(ARGV[REQ.max_lifetime])
local stale, maxscan = tonumber(ARGV[REQ.stale_after_ms]), tonumber(ARGV[REQ.max_scan])
local keep = tonumber(ARGV[REQ.durations_kept])
local stagger = ARGV[REQ.stagger] == '1'
-- ClaimRequest.DrainHold (ms; 0: for as long as the worker drains).
local drain_hold = tonumber(ARGV[REQ.drain_hold_ms]) or 0
local lid = ARGV[REQ.lease_id]
-- Registry.StoreLimits: settle and store the request's limits as a claim
-- does, then stop: no lease, no sweep, no client, no walk (Caddy, as a
-- configuration starts, so that its limits are in force before its first
-- claim). Its caller sends no lease id, epoch seen, sweep or client.
local limits_only = ARGV[REQ.limits_only] == '1'

-- A claim is keyed by its lease id (chosen by the caller): run again (a
-- client retry, or a caller repeating a claim whose reply it lost) it
-- returns the claim it made, and after its caller cancelled it, nothing.
if not dry and not limits_only then
  local replay = claim_replay(lid, now)
  if replay then return replay end
end

-- The dataset's epoch: a random token the pool's config hash keeps from
-- its first claim on. A claimer passes the epoch it last saw (epoch_seen);
-- when Redis no longer has it (restarted empty, or a failover to a replica
-- without it), the leases that claimer holds may be gone too, so it is
-- told to re-assert them (renewal) before anything is granted to it:
-- {-3, epoch}. epoch_new is a fresh token, stored when the pool has none.
-- The config hash is read once, here (epoch, limits, max_scan): nothing
-- below writes it before the limits are settled.
local cfg = load_cfg()
local epoch = cfg.epoch
if not epoch then
  epoch = ARGV[REQ.epoch_new]
  -- and when: a worker registering again soon after is held
  -- (register.lua), for the claimers of the data lost to re-assert it
  if not dry then cfg.server = epoch_start(epoch, now) end
end
-- Data that came back on another server process keeps its epoch but may
-- have lost writes: a restart from an older snapshot (RDB, or an AOF not
-- written through), a failover to a replica that had not had them all.
-- The leases, lifetimes and limits claimers wrote since are then as gone
-- as after an empty restart, and nothing else would tell them. So the
-- pool notes the server (run_id) its epoch was checked on, and the first
-- claim on another one gives the pool a new epoch, as after a loss (and
-- its epoch_at: workers registering again now are held): every claimer
-- re-asserts before it is granted a slot. A restart that lost nothing
-- costs one re-assertion. Not a StoreLimits call (it sends no epoch
-- seen): the next claim checks. The pool's claims are then held for
-- restore_hold_ms (restored_at; see below the limits). Not the
-- replication id as well (which would tell a failback to the same
-- process): each library version reads it once and keeps it, and two
-- versions side by side (a rolling upgrade) that read it either side of
-- a change made without data lost (a first replica attached, a
-- switchover) gave the pool a new epoch on every claim; read on every
-- claim, each such change would cost a hold.
if not dry and not limits_only then
  local here = server_id()
  if here ~= '0' and cfg.server ~= here then
    if cfg.server and cfg.epoch then
      epoch = ARGV[REQ.epoch_new]
      cfg_set('epoch', epoch, 'epoch_at', fmt(now), 'server', here, 'restored_at', fmt(now))
      cfg.restored_at = now
    else
      -- the pool's first claim, or its first since a version that notes
      -- no server: nothing to compare with
      cfg_set('server', here)
    end
  end
end
if not dry and ARGV[REQ.epoch_seen] ~= '' and ARGV[REQ.epoch_seen] ~= epoch then
  return { -3, epoch }
end

-- A Pick (dry) frees nothing: it sees expired leases' sessions as live.
if not dry then
  local freed = expire_leases(now, tonumber(ARGV[REQ.lease_sweep]), keep)
  if freed > 0 then wake() end
end

-- Per-client limit (see common.lua, "Clients"): counted after expired
-- leases are freed, so a crashed holder's sessions stop counting once
-- their leases lapse; refused before any walk, so nothing is claimed.
local client = ARGV[REQ.client]
if not dry then
  local live = client_over(client, tonumber(ARGV[REQ.client_limit]))
  if live then return { -4, live } end
end

-- Which limits win (issue 9): the newest configuration. The pool's config
-- hash holds the limits in force and set_at, the time of the configuration
-- that brought them. A claim whose limits differ stores them when its
-- configuration time (config_time_ms, 0: now) is not older than set_at;
-- otherwise it runs under the stored limits and says so (overridden).
-- Nothing is rebuilt when they change: the indexes converge worker by
-- worker (see common.lua's invariant), so the change costs O(1) here.
-- A claim may also name a configuration time it supersedes
-- (config_supersedes_ms, 0: none): limits stored with exactly that time
-- are replaced whatever config_time_ms (a configuration that went away,
-- ClaimRequest.Supersedes), even by equal limits: set_at must stop
-- carrying the time that went away, or equal limits of the running
-- configuration would keep it (newer than another instance's), and a
-- second failed configuration with the same limits would store nothing
-- and leave the first one's time, which the running configuration no
-- longer supersedes (it supersedes the newest).
local cfg_time = tonumber(ARGV[REQ.config_time_ms])
if cfg_time == 0 then cfg_time = now end
local supersedes = tonumber(ARGV[REQ.config_supersedes_ms])
local superseded = supersedes ~= 0 and cfg.set_at == supersedes
local want_fs = policy == 'fair_share'
local win, med, def = tonumber(ARGV[REQ.fs_window]), ARGV[REQ.fs_median] == '1', tonumber(ARGV[REQ.fs_default_ms])
local differ = superseded or cfg.set_at == nil or cfg.mc ~= mc or cfg.ml ~= ml or cfg.stagger ~= stagger
if want_fs and (cfg.win ~= win or cfg.med ~= med or cfg.def ~= def) then differ = true end
local overridden = 0
if differ then
  if cfg.set_at == nil or cfg_time >= cfg.set_at or superseded then
    -- A Pick (dry) uses its limits but stores nothing: an admin's preview
    -- must not change what the pool runs under.
    if not dry then
      cfg_set('max_concurrent', fmt(mc), 'max_lifetime', fmt(ml), 'stagger_drains',
        ARGV[REQ.stagger], 'set_at', fmt(cfg_time))
      if want_fs then
        cfg_set('fs_window', fmt(win), 'fs_median', ARGV[REQ.fs_median], 'fs_default_ms', fmt(def))
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
if not dry and (cfg.stale ~= stale or cfg.scan ~= maxscan) then
  cfg_set('stale_after_ms', fmt(stale), 'max_scan', fmt(maxscan))
end
-- none is the reply of a call that decided nothing: the limits in force,
-- and for how much longer (ms) the pool's claims are held (0: not held;
-- a held claim that avoided workers says how many the pool has, as
-- below).
local function none(held)
  local registered = 0
  if held > 0 and ARGV[REQ.avoid] ~= '' then registered = redis.call('HLEN', K_WORKERS) end
  return reply {
    ok = 0, id = '', record = '', active = 0, lifetime = 0, durations = '', hot = '', drain = 0,
    scanned = 0, stale = {}, bad = {}, wraps = 0, effective = 0, dedupes = 0, tied = 0, now = now,
    retiring = 0, retired_stale = {},
    overridden = overridden, max_concurrent = cfg.mc, max_lifetime = cfg.ml, stagger = cfg.stagger and 1 or 0,
    fs_window = cfg.win, fs_median = cfg.med and 1 or 0, fs_default_ms = cfg.def, epoch = epoch, building = 0,
    registered = registered, held = held,
  }
end
if limits_only then return none(0) end
-- Held after a restore (restored_at, set above). The restored records are
-- there, so no registration is held (register.lua), yet another instance
-- may have served the workers since the snapshot and not claim now: it
-- learns of the new epoch at its epoch watch (every half second) and only
-- then re-asserts what it served. Until then every worker looks younger
-- than it is, and the claims of whoever claims first would be swallowed
-- by the floors that come after (a review measured 4 sessions served
-- where 2 were left). So for restore_hold_ms (RestoreHold, twice the
-- watch's period) a claim or Pick finds no worker: the caller queues,
-- as for a full pool. A restored_at ahead of this Redis' clock (written
-- by a server whose clock was ahead) holds nothing.
local hold = tonumber(ARGV[REQ.restore_hold_ms]) or 0
if cfg.restored_at and now >= cfg.restored_at and now - cfg.restored_at < hold then
  return none(cfg.restored_at + hold - now)
end
local walk = WALKS[policy]
if not walk then return redis.error_reply('unknown policy ' .. tostring(policy)) end
-- The index the policy walks: kept, or built a step further (common.lua,
-- "Kept indexes"); until it is complete the claim walks idx:lifetime as
-- lifetime_first does, with lifetime_first's scan budget.
local building = 0
if not ix_settle(cfg, WALK_INDEX[policy], now, dry) then
  walk, building = WALKS.lifetime_first, 1
  maxscan = tonumber(ARGV[REQ.fallback_max_scan])
end
-- The walk's state (lua/walk.lua): budget, what it finds, workers read.
local ws = walk_state(now, stale, maxscan, dry, cfg)
-- Workers the caller avoids (ClaimRequest.Avoid: ids joined by spaces).
if ARGV[REQ.avoid] ~= '' then
  local avoid = {}
  for id in string.gmatch(ARGV[REQ.avoid], '%S+') do avoid[id] = true end
  ws.avoid = avoid
end

-- StaggerDrains: is some fresh worker of the pool retiring? Only the
-- retiring set's members can be (common.lua's second invariant), so this
-- reads R records, not the pool. The first fresh retiring member settles it.
local retiring = false
-- StaggerDrains: a member draining a session past drain_hold was seen.
local long_drain = false
local retired_stale = {}
if stagger and ml > 0 then
  -- Workers at or past max_lifetime still in idx:lifetime (the limit was
  -- lowered, or first stored over a used pool) are retiring although no
  -- script has put them in the set yet: move up to 8 per claim there (and
  -- out of the indexes), as their heartbeats would. O(log N) when none.
  local over = redis.call('ZRANGEBYSCORE', K_LF, '-inf', '(' .. fmt(-(ml - 1) * LF_SCALE), 'LIMIT', 0, 8)
  for _, id in ipairs(over) do
    local w = walk_get(ws, id)
    if w and fresh(w, now, stale) and may_retire(w, cfg) then retiring = true end
    if not dry then
      if w then reindex(id, w, cfg, now) else unindex(id) end
    end
  end
  local prune = {}
  for _, id in ipairs(redis.call('SMEMBERS', K_RET)) do
    local w, err = walk_get(ws, id)
    if not w then
      -- a bad record is not part of the snapshot: it holds nothing back
      if err == 'missing' then prune[#prune + 1] = id end
    elseif not fresh(w, now, stale) then
      retired_stale[#retired_stale + 1] = id
    elseif not (may_retire(w, cfg) or live_command(id, now)) then
      prune[#prune + 1] = id
    elseif drain_hold > 0 and w.active > 0 then
      -- Retiring with sessions left (draining them, or at its limit or
      -- told to shut down before its agent heard, which is up to a
      -- heartbeat interval, 10 s by default): it holds the others' last
      -- sessions back for drain_hold ms from when a claim first saw it so
      -- (the config hash's drain_seen:<id>), then no longer while it is
      -- the only member retiring. A worker held back takes no session
      -- either way; held for as long as a long session lasts, every other
      -- worker reached its last session and the pool stopped serving until
      -- -drain-timeout (22 s of 40 without a session with one long
      -- session, max_lifetime 20, in steady state). Past drain_hold the
      -- next worker may take its last session and retire beside it; that
      -- one then counts, so at most two drain at once: a red team whose
      -- long sessions all ended together had every worker draining when
      -- any long drain stopped counting.
      local key = 'drain_seen:' .. id
      local seen = count(redis.call('HGET', K_CFG, key))
      if not seen or seen > now then
        -- none yet, or not a time this clock has passed (written by hand,
        -- or a failover to a server whose clock is behind)
        seen = now
        if not dry then cfg_set(key, fmt(now)) end
      end
      if now - seen < drain_hold or long_drain then
        retiring = true
        break
      end
      long_drain = true
    else
      retiring = true
      break
    end
  end
  if not dry and #prune > 0 then
    redis.call('SREM', K_RET, unpack(prune))
    -- retiring no more (a raised limit): a later retirement times its
    -- hold afresh
    for _, id in ipairs(prune) do cfg_del('drain_seen:' .. id) end
  end
end
ws.retiring = retiring

local chosen, cw = walk(ws)
-- What the walk found, for the upkeep and the reply.
local scanned, stale_ids, bad, debris, stats = ws.scanned, ws.stale_ids, ws.bad, ws.debris, ws

-- Upkeep after the decision: drop bad records and index debris (entries of
-- workers that are not indexed) from every index.
if not dry then
  for i = 1, #bad, 2 do unindex(bad[i]) end
  for _, id in ipairs(debris) do unindex(id) end
end

local drain = 0
local record, durations, hot = '', '', ''
local active, lifetime = 0, 0
if chosen then
  if not dry then
    cw.active = owner_add(chosen, cw.gen, lid)
    cw.lifetime = cw.lifetime + 1
    redis.call('HSET', K_LIFETIME, chosen, fmt(cw.lifetime))
    -- the new predicted end goes in the hot figures: the record is left as
    -- it is (see common.lua, "Hot figures")
    local est = estimate(cw, cfg)
    cw.predicted_end = math.max(now, cw.predicted_end) + est
    store_hot(chosen, cw, cfg.win)
    reindex(chosen, cw, cfg, now, true)
    local cmd_at
    if cfg.ml > 0 and cw.lifetime >= cfg.ml then
      drain = 1
      cmd_at = now + tonumber(ARGV[REQ.command_ttl_ms])
      redis.call('HSET', K_CMD, chosen, 'shutdown|' .. fmt(cmd_at))
    end
    local lease = {
      worker = chosen, gen = cw.gen, claimed = now, est = est, drain = drain, holder = ARGV[REQ.holder],
      life = cw.lifetime, cmd_at = cmd_at,
    }
    if client ~= '' then lease.client = client end
    redis.call('HSET', K_LEASES, lid, cjson.encode(lease))
    redis.call('ZADD', K_LEXP, fmt(now + tonumber(ARGV[REQ.lease_ttl_ms])), lid)
    client_add(client, lid)
  end
  -- The reply's record, durations and hot figures are what the script
  -- holds: the record and durations as read (a claim leaves them), the hot
  -- figures as store_hot wrote them (a Pick's as read).
  record, hot = cw.rec, cw.hot
  durations = cw.dur_raw
  active, lifetime = cw.active, cw.lifetime
else
  chosen = ''
end

-- A claim that avoided workers and found none says how many the pool
-- has: whether others (busy, suspect, draining) may free up, or the
-- avoided ones are all there is.
local registered = 0
if chosen == '' and ws.avoid then registered = redis.call('HLEN', K_WORKERS) end

local function bit(b)
  if b then return 1 end
  return 0
end
return reply {
  ok = bit(chosen ~= ''), id = chosen, record = record, active = active, lifetime = lifetime,
  durations = durations, hot = hot, drain = drain, scanned = scanned, stale = stale_ids, bad = bad,
  wraps = stats.wraps, effective = stats.effective, dedupes = stats.dedupes, tied = stats.tied, now = now,
  retiring = bit(retiring), retired_stale = retired_stale,
  overridden = overridden, max_concurrent = cfg.mc, max_lifetime = cfg.ml, stagger = bit(cfg.stagger),
  fs_window = cfg.win, fs_median = bit(cfg.med), fs_default_ms = cfg.def, epoch = epoch, building = building,
  registered = registered, held = 0,
}
