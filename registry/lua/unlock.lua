-- unlock.lua: release the reaper's per-pool lock only while this reaper
-- still holds it (its token), so a lock that expired and was taken by
-- another reaper is left alone.
--
-- KEYS: 1 the pool's reaper_lock.
-- ARGV: 1 the holder's token.
-- Returns: 1 when deleted, 0 otherwise.
-- Complexity: O(1).
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
