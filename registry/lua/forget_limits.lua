-- forget_limits.lua: drop the limits a pool stores (and their time) when
-- they carry exactly the given configuration time: those of a
-- configuration that went away (ClaimRequest.Supersedes, Registry.
-- ForgetLimits). The pool's next claim then stores its own, as on a pool
-- that never had any, and the newest configuration still claiming wins
-- again from there. Limits stored with any other time are left alone.
--
-- KEYS: 1 the pool's config hash.
-- ARGV: 1 the configuration time, ms.
-- Returns: 1 when dropped, 0 otherwise.
-- Complexity: O(1).
local at = redis.call('HGET', KEYS[1], 'set_at')
if at and tonumber(at) == tonumber(ARGV[1]) then
  redis.call('HDEL', KEYS[1], 'max_concurrent', 'max_lifetime', 'stagger_drains', 'set_at',
    'fs_window', 'fs_median', 'fs_default_ms')
  return 1
end
return 0
