-- register.lua: write (or rewrite) a worker's record, status available,
-- its ring positions, and put it in the selection indexes the pool's stored
-- config says it belongs in. A rewrite first removes what the previous
-- registration wrote (its old positions may differ).
--
-- The generation names the registration's browser process. Its active
-- count is always its own generation's live leases (a new process has
-- none); leases of another generation no longer move its counters. A
-- different generation than the stored record's starts afresh otherwise
-- (lifetime, durations, command). The same generation, or no stored
-- record at all (it expired, was reaped, or Redis lost it), continues what
-- the worker had: its active count is its generation's live leases, and
-- its lifetime the highest of the stored one (same generation), the one
-- the agent re-asserts, the lifetimes its live leases recorded, the one
-- kept when its record lapsed (lapsed, common.lua), and its active count;
-- its durations and a live shutdown command are kept. A
-- worker so brought to or past the stored lifetime limit gets its shutdown
-- command.
--
-- KEYS: the pool keys (see common.lua).
-- ARGV: 1 now ms (0: TIME), 2 wakeup channel, 3 pool,
--       4 id, 5 browser, 6 addr, 7 path, 8 capacity, 9 V, 10 ttl ms,
--       11 generation (no spaces), 12 ring positions (hex, space separated),
--       13 lifetime the agent re-asserts, 14 command ttl ms,
--       15 '1' to register as draining (an agent draining when its record was lost),
--       16 signature (hex HMAC made by the agent; '' for none: the record has no sig),
--       17 weight (interleaved weighted round robin, 1-10000),
--       18 hold ms, for an agent registering again after its record was
--          lost: when the pool's data was lost too (no dataset epoch, or
--          one made less than that long ago, by the first claim after the
--          loss or a claimer's epoch watch: lease.lua 'epoch'), the worker
--          is suspect that long from now, so that the claimers that served
--          it re-assert what Redis lost before a new session counts on it
--          (a raise takes the higher count, it does not add). A record
--          that merely lapsed kept its count (lapsed): no hold, but where
--          the pool has no epoch at all (a lapse cannot be told from a
--          loss). An epoch_at ahead of this Redis' clock holds nothing.
--          0: none.
--       19 '1': exclusive (see above).
-- With ARGV 19 '1' (the browser is the only one at its address and path),
-- an available record of another id registered so at the same address and
-- path is removed (addrs, below).
-- Writes the record, its counters and its hot figures (common.lua, "Hot
-- figures": a new registration starts with no predicted end or suspicion;
-- the same generation keeps its predicted end).
-- Returns: {active, lifetime} as registered.
-- Complexity: O(V log N) plus O(A log L) for A live leases of the worker.
local now = now_ms(ARGV[1])
local id, gen = ARGV[4], ARGV[11]
local prev, why = load_worker(id)
local same = prev ~= nil and prev.gen == gen
-- its address, when it moved, is no longer its
if prev and (prev.addr ~= ARGV[6] or prev.path ~= ARGV[7]) then addr_forget(id, prev) end
-- Another record at this address and path (a browser restarted at a fixed
-- port under a new id, the crashed one before it never deregistered):
-- claims through it would reach this browser beside this record's, past
-- its cap and its lifetime, until it went stale. It goes, as a
-- deregistration would (its leases stay, as a stale expiry's). A draining
-- one stays: it takes no session, and an agent's hand-over to the browser
-- it respawned at the same port removes it itself.
if ARGV[19] == '1' then
  local here = addr_key(ARGV[6], ARGV[7])
  local other = redis.call('HGET', K_ADDRS, here)
  if other and other ~= id then
    local o = decode(redis.call('HGET', K_WORKERS, other))
    if o and o.addr == ARGV[6] and o.path == ARGV[7] and o.status == 'available' then
      expire_worker(other, o, now, false)
    end
  end
  redis.call('HSET', K_ADDRS, here, id)
end
-- Carry on: the same generation, or nothing stored (a bad record is
-- replaced as a new registration).
local carry = same or why == 'missing'
unindex(id)
local w = {
  id = id, browser = ARGV[5], addr = ARGV[6], path = ARGV[7], status = 'available', gen = gen,
  capacity = tonumber(ARGV[8]), vnodes = tonumber(ARGV[9]), heartbeat = now, registered = now,
  expires = now + tonumber(ARGV[10]), suspect_until = 0, predicted_end = 0,
  active = 0, lifetime = 0, durations = {}, dur_raw = '',
}
if ARGV[15] == '1' then w.status = 'draining' end
-- The generation's live leases are its sessions whatever was stored
-- before (claims and releases move the count by one from here, so it must
-- start equal to them): none for a new browser process, but an earlier
-- generation registering again, or one whose record had gone bad, has
-- some.
w.active = owner_count(id, gen)
w.lifetime = w.active
if carry then
  w.lifetime = math.max(tonumber(ARGV[13]) or 0, w.active, owned_life(id, gen), lapsed_life(id, gen, now))
  if same then
    w.lifetime = math.max(w.lifetime, prev.lifetime)
    w.durations, w.dur_raw = prev.durations, prev.dur_raw
    w.fs_win, w.fs_len, w.fs_sum = prev.fs_win, prev.fs_len, prev.fs_sum
    w.registered = prev.registered
    w.predicted_end = prev.predicted_end
  else
    -- kept as stored; a list that does not parse is kept too, and counted
    -- as empty until a read finds it (the hot figures, counted from '',
    -- match no stored list)
    local d, raw = load_durations(id)
    if d then w.durations, w.dur_raw = d, raw end
  end
end
if ARGV[16] and ARGV[16] ~= '' then w.sig = ARGV[16] end
local hold = tonumber(ARGV[18]) or 0
if hold > 0 then
  local e = redis.call('HMGET', K_CFG, 'epoch', 'epoch_at')
  local at = count(e[2])
  -- an epoch without its time was made by an older version: not new; one
  -- ahead of this Redis' clock (a promoted replica's clock behind) is
  -- not taken as new either, or the skew would hold every registration.
  -- No epoch at all cannot be told from a loss: held.
  if not e[1] or (at and now >= at and now - at < hold) then w.suspect_until = now + hold end
end
store(id, w)
redis.call('HSET', K_ACTIVE, id, fmt(w.active))
redis.call('HSET', K_LIFETIME, id, fmt(w.lifetime))
redis.call('HDEL', K_LAPSED, id)
if not carry then
  redis.call('HDEL', K_DUR, id)
  redis.call('HDEL', K_CMD, id)
  cfg_del('drain_seen:' .. id)
elseif not same and w.active == 0 and w.lifetime == 0 then
  -- Nothing shows this is the process whose record was removed (no live
  -- session, no lifetime): a command kept for that one is not for it.
  redis.call('HDEL', K_CMD, id)
end
redis.call('HSET', K_VPOS, id, ARGV[12])
redis.call('HSET', K_IWRRW, id, ARGV[17])
local cfg = load_cfg()
if carry then
  -- a live shutdown command kept (an operator's drain of a worker whose
  -- record lapsed) makes it a member again, so that reindex keeps it out
  -- of the indexes until its agent hears (retire_sync)
  if live_command(id, now) then redis.call('SADD', K_RET, id) end
  command_if_spent(id, w, cfg, now, tonumber(ARGV[14]) or 0)
end
reindex(id, w, cfg, now)
store_hot(id, w, cfg.win)
wake()
return { w.active, w.lifetime }
