-- walk_fair_share.lua: the fair-share walk (selection.FairShare), part of
-- walk.lua. A merge of idx:fair_idle (key now + estimate) and
-- idx:fair_busy (key predicted end + estimate), key ASC then id ASC.
-- Busy workers whose predicted end has passed are idle: a claim moves up
-- to 64 of them first (fs_migrate); a Pick, which writes nothing, reads the
-- same 64 and walks them as idle entries instead.
-- Complexity: O(log N + S) for S entries walked, plus O(log N) amortised.

-- fs_due_less orders a Pick's due entries as idx:fair_idle would: by
-- estimate, then id.
local function fs_due_less(a, b)
  if a.est ~= b.est then return a.est < b.est end
  return bytes_less(a.id, b.id)
end

-- fs_due returns what fs_migrate would move (a Pick's view): the due
-- entries, sorted, and their ids as a set (passed over in idx:fair_busy).
local function fs_due(now)
  local moved, due = {}, {}
  local ids = redis.call('ZRANGEBYSCORE', K_FSP, '-inf', fmt(now), 'WITHSCORES', 'LIMIT', 0, 64)
  for i = 1, #ids, 2 do
    local id, pend = ids[i], tonumber(ids[i + 1])
    local key = tonumber(redis.call('ZSCORE', K_FSB, id)) or pend
    moved[id] = true
    due[#due + 1] = { id = id, est = key - pend }
  end
  table.sort(due, fs_due_less)
  return due, moved
end

WALK_INDEX.fair_share = 'fair'

WALKS.fair_share = function(s)
  local now = s.now
  local due, moved
  if not s.dry then
    fs_migrate(now)
  else
    due, moved = fs_due(now)
  end
  -- idle: idx:fair_idle merged with the due entries, by estimate then id
  local idle, di = zstream(K_FSI, nil), 1
  local iid, iest = zs_next(idle)
  -- busy: read first only as far as the idle side's head key (usually
  -- nothing there: an idle worker's key is now + estimate, a busy one's
  -- later), and on without a bound once the walk goes past that key
  local busy, bid, bkey
  while true do
    -- the idle side's head
    local id0, est0, fromdue = iid, iest, false
    local d = due and due[di]
    if d and (not iid or d.est < iest or (d.est == iest and bytes_less(d.id, iid))) then
      id0, est0, fromdue = d.id, d.est, true
    end
    local upto
    if id0 then upto = now + est0 end
    if not busy then
      busy = zstream(K_FSB, moved, upto)
      bid, bkey = zs_next(busy)
    elseif not bid and busy.upto and (not upto or upto > busy.upto) then
      zs_unbound(busy)
      bid, bkey = zs_next(busy)
    end
    local id
    if id0 and (not bid or now + est0 < bkey or (now + est0 == bkey and bytes_less(id0, bid))) then
      id = id0
      if fromdue then di = di + 1 else iid, iest = zs_next(idle) end
    elseif bid then
      id = bid
      bid, bkey = zs_next(busy)
    else
      return nil
    end
    local w = examine(s, id)
    if w then return id, w end
    if exhausted(s) then return nil end
  end
end
