-- walk_fair_share.lua: fair share (selection.FairShare), part of claim.lua.
-- A worker's key is max(now, predicted end) + its estimate; the earliest
-- key wins, ties by id. idx:fair_idle holds the workers whose predicted
-- end has passed, by estimate; idx:fair_busy the others, by predicted end
-- + estimate. An entry of idx:fair_busy whose predicted end has passed is
-- found only at the head of what is left of it (its key is larger than its
-- score, so it sorts no earlier than it is met), and moves to idx:fair_idle.
-- Arguments: window, median (0/1), default estimate (ms).
-- Complexity: O(log N + S) for S entries walked.

local function zstream(key)
  return { key = key, buf = {}, i = 1, off = 0, cnt = FIRST, done = false }
end

local function zpeek(z)
  if z.i > #z.buf then
    if z.done then return nil end
    z.buf = redis.call('ZRANGEBYSCORE', z.key, '-inf', '+inf', 'WITHSCORES', 'LIMIT', z.off, z.cnt)
    z.i, z.off = 1, z.off + #z.buf / 2
    if #z.buf < 2 * z.cnt then z.done = true end
    z.cnt = BATCH
    if #z.buf == 0 then return nil end
  end
  return z.buf[z.i], tonumber(z.buf[z.i + 1])
end

local function before(k1, id1, k2, id2)
  if not k2 then return true end
  return k1 < k2 or (k1 == k2 and id1 < id2)
end

WALKS.fair_share = function(s)
  local K, now = s.K, s.now
  local window, median, default = tonumber(s.args[s.wa]), s.args[s.wa + 1] == '1', tonumber(s.args[s.wa + 2])
  local idle, busy, late, moved = zstream(K.idle), zstream(K.busy), {}, {}
  local function state(id)
    local w = s.cache[id]
    if w == nil then
      w = get_state(K, id) or false
      s.cache[id] = w
    end
    return w
  end
  local pick_id, pick_w
  while true do
    local bid, bkey
    while true do
      local id, score = zpeek(busy)
      if not id then break end
      local w = state(id)
      if w and w.pe <= now then
        late[#late + 1] = { id = id, key = now + w.est }
        moved[#moved + 1] = { id = id, est = w.est }
        busy.i = busy.i + 2
      else
        bid, bkey = id, score
        break
      end
    end
    local iid, ikey = zpeek(idle)
    if iid then ikey = now + ikey end
    local li
    for i, e in ipairs(late) do
      if not li or before(e.key, e.id, late[li].key, late[li].id) then li = i end
    end
    local id, key, from = bid, bkey, 'busy'
    if iid and before(ikey, iid, key, id) then id, key, from = iid, ikey, 'idle' end
    if li and before(late[li].key, late[li].id, key, id) then id, key, from = late[li].id, late[li].key, 'late' end
    if not id then break end
    if from == 'busy' then busy.i = busy.i + 2
    elseif from == 'idle' then idle.i = idle.i + 2
    else table.remove(late, li) end
    local w = examine(s, id, false)
    if w then
      pick_id, pick_w = id, w
      break
    end
    if exhausted(s) then break end
  end
  if not s.dry then
    for _, m in ipairs(moved) do
      redis.call('ZREM', K.busy, m.id)
      redis.call('ZADD', K.idle, m.est, m.id)
    end
  end
  if not pick_id then return nil end
  s.on_claim = function(id, w)
    local h = get_history(K, id)
    if h.window ~= window or h.median ~= median or h.default ~= default then
      h.window, h.median, h.default = window, median, default
      put_history(K, id, h)
    end
    w.est = estimate(h, window, median, default)
    w.pe = math.max(now, w.pe) + w.est
  end
  return pick_id, pick_w
end
