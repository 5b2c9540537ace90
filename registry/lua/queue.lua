-- queue.lua: the pool's queue of waiting requests, across every Caddy
-- instance (common.lua describes its keys). Requests are served oldest
-- first: a claim yields to an older waiter that could take its worker
-- (claim.lua, queue_ahead).

-- queue_join: a request joins the pool's queue, unless limit waiters
-- wait already. Joining again refreshes it.
-- KEYS: queue, qalive, qinfo.
-- ARGV: waiter, versions (space-separated; '-' the pool's own), avoid (space-separated), limit,
--   keep_ms (how long it stays without queue_keep).
-- Returns: {1, its position (0: first)} or {0, the depth} when full.
local function queue_join(keys, args)
  local K = keyset(keys)
  local m, limit, now = args[1], tonumber(args[4]), now_ms()
  queue_prune(K, now)
  if not redis.call('ZSCORE', K.queue, m) then
    local depth = redis.call('ZCARD', K.queue)
    if limit > 0 and depth >= limit then return { 0, depth } end
    redis.call('ZADD', K.queue, redis.call('HINCRBY', K.qinfo, ' seq', 1), m)
    put_waiter(K, m, { grant = 0, joined = now, versions = ' ' .. args[2] .. ' ', avoid = ' ' .. args[3] .. ' ' })
  end
  redis.call('ZADD', K.qalive, now + tonumber(args[5]), m)
  return { 1, redis.call('ZRANK', K.queue, m) }
end

-- queue_keep: an instance keeps its waiters in the queue for keep_ms
-- more and updates what each may take; it reads the queue's state.
-- KEYS: queue, qalive, qinfo.
-- ARGV: keep_ms, then per waiter: id, versions, avoid.
-- Returns: {depth, oldest wait (ms), served (requests served from the
--   queue, ever), then each waiter's position (-1: no longer queued)}.
local function queue_keep(keys, args)
  local K = keyset(keys)
  local now = now_ms()
  queue_prune(K, now)
  local out = { 0, 0, tonumber(redis.call('HGET', K.qinfo, ' served') or '0') }
  for i = 2, #args, 3 do
    local m = args[i]
    local r = redis.call('ZRANK', K.queue, m)
    local q = r and get_waiter(K, m)
    if q then
      redis.call('ZADD', K.qalive, now + tonumber(args[1]), m)
      q.versions, q.avoid = ' ' .. args[i + 1] .. ' ', ' ' .. args[i + 2] .. ' '
      put_waiter(K, m, q)
      out[#out + 1] = r
    else
      out[#out + 1] = -1
    end
  end
  out[1] = redis.call('ZCARD', K.queue)
  local head = redis.call('ZRANGE', K.queue, 0, 0)
  if #head > 0 then
    local q = get_waiter(K, head[1])
    if q then out[2] = now - q.joined end
  end
  return out
end

-- queue_leave: waiters leave the queue (served elsewhere, timed out,
-- gone). One that held a grant passes it on at once.
-- KEYS: queue, qalive, qinfo, groups (for the wake-up channel).
-- ARGV: waiter ids.
local function queue_leave(keys, args)
  local K = keyset(keys)
  local granted = false
  for _, m in ipairs(args) do
    local q = get_waiter(K, m)
    if q and q.grant > 0 then granted = true end
    queue_drop(K, m)
  end
  if granted then wakeup(K) end
  return 1
end

redis.register_function('@LIB@_queue_join', queue_join)
redis.register_function('@LIB@_queue_keep', queue_keep)
redis.register_function('@LIB@_queue_leave', queue_leave)
