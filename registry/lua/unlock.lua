-- unlock.lua: release the reaper's per-pool lock, or renew it, only while
-- this reaper still holds it (its token), so a lock that expired and was
-- taken by another reaper is left alone.
--
-- KEYS: 1 the pool's reaper_lock.
-- ARGV: 1 the holder's token; 2 (optional) a TTL in ms: renew the lock
--   for that long instead of releasing it.
-- Returns: 1 when deleted (or renewed), 0 otherwise.
-- Complexity: O(1).
if redis.call('GET', KEYS[1]) == ARGV[1] then
  if ARGV[2] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
  return redis.call('DEL', KEYS[1])
end
return 0
