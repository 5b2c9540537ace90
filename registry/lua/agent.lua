-- agent.lua: what a worker's agent calls: register, heartbeat, end,
-- deregister. The agent sees every session of its browser, so what it
-- reports is the truth these functions write.

-- register: a browser joins its group (again, after its record was lost).
-- KEYS: workers, state, retiring, lf, ring, idle, busy, iwrr, sessions,
--   sindex, groups.
-- ARGV: id, record (JSON), capacity, status (a, d or x), lifetime (the
--   browser's sessions so far), hold (0/1), replaces (the id of the worker
--   this browser replaces, or ''), version (or '-'), then its live
--   sessions: triples of id, client hash (or '-') and idle time (ms).
-- Returns: 'ok'. Complexity: O(log N) per session and ring position.
local function register(keys, args)
  local K = keyset(keys)
  local err = check_schema(K)
  if err then return err end
  redis.call('HSET', K.state, ' schema', SCHEMA)
  local id, now = args[1], now_ms()
  if redis.call('HEXISTS', K.state, id) == 1 then remove_worker(K, id) end
  redis.call('HSET', K.workers, id, args[2])
  local cap = tonumber(args[3])
  local w = {
    st = 'x', a = (#args - 8) / 3, l = tonumber(args[5]), cr = cap, ch = cap, hb = now, sus = 0,
    hold = args[6] == '1', pe = 0, est = DEFAULT_ESTIMATE,
  }
  set_status(K, id, w, args[4])
  for i = 9, #args, 3 do
    local sid = args[i]
    if redis.call('HEXISTS', K.sessions, sid) == 0 then
      new_session(K, sid, { wid = id, ver = args[8], claimed = now, st = 'l', client = args[i + 1], inst = '-',
        active = now - math.max(0, tonumber(args[i + 2]) or 0), label = '' })
    end
  end
  if args[7] ~= '' then
    local old = get_state(K, args[7])
    if old and (old.st == 'r' or old.st == 'd') then
      set_status(K, args[7], old, 'x')
      save(K, args[7], old, now)
    end
  end
  save(K, id, w, now)
  redis.call('SADD', K.groups, args[8])
  wakeup(K)
  return 'ok'
end

-- heartbeat: the agent's whole truth about one browser. Its counts become
-- the live sessions it reports plus the claims on their way to it (claimed
-- within grace); a session it does not report and older than that ended.
-- KEYS: state, retiring, lf, ring, iwrr, idle, busy, workers, sessions,
--   sindex, groups (for the wake-up channel).
-- ARGV: id, status (a serving, d draining, x replaced), lifetime, hold
--   (0/1), grace (ms), then its live sessions: triples of id, client
--   hash (or '-') and idle time (ms).
-- Returns: {'unregistered'} when the worker has no record, else
--   {'ok', drain, ids...}: drain 1 when an operator's drain is pending for
--   it, and the live sessions told to end.
-- Complexity: O(S log N) for S sessions of the worker.
local function heartbeat(keys, args)
  local K = keyset(keys)
  local err = check_schema(K)
  if err then return err end
  local id = args[1]
  local w = get_state(K, id)
  if not w then return { 'unregistered' } end
  local now, grace = now_ms(), tonumber(args[5])
  local reported, live, ending = {}, 0, {}
  for i = 6, #args, 3 do
    local sid = args[i]
    if not reported[sid] then
      reported[sid] = true
      live = live + 1
      local s = get_session(K, sid)
      local active = now - math.max(0, tonumber(args[i + 2]) or 0)
      if not s then
        new_session(K, sid, { wid = id, ver = '-', claimed = now, st = 'l', client = args[i + 1], inst = '-', active = active, label = '' })
      elseif s.wid == id then
        -- rewritten when its state or, by a second or more, its last
        -- activity changed
        local changed = math.abs(active - s.active) >= 1000
        if s.st == 'p' or s.st == 'q' then
          s.st, changed = 'l', true
        elseif s.st == 'e' then
          ending[#ending + 1] = sid
        end
        if changed then
          s.active = active
          put_session(K, sid, s)
        end
      end
    end
  end
  local kept = 0
  for _, sid in ipairs(worker_sessions(K, id)) do
    if not reported[sid] then
      local s = get_session(K, sid)
      if s and (s.st == 'p' or s.st == 'q') and s.claimed >= now - grace then
        kept = kept + 1
      elseif s then
        drop_session(K, sid, s)
      else
        redis.call('ZREM', K.sindex, 'w ' .. id .. ' ' .. sid)
      end
    end
  end
  local was_a, was_st = w.a, w.st
  w.a, w.l, w.hold, w.hb = live + kept, tonumber(args[3]) + kept, args[4] == '1', now
  -- The cap of the last claim is a hint that can go out of date (a
  -- raised max_concurrent, another route's): when a session of the worker
  -- ends it goes back to the worker's own capacity, so a worker full under
  -- an old cap is found again; a claim that finds it full under its own
  -- sets it back. A worker whose count holds keeps it, so full workers
  -- stay out of the indexes.
  if w.a < was_a then w.ch = w.cr end
  local drain = 0
  local agent = args[2]
  if agent == 'x' then
    set_status(K, id, w, 'x')
  elseif agent == 'd' then
    if w.st ~= 'x' then set_status(K, id, w, 'd') end
  elseif w.st == 'd' then
    drain = 1
  elseif w.st == 'r' and kept == 0 then
    set_status(K, id, w, 'a')
  end
  save(K, id, w, now)
  if w.a < was_a or (w.st == 'a' and was_st ~= 'a') then wakeup(K) end
  local out = { 'ok', drain }
  for _, sid in ipairs(ending) do out[#out + 1] = sid end
  return out
end

-- end_sessions: sessions of one worker end. The agent ends the sessions
-- it served (mode s, with their durations) and the claims it refused
-- (mode g: given back, lifetime too); Caddy gives back a claim that never
-- reached the agent (g, or f when the worker failed it: suspect for a
-- while, whether or not its agent gave the claim back first). A session
-- already ended counts nothing: ending is idempotent.
-- KEYS: state, retiring, lf, ring, iwrr, idle, busy, workers, sessions,
--   sindex, groups (for the wake-up channel).
-- ARGV: worker id, mode (s, g or f), suspect (ms, mode f), then pairs of
--   session id and duration (ms).
-- Returns: the sessions ended. Complexity: O(log N) per session.
local function end_sessions(keys, args)
  local K = keyset(keys)
  local err = check_schema(K)
  if err then return err end
  local id, mode = args[1], args[2]
  local w = get_state(K, id)
  local ended, last, h = 0, false, nil
  for i = 4, #args, 2 do
    local s = get_session(K, args[i])
    if s and s.wid == id then
      drop_session(K, args[i], s)
      ended = ended + 1
      if s.st == 'q' then last = true end
      local d = tonumber(args[i + 1])
      -- only a worker a fair-share claim chose (pe > 0) keeps durations:
      -- fair share's estimate is all they are for
      if w and mode == 's' and d and w.pe > 0 then
        h = h or get_history(K, id)
        h.d[#h.d + 1] = math.max(0, math.floor(d))
      end
    end
  end
  if not w or (ended == 0 and mode ~= 'f') then return ended end
  local now = now_ms()
  w.a = math.max(0, w.a - ended)
  if mode ~= 's' then
    w.l = math.max(0, w.l - ended)
    if last and w.st == 'r' then set_status(K, id, w, 'a') end
  end
  if mode == 'f' then w.sus = now + tonumber(args[3]) end
  if h then
    -- the estimate reads the last window durations: no more are kept
    local keep = math.max(1, h.window)
    if #h.d > keep then
      local t = {}
      for i = #h.d - keep + 1, #h.d do t[#t + 1] = h.d[i] end
      h.d = t
    end
    put_history(K, id, h)
    w.est = estimate(h, h.window, h.median, h.default)
  end
  save(K, id, w, now)
  if ended > 0 then wakeup(K) end
  return ended
end

-- deregister: the browser is closed; its record goes, with any session
-- left on it.
-- KEYS: workers, state, retiring, lf, ring, idle, busy, iwrr, sessions,
--   sindex, groups (for the wake-up channel).
-- ARGV: id. Returns: the sessions dropped with it.
local function deregister(keys, args)
  local K = keyset(keys)
  local err = check_schema(K)
  if err then return err end
  local dropped = remove_worker(K, args[1])
  wakeup(K)
  return dropped
end

redis.register_function('@LIB@_register', register)
redis.register_function('@LIB@_heartbeat', heartbeat)
redis.register_function{ function_name = '@LIB@_end', callback = end_sessions, flags = { 'allow-oom' } }
redis.register_function{ function_name = '@LIB@_deregister', callback = deregister, flags = { 'allow-oom' } }
