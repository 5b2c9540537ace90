-- walk_lifetime_first.lua: the lifetime-first walk (selection.LifetimeFirst),
-- part of claim.lua. idx:lifetime by score (lifetime DESC, active ASC, id
-- ASC): the primary phase above the margin edge, then the fallback phase.
-- It never reaches workers at or past max_lifetime (its fallback range
-- stops at lifetime max_lifetime - 1).
-- Complexity: O(log N + S) for S entries walked.

-- lf_walk walks idx:lifetime between two scores.
local function lf_walk(min, max)
  return index_walk('ZRANGEBYSCORE', K_LF, min, max, function(m) return m end)
end

WALKS.lifetime_first = function()
  if ml == 0 then
    return lf_walk('-inf', '+inf')
  end
  local total = redis.call('HLEN', K_WORKERS)
  local margin = 1
  if total > 0 then margin = math.max(1, math.floor(ml / total)) end
  local edge = fmt(-(ml - margin - 1) * LF_SCALE)
  local id, r = lf_walk(edge, '+inf')
  if id then return id, r end
  if r then return nil end
  -- Never walk workers at or past max_lifetime (left in the index by a
  -- lowered limit): lifetime <= ml - 1 means score >= -(ml-1) * 2^21.
  return lf_walk(fmt(-(ml - 1) * LF_SCALE), '(' .. edge)
end
