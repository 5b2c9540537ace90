-- walk_interleaved_weighted_round_robin.lua: interleaved weighted round
-- robin (selection.InterleavedWeightedRoundRobin), part of walk.lua.
-- idx:iwrr holds "<weight, 6 digits>:<id>" for every indexed worker, so
-- its lex order is (weight, id) and round r is the members from
-- '[<r, 6 digits>' on. The cursor (round, last member) lives in the iwrr
-- hash (fields ' round', ' cur'): two fields per pool, in its slot.
-- The walk follows the cursor: the rest of its round, then round r+1,
-- then round 1, examining each worker once. That is selection's walk:
-- rounds r+2 … W hold only members of round r+1, and rounds 2 … r only
-- members of round 1, all examined by then, so they can pick nobody.
-- A claim moves the cursor to its pick; a Pick moves nothing.
-- Complexity: O(log N + S) for S entries read; an examined entry is read
--   again at most twice, so S <= 3 (max_scan + 128 debris + 1).

-- iwrr_pass walks idx:iwrr from min, skipping workers already examined
-- (seen); returns id, worker, member for the first usable one, or nil,
-- stopped.
local function iwrr_pass(s, seen, min)
  local off, n = 0, FIRST_BATCH
  while true do
    local batch = redis.call('ZRANGEBYLEX', K_IWRR, min, '+', 'LIMIT', off, n)
    for _, m in ipairs(batch) do
      local id = string.sub(m, 8)
      if not seen[id] then
        seen[id] = true
        local w = examine(s, id)
        if w then return id, w, m end
        if exhausted(s) then return nil, true end
      end
    end
    if #batch < n then return nil, false end
    off, n = off + #batch, BATCH
  end
end

-- iwrr_from is the lex bound where round r starts.
local function iwrr_from(r) return '[' .. string.format('%06d', r) end

WALK_INDEX.interleaved_weighted_round_robin = 'iwrr'

WALKS.interleaved_weighted_round_robin = function(s)
  local top = redis.call('ZREVRANGEBYLEX', K_IWRR, '+', '-', 'LIMIT', 0, 1)
  if #top == 0 then return nil end
  top = tonumber(string.sub(top[1], 1, 6))
  local st = redis.call('HMGET', K_IWRRW, ' round', ' cur')
  local round, cur = tonumber(st[1]) or 0, st[2]
  local seen = {}
  local id, w, m, r
  if round >= 1 and round <= top and cur then
    local min = '(' .. cur
    if tonumber(string.sub(cur, 1, 6)) < round then min = iwrr_from(round) end
    id, w, m = iwrr_pass(s, seen, min)
    r = round
    if not id and not w and round + 1 <= top then
      id, w, m = iwrr_pass(s, seen, iwrr_from(round + 1))
      r = round + 1
    end
  end
  if not id and not w then
    id, w, m = iwrr_pass(s, seen, iwrr_from(1))
    r = 1
  end
  if not id then return nil end
  if not s.dry then redis.call('HSET', K_IWRRW, ' round', fmt(r), ' cur', m) end
  return id, w
end
