-- walk.lua: the walk machinery of claim.lua, and every policy's walk (its
-- own file, lua/walk_<policy>.lua, inserted below where "@walks" is;
-- registry/policy.go's table lists them). It runs once, when the library
-- loads (FUNCTION LOAD), before claim.lua's function is made: the functions
-- here are created once, not on every claim. A claim keeps what one walk
-- needs in one table, its walk state (walk_state below), and passes it to
-- each of them. A walk sets WALKS[<policy>] to a function of the walk
-- state returning the chosen id and worker, or nil.
--
-- Every walked entry that is not usable (missing, stale, suspect, held back
-- or bad) costs one unit of the max_scan budget; index debris (a worker not
-- indexed under the limits in force) costs none but is recorded for
-- removal, at most DEBRIS_MAX per claim. Stale and missing ones are
-- recorded for expiry, bad ones for the reply and removal from the indexes.
-- Complexity: index_walk and zs_next O(log N + S) for S entries read;
--   examine O(1) plus one load_worker per worker, once per claim.

-- DEBRIS_MAX bounds the debris one claim removes.
local DEBRIS_MAX = 128

-- Index reads start small and grow: most claims use the first usable
-- entry, so reading FIRST_BATCH entries first saves the 32-entry read
-- (profile item 5); a walk past unusable entries reads BATCH at a time.
local FIRST_BATCH, BATCH = 4, 32

-- walk_state is one claim's walk state: now (ms), stale (stale_after_ms),
-- dry, cfg (the limits in force), retiring (StaggerDrains holds back a
-- worker's last session), budget (units of max_scan left, -1: unbounded),
-- and what the walk found: scanned, stale_ids, bad (id, why pairs),
-- debris, the figures vnode reports (wraps, effective, dedupes, tied), and
-- loaded, the workers read so far (a worker or the reason it is unusable).
-- avoid (nil: none) is the set of worker ids the caller asked to avoid,
-- walked past as suspect ones are; claim.lua sets it.
local function walk_state(now, stale, maxscan, dry, cfg)
  local budget = maxscan
  if budget == 0 then budget = -1 end
  return {
    now = now, stale = stale, dry = dry, cfg = cfg, retiring = false, budget = budget,
    scanned = 0, stale_ids = {}, bad = {}, debris = {}, loaded = {},
    wraps = 0, effective = 0, dedupes = 0, tied = 0,
  }
end

-- walk_get returns the worker id (read once per claim), or nil and why.
local function walk_get(s, id)
  local c = s.loaded[id]
  if c == nil then
    local w, err = load_worker(id)
    c = w or err
    s.loaded[id] = c
  end
  if type(c) == 'string' then return nil, c end
  return c
end

-- walk_note adds id to one of the walk's reports, once: list is
-- s.stale_ids (ids for expiry) or s.bad (each bad id followed by why), and
-- seen_key names the set of ids already in it (made on first use).
local function walk_note(s, list, seen_key, id, why)
  local seen = s[seen_key]
  if not seen then
    seen = {}
    s[seen_key] = seen
  end
  if seen[id] then return end
  seen[id] = true
  list[#list + 1] = id
  if why then list[#list + 1] = why end
end

-- examine returns the worker when it is eligible; otherwise charges the
-- budget and records why.
local function examine(s, id)
  s.scanned = s.scanned + 1
  local w, err = walk_get(s, id)
  local now = s.now
  if not w then
    if err == 'missing' then
      walk_note(s, s.stale_ids, 'stale_seen', id)
    else
      walk_note(s, s.bad, 'bad_seen', id, err)
    end
  elseif not fresh(w, now, s.stale) then
    walk_note(s, s.stale_ids, 'stale_seen', id)
  elseif not indexed(w, s.cfg) then
    s.debris[#s.debris + 1] = id
    return nil
  elseif s.retiring and w.lifetime + 1 >= s.cfg.ml then
    -- held back (StaggerDrains): its last session waits for the retiring one
  elseif w.suspect_until > 0 and now < w.suspect_until then
    -- suspect: walked past
  elseif s.avoid and s.avoid[id] then
    -- avoided (ClaimRequest.Avoid): walked past as a suspect one
  else
    return w
  end
  if s.budget > 0 then s.budget = s.budget - 1 end
  return nil
end

-- exhausted: the scan budget ran out, or the claim met all the debris it
-- may remove.
local function exhausted(s)
  return s.budget == 0 or #s.debris >= DEBRIS_MAX
end

-- index_walk walks a sorted-set index in batches between min and max with
-- cmd (ZRANGEBYSCORE or ZRANGEBYLEX); a member is a worker id, or, with
-- cut, holds it from byte cut on. first (nil: FIRST_BATCH) is the size of
-- the first read. Returns id, worker for the first usable one, or nil,
-- stopped (stopped: the scan budget ran out).
local function index_walk(s, cmd, key, min, max, cut, first)
  local off, n = 0, first or FIRST_BATCH
  while true do
    local batch = redis.call(cmd, key, min, max, 'LIMIT', off, n)
    for _, m in ipairs(batch) do
      local id = m
      if cut then id = string.sub(m, cut) end
      local w = examine(s, id)
      if w then return id, w end
      if exhausted(s) then return nil, true end
    end
    if #batch < n then return nil, false end
    off, n = off + #batch, BATCH
  end
end

-- zstream reads a sorted set in ascending (score, member) order, batch by
-- batch: zstream(key, skip, upto) opens it, zs_next(z) returns the next
-- member and its score, or nil at the end. Members in skip are passed
-- over. upto (a number; nil: no bound) reads only members scored at most
-- upto, for a walk that may not need the rest; zs_unbound lifts the bound
-- (what was read stays a prefix of the stream: zs_next reads on).
local function zstream(key, skip, upto)
  local max = '+inf'
  if upto then max = fmt(math.ceil(upto)) end
  return { key = key, skip = skip, buf = {}, i = 1, off = 0, n = FIRST_BATCH, done = false, upto = upto, max = max }
end

local function zs_unbound(z)
  z.upto, z.max, z.done = nil, '+inf', false
end

local function zs_next(z)
  while true do
    local buf, i = z.buf, z.i
    if i > #buf then
      if z.done then return nil end
      buf = redis.call('ZRANGEBYSCORE', z.key, '-inf', z.max, 'WITHSCORES', 'LIMIT', z.off, z.n)
      z.buf, z.off, i = buf, z.off + #buf / 2, 1
      if #buf < 2 * z.n then z.done = true end
      z.n = BATCH
      if #buf == 0 then return nil end
    end
    local id, sc = buf[i], tonumber(buf[i + 1])
    z.i = i + 2
    if not (z.skip and z.skip[id]) then return id, sc end
  end
end

local WALKS = {}
-- WALK_INDEX names the index a policy's walk reads, when it is not
-- idx:lifetime (every policy's): one of common.lua's OPT_NAMES, kept while
-- the policy claims the pool (common.lua, "Kept indexes").
local WALK_INDEX = {}
-- @walks
