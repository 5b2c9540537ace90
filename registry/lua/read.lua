-- read.lua: raw figures of one worker, or of one chunk of the pool's
-- workers, for Worker and Inspect (decoded and checked in Go). It only
-- reads: Go runs it with FCALL_RO, so it may go to a replica. The pool
-- is read in chunks (HSCAN with a COUNT) so that no call blocks Redis for
-- long at any pool size; Go calls again with the returned cursor until it
-- is '0'. Each chunk is atomic, the whole is not: a worker registered or
-- removed meanwhile may or may not appear, one present throughout appears
-- (possibly twice: Go keeps one).
--
-- KEYS: the pool keys (see common.lua).
-- ARGV: the common three, then registry/contract.go's readArgs: id ('' =
--   the pool), cursor ('0' to start), chunk (HSCAN COUNT).
-- Returns: reply{...} with contract.go's readReply fields: now, leases
--   (live leases: lease_owner's entries, one per lease; leases also holds
--   tombstones), config (flat HGETALL, in a pool's first chunk only: Go
--   reads it there, and a config hash swollen by a hand or hostile write
--   must not be sent again with every chunk), rows, retiring, cursor,
--   where rows is a flat
--   list of readRow's fields per worker, added by add_row (id, record,
--   active, lifetime, durations, command, hot figures; '' for a missing
--   value), retiring the
--   members of the retiring set (first chunk of a pool only) and cursor
--   the next one ('0': done).
-- Complexity: O(1) for one worker; O(C) per chunk of C workers, plus O(R)
--   for R members of the retiring set in the first chunk.
local now = now_ms(ARGV[1])
local function s(v)
  if v then return v end
  return ''
end
local rows = {}
local function row(id, rec)
  add_row(rows, {
    id = id, record = s(rec), active = s(redis.call('HGET', K_ACTIVE, id)),
    lifetime = s(redis.call('HGET', K_LIFETIME, id)), durations = s(redis.call('HGET', K_DUR, id)),
    command = s(redis.call('HGET', K_CMD, id)), hot = s(redis.call('HGET', K_HOT, id)),
  })
end
local id, cursor, retiring, config = ARGV[REQ.id], '0', {}, {}
if id ~= '' then
  local rec = redis.call('HGET', K_WORKERS, id)
  if rec then row(id, rec) end
else
  local res = redis.call('HSCAN', K_WORKERS, ARGV[REQ.cursor], 'COUNT', tonumber(ARGV[REQ.chunk]))
  cursor = res[1]
  local kv = res[2]
  for i = 1, #kv, 2 do row(kv[i], kv[i + 1]) end
  if ARGV[REQ.cursor] == '0' then
    retiring = redis.call('SMEMBERS', K_RET)
    config = redis.call('HGETALL', K_CFG)
  end
end
return reply {
  now = now, leases = redis.call('ZCARD', K_OWNER), config = config, rows = rows,
  retiring = retiring, cursor = cursor,
}
