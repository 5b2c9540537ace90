-- common.lua: helpers shared by every registry script. It is prepended to
-- each script when the package loads, so every script sees the same KEYS
-- layout and the same record rules.
--
-- KEYS (every script gets all of them, built by poolKeys in keys.go; all share
-- the hash tag {<prefix>:<pool>} so a script touches one Cluster slot):
--   1 workers        HASH id -> worker record (JSON object, see decode)
--   2 active         HASH id -> live sessions (integer)
--   3 lifetime       HASH id -> sessions claimed since registration (integer)
--   4 durations      HASH id -> recent session durations in ms, "d1,d2,..." oldest first
--   5 commands       HASH id -> "shutdown|<expires ms>"
--   6 vnodes         HASH id -> the worker's ring positions, 32 hex chars each, space separated
--   7 leases         HASH lease id -> lease (JSON object), or the lease's tombstone
--                    'ended:<forget at ms>' once it was released, undone or
--                    cancelled (see "Leases")
--   8 lease_expiry   ZSET lease id, score = expiry (ms) of a lease, or when to
--                    forget a tombstone
--   9 config         HASH the pool's limits in force: max_concurrent, max_lifetime,
--                    stagger_drains, fs_window, fs_median, fs_default_ms, set_at
--                    (ms, the time of the configuration that brought them; the
--                    newest wins, see claim.lua), stale_after_ms, max_scan
--                    of the last claim, and restarting (see restart_turn)
--  10 idx:lifetime   ZSET indexed workers, score = -lifetime * 2^21 + active
--  11 idx:ring       ZSET (all scores 0) "<pos hex>:<id>" for every indexed worker
--  12 idx:fair_idle  ZSET indexed workers whose predicted end has passed, score = estimate (ms)
--  13 idx:fair_busy  ZSET the other indexed workers, score = predicted end + estimate (ms)
--  14 idx:fair_end   ZSET the same workers as idx:fair_busy, score = predicted end (ms)
--  15 retiring       SET workers that may be retiring: draining, at the lifetime
--                    limit, or with a shutdown command (see retire_sync)
--  16 lease_owner    ZSET (lex, all scores 0) "<worker id> <gen> <lease id>" for
--                    every lease: who owns it, by worker and registration generation
--  17 cancelled      ZSET tombstones of a version before tombstones moved into
--                    leases (lease id, score = when to forget it, ms): nothing
--                    reads it; reconcile forgets its due entries (rolling upgrade)
--  18 lease_client   ZSET (lex, all scores 0) "<client hash> <lease id>" for
--                    every lease claimed with a client key (see "Clients")
--  19 idx:iwrr       ZSET (lex, all scores 0) "<weight, 6 digits>:<id>" for every
--                    indexed worker (interleaved weighted round robin)
--  20 iwrr           HASH id -> the worker's weight; and the round robin's
--                    cursor in fields ' round' and ' cur' (no id has a space)
--  21 hot            HASH id -> the figures claims and releases change (see
--                    "Hot figures"): "<predicted end> <suspect until>", then
--                    optionally " <window> <count> <window sum> <durations>"
--  22 lapsed         HASH id -> "<gen> <lifetime> <forget at ms>": the lifetime of
--                    a worker whose record lapsed (stale expiry), kept for its
--                    comeback (see lapsed_entry)
--
-- ARGV common to every script: 1 now in ms (0: Redis TIME), 2 the pool's
-- wakeup channel, 3 the pool name. Script-specific arguments follow.
--
-- Invariant kept by every script: a worker is in idx:lifetime, and in each
-- kept one of idx:ring (all V positions), idx:fair_idle / idx:fair_busy
-- (exactly one of the two) and idx:iwrr, exactly when it is "indexed"
-- (status available, below its cap, below the lifetime limit) under the
-- pool's stored config and holds no live shutdown command (an operator's
-- drain takes no new session: retire_sync), as of the last script that
-- touched the worker (a command that lapses unheard gives the worker back
-- at its next heartbeat, release or reconcile);
-- an index being built holds that for the workers it has met (see "Kept
-- indexes"). When the stored limits change nothing rebuilds
-- the indexes (that would be O(N) in one script): they converge worker by
-- worker. A claim treats an entry whose worker is not indexed under the
-- current limits as debris and removes it; every heartbeat, claim and
-- release reindexes the worker it touches, so a worker that became
-- indexed (a limit was raised) is back within one heartbeat interval.
--
-- Second invariant: every worker that is draining, at or past the stored
-- lifetime limit, or has a shutdown command is in retiring (a superset: a
-- claim checks each member's figures before it counts, and may drop the
-- ones that no longer qualify). Every path that can make a worker retiring
-- (reindex after a claim or a limits change, update.lua) adds it; removal
-- (remove_worker, a new registration, an undo) takes it out.

local K_WORKERS, K_ACTIVE, K_LIFETIME, K_DUR, K_CMD, K_VPOS = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local K_LEASES, K_LEXP, K_CFG = KEYS[7], KEYS[8], KEYS[9]
local K_LF, K_RING, K_FSI, K_FSB, K_FSP = KEYS[10], KEYS[11], KEYS[12], KEYS[13], KEYS[14]
local K_RET = KEYS[15]
local K_OWNER, K_TOMB = KEYS[16], KEYS[17]
local K_CLIENT = KEYS[18]
local K_IWRR, K_IWRRW = KEYS[19], KEYS[20]
local K_HOT = KEYS[21]
local K_LAPSED = KEYS[22]
local K_ADDRS = KEYS[23]

-- Lifetime-first score: lifetime descending, then active ascending; members
-- with equal scores sort by id bytes, which gives the ID ASC tiebreak.
local LF_SCALE = 2097152

local function fmt(n)
  return string.format('%d', n)
end

local function now_ms(arg)
  local n = tonumber(arg)
  if n and n > 0 then return n end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- is_count: a whole number in [0, 2^53) (n % 1 is 0 only for a whole
-- finite number: NaN and the infinities give NaN).
local function is_count(n)
  return type(n) == 'number' and n >= 0 and n % 1 == 0 and n < 9007199254740992
end

-- Byte-order string comparison (Lua's < uses strcoll, which follows the
-- server's locale).
local function bytes_less(a, b)
  local n = math.min(#a, #b)
  for i = 1, n do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return #a < #b
end

-- The batch memo. A batched call (registry/scripts.go's manyLua: several
-- claims, or several lease ends, of one pool in one FCALL) gets a table
-- shared by the calls of its batch as ARGV.memo, which bind() puts in
-- MEMO; any other call has none (Redis' own args table has no such field),
-- so nothing one FCALL keeps can reach another. The calls of a batch run
-- back to back in one atomic function, so what one read stays true for the
-- next until one of them writes it. Two reads are kept: the config hash's
-- HMGET (cfg, with cfg_lf, the index key it was read for: a batch's calls
-- share their keys, the check only guards that), dropped by every write to
-- the config hash, which goes through cfg_set / cfg_del; and the decoded
-- records (rec, see decoded), which a write cannot make stale.
local MEMO = nil

-- cfg_set and cfg_del are the only writes to the config hash (a test reads
-- the scripts for any other): each drops the batch memo's copy.
local function cfg_set(...)
  if MEMO then MEMO.cfg = nil end
  return redis.call('HSET', K_CFG, ...)
end

local function cfg_del(...)
  if MEMO then MEMO.cfg = nil end
  return redis.call('HDEL', K_CFG, ...)
end

-- load_cfg reads the pool's limits in force (config hash): the limits
-- the newest configuration brought (claim.lua decides), set_at (ms) being
-- that configuration's time (nil: never set), stale_after_ms and max_scan,
-- kept from the last claim, and the dataset's epoch (nil: none yet). One
-- HMGET: a claim reads the whole config once (profile item 7); in a batch,
-- once for all its calls until one writes the hash (see MEMO). Each call
-- gets a table of its own: callers change theirs.
local function load_cfg()
  -- the config hash is the pool's, the indexes are the version group's:
  -- a group's fields are named after it ('v=1.65:ix', ...; see keys.go)
  local m, v, ixf = MEMO, nil, nil
  if m and m.cfg and m.cfg_lf == K_LF then
    v, ixf = m.cfg, m.cfg_ixf
  else
    ixf = string.sub(K_LF, #K_CFG - #'config' + 1, #K_LF - #'idx:lifetime') .. 'ix'
    v = redis.call('HMGET', K_CFG, 'max_concurrent', 'max_lifetime', 'fs_window', 'fs_median', 'fs_default_ms',
      'stagger_drains', 'set_at', 'stale_after_ms', 'max_scan', 'epoch', ixf, ixf .. ':ring', ixf .. ':fair',
      ixf .. ':iwrr', 'server', 'restored_at')
    if m then m.cfg, m.cfg_lf, m.cfg_ixf = v, K_LF, ixf end
  end
  -- the kept indexes (see "Kept indexes"): all of them until a claim
  -- settled which ('ix' unset, and no 'ix:<name>' either: one without
  -- the other is a hand edit, not a pool every index was kept for)
  local ix = { ring = v[12] or nil, fair = v[13] or nil, iwrr = v[14] or nil }
  local settled = v[11] ~= false or ix.ring ~= nil or ix.fair ~= nil or ix.iwrr ~= nil
  return {
    mc = tonumber(v[1]) or 0,
    ml = tonumber(v[2]) or 0,
    win = tonumber(v[3]) or 20,
    med = v[4] == '1',
    def = tonumber(v[5]) or 30000,
    stagger = v[6] == '1',
    set_at = tonumber(v[7]),
    stale = tonumber(v[8]) or 0,
    scan = tonumber(v[9]),
    -- HMGET gives false for a missing field
    epoch = v[10] or nil,
    -- the server process the epoch was last checked on (claim.lua)
    server = v[15] or nil,
    -- when the last claim gave the pool a new epoch for data that came
    -- back on another server (claim.lua: claims are held a while after)
    restored_at = tonumber(v[16] or nil),
    settled = settled, ix = ix, ixf = ixf, cleared = tonumber(v[11]) or 0,
  }
end

-- kept reports whether the pool keeps optional index n (see "Kept
-- indexes"): every one until a claim settled which, then those with an
-- 'ix:<name>' state (complete or being built).
local function kept(cfg, n)
  return not cfg.settled or cfg.ix[n] ~= nil
end

local NUM_FIELDS = { 'capacity', 'vnodes', 'heartbeat', 'registered', 'expires', 'suspect_until', 'predicted_end' }
local STR_FIELDS = { 'id', 'browser', 'addr', 'path', 'gen', 'status' }

-- bad_name: an id or generation is joined with spaces in lease_owner's
-- members and checked by every renewal: empty, over 200 bytes, or holding
-- a space or control character, it would be refused there.
local function bad_name(s)
  return s == '' or #s > 200 or string.find(s, '[%s%c]') ~= nil
end

-- decode checks a raw record; returns the table or nil and why. It runs
-- for every worker a script reads, so the usual record (every field right)
-- is checked in one expression; only a bad one walks the fields in order
-- to say which is wrong (the same order and words as Go's decodeWorker).
local function decode(raw)
  if not raw then return nil, 'missing' end
  local ok, w = pcall(cjson.decode, raw)
  if not ok or type(w) ~= 'table' then return nil, 'record is not a JSON object' end
  if is_count(w.capacity) and is_count(w.vnodes) and is_count(w.heartbeat) and is_count(w.registered)
      and is_count(w.expires) and is_count(w.suspect_until) and is_count(w.predicted_end)
      and type(w.id) == 'string' and type(w.browser) == 'string' and type(w.addr) == 'string'
      and type(w.path) == 'string' and type(w.gen) == 'string'
      and (w.status == 'available' or w.status == 'draining')
      and not bad_name(w.id) and not bad_name(w.gen) then
    return w
  end
  for _, f in ipairs(NUM_FIELDS) do
    if w[f] == nil then return nil, 'field ' .. f .. ' is missing' end
    if not is_count(w[f]) then return nil, 'field ' .. f .. ' is not a whole number (' .. type(w[f]) .. ')' end
  end
  for _, f in ipairs(STR_FIELDS) do
    if type(w[f]) ~= 'string' then return nil, 'field ' .. f .. ' is missing or not a string' end
  end
  if w.status ~= 'available' and w.status ~= 'draining' then
    return nil, 'unknown status "' .. w.status .. '"'
  end
  for _, f in ipairs({ 'id', 'gen' }) do
    if bad_name(w[f]) then
      return nil, 'field ' .. f .. ' is empty, longer than 200 bytes or has spaces or control characters'
    end
  end
  return w
end

-- Addresses (addrs): the worker registered last at each address and path,
-- so that a browser restarted at a fixed port replaces the record of the
-- one that crashed there (register.lua).
local function addr_key(addr, path) return addr .. ' ' .. path end

-- addr_forget drops worker id's entry (w: its record; nil, a missing or bad
-- one, leaves the entry to the next registration at that address, which
-- checks the record it names).
local function addr_forget(id, w)
  if not w then return end
  local k = addr_key(w.addr, w.path)
  if redis.call('HGET', K_ADDRS, k) == id then redis.call('HDEL', K_ADDRS, k) end
end

-- count reads a stored counter: decimal digits only (tonumber would also
-- take " 5", "0x10" and "1e2").
local function count(s)
  if type(s) ~= 'string' or #s > 15 or not string.match(s, '^%d+$') then return nil end
  return tonumber(s)
end

-- parse_durations returns the entries of a stored durations string (nil
-- when one is not a whole number; empty entries are skipped).
local function parse_durations(raw)
  local d = {}
  if not raw or raw == '' then return d end
  for s in string.gmatch(raw, '[^,]+') do
    local n = count(s)
    if not n then return nil end
    d[#d + 1] = n
  end
  return d
end

-- list_len returns the number of entries of a durations string written
-- with one comma between entries (O(length), no parse).
local function list_len(raw)
  if raw == '' then return 0 end
  local _, commas = string.gsub(raw, ',', ',')
  return commas + 1
end

-- load_durations returns a worker's durations (nil when one is not a
-- whole number) and the stored string ('' when none).
local function load_durations(id)
  local raw = redis.call('HGET', K_DUR, id) or ''
  return parse_durations(raw), raw
end

-- rec_copy is a new table with a record's fields: what store() writes,
-- and what a batch keeps of a decoded record (decoded).
local function rec_copy(w)
  return {
    id = w.id, browser = w.browser, addr = w.addr, path = w.path, status = w.status, gen = w.gen,
    capacity = w.capacity, vnodes = w.vnodes, heartbeat = w.heartbeat, registered = w.registered,
    expires = w.expires, suspect_until = w.suspect_until, predicted_end = w.predicted_end, sig = w.sig,
  }
end

-- decoded is decode(rec), decoded at most twice per batch for each
-- record string (see MEMO): a batch's claims often take the same worker,
-- and decode depends on the string alone, so a kept result never goes
-- stale. The first read of a string only notes it (most strings are read
-- once), the second keeps a copy, later ones get copies of that: each
-- caller gets a table of its own (load_worker adds to it).
local function decoded(rec)
  local m = MEMO
  if not (m and rec) then return decode(rec) end
  local seen = m.rec
  if not seen then
    seen = {}
    m.rec = seen
  end
  local d = seen[rec]
  if d and d ~= true then return rec_copy(d) end
  local w, err = decode(rec)
  if w then
    if d then seen[rec] = rec_copy(w) else seen[rec] = true end
  end
  return w, err
end

-- Hot figures (KEYS 21, hot). What claims and releases change lives
-- beside the record, not in it, so that they never re-encode the record
-- (the record's JSON changes only at registration, heartbeat and update):
-- the predicted end and the end of a suspicion (ms), and the fair-share
-- estimate's inputs as running figures, so that no claim or release
-- parses the durations list in the usual case: the window they were
-- counted for, the list's length and the sum of its last <window>
-- entries (all of them for window 0), with a copy of the list they were
-- counted from. The figures hold only while that copy is the stored list;
-- a list Redis lost or an operator edited no longer matches, and the
-- next read counts it again (and validates it: a bad list makes the
-- worker bad, as before). A worker with no hot value (written by a
-- version without it, or Redis lost it) uses the record's predicted_end
-- and suspect_until, which every record write keeps as a copy (older
-- versions read only those).

-- load_worker reads a worker's record, counters, durations and hot
-- figures. Returns the worker or nil and 'missing' / a reason the record
-- is bad. w.rec, w.dur_raw and w.hot are the stored record, durations and
-- hot strings, for replies ('' for no hot value). The durations are
-- parsed only when the hot figures do not match the list (w.durations
-- then holds them and w.fs_counted is set: a writing script stores the
-- figures again, store_hot; otherwise durations_of parses on demand).
local function load_worker(id)
  local rec = redis.call('HGET', K_WORKERS, id)
  local w, err = decoded(rec)
  if not w then return nil, err end
  -- The hash field names the worker (leases, indexes, replies): a record
  -- stored under another name than its own id (a hand copy, a hostile
  -- write) is not that worker. As Go's decodeWorker.
  if w.id ~= id then return nil, 'stored under another name than its id' end
  -- A record's JSON may hold more than store() writes (an older or newer
  -- version's field, a hand edit, an attacker): a field named after a
  -- figure set below only when missing must not stand in for it (a batch's
  -- kept copy of the record, rec_copy, has none of them either, so a call
  -- would count differently batched and alone). The others are set below
  -- whatever the record holds. Cleared only when present: an assignment of
  -- nil to a missing field makes a slot for it.
  if w.durations ~= nil or w.fs_counted ~= nil or w.fs_win ~= nil or w.fs_len ~= nil or w.fs_sum ~= nil then
    w.durations, w.fs_counted, w.fs_win, w.fs_len, w.fs_sum = nil, nil, nil, nil, nil
  end
  w.rec = rec
  local a = count(redis.call('HGET', K_ACTIVE, id))
  if not a then return nil, 'active count is missing or not a whole number' end
  local l = count(redis.call('HGET', K_LIFETIME, id))
  if not l then return nil, 'lifetime count is missing or not a whole number' end
  local draw = redis.call('HGET', K_DUR, id) or ''
  w.active, w.lifetime, w.dur_raw, w.hot = a, l, draw, ''
  local hot = redis.call('HGET', K_HOT, id)
  if hot then
    local pe, su, fw, fl, fs, fraw = string.match(hot, '^(%d+) (%d+) (%d+) (%d+) (%d+) (.*)$')
    if not pe then pe, su = string.match(hot, '^(%d+) (%d+)$') end
    -- the patterns match digits only: the length is what count() checks
    -- beyond them
    if pe and #pe <= 15 and #su <= 15 then
      pe, su = tonumber(pe), tonumber(su)
      -- the later suspicion: an older version's undo (or a hand edit)
      -- writes the record's only, and only registration lowers one (both)
      w.predicted_end, w.suspect_until, w.hot = pe, math.max(su, w.suspect_until), hot
      if fraw == draw then
        -- the count must be the list's (one comma between entries): a
        -- release trusts it to cut the list (a count of 0 would replace
        -- a list written by hand or by an attacker with one entry)
        if #fw <= 15 and #fl <= 15 and #fs <= 15 then
          fw, fl, fs = tonumber(fw), tonumber(fl), tonumber(fs)
          if fl == list_len(draw) then w.fs_win, w.fs_len, w.fs_sum = fw, fl, fs end
        end
      end
    end
  end
  if not w.fs_len then
    -- no figures for this list: count it (which also validates it)
    local d = parse_durations(draw)
    if not d then return nil, 'durations are not whole numbers' end
    w.durations, w.fs_counted = d, true
  end
  return w
end

-- durations_of returns the worker's durations, oldest first (parsed from
-- w.dur_raw once; an unparsable list, which load_worker refuses, as none).
local function durations_of(w)
  if not w.durations then w.durations = parse_durations(w.dur_raw) or {} end
  return w.durations
end

-- fs_count sets the worker's hot figures for window win from its list.
local function fs_count(w, win)
  local d = durations_of(w)
  local n, first, s = #d, 1, 0
  if win > 0 and n > win then first = n - win + 1 end
  for i = first, n do s = s + d[i] end
  w.fs_win, w.fs_len, w.fs_sum, w.fs_counted = win, n, s, true
end

-- fs_figures returns the list's length and the sum of its last n entries
-- under window win (n of them), counting only when the hot figures are
-- missing or were counted for another window (a change of fs_window).
local function fs_figures(w, win)
  if not w.fs_len or w.fs_win ~= win then fs_count(w, win) end
  local n = w.fs_len
  if win > 0 and n > win then n = win end
  return w.fs_len, n, w.fs_sum
end

-- store writes the worker's record and returns it as stored. Only
-- registration, heartbeat and update write it; predicted_end and
-- suspect_until go in as copies of the hot figures, for versions that
-- read only the record.
local function store(id, w)
  local raw = cjson.encode(rec_copy(w))
  redis.call('HSET', K_WORKERS, id, raw)
  w.rec = raw
  return raw
end

-- store_hot writes the worker's hot figures (see "Hot figures") and
-- returns them as stored; the fair-share ones under window win (counted
-- first when missing). w.dur_raw must be a list that parses (load_worker
-- refuses others; register.lua gives '' for one it keeps unparsed, which
-- then matches no stored list).
local function store_hot(id, w, win)
  local len, _, sum = fs_figures(w, win)
  local h = string.format('%d %d %d %d %d ', w.predicted_end, w.suspect_until, win, len, sum) .. w.dur_raw
  redis.call('HSET', K_HOT, id, h)
  w.hot = h
  return h
end

-- Fair-share estimate (poolifier): moving mean (floor) or median of the
-- last cfg.win durations; cfg.def without history. The mean comes from
-- the hot figures (no parse); the median sorts the window.
local function estimate(w, cfg)
  if cfg.med then
    local d = durations_of(w)
    local n = #d
    if n == 0 then return cfg.def end
    local first = 1
    if cfg.win > 0 and n > cfg.win then first = n - cfg.win + 1 end
    local xs = {}
    for i = first, n do xs[#xs + 1] = d[i] end
    local m = #xs
    table.sort(xs)
    if m % 2 == 1 then return xs[(m + 1) / 2] end
    return math.floor((xs[m / 2] + xs[m / 2 + 1]) / 2)
  end
  local _, n, s = fs_figures(w, cfg.win)
  if n == 0 then return cfg.def end
  return math.floor(s / n)
end

local function cap_of(w, cfg)
  local c, m = w.capacity, cfg.mc
  if c == 0 then return m end
  if m > 0 and m < c then return m end
  return c
end

local function indexed(w, cfg)
  if w.status ~= 'available' then return false end
  local c = cap_of(w, cfg)
  if c > 0 and w.active >= c then return false end
  if cfg.ml > 0 and w.lifetime >= cfg.ml then return false end
  return true
end

-- fresh: heartbeat within stale ms (0: always) and the record's own TTL
-- not passed.
local function fresh(w, now, stale)
  if w.expires < now then return false end
  return stale == 0 or now - w.heartbeat <= stale
end

-- may_retire: the part of selection's IsRetiring the stored figures decide
-- (freshness is checked when a claim reads the set): draining, or at the
-- lifetime limit (its shutdown command set, its agent not yet draining).
local function may_retire(w, cfg)
  return w.status == 'draining' or (cfg.ml > 0 and w.lifetime >= cfg.ml)
end

-- command_live reports whether a stored command c (nil: none) is a
-- shutdown command that has not expired at now. Another name (a hand
-- edit, a newer version's command) is one the agent ignores: it holds
-- nothing.
local function command_live(c, now)
  if not c then return false end
  local exp = string.match(c, '^shutdown|(%d+)$')
  return exp ~= nil and tonumber(exp) >= now
end

-- live_command reports whether the worker has a shutdown command that has
-- not expired at now (reads only; pending_command also drops expired ones).
local function live_command(id, now)
  return command_live(redis.call('HGET', K_CMD, id), now)
end

-- retire_sync keeps the worker's membership of the retiring set true to its
-- figures. A worker with a shutdown command (an operator's drain) stays a
-- member: its agent drains at its next heartbeat. One that leaves the set
-- loses its drain hold's start (drain_seen, claim.lua): a later
-- retirement (a limit raised, then reached) times its hold afresh.
-- Returns true when the worker is held out of the selection indexes by a
-- live command although its figures would index it (an operator's drain
-- its agent has not acted on yet: it takes no new session meanwhile).
-- Every worker with a live command is a member (the scripts that set
-- one add it; heartbeat.lua and register.lua add a worker whose command
-- outlived its record; the reaper repairs the set before it reindexes),
-- so the usual case (not a member) still costs one command.
local function retire_sync(id, w, cfg, now)
  if may_retire(w, cfg) then
    redis.call('SADD', K_RET, id)
  elseif redis.call('SISMEMBER', K_RET, id) == 1 then
    local c = redis.call('HGET', K_CMD, id)
    if c then return command_live(c, now) end
    redis.call('SREM', K_RET, id)
    cfg_del('drain_seen:' .. id)
  end
  return false
end

-- restarting reports whether worker o holds the restart turn now: fresh,
-- and holding a live shutdown command, or draining with no session left
-- (closing its browser, or, with --respawn, waiting for its replacement
-- to register). A worker draining its last sessions does not hold it: it
-- takes no session whether it drains or not, and a turn held for a long
-- session kept every other worker past a lowered limit from restarting,
-- and the pool from serving, until that session ended (a red team: 17.5 s
-- without a session after max_lifetime 100 -> 10).
local function restarting(o, now, stale)
  local w = decode(redis.call('HGET', K_WORKERS, o))
  if not (w and fresh(w, now, stale)) then return false end
  if w.status == 'draining' then return (count(redis.call('HGET', K_ACTIVE, o)) or 0) == 0 end
  return live_command(o, now)
end

-- restart_turn reports whether worker id may be told to drain now under
-- StaggerDrains: no other member of the retiring set is restarting.
-- Members that are merely at the lifetime limit wait their turn as id
-- does, so they do not hold it back (else two at the limit would wait for
-- each other for ever). The config hash's 'restarting' field remembers the
-- last restarting worker found, so while one restarts each waiting
-- worker's heartbeat costs O(1); the set is read (O(R)) only when that one
-- is gone, about once per restart. When id's turn has come it becomes the
-- remembered one.
local function restart_turn(id, now, stale)
  local m = redis.call('HGET', K_CFG, 'restarting')
  if m and m ~= id and restarting(m, now, stale) then return false end
  for _, o in ipairs(redis.call('SMEMBERS', K_RET)) do
    if o ~= id and restarting(o, now, stale) then
      cfg_set('restarting', o)
      return false
    end
  end
  cfg_set('restarting', id)
  return true
end

local function lf_score(w)
  local a = w.active
  if a > LF_SCALE - 1 then a = LF_SCALE - 1 end
  return -w.lifetime * LF_SCALE + a
end

local function ring_members(id)
  local raw = redis.call('HGET', K_VPOS, id)
  local t = {}
  if raw then
    for p in string.gmatch(raw, '%x+') do t[#t + 1] = p .. ':' .. id end
  end
  return t
end

-- ring_add puts the worker's ring positions in idx:ring; returns how many.
local function ring_add(id)
  local ms = ring_members(id)
  if #ms == 0 then return 0 end
  local args = {}
  for _, m in ipairs(ms) do
    args[#args + 1] = 0
    args[#args + 1] = m
  end
  redis.call('ZADD', K_RING, unpack(args))
  return #ms
end

local function ring_rem(id)
  local ms = ring_members(id)
  if #ms > 0 then redis.call('ZREM', K_RING, unpack(ms)) end
end

-- idx:iwrr's member for a worker, from its registered weight (1 when a
-- registration wrote none).
local function iwrr_member(id)
  local wt = tonumber(redis.call('HGET', K_IWRRW, id)) or 1
  return string.format('%06d', wt) .. ':' .. id
end

-- opt_add / opt_rem put a worker's entries in (take them out of) the
-- kept ring and idx:iwrr, when it enters (leaves) idx:lifetime; the
-- fair-share sets follow its figures instead (fs_place).
local function opt_add(id, cfg)
  if kept(cfg, 'ring') then ring_add(id) end
  if kept(cfg, 'iwrr') then redis.call('ZADD', K_IWRR, 0, iwrr_member(id)) end
end

local function opt_rem(id, cfg)
  if kept(cfg, 'ring') then ring_rem(id) end
  if kept(cfg, 'iwrr') then redis.call('ZREM', K_IWRR, iwrr_member(id)) end
end

-- fs_place puts an indexed worker in idx:fair_busy (and idx:fair_end) or
-- idx:fair_idle. A worker is in exactly one of the two (the invariant
-- above), so the other is cleared only when ZADD says the worker was not
-- already where it belongs.
local function fs_place(id, w, est, now)
  if w.predicted_end > now then
    local new = redis.call('ZADD', K_FSB, fmt(w.predicted_end + est), id)
    redis.call('ZADD', K_FSP, fmt(w.predicted_end), id)
    if new == 1 then redis.call('ZREM', K_FSI, id) end
  elseif redis.call('ZADD', K_FSI, fmt(est), id) == 1 then
    redis.call('ZREM', K_FSB, id)
    redis.call('ZREM', K_FSP, id)
  end
end

local function unindex(id)
  redis.call('ZREM', K_LF, id)
  redis.call('ZREM', K_FSI, id)
  redis.call('ZREM', K_FSB, id)
  redis.call('ZREM', K_FSP, id)
  ring_rem(id)
  redis.call('ZREM', K_IWRR, iwrr_member(id))
end

-- reindex puts a worker where its current figures say it belongs, in the
-- selection indexes and the retiring set. Returns true when the worker
-- (re-)entered the indexes: a waiting claim may take it now.
-- claimed: the worker was just taken from the indexes by a claim (indexed,
-- so available and below the lifetime limit, and now lifetime + 1 under
-- the same limits, and no live command held it out): only its reaching
-- the limit can change what the retiring set must hold, so that is all it
-- checks (an SADD then, no command otherwise). Otherwise a live shutdown
-- command keeps it out of the indexes (retire_sync). A member that no
-- longer qualifies is left to the
-- next full retire_sync (heartbeat, release) or a StaggerDrains claim's
-- prune: the set is a superset (see the second invariant above).
local function reindex(id, w, cfg, now, claimed)
  local held = false
  if not claimed then
    held = retire_sync(id, w, cfg, now)
  elseif may_retire(w, cfg) then
    redis.call('SADD', K_RET, id)
  end
  if held or not indexed(w, cfg) then
    -- ZREM's count says whether it was indexed (its ring positions go too);
    -- the fair-share entries may linger either way
    if redis.call('ZREM', K_LF, id) == 1 then opt_rem(id, cfg) end
    if kept(cfg, 'fair') then
      redis.call('ZREM', K_FSI, id)
      redis.call('ZREM', K_FSB, id)
      redis.call('ZREM', K_FSP, id)
    end
    return false
  end
  -- ZADD's count says whether it is new to the index
  local new = redis.call('ZADD', K_LF, fmt(lf_score(w)), id) == 1
  if new then opt_add(id, cfg) end
  if kept(cfg, 'fair') then fs_place(id, w, estimate(w, cfg), now) end
  return new
end

-- fs_migrate moves busy workers whose predicted end has passed to the idle
-- index. Every claim makes at most one worker busy, so this is amortised
-- O(log N) per claim.
local function fs_migrate(now)
  -- bounded: after a quiet spell many may be due; later claims move the
  -- rest (meanwhile such a busy entry sorts a little earlier than it would
  -- as an idle one)
  local ids = redis.call('ZRANGEBYSCORE', K_FSP, '-inf', fmt(now), 'WITHSCORES', 'LIMIT', 0, 64)
  for i = 1, #ids, 2 do
    local id, pend = ids[i], tonumber(ids[i + 1])
    local key = tonumber(redis.call('ZSCORE', K_FSB, id)) or pend
    redis.call('ZREM', K_FSP, id)
    redis.call('ZREM', K_FSB, id)
    redis.call('ZADD', K_FSI, fmt(key - pend), id)
  end
end

-- Kept indexes (profile item 1). idx:lifetime is every policy's: it says
-- which workers are indexed. The others (OPT_NAMES: the ring, the three
-- fair-share sets, idx:iwrr) are kept only while a policy that walks them
-- claims the pool, so a pool claimed with lifetime_first does not move a
-- worker's ring positions each time it fills up and frees a slot. The
-- config hash says which are kept: field 'ix' once a claim settled it (a
-- pool no claim has settled, and one an older version wrote, keeps them
-- all, as every version before this one did; 'ix' holds when the keys of
-- the indexes not kept were last cleared, see ix_settle), and per index
-- 'ix:<name>' = '<state> <last claim that walked it, ms>', state 'on'
-- (complete) or 'b<cursor>@<server run_id>' (being built: a ZSCAN cursor
-- means something only to the server process that gave it); no field:
-- not kept. A version group's fields start with its key prefix
-- ('v=1.65:ix', ...): the config hash is the pool's, the indexes each
-- group's. While an index is kept, built or not, every script keeps it
-- for the workers it touches (reindex), as before.
-- A claim whose policy walks an index that is not kept starts building
-- it: each claim adds members of idx:lifetime (ZSCAN, so a worker present
-- throughout is met; one that comes or goes meanwhile is kept by reindex)
-- for about IX_STEP units of work (see ix_step). Until it is complete such
-- a claim (and a Pick) walks idx:lifetime as lifetime_first does, and
-- says so (reply field 'building'). An index no claim has walked for
-- IX_RETAIN ms is dropped by the next claim (UNLINK, so freeing it does
-- not block Redis).
local OPT_NAMES = { 'ring', 'fair', 'iwrr' }
-- (the K_* locals are bound at each call: a function, not a table)
local function opt_keys(n)
  if n == 'ring' then return { K_RING } end
  if n == 'fair' then return { K_FSI, K_FSB, K_FSP } end
  return { K_IWRR }
end
local IX_STEP = 2048
local IX_RETAIN = 3600000

-- ix_parse splits an 'ix:<name>' value: state ('on' or 'b'), when last
-- walked (ms), and for 'b' the cursor and the server it belongs to. A
-- value that is not one (a Redis writer's) means 'build it from the
-- start' ('b', cursor '0').
local function ix_parse(v)
  if not v then return nil, 0 end
  local st, used = string.match(v, '^(%S+) (%d+)$')
  used = tonumber(used) or 0
  if st == 'on' then return 'on', used end
  local cur, rid = string.match(st or '', '^b(%d+)@(%x+)$')
  if cur then return 'b', used, cur, rid end
  return 'b', used, '0', ''
end

-- server_id is this Redis process's run_id (another after a restart or on
-- a promoted replica), or '0' when the ACL user may not run INFO (it is
-- in @dangerous): then a build resumed on another server can miss
-- workers until the reaper's reconcile puts them back, and a claim cannot
-- tell data that came back on another server (claim.lua). Read once per
-- server process, a refusal included (asked on every claim, it would log
-- an ACL LOG entry each time; a user granted +info later is seen after the
-- next restart): the library's state (SERVER) lives as long as the
-- process, and is made anew on a restarted or promoted one.
local SERVER = nil
local function server_id()
  if not SERVER then
    local info = redis.pcall('INFO', 'server')
    SERVER = type(info) == 'string' and string.match(info, 'run_id:(%x+)') or '0'
  end
  return SERVER
end

-- epoch_start gives the pool epoch e, made now, and notes the server it
-- was made on as a claim checks it (claim.lua): a snapshot taken before
-- the pool's first claim (after Caddy stored its limits, or after an
-- epoch watch marked a loss) then carries the server too, and a restore
-- of it is noticed. Returns the server (server_id).
local function epoch_start(e, now)
  local here = server_id()
  if here == '0' then
    cfg_set('epoch', e, 'epoch_at', fmt(now))
  else
    cfg_set('epoch', e, 'epoch_at', fmt(now), 'server', here)
  end
  return here
end

-- ix_drop stops keeping index n and frees its keys.
local function ix_drop(cfg, n)
  redis.call('UNLINK', unpack(opt_keys(n)))
  cfg_del(cfg.ixf .. ':' .. n)
  cfg.ix[n] = nil
end

-- ix_step adds members of idx:lifetime to index n from cursor cur (as
-- reindex would have) until it has done IX_STEP units of work: a ring
-- position or a command is one, a worker's fair-share read eight (so a
-- step adds about 200 workers' 8 ring positions, 256 workers to the
-- fair-share sets, 1,000 to idx:iwrr). Returns the next cursor ('0': done).
local function ix_step(n, cur, cfg, now)
  local work = 0
  repeat
    local res = redis.pcall('ZSCAN', K_LF, cur, 'COUNT', 32)
    -- a cursor Redis refuses (a Redis writer's) starts the build again
    if res.err then res = redis.call('ZSCAN', K_LF, '0', 'COUNT', 32) end
    cur = res[1]
    local ms = res[2]
    -- a call counts too: on a sparse table ZSCAN may return nothing
    work = work + 4
    for i = 1, #ms, 2 do
      local id = ms[i]
      if n == 'ring' then
        work = work + 1 + ring_add(id)
      elseif n == 'iwrr' then
        redis.call('ZADD', K_IWRR, 0, iwrr_member(id))
        work = work + 2
      else
        local w = load_worker(id)
        if w then fs_place(id, w, estimate(w, cfg), now) end
        work = work + 8
      end
    end
  until cur == '0' or work >= IX_STEP
  return cur
end

-- ix_settle is a claim's upkeep of the kept indexes (after its limits are
-- settled, before it walks): need is the index its policy walks (nil:
-- idx:lifetime's only). It takes one build step of need when that is not
-- complete, notes that need was walked (at most every IX_RETAIN / 4), and
-- drops indexes no claim walked for IX_RETAIN. Every IX_RETAIN / 4 it
-- also clears the keys of indexes not kept (an older version, still
-- running, writes every index). A dry claim (Pick) writes nothing.
-- Returns whether need is complete, so the claim may walk it.
local function ix_settle(cfg, need, now, dry)
  if dry then return need == nil or not cfg.settled or ix_parse(cfg.ix[need]) == 'on' end
  if not cfg.settled then
    -- every index was kept until now: keep need's, drop the rest
    cfg_set(cfg.ixf, fmt(now))
    cfg.settled = true
    for _, n in ipairs(OPT_NAMES) do
      if n == need then
        cfg.ix[n] = 'on ' .. fmt(now)
        cfg_set(cfg.ixf .. ':' .. n, cfg.ix[n])
      else
        ix_drop(cfg, n)
      end
    end
    return true
  end
  local clear = now - cfg.cleared > IX_RETAIN / 4
  for _, n in ipairs(OPT_NAMES) do
    if n == need then
      -- below
    elseif cfg.ix[n] then
      local _, used = ix_parse(cfg.ix[n])
      if now - used > IX_RETAIN then ix_drop(cfg, n) end
    elseif clear then
      redis.call('UNLINK', unpack(opt_keys(n)))
    end
  end
  if clear then cfg_set(cfg.ixf, fmt(now)) end
  if not need then return true end
  local st, used, cur, rid = ix_parse(cfg.ix[need])
  if st == 'on' then
    if now - used > IX_RETAIN / 4 then cfg_set(cfg.ixf .. ':' .. need, 'on ' .. fmt(now)) end
    return true
  end
  if not st then
    -- not kept: whatever the keys hold (an older version's writes) goes
    redis.call('UNLINK', unpack(opt_keys(need)))
    cur = '0'
  end
  local sid = server_id()
  -- a cursor of another server process (a restart, a failover) would
  -- skip members: start again (what was added stays right)
  if rid ~= sid then cur = '0' end
  cur = ix_step(need, cur, cfg, now)
  if cur == '0' then st = 'on' else st = 'b' .. cur .. '@' .. sid end
  cfg.ix[need] = st .. ' ' .. fmt(now)
  cfg_set(cfg.ixf .. ':' .. need, cfg.ix[need])
  return st == 'on'
end

-- append_duration adds a session's duration (ms) to the worker's list,
-- keeping the last keep (0: all), and moves its hot figures for window win
-- along (the caller stores them: store_hot). The usual cases edit the
-- stored string (append; at keep, also drop the oldest) and the window
-- sum (add the new entry; at the window, take away the one leaving it,
-- the list's first when the window is the whole list) without parsing
-- the list. That needs the string to hold exactly the list, one comma
-- between entries, which load_worker's w.dur_raw does unless it was
-- written with empty entries; anything else (an untidy string, a list
-- longer than keep, a window shorter than the list) is rebuilt or
-- counted from the entries.
local function append_duration(id, w, ms, keep, win)
  local len, n, sum = fs_figures(w, win)
  local raw = w.dur_raw
  local tidy = raw ~= '' and not string.find(raw, ',,', 1, true)
    and string.sub(raw, 1, 1) ~= ',' and string.sub(raw, -1) ~= ','
  local out, nlen
  if len == 0 then
    out, nlen = fmt(ms), 1
  elseif not tidy or (keep > 0 and len > keep) then
    -- the window shrank, or the string is not tidy: rebuild and count
    local d = durations_of(w)
    d[#d + 1] = ms
    local first = 1
    if keep > 0 and #d > keep then first = #d - keep + 1 end
    local parts, nd = {}, {}
    for i = first, #d do
      parts[#parts + 1] = fmt(d[i])
      nd[#nd + 1] = d[i]
    end
    w.durations, w.dur_raw = nd, table.concat(parts, ',')
    fs_count(w, win)
    redis.call('HSET', K_DUR, id, w.dur_raw)
    return
  else
    if keep > 0 and len == keep then
      -- at keep: the oldest goes
      local c = string.find(raw, ',', 1, true)
      if c then out = string.sub(raw, c + 1) .. ',' .. fmt(ms) else out = fmt(ms) end
      nlen = len
    else
      out, nlen = raw .. ',' .. fmt(ms), len + 1
    end
  end
  local nn = nlen
  if win > 0 and nn > win then nn = win end
  if nn == n + 1 then
    sum = sum + ms
  elseif n == len then
    -- the window was the whole list: its first entry leaves it
    local c = string.find(raw, ',', 1, true)
    sum = sum + ms - tonumber(c and string.sub(raw, 1, c - 1) or raw)
  else
    sum = nil
  end
  w.durations, w.dur_raw = nil, out
  if sum then w.fs_win, w.fs_len, w.fs_sum = win, nlen, sum else fs_count(w, win) end
  redis.call('HSET', K_DUR, id, out)
end

-- Leases. A lease belongs to a worker id and the generation of the
-- registration that claimed it (lease_owner), not to the worker's record:
-- removing a record (stale expiry, reaper, Redis losing it) leaves its
-- leases in place, and a registration of the same generation counts them
-- again. A worker's active count is always the number of its generation's
-- leases (owner_count); every script that adds or removes a lease sets
-- the active hash from it, so readers and the indexes keep reading one
-- field. A lease that was released, undone or cancelled leaves a
-- tombstone for a while, so that a claim run late (after its caller gave
-- up and cancelled it) claims nothing, and a renewal racing a release does
-- not bring the lease back. The tombstone is the lease's own entry in
-- leases, rewritten to 'ended:<forget at ms>', its lease_expiry entry
-- moved to the forget time (by the sweep, see tombstone): one record per
-- lease id, one HGET tells a live lease, a tombstone and a new id apart,
-- and one sweep (expire_leases) both expires leases and forgets
-- tombstones. Everything that reads leases tells the two apart
-- (tomb_until; Go: isTombstone).

local function owner_member(id, gen, lid)
  return id .. ' ' .. gen .. ' ' .. lid
end

-- owner_range returns the lex bounds of a worker generation's entries: ids
-- and generations hold no spaces, and every member of the prefix
-- "<id> <gen> " sorts below "<id> <gen>!" (' ' is 0x20, '!' 0x21).
local function owner_range(id, gen)
  return '[' .. id .. ' ' .. gen .. ' ', '(' .. id .. ' ' .. gen .. '!'
end

local function owner_count(id, gen)
  local lo, hi = owner_range(id, gen)
  return redis.call('ZLEXCOUNT', K_OWNER, lo, hi)
end

-- owner_add records a lease of (id, gen), leaves the new count in active
-- and returns it. The count follows the entry (HINCRBY when ZADD added one)
-- rather than being counted again: the scripts keep the two in step, and
-- renewal, register and reconcile, which can find them apart, count
-- (owner_count); so does an entry that was there already.
local function owner_add(id, gen, lid)
  if redis.call('ZADD', K_OWNER, 0, owner_member(id, gen, lid)) == 1 then
    return redis.call('HINCRBY', K_ACTIVE, id, 1)
  end
  local n = owner_count(id, gen)
  redis.call('HSET', K_ACTIVE, id, fmt(n))
  return n
end

-- owned_life is the highest lifetime recorded in the live leases of
-- (id, gen) (each lease holds its worker's lifetime right after its claim).
-- O(A log L) for A leases of the worker.
local function owned_life(id, gen)
  local lo, hi = owner_range(id, gen)
  local best = 0
  local skip = #id + #gen + 3
  for _, m in ipairs(redis.call('ZRANGEBYLEX', K_OWNER, lo, hi)) do
    local raw = redis.call('HGET', K_LEASES, string.sub(m, skip))
    if raw then
      local ok, l = pcall(cjson.decode, raw)
      if ok and type(l) == 'table' and is_count(l.life) and l.life > best then best = l.life end
    end
  end
  return best
end

-- TOMB prefixes a tombstone's value in leases (a lease is a JSON object,
-- '{...'); keys.go's tombPrefix is the same.
local TOMB = 'ended:'

-- tomb_until returns when the tombstone raw (a value of leases) is to be
-- forgotten (ms), or nil when raw is a lease. A lease costs one byte test.
-- Every value with the prefix is a tombstone (as keys.go's isTombstone
-- says); one whose time is not a count (count: at most 15 digits) is due
-- at once, 0: a time past 2^63 would be written back by fmt as no number
-- (a negative score), due again at every sweep.
local function tomb_until(raw)
  if string.byte(raw, 1) ~= 101 or string.sub(raw, 1, 6) ~= TOMB then return nil end -- 'e'
  return count(string.sub(raw, 7)) or 0
end

-- tombstone ends lease lid in place (see "Leases"): its entry becomes the
-- tombstone. Its lease_expiry score becomes the forget time, except for a
-- lease that existed (scored: its entry is there, at the lease's expiry):
-- the sweep that meets it then moves it to the forget time (expire_leases),
-- which spares the release a command. ttl <= 0 keeps no tombstone: both
-- entries go.
local function tombstone(lid, now, ttl, scored)
  if ttl and ttl > 0 then
    local at = fmt(now + ttl)
    redis.call('HSET', K_LEASES, lid, TOMB .. at)
    if not scored then redis.call('ZADD', K_LEXP, at, lid) end
  else
    redis.call('HDEL', K_LEASES, lid)
    redis.call('ZREM', K_LEXP, lid)
  end
end

-- command_if_spent sets the shutdown command of a worker at or past the
-- stored lifetime limit that has none (its figures were re-asserted after
-- Redis lost them: no claim will reach the limit to set it). Under
-- StaggerDrains it waits its turn as heartbeat.lua's rule does (after an
-- empty Redis restart many workers come back spent at once); a later
-- heartbeat tells it then.
local function command_if_spent(id, w, cfg, now, cmd_ttl)
  if cfg.ml > 0 and w.lifetime >= cfg.ml and cmd_ttl > 0 and not live_command(id, now)
      and (not cfg.stagger or restart_turn(id, now, cfg.stale)) then
    redis.call('HSET', K_CMD, id, 'shutdown|' .. fmt(now + cmd_ttl))
    redis.call('SADD', K_RET, id)
  end
end

-- owner_repair makes lease_owner hold exactly one entry per lease (for
-- leases written by a version without it, or after a partial loss): adds
-- the missing, removes the entries of no lease. Returns how many it fixed.
-- O(L log L) for L leases.
local function owner_repair(lease_ids)
  local want, fixed = {}, 0
  for _, lid in ipairs(lease_ids) do
    local ok, l = pcall(cjson.decode, redis.call('HGET', K_LEASES, lid) or '')
    if ok and type(l) == 'table' and type(l.worker) == 'string' and type(l.gen) == 'string' then
      local m = owner_member(l.worker, l.gen, lid)
      want[m] = true
      if not redis.call('ZSCORE', K_OWNER, m) then
        redis.call('ZADD', K_OWNER, 0, m)
        fixed = fixed + 1
      end
    end
  end
  for _, m in ipairs(redis.call('ZRANGE', K_OWNER, 0, -1)) do
    if not want[m] then
      redis.call('ZREM', K_OWNER, m)
      fixed = fixed + 1
    end
  end
  return fixed
end

-- Clients (issue 10, per-client limit). A lease claimed with a client key
-- stores the key's hash (hex, never the raw key) as its 'client' field and
-- has one lease_client entry "<hash> <lease id>". A client's live sessions
-- are the count of its entries (client_count), so they follow the leases:
-- every path that removes a lease (release, undo, cancel, expiry, a
-- replayed claim of a worker gone) drops its entry with it (client_drop),
-- renewal re-creates it with the lease, and reconcile repairs the set
-- against the leases. Hashes are hex: they hold no spaces.

local function client_range(c)
  return '[' .. c .. ' ', '(' .. c .. '!'
end

local function client_count(c)
  local lo, hi = client_range(c)
  return redis.call('ZLEXCOUNT', K_CLIENT, lo, hi)
end

local function client_add(c, lid)
  if type(c) == 'string' and c ~= '' then redis.call('ZADD', K_CLIENT, 0, c .. ' ' .. lid) end
end

-- client_drop removes the entry of lease lid whose decoded value is l.
local function client_drop(l, lid)
  if type(l) == 'table' and type(l.client) == 'string' and l.client ~= '' then
    redis.call('ZREM', K_CLIENT, l.client .. ' ' .. lid)
  end
end

-- client_over reports the live sessions of client c when a new claim
-- would take it past limit (limit 0 or no client: never).
local function client_over(c, limit)
  if c == '' or not limit or limit <= 0 then return nil end
  local n = client_count(c)
  if n >= limit then return n end
  return nil
end

-- claim_replay answers a claim whose lease id was used before: the same
-- claim again while its lease lives ({-2, ...}, see claim.lua), or
-- {-1, 'cancelled'} when the lease was ended or cancelled (its tombstone is
-- not yet due). A lease whose worker is gone or registered anew is dropped
-- and the claim runs afresh. nil: a new lease id (or a tombstone past its
-- time, which the claim overwrites). One HGET for a new id.
local function claim_replay(lid, now)
  local raw = redis.call('HGET', K_LEASES, lid)
  if not raw then return nil end
  local till = tomb_until(raw)
  if till then
    if till >= now then return { -1, 'cancelled' } end
    return nil
  end
  local ok, l = pcall(cjson.decode, raw)
  local w
  if ok and type(l) == 'table' and type(l.worker) == 'string' then w = load_worker(l.worker) end
  if not w or w.gen ~= l.gen then
    redis.call('HDEL', K_LEASES, lid)
    redis.call('ZREM', K_LEXP, lid)
    if ok and type(l) == 'table' and type(l.worker) == 'string' and type(l.gen) == 'string' then
      redis.call('ZREM', K_OWNER, owner_member(l.worker, l.gen, lid))
    end
    if ok then client_drop(l, lid) end
    return nil
  end
  local drain = 0
  if l.drain == 1 then drain = 1 end
  return { -2, l.worker, w.rec, w.active, w.lifetime, w.dur_raw, drain, now, w.hot }
end

-- LAPSED_KEEP_MS is how long a lapsed worker's lifetime waits for its
-- comeback (a day: an agent cut off from Redis, not from its clients, may
-- come back after hours).
local LAPSED_KEEP_MS = 86400000

-- lapsed_entry returns the lapsed value to keep for worker id (record w)
-- whose record a stale expiry is about to remove, or nil: its generation
-- and lifetime. With no record (a later expiry of the same worker: a
-- claim's, another instance's, the reaper's) the stored value stays. The
-- sessions claimed while its agent could not heartbeat (frozen, cut off
-- from Redis) are in no reply the agent saw, and those that ended are in
-- no lease either; without this a browser that comes back registers with
-- the lifetime of its last heartbeat, and serves max_lifetime again
-- (register.lua takes the kept figure back).
local function lapsed_entry(id, w, now)
  local l = count(redis.call('HGET', K_LIFETIME, id))
  if not (w and type(w.gen) == 'string' and l and l > 0) then return nil end
  return w.gen .. ' ' .. fmt(l) .. ' ' .. fmt(now + LAPSED_KEEP_MS)
end

-- lapsed_parse reads a lapsed value: generation, lifetime and forget
-- time, or nil when it is not one (a hand edit: forgotten by the reaper).
-- lapsed_life returns the lifetime kept for generation gen of worker id
-- (lapsed_entry) while it is not forgotten, else 0.
local function lapsed_parse(raw)
  local g, l, t = string.match(raw or '', '^(%S+) (%d+) (%d+)$')
  l, t = count(l), count(t)
  if not (l and t) then return nil end
  return g, l, t
end

local function lapsed_life(id, gen, now)
  local g, l, t = lapsed_parse(redis.call('HGET', K_LAPSED, id))
  if g ~= gen or t < now then return 0 end
  return l
end

-- lapsed_raise keeps lifetime life for generation gen of worker id, which
-- has no record, for LAPSED_KEEP_MS (its agent may be cut off for hours,
-- after Redis lost its data as after a freeze; after a deregistration
-- nobody comes back, and the reaper forgets the entry when due): the
-- highest of it and a kept entry's of the same generation. An entry of
-- another generation that is not forgotten stays (which process is newer
-- is not this caller's to judge). Returns true when it wrote.
local function lapsed_raise(id, gen, life, now)
  local g, l, t = lapsed_parse(redis.call('HGET', K_LAPSED, id))
  local live = g and t >= now
  if live and (g ~= gen or l >= life) then return false end
  redis.call('HSET', K_LAPSED, id, gen .. ' ' .. fmt(life) .. ' ' .. fmt(now + LAPSED_KEEP_MS))
  return true
end

-- lease_free gives back what lease lid (raw: its value in leases, a lease
-- and not a tombstone) held: mode 'release' (duration recorded), 'undo'
-- (lifetime given back, shutdown withdrawn, worker suspect) or 'expire'
-- (the holder stopped renewing). Its entries in leases and lease_expiry
-- are the caller's (tombstone, or deleted by expire_leases). Counters
-- move only when the lease belongs to the worker's current registration.
-- Returns true when the lease existed (always: raw is one). The second
-- result is true when the worker re-entered the indexes (a waiting claim
-- may take it: see wake_if).
local function lease_free(lid, raw, now, mode, suspect_ms, keep)
  local ok, l = pcall(cjson.decode, raw)
  if ok then client_drop(l, lid) end
  if not ok or type(l) ~= 'table' or type(l.worker) ~= 'string' then return true, false end
  local id = l.worker
  local gone = 0
  if type(l.gen) == 'string' then gone = redis.call('ZREM', K_OWNER, owner_member(id, l.gen, lid)) end
  local w, why = load_worker(id)
  if not w then
    -- Its record is gone (lapsed while its agent could not heartbeat, or
    -- lost by Redis before its agent registered again): the session
    -- counted toward its lifetime, and no lease will carry that once this
    -- one is gone. Keep it for the comeback (register.lua takes it back),
    -- as a stale expiry keeps the record's count.
    if why == 'missing' and mode ~= 'undo' and type(l.gen) == 'string' and not bad_name(l.gen)
        and is_count(l.life) and l.life > 0 then
      lapsed_raise(id, l.gen, l.life, now)
    end
    return true, false
  end
  if w.gen ~= l.gen then return true, false end
  local cfg = load_cfg()
  if gone == 1 and w.active > 0 then
    -- the count follows the entry (see owner_add)
    w.active = redis.call('HINCRBY', K_ACTIVE, id, -1)
  else
    -- no entry (a lease written before lease_owner) or a count already
    -- apart from the entries: count them
    w.active = owner_count(id, w.gen)
    redis.call('HSET', K_ACTIVE, id, fmt(w.active))
  end
  -- the hot figures are rewritten only when one changes (never the record)
  local dirty = false
  if mode == 'undo' then
    dirty = true
    if w.lifetime > 0 then w.lifetime = w.lifetime - 1 end
    redis.call('HSET', K_LIFETIME, id, fmt(w.lifetime))
    -- the shutdown command this claim set, not one set since (an
    -- operator's drain, a heartbeat's): cmd_at is its expiry (absent from
    -- an older version's lease: withdrawn as before)
    if l.drain == 1 and (l.cmd_at == nil or redis.call('HGET', K_CMD, id) == 'shutdown|' .. fmt(l.cmd_at)) then
      redis.call('HDEL', K_CMD, id)
    end
    if suspect_ms > 0 then w.suspect_until = now + suspect_ms end
    if type(l.est) == 'number' then
      w.predicted_end = math.max(0, w.predicted_end - l.est)
    end
  else
    if mode == 'release' and type(l.claimed) == 'number' then
      append_duration(id, w, math.max(0, now - l.claimed), keep, cfg.win)
      dirty = true
    end
    -- An idle worker has no queue left: its predicted end is now at most.
    if w.active == 0 and w.predicted_end > now then
      w.predicted_end = now
      dirty = true
    end
  end
  if dirty then store_hot(id, w, cfg.win) end
  return true, reindex(id, w, cfg, now)
end

-- expire_leases handles up to max entries of lease_expiry that are due:
-- a lease whose expiry passed is freed and deleted (no tombstone: its
-- holder may renew it, and renewal re-creates it); a tombstone whose time
-- passed is forgotten, one met at its lease's old expiry (see tombstone)
-- moves to its forget time; max 0 does nothing (a claim that does not
-- sweep this time: the caller chooses, see claimSweep in Go). Returns how
-- many leases it freed, whether a worker re-entered the indexes, and how
-- many entries it handled (max: there may be more).
local function expire_leases(now, max, keep)
  if not max or max <= 0 then return 0, false, 0 end
  local ids = redis.call('ZRANGEBYSCORE', K_LEXP, '-inf', '(' .. fmt(now), 'LIMIT', 0, max)
  if #ids == 0 then return 0, false, 0 end
  local n, back, gone, later = 0, false, {}, {}
  for _, lid in ipairs(ids) do
    local raw = redis.call('HGET', K_LEASES, lid)
    local till = raw and tomb_until(raw)
    if till and till >= now then
      later[#later + 1] = fmt(till)
      later[#later + 1] = lid
    else
      gone[#gone + 1] = lid
      if raw and not till then
        n = n + 1
        local _, entered = lease_free(lid, raw, now, 'expire', 0, keep)
        if entered then back = true end
      end
    end
  end
  if #gone > 0 then
    redis.call('HDEL', K_LEASES, unpack(gone))
    redis.call('ZREM', K_LEXP, unpack(gone))
  end
  if #later > 0 then redis.call('ZADD', K_LEXP, unpack(later)) end
  return n, back, #ids
end

local function wake()
  redis.call('PUBLISH', ARGV[2], ARGV[3])
end

-- wake_if publishes only when something can wake a waiter: a worker
-- (re-)entered the indexes. A release that leaves its worker in them
-- (below its cap before and after) frees nothing a waiting claim could not
-- already take; waiters also poll (caddygrid's safetyPoll).
local function wake_if(entered)
  if entered then wake() end
end

-- remove_worker deletes everything a registration wrote (a lapsed
-- lifetime is not the registration's: its callers keep or delete it); w is
-- its record when the caller read it (nil: read here, for its address).
local function remove_worker(id, w)
  addr_forget(id, w or decode(redis.call('HGET', K_WORKERS, id)))
  unindex(id)
  redis.call('HDEL', K_IWRRW, id)
  redis.call('SREM', K_RET, id)
  local n = redis.call('HDEL', K_WORKERS, id)
  n = n + redis.call('HDEL', K_ACTIVE, id) + redis.call('HDEL', K_LIFETIME, id)
  n = n + redis.call('HDEL', K_DUR, id) + redis.call('HDEL', K_CMD, id) + redis.call('HDEL', K_VPOS, id)
  redis.call('HDEL', K_HOT, id)
  cfg_del('drain_seen:' .. id)
  return n
end

-- expire_worker removes worker id (record w, nil when missing or bad) and
-- returns how much of it there was (remove_worker). A stale expiry (stale
-- true) keeps what the worker's comeback needs, for its agent may be
-- paused, not dead: its live shutdown command and the lifetime it served
-- (lapsed_entry; with no record, the one stored stays). A kept command
-- does not count as removed: a later expiry of a gone record removes
-- nothing. A deregistration keeps nothing (a session released after it
-- leaves its lease's lifetime: lease_free).
local function expire_worker(id, w, now, stale)
  local cmd = stale and live_command(id, now) and redis.call('HGET', K_CMD, id)
  local lapsed = stale and lapsed_entry(id, w, now)
  local n = remove_worker(id, w)
  if cmd then
    redis.call('HSET', K_CMD, id, cmd)
    n = n - 1
  end
  if lapsed then
    redis.call('HSET', K_LAPSED, id, lapsed)
  elseif not stale then
    redis.call('HDEL', K_LAPSED, id)
  end
  return n
end

-- pending_command returns the worker's live command ('' when none),
-- deleting an expired one.
local function pending_command(id, now)
  local c = redis.call('HGET', K_CMD, id)
  if not c then return '' end
  local name, exp = string.match(c, '^([^|]*)|(%d+)$')
  if not name or tonumber(exp) < now then
    redis.call('HDEL', K_CMD, id)
    return ''
  end
  return name
end
