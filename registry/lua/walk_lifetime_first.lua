-- walk_lifetime_first.lua: the lifetime-first rule (selection.LifetimeFirst),
-- part of claim.lua. It walks idx:lifetime (lifetime descending, active
-- ascending, id ascending): first the workers below max_lifetime - margin,
-- then those in the margin, never one at or past max_lifetime.
-- margin = max(1, floor(max_lifetime / workers)), workers the records.
-- Arguments: none.
-- Complexity: O(log N + S) for S entries walked.

WALKS.lifetime_first = function(s)
  local K, ml = s.K, s.ml
  if ml == 0 then return walk(s, 'ZRANGEBYSCORE', K.lf, '-inf', '+inf') end
  local total = redis.call('HLEN', K.workers)
  local margin = math.max(1, math.floor(ml / math.max(total, 1)))
  -- lifetime < ml - margin  <=>  score >= -(ml - margin - 1) * LF
  local edge = n(-(ml - margin - 1) * LF)
  local id, w = walk(s, 'ZRANGEBYSCORE', K.lf, edge, '+inf')
  if id or w then return id, w end
  return walk(s, 'ZRANGEBYSCORE', K.lf, n(-(ml - 1) * LF), '(' .. edge)
end
