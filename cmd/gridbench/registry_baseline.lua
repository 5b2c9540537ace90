-- registry_baseline.lua: the baseline of gridbench's registry section: a
-- select-and-claim written as the lifetime-first rule first described its selector.lua, an O(N)
-- walk. It reads every worker's counters with HGETALL, then for each worker
-- of the pool its key's TTL and HMGET of its record, filters the eligible
-- ones, applies the lifetime-first rule's margin, primary and fallback phases, and claims
-- (HINCRBY of both counters). Worker keys are built in the script, as the
-- seed's layout requires: it runs on a single node only.
--
-- KEYS: 1 active counters HASH "<pool>:<id>" -> n, 2 lifetime counters HASH.
-- ARGV: 1 pool, 2 max_concurrent, 3 max_lifetime, 4 now (s), 5 stale (s),
--       6 worker key prefix (worker key = prefix .. "<pool>:<id>").
-- Returns: the claimed "<pool>:<id>", or false when none is eligible.
-- Complexity: O(N) in the workers of all pools sharing the counters.
local pool, mc, ml = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local now, stale, kp = tonumber(ARGV[4]), tonumber(ARGV[5]), ARGV[6]
local active = {}
local a = redis.call('HGETALL', KEYS[1])
for i = 1, #a, 2 do active[a[i]] = tonumber(a[i + 1]) end
local life = redis.call('HGETALL', KEYS[2])
local prefix = pool .. ':'
local eligible, total = {}, 0
for i = 1, #life, 2 do
  local field = life[i]
  if string.sub(field, 1, #prefix) == prefix then
    local key = kp .. field
    if redis.call('TTL', key) ~= -2 then
      total = total + 1
      local rec = redis.call('HMGET', key, 'status', 'lastHeartbeat')
      local lt, ac = tonumber(life[i + 1]) or 0, active[field] or 0
      if rec[1] == 'available' and ac < mc and lt < ml and now - (tonumber(rec[2]) or 0) <= stale then
        eligible[#eligible + 1] = { field = field, life = lt, active = ac }
      end
    end
  end
end
local margin = math.max(1, math.floor(ml / math.max(total, 1)))
local function best(pred)
  local b
  for _, w in ipairs(eligible) do
    if pred(w) and (not b or w.life > b.life or (w.life == b.life and w.active < b.active)) then b = w end
  end
  return b
end
local w = best(function(x) return x.life < ml - margin end) or best(function(x) return x.life + 1 <= ml end)
if not w then return false end
redis.call('HINCRBY', KEYS[1], w.field, 1)
redis.call('HINCRBY', KEYS[2], w.field, 1)
return w.field
