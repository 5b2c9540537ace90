-- admin.lua: what Caddy calls besides claims: an operator's drain and
-- session end, and the reaper's removal of stale workers.

-- drain: an operator tells a worker to drain. It takes no session from
-- now on; Caddy then tells its agent on the command channel.
-- KEYS: state, retiring, workers, ring, iwrr, lf, idle, busy.
-- ARGV: id. Returns: 1, or 0 when the worker is not registered.
local function drain(keys, args)
  local K = keyset(keys)
  local err = check_schema(K)
  if err then return err end
  local w = get_state(K, args[1])
  if not w then return 0 end
  if w.st == 'a' or w.st == 'r' then
    set_status(K, args[1], w, 'd')
    save(K, args[1], w, now_ms())
  end
  return 1
end

-- end_session: an operator ends a session. It is marked, so that its
-- agent's next heartbeat learns it if the command channel's message is
-- lost.
-- KEYS: sessions.
-- ARGV: session id. Returns: {worker id, version} or {} when there is no
--   such session.
local function end_session(keys, args)
  local K = keyset(keys)
  local s = get_session(K, args[1])
  if not s then return {} end
  if s.st == 'l' then
    s.st = 'e'
    put_session(K, args[1], s)
  end
  return { s.wid, s.ver }
end

-- reap: remove the workers among the ids given whose heartbeat is older
-- than the cutoff or whose state does not parse, with their sessions.
-- KEYS: workers, state, retiring, lf, ring, idle, busy, iwrr, sessions,
--   sindex, groups (for the wake-up channel).
-- ARGV: cutoff (Unix ms), then worker ids.
-- Returns: the workers removed. Complexity: O(S log N) per worker.
local function reap(keys, args)
  local K = keyset(keys)
  local err = check_schema(K)
  if err then return err end
  local cutoff, removed = tonumber(args[1]), 0
  for i = 2, #args do
    local w = get_state(K, args[i])
    local present = redis.call('HEXISTS', K.state, args[i]) == 1 or redis.call('HEXISTS', K.workers, args[i]) == 1
    if present and (not w or w.hb < cutoff) then
      remove_worker(K, args[i])
      removed = removed + 1
    end
  end
  if removed > 0 then wakeup(K) end
  return removed
end

redis.register_function{ function_name = '@LIB@_drain', callback = drain }
redis.register_function{ function_name = '@LIB@_end_session', callback = end_session }
redis.register_function{ function_name = '@LIB@_reap', callback = reap, flags = { 'allow-oom' } }
