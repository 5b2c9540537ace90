-- put.lua (tests only): write a worker with chosen figures, as if its agent
-- had registered and claims had run, and put it in the indexes its figures
-- call for, the retiring set included (reindex: draining or at the stored
-- lifetime limit), with as many never-expiring leases as its active count.
-- Lets tests build any pool state, including ones the real scripts only
-- reach over time.
--
-- KEYS: the pool keys (see common.lua).
-- ARGV: 1 now ms (0: TIME), 2 wakeup channel, 3 pool, 4 id, 5 record (JSON),
--       6 active, 7 lifetime, 8 durations ("ms,ms"), 9 ring positions,
--       10 weight (optional, default 1).
-- Returns: 1 when the worker parses and was indexed as its figures say, 0 if it does not parse.
-- Complexity: O(V log N).
local now = now_ms(ARGV[1])
local id = ARGV[4]
unindex(id)
redis.call('HSET', K_WORKERS, id, ARGV[5])
redis.call('HSET', K_ACTIVE, id, ARGV[6])
redis.call('HSET', K_LIFETIME, id, ARGV[7])
if ARGV[8] == '' then redis.call('HDEL', K_DUR, id) else redis.call('HSET', K_DUR, id, ARGV[8]) end
redis.call('HSET', K_VPOS, id, ARGV[9])
redis.call('HSET', K_IWRRW, id, ARGV[10] or '1')
-- no hot figures: the record's predicted_end and suspect_until stand (as
-- for a record written by a version without them), and the list is counted
redis.call('HDEL', K_HOT, id)
local w = load_worker(id)
if not w then return 0 end
-- A worker's active count is its generation's leases (common.lua): write
-- that many leases that never expire, so later scripts count them.
local lo, hi = owner_range(id, w.gen)
for _, m in ipairs(redis.call('ZRANGEBYLEX', K_OWNER, lo, hi)) do
  redis.call('HDEL', K_LEASES, string.sub(m, #id + #w.gen + 3))
end
redis.call('ZREMRANGEBYLEX', K_OWNER, lo, hi)
for i = 1, w.active do
  local lid = 'put-' .. id .. '-' .. i
  redis.call('HSET', K_LEASES, lid, cjson.encode({ worker = id, gen = w.gen, claimed = now, life = w.lifetime }))
  redis.call('ZADD', K_OWNER, 0, owner_member(id, w.gen, lid))
end
reindex(id, w, load_cfg(), now)
return 1
