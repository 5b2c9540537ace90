-- update.lua: change one worker: 'draining' sets its status to draining
-- and takes it out of every selection index; 'command' sets its pending
-- command with an expiry (an operator's drain). Either way the worker
-- joins the pool's retiring set (StaggerDrains).
--
-- KEYS: the pool keys (see common.lua).
-- ARGV: 1 now ms (0: TIME), 2 wakeup channel, 3 pool, 4 id,
--       5 op ('draining' | 'command'), 6 command name, 7 command ttl ms.
-- Returns: 1 when done; {0, reason} when the record is missing or bad.
-- Complexity: O(V log N).
local now = now_ms(ARGV[1])
local id = ARGV[4]
local w, err = decode(redis.call('HGET', K_WORKERS, id))
if not w then return { 0, err } end
if ARGV[5] == 'draining' then
  w.status = 'draining'
  store(id, w)
  unindex(id)
else
  redis.call('HSET', K_CMD, id, ARGV[6] .. '|' .. fmt(now + tonumber(ARGV[7])))
end
redis.call('SADD', K_RET, id)
return 1
