-- walk_fair_share.lua: the fair-share walk (selection.FairShare), part of
-- claim.lua. A merge of idx:fair_idle (key now + estimate) and
-- idx:fair_busy (key predicted end + estimate), key ASC then id ASC.
-- Busy workers whose predicted end has passed are idle: a claim moves up
-- to 64 of them first (fs_migrate); a Pick, which writes nothing, reads the
-- same 64 and walks them as idle entries instead.
-- Complexity: O(log N + S) for S entries walked, plus O(log N) amortised.

WALKS.fair_share = function()
  local moved = {}
  local due = {}
  if not dry then
    fs_migrate(now)
  else
    local ids = redis.call('ZRANGEBYSCORE', K_FSP, '-inf', fmt(now), 'WITHSCORES', 'LIMIT', 0, 64)
    for i = 1, #ids, 2 do
      local id, pend = ids[i], tonumber(ids[i + 1])
      local key = tonumber(redis.call('ZSCORE', K_FSB, id)) or pend
      moved[id] = true
      due[#due + 1] = { id = id, est = key - pend }
    end
    table.sort(due, function(a, b)
      if a.est ~= b.est then return a.est < b.est end
      return bytes_less(a.id, b.id)
    end)
  end
  -- idle: idx:fair_idle merged with the due entries, by estimate then id.
  local inext, di = zstream(K_FSI, nil), 1
  local iid, iest = inext()
  local function idle_peek()
    local d = due[di]
    if d and (not iid or d.est < iest or (d.est == iest and bytes_less(d.id, iid))) then
      return d.id, d.est, true
    end
    return iid, iest, false
  end
  local bnext = zstream(K_FSB, moved)
  local bid, bkey = bnext()
  while true do
    local id0, est0, fromdue = idle_peek()
    local ikey
    if id0 then ikey = now + est0 end
    local id
    if id0 and (not bid or ikey < bkey or (ikey == bkey and bytes_less(id0, bid))) then
      id = id0
      if fromdue then di = di + 1 else iid, iest = inext() end
    elseif bid then
      id = bid
      bid, bkey = bnext()
    else
      return nil
    end
    local w = examine(id)
    if w then return id, w end
    if exhausted() then return nil end
  end
end
