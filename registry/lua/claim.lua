-- claim.lua: select a worker of a version group and claim it for a session,
-- in one atomic call (Caddy's browser_grid policies). With dry = 1 it only
-- selects and writes nothing (registered no-writes too, for the admin
-- API's pick).
--
-- KEYS: common.lua's layout; reads workers, state, retiring, the index of
--   the policy (lf, ring, idle and busy, iwrr), sindex and the queue
--   (queue, qalive, qinfo); writes state, retiring, lf, ring, idle, busy,
--   iwrr, sessions, sindex and the queue.
-- ARGV: registry/claim.go's claimArgs, in order:
--   policy dry session version client client_limit instance label
--   max_concurrent max_lifetime stagger stale_ms max_scan avoid waiter
--   then the policy's own arguments, from s.wa on (each walk says which).
-- Returns: {outcome, worker id, record, lifetime, last, scanned, stale,
--   workers, drained}: outcome 'ok', 'none' (no usable worker), 'client'
--   (the client holds client_limit live sessions) or 'behind' (an older
--   request in the pool's queue may take the worker found); lifetime is the
--   worker's after the claim, last 1 when the claim brought it to
--   max_lifetime, scanned the index entries examined, stale the stale or
--   missing workers walked past, workers the group's registered workers,
--   drained the worker this claim told to drain ('' none; see below).
--
-- A worker already past this claim's max_lifetime (the limit was lowered,
-- or another instance's is higher) takes no session of it, and no claim
-- would be its last: the claim tells it to drain instead, one at a time
-- under stagger_drains (none while another worker retires).
-- waiter is the request's place in the pool's queue ('-': none, '*': an
-- instance that queues on its own); the claim yields to an older waiter
-- (queue_ahead), but for '*', and, made, takes the waiter out of the
-- queue.
-- Complexity: O(log N) per index read, at most max_scan unusable entries
--   and DEBRIS_MAX entries full for this claim's limits.

-- DEBRIS_MAX bounds the entries a walk passes for free: in an index,
-- but full or spent under this claim's limits (another instance's cap).
local DEBRIS_MAX = 64
local FIRST, BATCH = 4, 32

local function effcap(capacity, mc)
  if capacity > 0 and mc > 0 then return math.min(capacity, mc) end
  if capacity > 0 then return capacity end
  return mc
end

-- examine returns the worker when it may take the session; otherwise it
-- notes why, charges one unit of max_scan and returns nil. An entry full
-- or spent under this claim's limits is free unless strict (the ring and
-- idx:iwrr hold full workers; the other indexes do not).
local function examine(s, id, strict)
  s.scanned = s.scanned + 1
  local w = s.cache[id]
  if w == nil then
    w = get_state(s.K, id) or false
    s.cache[id] = w
  end
  local stale = not w or (s.stale > 0 and s.now - w.hb > s.stale)
  if w then
    local cap = effcap(w.cr, s.mc)
    local full = w.st ~= 'a' or (cap > 0 and w.a >= cap) or (s.ml > 0 and w.l >= s.ml)
    if full and not strict then
      s.debris = s.debris + 1
      if w.st == 'a' and cap > 0 and w.a >= cap and w.ch ~= cap then
        s.full[#s.full + 1] = { id = id, w = w, cap = cap }
      end
      return nil
    end
    if not stale and not full then
      if s.ml > 0 and w.l + 1 >= s.ml and (w.hold or s.retiring) then
        -- held back: its last session waits for the restart under way
      elseif w.sus > s.now then
        -- suspect
      elseif not s.avoid[id] then
        return w
      end
    end
  end
  if stale and not s.stale_seen[id] then
    s.stale_seen[id] = true
    s.stale_ids[#s.stale_ids + 1] = id
  end
  if s.budget > 0 then s.budget = s.budget - 1 end
  return nil
end

local function exhausted(s)
  return s.budget == 0 or s.debris >= DEBRIS_MAX
end

-- walk reads a sorted set in batches with cmd between lo and hi and
-- examines each member (its id from byte cut on, when cut is set), once
-- when seen is given. Returns id, worker, member for the first usable one,
-- else nil, stopped.
local function walk(s, cmd, key, lo, hi, cut, strict, seen)
  local off, cnt = 0, FIRST
  while true do
    local batch = redis.call(cmd, key, lo, hi, 'LIMIT', off, cnt)
    for _, m in ipairs(batch) do
      local id = m
      if cut then id = string.sub(m, cut) end
      if not (seen and seen[id]) then
        if seen then
          seen[id] = true
          s.fresh = true
        end
        local w = examine(s, id, strict)
        if w then return id, w, m end
        if exhausted(s) then return nil, true end
      end
    end
    if #batch < cnt then return nil, false end
    off, cnt = off + #batch, BATCH
  end
end

local WALKS = {}
-- @walks

local function claim(keys, args)
  local K = keyset(keys)
  local err = check_schema(K)
  if err then return err end
  local policy, dry, sid, version, client = args[1], args[2] == '1', args[3], args[4], args[5]
  local client_limit, instance, label = tonumber(args[6]), args[7], args[8]
  local s = {
    K = K, now = now_ms(), mc = tonumber(args[9]), ml = tonumber(args[10]),
    stale = tonumber(args[12]), budget = tonumber(args[13]), avoid = {},
    scanned = 0, debris = 0, cache = {}, stale_ids = {}, stale_seen = {}, retiring = false, full = {},
    args = args, dry = dry, wa = 16,
  }
  if s.budget == 0 then s.budget = -1 end
  for id in string.gmatch(args[14], '%S+') do s.avoid[id] = true end
  local total = redis.call('HLEN', K.workers)
  local drained = ''
  local function reply(outcome, id, w, last)
    local rec = ''
    if id then rec = redis.call('HGET', K.workers, id) or '' end
    return { outcome, id or '', rec, w and w.l or 0, last and 1 or 0, s.scanned, s.stale_ids, total, drained }
  end
  if client ~= '-' and client_limit > 0 then
    local prefix = 'c ' .. client .. ' '
    if redis.call('ZLEXCOUNT', K.sindex, '[' .. prefix, '[' .. prefix .. '\255') >= client_limit then
      return reply('client')
    end
  end
  local retiring = false
  if s.ml > 0 then
    for _, id in ipairs(redis.call('SMEMBERS', K.retiring)) do
      local r = get_state(K, id)
      if r and (s.stale == 0 or s.now - r.hb <= s.stale) then
        retiring = true
        break
      end
    end
    s.retiring = retiring and args[11] == '1'
    -- the available worker with the highest lifetime past max_lifetime
    local spent = redis.call('ZRANGEBYSCORE', K.lf, '-inf', '(' .. n(-(s.ml - 1) * LF), 'LIMIT', 0, 1)
    if #spent > 0 and not dry and not (s.retiring) then
      local w = get_state(K, spent[1])
      if w and w.st == 'a' then
        set_status(K, spent[1], w, 'd')
        save(K, spent[1], w, s.now)
        drained = spent[1]
        s.retiring = args[11] == '1'
      end
    end
  end
  local pick = WALKS[policy]
  if not pick then return redis.error_reply('ERR unknown policy ' .. tostring(policy)) end
  -- The workers full under this claim's cap leave the count-ordered
  -- indexes until their counts change, so claims like it do not walk past
  -- them again (after the walk: its pages must not shift); a walk they
  -- stopped runs once more without them.
  local function shrink()
    local n = #s.full
    for _, f in ipairs(s.full) do
      f.w.ch = f.cap
      save(K, f.id, f.w, s.now)
    end
    s.full, s.debris = {}, 0
    return n
  end
  local id, w = pick(s)
  if not dry and shrink() > 0 and not id then
    id, w = pick(s)
    shrink()
  end
  if not id then return reply('none') end
  if dry then return reply('ok', id, w, s.ml > 0 and w.l + 1 >= s.ml) end
  local waiter = args[15]
  if waiter ~= '*' and queue_ahead(K, s.now, waiter, version, id) then return reply('behind') end
  if waiter ~= '-' and redis.call('ZSCORE', K.queue, waiter) then
    queue_drop(K, waiter)
    redis.call('HINCRBY', K.qinfo, ' served', 1)
  end

  w.a, w.l, w.ch = w.a + 1, w.l + 1, effcap(w.cr, s.mc)
  if s.on_claim then s.on_claim(id, w) end
  local last = s.ml > 0 and w.l >= s.ml
  if last then set_status(K, id, w, 'r') end
  save(K, id, w, s.now)
  new_session(K, sid, { wid = id, ver = version, claimed = s.now, st = last and 'q' or 'p', client = client, inst = instance, label = label })
  return reply('ok', id, w, last)
end

redis.register_function('@LIB@_claim', claim)
redis.register_function{ function_name = '@LIB@_pick', callback = claim, flags = { 'no-writes' } }
