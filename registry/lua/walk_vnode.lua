-- walk_vnode.lua: the vnode ring with power-of-K choices (selection.Vnode),
-- part of claim.lua. idx:ring holds "<position, 32 hex digits>:<id>" for
-- each of an available worker's ring positions. Each of K samples walks
-- the ring from its pivot, wrapping once, to the first usable worker; the
-- candidate with the fewest live sessions plus its jitter wins, ties by
-- the tiebreak. Full workers cost max_scan budget here, as in selection.
-- Arguments: K, then K pivots, K jitters, the tiebreak (mod 840, which
--   every tie count 1-8 divides).
-- Complexity: O(K log N + S) for S entries walked.

WALKS.vnode = function(s)
  local K, a = s.K, s.args
  local o = s.wa
  local k = tonumber(a[o])
  local cands, seen = {}, {}
  for i = 1, k do
    local pivot, jitter = a[o + i], tonumber(a[o + k + i])
    local id, w = walk(s, 'ZRANGEBYLEX', K.ring, '[' .. pivot, '+', 34, true)
    if not id and not w then
      id, w = walk(s, 'ZRANGEBYLEX', K.ring, '-', '(' .. pivot, 34, true)
    end
    if id then
      if not seen[id] then
        seen[id] = true
        cands[#cands + 1] = { id = id, w = w, slots = w.a + jitter }
      end
    elseif w then
      break -- the budget ran out
    end
  end
  if #cands == 0 then return nil end
  if k == 1 then return cands[1].id, cands[1].w end
  local lo = cands[1].slots
  for i = 2, #cands do lo = math.min(lo, cands[i].slots) end
  local tied = {}
  for _, c in ipairs(cands) do
    if c.slots == lo then tied[#tied + 1] = c end
  end
  local c = tied[(tonumber(a[o + 1 + 2 * k]) % #tied) + 1]
  return c.id, c.w
end
