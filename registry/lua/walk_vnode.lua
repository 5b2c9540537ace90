-- walk_vnode.lua: the vnode walk (selection.Vnode), part of walk.lua. For
-- each of K pivots, idx:ring from the pivot (ZRANGEBYLEX), then from the
-- start (wrap); power-of-K on active + jitter, random tiebreak.
-- Its own arguments (registry/policy.go, vnodeArgs): PARG(1) K, then K
-- pivots (32 hex), K jitters, K tiebreaks (tiebreak mod m for m = 1..K).
-- Complexity: O(K (log NV + S)) for S entries walked.

-- ring_walk walks idx:ring between two lex bounds (members are
-- '<32 hex>:<id>': the id is from byte 34 on). It reads one member first:
-- the ring holds only indexed workers, so the first after a pivot is
-- nearly always usable (K reads of 4 members cost more than K of 1).
local function ring_walk(s, min, max)
  return index_walk(s, 'ZRANGEBYLEX', K_RING, min, max, 34, 1)
end

WALK_INDEX.vnode = 'ring'

WALKS.vnode = function(s)
  local k = tonumber(PARG(1))
  -- candidates in order: ids, workers and slots (active + jitter)
  local ids, ws, slots = {}, {}, {}
  for i = 1, k do
    local piv = PARG(1 + i)
    local id, r = ring_walk(s, '[' .. piv, '+')
    if not id and not r then
      s.wraps = s.wraps + 1
      id, r = ring_walk(s, '-', '(' .. piv)
    end
    if id then
      local dup = false
      for j = 1, #ids do
        if ids[j] == id then dup = true end
      end
      if dup then
        s.dedupes = s.dedupes + 1
      else
        local n = #ids + 1
        ids[n], ws[n], slots[n] = id, r, r.active + tonumber(PARG(1 + k + i))
      end
    end
    if not id and r then break end
  end
  local n = #ids
  s.effective = n
  if n == 0 then return nil end
  if k == 1 then return ids[1], ws[1] end
  local min = slots[1]
  for j = 2, n do
    if slots[j] < min then min = slots[j] end
  end
  -- the candidates at the minimum, in order; the tiebreak picks one
  local ties = {}
  for j = 1, n do
    if slots[j] == min then ties[#ties + 1] = j end
  end
  if #ties >= 2 then s.tied = 1 end
  local pick = ties[tonumber(PARG(1 + 2 * k + #ties)) + 1]
  return ids[pick], ws[pick]
end
