-- walk_vnode.lua: the vnode walk (selection.Vnode), part of claim.lua. For
-- each of K pivots, idx:ring from the pivot (ZRANGEBYLEX), then from the
-- start (wrap); power-of-K on active + jitter, random tiebreak.
-- Its own arguments (registry/policy.go, vnodeArgs): PARG(1) K, then K
-- pivots (32 hex), K jitters, K tiebreaks (tiebreak mod m for m = 1..K).
-- Complexity: O(K (log NV + S)) for S entries walked.

-- ring_walk walks idx:ring between two lex bounds (members are
-- '<32 hex>:<id>').
local function ring_walk(min, max)
  return index_walk('ZRANGEBYLEX', K_RING, min, max, function(m) return string.sub(m, 34) end)
end

WALKS.vnode = function()
  local k = tonumber(PARG(1))
  local cands = {}
  local cand_seen = {}
  for i = 1, k do
    local piv = PARG(1 + i)
    local id, r = ring_walk('[' .. piv, '+')
    if not id and not r then
      stats.wraps = stats.wraps + 1
      id, r = ring_walk('-', '(' .. piv)
    end
    if id then
      if cand_seen[id] then
        stats.dedupes = stats.dedupes + 1
      else
        cand_seen[id] = true
        cands[#cands + 1] = { id = id, w = r, slots = r.active + tonumber(PARG(1 + k + i)) }
      end
    end
    if not id and r then break end
  end
  stats.effective = #cands
  if #cands == 0 then return nil end
  if k == 1 then return cands[1].id, cands[1].w end
  local min = cands[1].slots
  for _, c in ipairs(cands) do
    if c.slots < min then min = c.slots end
  end
  local ties = {}
  for _, c in ipairs(cands) do
    if c.slots == min then ties[#ties + 1] = c end
  end
  if #ties >= 2 then stats.tied = 1 end
  local pick = ties[tonumber(PARG(1 + 2 * k + #ties)) + 1]
  return pick.id, pick.w
end
