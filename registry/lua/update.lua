-- update.lua: change one worker: 'draining' sets its status to draining
-- and takes it out of every selection index; 'command' sets its pending
-- command with an expiry (an operator's drain) and takes it out of the
-- indexes too: it takes no new session from now on, not only once its
-- agent hears the command and marks it draining (while the command is
-- live, reindex keeps it out: retire_sync). Either way the worker joins
-- the pool's retiring set (StaggerDrains). 'suspect' marks the
-- worker suspect (walked past by claims) for a while, when its
-- registration is still the given generation, without a lease: a worker
-- whose claim was given back before another worker accepted what it
-- refused (Registry.Suspect).
--
-- KEYS: the pool keys (see common.lua).
-- ARGV: 1 now ms (0: TIME), 2 wakeup channel, 3 pool, 4 id,
--       5 op ('draining' | 'command' | 'suspect'),
--       6 command name ('suspect': the generation blamed),
--       7 command ttl ms ('suspect': how long it is suspect).
-- Returns: 1 when done ('suspect': 2 when the worker registered again
-- since, left alone); {0, reason} when the record is missing or bad.
-- Complexity: O(V log N); 'suspect' O(1).
local now = now_ms(ARGV[1])
local id = ARGV[4]
if ARGV[5] == 'suspect' then
  local w, err = load_worker(id)
  if not w then return { 0, err } end
  if w.gen ~= ARGV[6] then return 2 end
  local till = now + tonumber(ARGV[7])
  if till > w.suspect_until then
    w.suspect_until = till
    store_hot(id, w, load_cfg().win)
  end
  return 1
end
local w, err = decode(redis.call('HGET', K_WORKERS, id))
if not w then return { 0, err } end
if ARGV[5] == 'draining' then
  w.status = 'draining'
  store(id, w)
  unindex(id)
else
  redis.call('HSET', K_CMD, id, ARGV[6] .. '|' .. fmt(now + tonumber(ARGV[7])))
  unindex(id)
end
redis.call('SADD', K_RET, id)
return 1
