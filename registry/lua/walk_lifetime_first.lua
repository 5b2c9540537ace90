-- walk_lifetime_first.lua: the lifetime-first walk (selection.LifetimeFirst),
-- part of walk.lua. idx:lifetime by score (lifetime DESC, active ASC, id
-- ASC): the primary phase above the margin edge, then the fallback phase.
-- It never reaches workers at or past max_lifetime (its fallback range
-- stops at lifetime max_lifetime - 1).
-- Complexity: O(log N + S) for S entries walked.

-- lf_walk walks idx:lifetime between two scores.
local function lf_walk(s, min, max)
  return index_walk(s, 'ZRANGEBYSCORE', K_LF, min, max)
end

WALKS.lifetime_first = function(s)
  local ml = s.cfg.ml
  if ml == 0 then
    return lf_walk(s, '-inf', '+inf')
  end
  local total = redis.call('HLEN', K_WORKERS)
  local margin = 1
  if total > 0 then margin = math.max(1, math.floor(ml / total)) end
  local edge = fmt(-(ml - margin - 1) * LF_SCALE)
  local id, r = lf_walk(s, edge, '+inf')
  if id then return id, r end
  if r then return nil end
  -- Never walk workers at or past max_lifetime (left in the index by a
  -- lowered limit): lifetime <= ml - 1 means score >= -(ml-1) * 2^21.
  return lf_walk(s, fmt(-(ml - 1) * LF_SCALE), '(' .. edge)
end
