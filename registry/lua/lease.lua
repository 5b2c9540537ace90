-- lease.lua: everything done to leases after a claim.
--   'release' ends a session: active -1, its duration recorded.
--   'undo'    gives a claim back: active -1, lifetime -1, a shutdown
--             command this claim set withdrawn, the worker suspect
--             (Cancel is an undo with no suspicion).
--   'renew'   extends live leases, re-creates those Redis lost (see below)
--             and reports those that ended.
--   'expire'  frees up to N leases whose expiry has passed.
--   'floor'   raises workers' lifetimes to what a claimer saw them serve
--             (see below);
--   'epoch'   gives the pool a dataset epoch when it has none, as its
--             first claim would (with epoch_at: claim.lua), and returns
--             the pool's epoch: a claimer that learned of a loss without
--             claiming marks it so, and a second loss then shows as one.
-- Counters move only for a lease of the worker's current registration
-- (generation). Release and undo leave a tombstone whether or not the lease
-- existed, so both are safe to retry, a claim that runs after its caller
-- cancelled it claims nothing, and a renewal racing a release does not
-- bring the lease back. The tombstone is the lease's own entry, rewritten
-- in place ('ended:<forget at ms>' in leases; its lease_expiry entry
-- moves to the forget time when the sweep meets it: common.lua, "Leases"),
-- so a release writes one entry rather than deleting two and adding a
-- third. Wakes the pool's waiters when a freed slot puts
-- its worker back in the indexes (wake_if).
--
-- Renewal re-asserts what Redis lost: each lease comes with what its
-- holder knows (worker, generation, claim time, the worker's lifetime right
-- after the claim). A lease that is missing and not tombstoned (expired
-- while its holder could not reach Redis, removed by a restart or a
-- failover) is re-created with its owner entry; when the worker's record
-- exists with that generation, its active count is recomputed from its
-- leases, its lifetime raised to at least the lease's, and it is reindexed
-- (and told to shut down when that puts it at the lifetime limit).
--
-- A floor re-asserts the sessions that ended: after Redis lost the pool's
-- data, a claimer knows, per worker generation, the highest lifetime it saw
-- one of its served sessions claimed at (Caddy keeps it for a while). A
-- worker whose record has that generation gets its lifetime raised to at
-- least the floor (told to shut down when that puts it at the limit); one
-- with no record keeps the floor in lapsed, as a stale expiry does, for
-- its agent's registration to take back (register.lua); an entry of
-- another generation is left as it is. Without it, a browser came back
-- from an empty restart counting only its agent's last heartbeat, and
-- served the sessions since then again.
--
-- KEYS: the pool keys (see common.lua).
-- ARGV: 1 now ms (0: TIME), 2 wakeup channel, 3 pool, 4 op, 5 durations kept,
--   release/undo: 6 lease id, 7 suspect ms, 8 tombstone ttl ms
--   renew:   6 ttl ms, 7 command ttl ms, 8 holder, then per lease 6 values:
--            lease id, worker id, generation, claimed ms, lifetime, client hash
--            ('' none: a re-created lease counts for its client again)
--   expire:  6 max leases
--   floor:   6 command ttl ms, then per worker 3 values: worker id,
--            generation, lifetime
--   epoch:   6 a fresh epoch token
-- Returns: release/undo: 1 when the lease existed, else 0 (missing, or
--   ended already: a retry leaves its tombstone as it is); renew:
--   {{re-created lease ids}, {ended (tombstoned) lease ids}}; expire: how
--   many leases were freed; floor: {records raised, floors kept in lapsed};
--   epoch: the pool's epoch.
-- Complexity: release/undo O(log L) for the lease's own entries plus
--   O(V log N) per lease freed (V only when a worker re-enters the
--   indexes); renew O(M log L) for M leases, plus O(V log N) per worker
--   whose leases were re-created; floor O(F) for F floors, plus O(V log N)
--   per worker raised.
local now = now_ms(ARGV[1])
local op = ARGV[4]
local keep = tonumber(ARGV[5])
if op == 'release' or op == 'undo' then
  local lid = ARGV[6]
  local raw = redis.call('HGET', K_LEASES, lid)
  local till = raw and tomb_until(raw)
  -- already ended (a retry): nothing moves, the tombstone stays as it is
  if till and till >= now then return 0 end
  local existed, entered = false, false
  if raw and not till then
    existed, entered = lease_free(lid, raw, now, op, tonumber(ARGV[7]) or 0, keep)
  end
  -- ended in place: the lease's entry becomes its tombstone
  tombstone(lid, now, tonumber(ARGV[8]), existed)
  wake_if(entered)
  if existed then return 1 end
  return 0
elseif op == 'renew' then
  local exp = fmt(now + tonumber(ARGV[6]))
  local cmd_ttl = tonumber(ARGV[7])
  local holder = ARGV[8]
  local recreated, ended = {}, {}
  local touched, order = {}, {}
  for i = 9, #ARGV - 5, 6 do
    local lid, wid, gen = ARGV[i], ARGV[i + 1], ARGV[i + 2]
    local client = ARGV[i + 5]
    local claimed, life = tonumber(ARGV[i + 3]) or 0, tonumber(ARGV[i + 4]) or 0
    if claimed <= 0 or claimed > now then claimed = now end
    local raw = redis.call('HGET', K_LEASES, lid)
    local till = raw and tomb_until(raw)
    if raw and not till then
      redis.call('ZADD', K_LEXP, exp, lid)
    elseif till and till >= now then
      ended[#ended + 1] = lid
    else
      -- missing, or a tombstone past its time (overwritten)
      local lease = { worker = wid, gen = gen, claimed = claimed, est = 0, drain = 0, holder = holder, life = life }
      if client ~= '' then lease.client = client end
      redis.call('HSET', K_LEASES, lid, cjson.encode(lease))
      redis.call('ZADD', K_LEXP, exp, lid)
      redis.call('ZADD', K_OWNER, 0, owner_member(wid, gen, lid))
      client_add(client, lid)
      recreated[#recreated + 1] = lid
      local k = wid .. ' ' .. gen
      local t = touched[k]
      if not t then
        t = { id = wid, gen = gen, life = 0 }
        touched[k] = t
        order[#order + 1] = k
      end
      if life > t.life then t.life = life end
    end
  end
  if #order > 0 then
    local cfg = load_cfg()
    for _, k in ipairs(order) do
      local t = touched[k]
      local w = load_worker(t.id)
      if w and w.gen == t.gen then
        w.active = owner_count(t.id, t.gen)
        w.lifetime = math.max(w.lifetime, t.life, w.active)
        redis.call('HSET', K_ACTIVE, t.id, fmt(w.active))
        redis.call('HSET', K_LIFETIME, t.id, fmt(w.lifetime))
        command_if_spent(t.id, w, cfg, now, cmd_ttl)
        reindex(t.id, w, cfg, now)
      end
    end
  end
  return { recreated, ended }
elseif op == 'floor' then
  local cmd_ttl = tonumber(ARGV[6]) or 0
  local raised, kept = 0, 0
  local cfg
  for i = 7, #ARGV - 2, 3 do
    local id, gen, life = ARGV[i], ARGV[i + 1], count(ARGV[i + 2])
    if life and life > 0 then
      local w, err = load_worker(id)
      if w then
        if w.gen == gen and life > w.lifetime then
          cfg = cfg or load_cfg()
          w.lifetime = life
          redis.call('HSET', K_LIFETIME, id, fmt(life))
          command_if_spent(id, w, cfg, now, cmd_ttl)
          reindex(id, w, cfg, now)
          raised = raised + 1
        end
      elseif err == 'missing' and lapsed_raise(id, gen, life, now) then
        kept = kept + 1
      end
    end
  end
  return { raised, kept }
elseif op == 'expire' then
  local n, back = expire_leases(now, tonumber(ARGV[6]), keep)
  wake_if(back)
  return n
elseif op == 'epoch' then
  local e = redis.call('HGET', K_CFG, 'epoch')
  if e and e ~= '' then return e end
  epoch_start(ARGV[6], now)
  return ARGV[6]
end
return redis.error_reply('unknown lease op ' .. tostring(op))
