-- common.lua: what every function of the library shares. Loaded once with
-- the library (FUNCTION LOAD); each function below it binds its call's keys
-- with keyset.
--
-- Every function takes the same KEYS, the layout of registry/keys.go
-- (groupKeyNames): a version group's workers, state, retiring set and
-- indexes, then its pool's sessions, session index, groups and queue. They share
-- one hash tag, so a call touches one Cluster slot.

local function keyset(k)
  return {
    workers = k[1], state = k[2], retiring = k[3],
    lf = k[4], ring = k[5], idle = k[6], busy = k[7], iwrr = k[8],
    sessions = k[9], sindex = k[10], groups = k[11],
    queue = k[12], qalive = k[13], qinfo = k[14],
  }
end

-- SCHEMA is the layout this library reads and writes. A group records
-- the schema that wrote it in its state hash (field ' schema'); a call
-- finding another refuses, naming both, instead of misreading.
local SCHEMA = '1'

local function schema_error(found)
  return redis.error_reply('GRIDSCHEMA the pool was written by registry schema ' .. found ..
    '; this build reads schema ' .. SCHEMA .. ' (CHANGELOG.md says how to upgrade)')
end

-- check_schema returns an error reply when the group was written by
-- another schema, nil otherwise.
local function check_schema(K)
  local s = redis.call('HGET', K.state, ' schema')
  if s and s ~= SCHEMA then return schema_error(s) end
  return nil
end

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- n formats an integer without an exponent.
local function n(x) return string.format('%d', x) end

-- Worker state, one field per worker in K.state:
--   "<status> <active> <lifetime> <capacity> <cap> <heartbeat> <suspect> <hold> <pe> <est>"
-- status: a available, r retiring at its max_lifetime (the claim that
-- brought it there is on its way to the agent), d draining (told by an
-- operator, or the agent drains on its own), x replaced (draining, its
-- replacement serving). capacity is the agent's; cap the cap of the last
-- claim that changed the counts (0: none), which keeps a full worker out
-- of the indexes. heartbeat and suspect are Unix ms; hold is 1 while the
-- agent's previous browser still drains. pe and est are fair share's
-- predicted end (ms) and estimate (ms).
local function get_state(K, id)
  local v = redis.call('HGET', K.state, id)
  if not v then return nil end
  local st, a, l, cr, ch, hb, sus, hold, pe, est = string.match(v,
    '^([ardx]) (%d+) (%d+) (%d+) (%d+) (%d+) (%d+) ([01]) (%d+) (%d+)$')
  if not st then return nil, 'bad' end
  local w = {
    st = st, a = tonumber(a), l = tonumber(l), cr = tonumber(cr), ch = tonumber(ch),
    hb = tonumber(hb), sus = tonumber(sus), hold = hold == '1', pe = tonumber(pe), est = tonumber(est),
  }
  -- where save last put it in the indexes, so that it writes only what moves
  w.was_pe, w.was_est = w.pe, w.est
  w.was_ix = st == 'a' and (w.ch == 0 or w.a < w.ch)
  return w
end

-- Fair share's history, field "<id> f" of K.state: "<window> <median> <default> <d1,d2,...>"
-- (the options of the last fair-share claim on the worker, and the
-- durations in ms of its last window sessions since that first claim,
-- oldest first). A worker no fair-share claim chose has none.
local DEFAULT_ESTIMATE, DEFAULT_WINDOW = 30000, 20

local function get_history(K, id)
  local v = redis.call('HGET', K.state, id .. ' f')
  local h = { window = 0, median = false, default = 0, d = {} }
  if not v then return h end
  local win, med, def, list = string.match(v, '^(%d+) ([01]) (%d+) ?(.*)$')
  if not win then return h end
  h.window, h.median, h.default = tonumber(win), med == '1', tonumber(def)
  for x in string.gmatch(list, '%d+') do h.d[#h.d + 1] = tonumber(x) end
  return h
end

local function put_history(K, id, h)
  local ds = {}
  for i = 1, #h.d do ds[i] = n(h.d[i]) end
  redis.call('HSET', K.state, id .. ' f', n(h.window) .. ' ' .. (h.median and '1' or '0') .. ' ' ..
    n(h.default) .. ' ' .. table.concat(ds, ','))
end

-- estimate is selection.FairShare.Estimate: the default with no history,
-- else the floor of the mean (or the median) of the last window durations.
local function estimate(h, window, median, default)
  if window <= 0 then window, median, default = DEFAULT_WINDOW, false, DEFAULT_ESTIMATE end
  if default <= 0 then default = DEFAULT_ESTIMATE end
  local c = #h.d
  if c == 0 then return default end
  local from = math.max(1, c - window + 1)
  if not median then
    local sum = 0
    for i = from, c do sum = sum + h.d[i] end
    return math.floor(sum / (c - from + 1))
  end
  local s = {}
  for i = from, c do s[#s + 1] = h.d[i] end
  table.sort(s)
  local m = math.floor(#s / 2)
  if #s % 2 == 1 then return s[m + 1] end
  return math.floor((s[m] + s[m + 1]) / 2)
end

-- LF scales a lifetime in idx:lifetime's score, -(lifetime * LF) + active:
-- ascending order is lifetime descending, then active ascending, then id.
local LF = 2097152

-- indexed: the worker belongs in idx:lifetime and the fair indexes.
local function indexed(w)
  return w.st == 'a' and (w.ch == 0 or w.a < w.ch)
end

-- save writes the worker's state and puts it where that state says in the
-- count-ordered indexes (idx:lifetime, idx:fair_idle, idx:fair_busy). A
-- worker read with get_state moves only in the indexes its change moves it
-- in: one no fair-share claim ever chose (pe 0) stays in idx:fair_idle at
-- its estimate. Every write of a state goes through save, which keeps that
-- true.
local function save(K, id, w, now)
  redis.call('HSET', K.state, id, w.st .. ' ' .. n(w.a) .. ' ' .. n(w.l) .. ' ' .. n(w.cr) .. ' ' ..
    n(w.ch) .. ' ' .. n(w.hb) .. ' ' .. n(w.sus) .. ' ' .. (w.hold and '1' or '0') .. ' ' ..
    n(w.pe) .. ' ' .. n(w.est))
  local ix = indexed(w)
  if not ix then
    if w.was_ix ~= false then
      redis.call('ZREM', K.lf, id)
      redis.call('ZREM', K.idle, id)
      redis.call('ZREM', K.busy, id)
    end
  else
    redis.call('ZADD', K.lf, -w.l * LF + w.a, id)
    if w.was_ix and w.pe == 0 and w.was_pe == 0 and w.est == w.was_est then
      -- where it was: idx:fair_idle at the same estimate
    elseif w.pe > now then
      redis.call('ZREM', K.idle, id)
      redis.call('ZADD', K.busy, w.pe + w.est, id)
    else
      redis.call('ZREM', K.busy, id)
      redis.call('ZADD', K.idle, w.est, id)
    end
  end
  w.was_ix, w.was_pe, w.was_est = ix, w.pe, w.est
end

-- The ring and idx:iwrr hold every available worker, full or not (their
-- walks skip the full ones); they change only with its status. rec is the
-- worker's record, decoded.
local function ring_members(id, rec)
  local out = {}
  for _, p in ipairs(rec.ring or {}) do out[#out + 1] = p .. ':' .. id end
  return out
end

local function iwrr_member(id, rec)
  return string.format('%06d', rec.weight or 1) .. ':' .. id
end

local function get_record(K, id)
  local raw = redis.call('HGET', K.workers, id)
  if not raw then return nil end
  local ok, rec = pcall(cjson.decode, raw)
  if not ok or type(rec) ~= 'table' then return nil end
  return rec
end

-- set_available adds the worker to the ring and idx:iwrr, or takes it out.
local function set_available(K, id, on)
  local rec = get_record(K, id)
  if not rec then return end
  for _, m in ipairs(ring_members(id, rec)) do
    if on then redis.call('ZADD', K.ring, 0, m) else redis.call('ZREM', K.ring, m) end
  end
  if on then redis.call('ZADD', K.iwrr, 0, iwrr_member(id, rec)) else redis.call('ZREM', K.iwrr, iwrr_member(id, rec)) end
end

-- set_status moves the worker to status st, with everything that follows:
-- ring and idx:iwrr membership, and the retiring set (r and d count there,
-- a and x do not).
local function set_status(K, id, w, st)
  local was = w.st
  if was == st then return end
  w.st = st
  if (was == 'a') ~= (st == 'a') then set_available(K, id, st == 'a') end
  if st == 'r' or st == 'd' then
    redis.call('SADD', K.retiring, id)
  else
    redis.call('SREM', K.retiring, id)
  end
end

-- Session records, K.sessions field <session id>:
--   "<worker> <version|-> <claimed ms> <p|q|l|e> <client|-> <instance|-> <active ms> <label>"
-- p pending (claimed, not yet reported by the agent), q pending and the
-- worker's last under its claim's max_lifetime, l live, e live and told to
-- end. active is when a data frame last passed, as the agent's heartbeat
-- last reported it (the claim's time until then). K.sindex holds "w <worker> <session>" for every session and
-- "c <client> <session>" for those with a client.
local function get_session(K, sid)
  local v = redis.call('HGET', K.sessions, sid)
  if not v then return nil end
  local wid, ver, claimed, st, client, inst, active, label = string.match(v, '^(%S+) (%S+) (%d+) ([pqle]) (%S+) (%S+) (%d+) ?(.*)$')
  if not wid then return nil end
  return { wid = wid, ver = ver, claimed = tonumber(claimed), st = st, client = client, inst = inst, active = tonumber(active), label = label }
end

local function put_session(K, sid, s)
  redis.call('HSET', K.sessions, sid, s.wid .. ' ' .. s.ver .. ' ' .. n(s.claimed) .. ' ' .. s.st .. ' ' ..
    s.client .. ' ' .. s.inst .. ' ' .. n(s.active or s.claimed) .. ' ' .. s.label)
end

local function new_session(K, sid, s)
  put_session(K, sid, s)
  redis.call('ZADD', K.sindex, 0, 'w ' .. s.wid .. ' ' .. sid)
  if s.client ~= '-' then redis.call('ZADD', K.sindex, 0, 'c ' .. s.client .. ' ' .. sid) end
end

local function drop_session(K, sid, s)
  redis.call('HDEL', K.sessions, sid)
  redis.call('ZREM', K.sindex, 'w ' .. s.wid .. ' ' .. sid)
  if s.client ~= '-' then redis.call('ZREM', K.sindex, 'c ' .. s.client .. ' ' .. sid) end
end

-- worker_sessions lists the session ids of a worker.
local function worker_sessions(K, wid)
  local prefix = 'w ' .. wid .. ' '
  local out = {}
  for _, m in ipairs(redis.call('ZRANGEBYLEX', K.sindex, '[' .. prefix, '[' .. prefix .. '\255')) do
    out[#out + 1] = string.sub(m, #prefix + 1)
  end
  return out
end

-- remove_worker deletes a worker and its sessions. Returns the sessions
-- dropped.
local function remove_worker(K, id)
  local rec = get_record(K, id)
  if rec then
    for _, m in ipairs(ring_members(id, rec)) do redis.call('ZREM', K.ring, m) end
    redis.call('ZREM', K.iwrr, iwrr_member(id, rec))
  end
  redis.call('ZREM', K.lf, id)
  redis.call('ZREM', K.idle, id)
  redis.call('ZREM', K.busy, id)
  redis.call('SREM', K.retiring, id)
  redis.call('HDEL', K.workers, id)
  redis.call('HDEL', K.state, id, id .. ' f')
  local dropped = 0
  for _, sid in ipairs(worker_sessions(K, id)) do
    local s = get_session(K, sid)
    if s then drop_session(K, sid, s) else redis.call('ZREM', K.sindex, 'w ' .. id .. ' ' .. sid) end
    dropped = dropped + 1
  end
  return dropped
end

-- wakeup tells the waiting requests of every Caddy that a slot may be
-- free: pub/sub channel "<pool tag>:wakeup" (K.groups is "<pool tag>:groups").
local function wakeup(K)
  redis.call('PUBLISH', string.sub(K.groups, 1, -7) .. 'wakeup', '1')
end

-- The pool's queue of waiting requests, across every Caddy instance:
-- K.queue ZSET waiter -> arrival number (HINCRBY of K.qinfo's ' seq'),
-- K.qalive ZSET waiter -> deadline (Unix ms) its instance keeps pushing
-- back, K.qinfo HASH waiter -> "<grant ms> <joined ms> <versions>|<avoid>"
-- (the versions of the pool's groups it may claim in, '-' the pool's own).
-- grant is when a younger request first found a worker this waiter could
-- take (0: none since); the waiter holds it for GRANT_MS, then it passes.
local GRANT_MS, QUEUE_SCAN = 250, 128

local function queue_drop(K, m)
  redis.call('ZREM', K.queue, m)
  redis.call('ZREM', K.qalive, m)
  redis.call('HDEL', K.qinfo, m)
end

-- queue_prune drops the waiters whose instance stopped keeping them.
local function queue_prune(K, now)
  for _, m in ipairs(redis.call('ZRANGEBYSCORE', K.qalive, '-inf', '(' .. n(now), 'LIMIT', 0, 64)) do
    queue_drop(K, m)
  end
end

local function get_waiter(K, m)
  local v = redis.call('HGET', K.qinfo, m)
  if not v then return nil end
  local grant, joined, versions, avoid = string.match(v, '^(%d+) (%d+) ([^|]*)|(.*)$')
  if not grant then return nil end
  return { grant = tonumber(grant), joined = tonumber(joined), versions = ' ' .. versions .. ' ', avoid = ' ' .. avoid .. ' ' }
end

local function put_waiter(K, m, q)
  redis.call('HSET', K.qinfo, m, n(q.grant) .. ' ' .. n(q.joined) .. ' ' .. string.sub(q.versions, 2, -2) .. '|' .. string.sub(q.avoid, 2, -2))
end

-- queue_ahead returns the waiter ahead of waiter ('-': a request not
-- queued) that may take worker id of version: alive, waiting for it,
-- not avoiding it, and holding its grant. Finding one grants it, once,
-- and wakes the instances so its own claims.
local function queue_ahead(K, now, waiter, version, id)
  if redis.call('ZCARD', K.queue) == 0 then return nil end
  local stop = QUEUE_SCAN - 1
  if waiter ~= '-' then
    local r = redis.call('ZRANK', K.queue, waiter)
    if r then
      local q = get_waiter(K, waiter)
      if q and q.grant > 0 and now - q.grant >= GRANT_MS then
        -- back after its grant passed: it may hold the next one
        q.grant = 0
        put_waiter(K, waiter, q)
      end
      if r == 0 then return nil end
      stop = math.min(stop, r - 1)
    end
  end
  for _, m in ipairs(redis.call('ZRANGE', K.queue, 0, stop)) do
    local dl = redis.call('ZSCORE', K.qalive, m)
    local q = dl and tonumber(dl) >= now and get_waiter(K, m)
    if not q then
      queue_drop(K, m)
    elseif string.find(q.versions, ' ' .. version .. ' ', 1, true) and not string.find(q.avoid, ' ' .. id .. ' ', 1, true) then
      if q.grant == 0 then
        q.grant = now
        put_waiter(K, m, q)
        wakeup(K)
        return m
      end
      if now - q.grant < GRANT_MS then return m end
    end
  end
  return nil
end
