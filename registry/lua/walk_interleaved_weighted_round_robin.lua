-- walk_interleaved_weighted_round_robin.lua: interleaved weighted round
-- robin (selection.InterleavedWeightedRoundRobin), part of claim.lua.
-- idx:iwrr holds "<weight, 6 digits>:<id>" for every available worker, so
-- lex order is (weight, id); round r is the members of weight >= r. The
-- cursor (state field ' iwrr': "<round> <weight> <id>") is the last pick;
-- the walk follows it: the rest of its round, the later rounds, the earlier
-- ones, then its round up to it. Each worker is examined once. Rounds only
-- shrink as r grows, so once a round holds nothing new the rest of that run
-- of rounds is skipped.
-- Arguments: none.
-- Complexity: O(log N + S) per round read, S entries.

WALKS.interleaved_weighted_round_robin = function(s)
  local K = s.K
  local last = redis.call('ZRANGE', K.iwrr, -1, -1)
  if #last == 0 then return nil end
  local top = tonumber(string.sub(last[1], 1, 6))
  local cr, cw, cid = string.match(redis.call('HGET', K.state, ' iwrr') or '', '^(%d+) (%d+) (%S+)$')
  cr, cw = tonumber(cr), tonumber(cw)
  local runs = {}
  local function round(r) return '[' .. string.format('%06d', r) .. ':' end
  if not cr or cr > top then
    runs[1] = { from = 1, to = top }
  else
    local cm = string.format('%06d', cw) .. ':' .. cid
    runs[1] = { from = cr, to = cr, lo = '(' .. cm, hi = '+' }
    runs[2] = { from = cr + 1, to = top }
    runs[3] = { from = 1, to = cr - 1 }
    runs[4] = { from = cr, to = cr, lo = round(cr), hi = '[' .. cm }
  end
  local seen = {}
  for _, run in ipairs(runs) do
    for r = run.from, run.to do
      s.fresh = false
      local id, w, m = walk(s, 'ZRANGEBYLEX', K.iwrr, run.lo or round(r), run.hi or '+', 8, false, seen)
      if id then
        if not s.dry then
          redis.call('HSET', K.state, ' iwrr', n(r) .. ' ' .. n(tonumber(string.sub(m, 1, 6))) .. ' ' .. id)
        end
        return id, w
      end
      if w then return nil end
      if not s.fresh then break end
    end
  end
  return nil
end
