package main

// The redis-profile section (issue 12, "profile before changing"): where a
// registry script's time goes inside Redis, measured with tiny scripts on
// a private redis-server beside a pool of N workers, each figure the
// script's usec_per_call from INFO commandstats (evalsha or fcall):
//
//   - the cost of calling a script at all (no keys; the claim's 17 keys and
//     23 arguments), and of the common.lua prologue every script runs
//     (about sixty local helpers created on every call);
//   - the same through Redis Functions (FCALL), with the helpers created
//     once when the library loads;
//   - one redis.call's overhead beyond the nested command's own time;
//   - cjson.decode / cjson.encode of a worker record, and common.lua's
//     decode (cjson plus the field checks);
//   - a cjson request and reply against positional ARGV and an array reply,
//     for a request and reply of the claim's size;
//   - a dry lifetime_first claim (Pick's walk, no writes) by EVALSHA
//     against the same code as a Function with library-level helpers;
//   - a claim and a release keeping most of the registry's rules on a
//     packed layout (profPacked) beside today's claim and release (claims
//     first, then their releases), and the bare lean sketch (profLean).
//
// The registry's Lua is read from registry/lua/ under the working
// directory (make bench runs from the repository root); a row whose script
// no longer fits today's layout prints its error instead of a figure.
//
//	gridbench -only redis-profile          # about 20 s at N=10,000
//	gridbench -only redis-profile -quick   # a smoke run

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/browsergrid/caddy-browser-grid/registry"
	"github.com/browsergrid/caddy-browser-grid/selection"
)

func init() {
	register(section{name: "redis-profile", order: 41, run: runProfile})
}

// profRow is one measured script.
type profRow struct {
	what string
	// loops is how many times the script repeats the measured operation
	// in one call (the figure is divided by it after the empty call's
	// cost is taken off); 0: the whole call is the figure.
	loops int
	run   func(ctx context.Context) error
	cmd   string // evalsha or fcall
}

func runProfile(cfg *config) error {
	w := cfg.out
	n, reps := *tgtN, 2000
	if cfg.quick {
		n, reps = 300, 50
	}
	reg, rdb, stop, err := regOpen()
	if err != nil {
		return err
	}
	defer stop()
	ctx := context.Background()
	const pool = "prof"
	if err := regPopulate(ctx, reg, rdb, pool, n); err != nil {
		return err
	}
	keys := make([]string, 17)
	for i := range keys {
		keys[i] = fmt.Sprintf("{grid:%s}:k%d", pool, i)
	}
	poolKeys := []string{}
	for _, k := range []string{"workers", "active", "lifetime", "durations", "commands", "vnodes", "leases", "lease_expiry", "config",
		"idx:lifetime", "idx:ring", "idx:fair_idle", "idx:fair_busy", "idx:fair_end", "retiring", "lease_owner", "cancelled"} {
		poolKeys = append(poolKeys, reg.Key(pool, k))
	}
	record, err := rdb.HGet(ctx, reg.Key(pool, "workers"), "w00001").Result()
	if err != nil {
		return fmt.Errorf("reading a worker record: %w", err)
	}
	if err := rdb.HSet(ctx, keys[0], "f", "12").Err(); err != nil {
		return err
	}
	// The claim's 23 arguments (a dry lifetime_first claim, as Pick sends).
	claimArgs := []any{0, reg.Key(pool, "wakeup"), pool, "lifetime_first", 1, 5, 1_000_000, 3_600_000, 16, 20, 0, 30_000,
		"", 30_000, "gridbench", 60_000, 20, 64, 0, 0, "", "0123456789abcdef", 0}
	common, _, luaErr := profReadLua()
	// The dry claim as Pick sends it (named ARGV, every policy's walk).
	pickKeys, pickArgs, claim, err := reg.PickScript(registry.ClaimRequest{Pool: pool, Policy: registry.LifetimeFirst,
		Limits: selection.Limits{MaxConcurrent: 5, MaxLifetime: 1_000_000, StaleAfter: time.Hour, MaxScan: 16}, Holder: "gridbench"})
	if err != nil {
		return fmt.Errorf("building the dry claim: %w", err)
	}

	leanKeys := []string{reg.Key(pool, "idx:lifetime"), reg.Key(pool, "workers"), reg.Key(pool, "active"),
		reg.Key(pool, "leases"), reg.Key(pool, "lease_expiry")}
	leanClaim, leanRelease := redis.NewScript(profLeanClaim), redis.NewScript(profLeanRelease)
	leaseNo := 0
	leanPair := func(fn bool) func(context.Context) error {
		return func(ctx context.Context) error {
			leaseNo++
			lid := fmt.Sprintf("lean%09d", leaseNo)
			var err error
			if fn {
				err = rdb.FCall(ctx, "gb_lean_claim", leanKeys, lid, 1e13).Err()
			} else {
				err = leanClaim.Run(ctx, rdb, leanKeys, lid, 1e13).Err()
			}
			if err != nil {
				return err
			}
			if fn {
				return rdb.FCall(ctx, "gb_lean_release", leanKeys, lid).Err()
			}
			return leanRelease.Run(ctx, rdb, leanKeys, lid).Err()
		}
	}
	// The packed sketch (profPacked) on keys of its own beside the pool's
	// records: every worker's figures in one packed value, leases as
	// plain strings.
	packedKeys := []string{reg.Key(pool, "sk:idx"), reg.Key(pool, "workers"), reg.Key(pool, "sk:figs"),
		reg.Key(pool, "sk:leases"), reg.Key(pool, "sk:lease_expiry"), reg.Key(pool, "sk:owner"), reg.Key(pool, "sk:config")}
	if err := profPackedPopulate(ctx, rdb, packedKeys, n); err != nil {
		return err
	}
	// Claims, then their releases in the order claimed (the rows run
	// one after the other, as many calls each), as redis-targets does.
	var packedLeases, todayLeases []string
	packedClaim := func(ctx context.Context) error {
		leaseNo++
		lid := fmt.Sprintf("packed%09d", leaseNo)
		got, err := rdb.FCall(ctx, "gb_packed_claim", packedKeys, lid, time.Now().UnixMilli(), 600_000).Slice()
		if err != nil {
			return fmt.Errorf("packed claim: %w", err)
		}
		if len(got) == 0 || got[0] != int64(1) {
			return fmt.Errorf("packed claim found no worker: %v", got)
		}
		packedLeases = append(packedLeases, lid)
		return nil
	}
	packedRelease := func(ctx context.Context) error {
		if len(packedLeases) == 0 {
			return errors.New("packed release: no lease left to release")
		}
		lid := packedLeases[0]
		packedLeases = packedLeases[1:]
		n, err := rdb.FCall(ctx, "gb_packed_release", packedKeys, lid, time.Now().UnixMilli()).Int()
		if err != nil || n != 1 {
			return fmt.Errorf("packed release: %d, %v", n, err)
		}
		return nil
	}
	// Today's lifetime_first claims and releases, the same way, for the
	// sketch to be read against.
	todayReq := registry.ClaimRequest{Pool: pool, Policy: registry.LifetimeFirst, Holder: "gridbench",
		Limits: selection.Limits{MaxConcurrent: 5, MaxLifetime: 1_000_000, StaleAfter: time.Hour, MaxScan: 16}}
	todayClaim := func(ctx context.Context) error {
		c, err := reg.Claim(ctx, todayReq)
		if err != nil {
			return err
		}
		todayLeases = append(todayLeases, c.LeaseID)
		return nil
	}
	todayRelease := func(ctx context.Context) error {
		if len(todayLeases) == 0 {
			return errors.New("release: no lease left to release")
		}
		lid := todayLeases[0]
		todayLeases = todayLeases[1:]
		return reg.Release(ctx, pool, lid)
	}
	evalsha := func(src string, keys []string, args ...any) func(context.Context) error {
		s := redis.NewScript(src)
		return func(ctx context.Context) error { return s.Run(ctx, rdb, keys, args...).Err() }
	}
	fcall := func(name string, keys []string, args ...any) func(context.Context) error {
		return func(ctx context.Context) error { return rdb.FCall(ctx, name, keys, args...).Err() }
	}
	libErr := func(lib string) error {
		if luaErr != nil {
			return luaErr
		}
		return rdb.FunctionLoadReplace(ctx, lib).Err()
	}
	rows := []profRow{
		{what: "EVALSHA `return 1`, no keys", run: evalsha("return 1", nil), cmd: "evalsha"},
		{what: "EVALSHA `return 1`, the claim's 17 keys and 23 arguments", run: evalsha("return 1", keys, claimArgs...), cmd: "evalsha"},
		{what: "EVALSHA common.lua + `return 1` (helpers created per call), 17 keys, 23 arguments",
			run: evalsha(common+"\nreturn 1", keys, claimArgs...), cmd: "evalsha"},
		{what: "FCALL `return 1`, 17 keys, 23 arguments", run: fcall("gb_noop", keys, claimArgs...), cmd: "fcall"},
		{what: "FCALL common.lua's helpers made once at load, keys set per call, `return 1`",
			run: fcall("gb_common_noop", keys, claimArgs...), cmd: "fcall"},
		{what: "one redis.call('HGET') beyond HGET's own time (100 per call)", loops: 100,
			run: evalsha("for i = 1, 100 do redis.call('HGET', KEYS[1], 'f') end return 1", keys[:1]), cmd: "evalsha"},
		{what: "cjson.decode of a worker record (100 per call)", loops: 100,
			run: evalsha("local r = ARGV[1] for i = 1, 100 do cjson.decode(r) end return 1", nil, record), cmd: "evalsha"},
		{what: "cjson.encode of a worker record (100 per call)", loops: 100,
			run: evalsha("local t = cjson.decode(ARGV[1]) for i = 1, 100 do cjson.encode(t) end return 1", nil, record), cmd: "evalsha"},
		{what: "common.lua decode(): cjson.decode and the field checks (100 per call)", loops: 100,
			run: evalsha(common+"\nlocal r = ARGV[1] for i = 1, 100 do decode(r) end return 1", nil, record), cmd: "evalsha"},
		{what: "common.lua load_worker(): one worker's 5 HGETs, decode and hot figures (100 per call)", loops: 100,
			run: fcall("gb_load_worker", pickKeys, "w00001"), cmd: "fcall"},
		{what: "common.lua load_cfg(): the config hash's HMGET into a table (100 per call)", loops: 100,
			run: fcall("gb_load_cfg", pickKeys), cmd: "fcall"},
		{what: "positional request (23 ARGV read) and an array reply of 25 items", run: evalsha(profPositional, nil, append(claimArgs, record)...), cmd: "evalsha"},
		{what: "the same through the named contract (registry/contract.go's REQ and reply{}), 24 ARGV", run: evalsha(profNamed(), nil, append(pickArgs, record)...), cmd: "evalsha"},
		{what: "cjson request (one ARGV) decoded and a cjson reply of 25 fields", run: evalsha(profJSON, nil, profRequest, record), cmd: "evalsha"},
		{what: "cjson request (one ARGV) decoded and an array reply of 25 items", run: evalsha(profJSONArray, nil, profRequest, record), cmd: "evalsha"},
		{what: fmt.Sprintf("dry lifetime_first claim at N=%d (Pick's walk), EVALSHA of common.lua + claim.lua", n),
			run: evalsha(common+claim, pickKeys, pickArgs...), cmd: "evalsha"},
		{what: fmt.Sprintf("the same walk as a Function, helpers made once at load, N=%d", n),
			run: fcall("gb_claim", pickKeys, pickArgs...), cmd: "fcall"},
		// These write: the packed sketch its own keys, today's pair the
		// pool's (before the lean rows reorder idx:lifetime).
		{what: "packed sketch's claim (11 commands, see profPacked), FCALL", run: packedClaim, cmd: "fcall"},
		{what: "packed sketch's release (8 commands) of those claims, in order", run: packedRelease, cmd: "fcall"},
		{what: "today's lifetime_first claim (Registry.Claim), FCALL", run: todayClaim, cmd: "fcall"},
		{what: "today's release (Registry.Release) of those claims, in order", run: todayRelease, cmd: "fcall"},
		// Last: these write to the pool's keys.
		{what: "lean claim + release sketch (7 + 5 commands, see profLean), EVALSHA, per script", run: leanPair(false), cmd: "evalsha"},
		{what: "the same lean sketch as Functions (FCALL), per script", run: leanPair(true), cmd: "fcall"},
	}
	libs := []string{
		"#!lua name=gbnoop\nredis.register_function('gb_noop', function(keys, args) return 1 end)",
		profLibrary("gbcommon", common, "gb_common_noop", "return 1"),
		profLibrary("gbclaim", common, "gb_claim", claim),
		profLibrary("gbloadworker", common, "gb_load_worker", "for i = 1, 100 do assert(load_worker(ARGV[1])) end return 1"),
		profLibrary("gbloadcfg", common, "gb_load_cfg", "for i = 1, 100 do load_cfg() end return 1"),
		// common.lua's decode (and what it uses): the sketch checks records
		// as the registry does
		"#!lua name=gbpacked\nlocal KEYS, ARGV = {}, {}\n" + common + profPacked,
		"#!lua name=gblean\nredis.register_function('gb_lean_claim', function(KEYS, ARGV)\n" + profLeanClaim +
			"\nend)\nredis.register_function('gb_lean_release', function(KEYS, ARGV)\n" + profLeanRelease + "\nend)\n",
	}
	var loadErr error
	for _, l := range libs {
		if err := libErr(l); err != nil && loadErr == nil {
			loadErr = fmt.Errorf("FUNCTION LOAD: %w", err)
		}
	}

	fmt.Fprintf(w, "Inside Redis (usec_per_call from INFO commandstats over %d calls each; N=%d workers in the pool):\n\n", reps, n)
	fmt.Fprintln(w, "| what | µs per call | µs per operation (loops: the empty call taken off) |")
	fmt.Fprintln(w, "|---|---:|---:|")
	var empty float64
	for i, r := range rows {
		d, err := profDelta(ctx, rdb, reps, r.run)
		us := d[r.cmd].perCall()
		if err != nil && r.cmd == "fcall" && loadErr != nil {
			err = loadErr
		}
		if err != nil && r.cmd == "fcall" && strings.Contains(r.what, "lean") {
			err = fmt.Errorf("%w (library load: %v)", err, loadErr)
		}
		if err == nil && (strings.Contains(r.what, "common.lua") || strings.Contains(r.what, "claim")) && luaErr != nil {
			err = luaErr
		}
		if err != nil {
			fmt.Fprintf(w, "| %s | n/a: %s | |\n", r.what, strings.ReplaceAll(err.Error(), "\n", " "))
			continue
		}
		if i == 0 {
			empty = us
		}
		per := ""
		if r.loops > 0 {
			op := (us - empty) / float64(r.loops)
			if strings.Contains(r.what, "HGET") {
				// the nested HGETs' own time, counted apart by Redis
				op -= d["hget"].usec / float64(reps*r.loops)
			}
			per = tgtF(op, 2)
		}
		fmt.Fprintf(w, "| %s | %s | %s |\n", r.what, tgtF(us, 2), per)
	}
	return nil
}

// profMeasure runs op reps times (after a warm-up) and returns cmd's
// usec_per_call over those calls.
func profMeasure(ctx context.Context, rdb *redis.Client, cmd string, reps int, op func(context.Context) error) (float64, error) {
	d, err := profDelta(ctx, rdb, reps, op)
	if err != nil {
		return 0, err
	}
	return d[cmd].perCall(), nil
}

// profDelta runs op reps times (after a warm-up) and returns the
// commandstats delta over those calls.
func profDelta(ctx context.Context, rdb *redis.Client, reps int, op func(context.Context) error) (cmdStats, error) {
	for range 5 {
		if err := op(ctx); err != nil {
			return nil, err
		}
	}
	a, err := tgtCommandStats(ctx, rdb)
	if err != nil {
		return nil, err
	}
	for range reps {
		if err := op(ctx); err != nil {
			return nil, err
		}
	}
	b, err := tgtCommandStats(ctx, rdb)
	if err != nil {
		return nil, err
	}
	return b.sub(a), nil
}

// profReadLua reads common.lua and claim.lua from registry/lua/.
func profReadLua() (common, claim string, err error) {
	dir := filepath.Join("registry", "lua")
	c, err := os.ReadFile(filepath.Join(dir, "common.lua"))
	if err != nil {
		return "", "", fmt.Errorf("reading the registry's Lua (run from the repository root): %w", err)
	}
	cl, err := os.ReadFile(filepath.Join(dir, "claim.lua"))
	if err != nil {
		return "", "", fmt.Errorf("reading the registry's Lua: %w", err)
	}
	return string(c), string(cl), nil
}

// profKeyLine matches common.lua's lines that name the KEYS.
var profKeyLine = regexp.MustCompile(`(?m)^local ((?:K_\w+, )*K_\w+) = ((?:KEYS\[\d+\], )*KEYS\[\d+\])$`)

// profLibrary turns common.lua into a Function library whose helpers are
// created once, at load: KEYS and ARGV become library locals that a setter
// assigns on every call, before body runs (in a function of keys and args).
func profLibrary(lib, common, name, body string) string {
	var set []string
	for _, m := range profKeyLine.FindAllStringSubmatch(common, -1) {
		set = append(set, m[1]+" = "+strings.ReplaceAll(m[2], "KEYS", "keys"))
	}
	return "#!lua name=" + lib + "\nlocal KEYS, ARGV = {}, {}\n" + common +
		"\nlocal function gb_set(keys, args)\n  KEYS, ARGV = keys, args\n  " + strings.Join(set, "\n  ") + "\nend\n" +
		"redis.register_function('" + name + "', function(keys, args)\n gb_set(keys, args)\n" + body + "\nend)\n"
}

// profPositional reads a claim's 23 positional arguments and returns an
// array reply of 25 items, as claim.lua does today.
const profPositional = `
local now = tonumber(ARGV[1])
local policy, dry = ARGV[4], ARGV[5] == '1'
local mc, ml, stale, maxscan = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9])
local win, med, def = tonumber(ARGV[10]), ARGV[11] == '1', tonumber(ARGV[12])
local lid, ttl, holder, cmdttl = ARGV[13], tonumber(ARGV[14]), ARGV[15], tonumber(ARGV[16])
local keep, sweep, stagger, cfgt = tonumber(ARGV[17]), tonumber(ARGV[18]), ARGV[19] == '1', tonumber(ARGV[20])
local epoch, token, k = ARGV[21], ARGV[22], tonumber(ARGV[23])
return { 1, 'w00001', ARGV[24], 1, 2, '', 0, 1, {}, {}, 0, 1, 0, 0, now, 0, {}, 0, mc, ml, 0, win, 0, def, token }
`

// profNamed reads the claim's arguments by name and builds its reply by
// name, through the prologue registry/contract.go generates and its
// compilation into positions (ClaimContractBody): what the
// named contract costs over profPositional.
func profNamed() string {
	lua, args, reply := registry.ClaimContractLua()
	var b strings.Builder
	b.WriteString(lua)
	b.WriteString("local now = tonumber(ARGV[1])\n")
	for i, a := range args {
		fmt.Fprintf(&b, "local v%d = ARGV[REQ.%s]\n", i, a)
	}
	var body strings.Builder
	body.WriteString("return reply {\n")
	for i, f := range reply {
		fmt.Fprintf(&body, "  %s = v%d,\n", f, i%len(args))
	}
	body.WriteString("}\n")
	// the names compiled into positions, as the registry's library does
	return registry.ClaimContractBody(b.String() + body.String())
}

// profJSON decodes a claim request of the same fields from one cjson
// argument and encodes a reply of the same 25 fields.
const profJSON = `
local req = cjson.decode(ARGV[1])
local now = req.now
local mc, ml = req.max_concurrent, req.max_lifetime
return cjson.encode({ ok = true, id = 'w00001', record = ARGV[2], active = 1, lifetime = 2, durations = '', drain = false,
  scanned = 1, stale = {}, bad = {}, wraps = 0, effective = 1, dedupes = 0, tied = false, now = now, retiring = false,
  retired_stale = {}, overridden = false, max_concurrent = mc, max_lifetime = ml, stagger = req.stagger, fs_window = req.fs_window,
  fs_median = req.fs_median, fs_default_ms = req.fs_default_ms, epoch = req.token })
`

// profJSONArray decodes the cjson request and answers with an array.
const profJSONArray = `
local req = cjson.decode(ARGV[1])
return { 1, 'w00001', ARGV[2], 1, 2, '', 0, 1, {}, {}, 0, 1, 0, 0, req.now, 0, {}, 0, req.max_concurrent, req.max_lifetime, 0,
  req.fs_window, 0, req.fs_default_ms, req.token }
`

// profRequest is a claim request as one JSON document (vnode, K = 2).
const profRequest = `{"now":0,"channel":"{grid:prof}:wakeup","pool":"prof","policy":"vnode","dry":false,"max_concurrent":5,` +
	`"max_lifetime":1000000,"stale_after_ms":60000,"max_scan":16,"fs_window":20,"fs_median":false,"fs_default_ms":30000,` +
	`"lease":"Zk3qW9rT2mXp8sLd4vBn","lease_ttl_ms":30000,"holder":"caddy-1","command_ttl_ms":60000,"keep":20,"sweep":64,` +
	`"stagger":false,"config_time_ms":1763884800000,"epoch":"0123456789abcdef","token":"fedcba9876543210","k":2,` +
	`"pivots":["8f14e45fceea167a5a36dedd4bea2543","c9f0f895fb98ab9159f51fd0297e236d"],"jitter":[1,3],"tiebreak":[0,1]}`

// profLean is a sketch of the least a lifetime-first claim and a release
// must do (not the registry's rules: no limits, no stale check, no
// generations): take the head of idx:lifetime, read its record, count the
// session in active and in the index, record and time the lease; and the
// reverse. KEYS: idx:lifetime, workers, active, leases, lease_expiry.
// ARGV: lease id, expiry.
const profLeanClaim = `
local id = redis.call('ZRANGE', KEYS[1], 0, 0)[1]
if not id then return false end
local rec = redis.call('HGET', KEYS[2], id)
local a = redis.call('HINCRBY', KEYS[3], id, 1)
redis.call('ZINCRBY', KEYS[1], 1, id)
redis.call('HSET', KEYS[4], ARGV[1], id)
redis.call('ZADD', KEYS[5], ARGV[2], ARGV[1])
return { id, rec, a }`

const profLeanRelease = `
local id = redis.call('HGET', KEYS[4], ARGV[1])
if not id then return 0 end
redis.call('HDEL', KEYS[4], ARGV[1])
redis.call('ZREM', KEYS[5], ARGV[1])
redis.call('HINCRBY', KEYS[3], id, -1)
redis.call('ZINCRBY', KEYS[1], -1, id)
return 1`

// profPacked sketches a lifetime_first claim and a release that keep most
// of the registry's rules on a leaner layout, to price that layout before
// anyone migrates to it: a worker's counts, predicted end, suspicion and
// durations in one packed value of one hash ("figs": "<active> <lifetime>
// <predicted end> <suspect until> <entries> <sum>|<durations>") instead of
// four, and a lease as a plain string ("<worker> <gen> <claimed ms>
// <lifetime>") instead of JSON. Kept: the replay check, the config read
// (limits, epoch), a look at due leases, the record read and its checks
// (common.lua's, so generations and status are honoured), owner entries,
// the lease's expiry, the release's tombstone, the duration window (20);
// the library is loaded behind common.lua, whose decode it calls.
// Left out: stagger, kept optional indexes, client limits, stale expiry
// reports, the wake-up. KEYS: idx, records, figs, leases, lease_expiry,
// owner, config. Claim ARGV: lease id, now ms, lease ttl ms; release ARGV:
// lease id, now ms.
const profPacked = `
local function unpack_figs(raw)
  if not raw then return nil end
  local a, l, pe, su, n, s, d = string.match(raw, '^(%d+) (%d+) (%d+) (%d+) (%d+) (%d+)|(.*)$')
  if not a then return nil end
  return { a = tonumber(a), l = tonumber(l), pe = tonumber(pe), su = tonumber(su), n = tonumber(n), s = tonumber(s), d = d }
end
local function pack_figs(f)
  return string.format('%d %d %d %d %d %d|', f.a, f.l, f.pe, f.su, f.n, f.s) .. f.d
end
local function score(f) return -f.l * LF_SCALE + f.a end

redis.register_function('gb_packed_claim', function(K, A)
  local lid, now = A[1], tonumber(A[2])
  if redis.call('HGET', K[4], lid) then return { -2 } end
  local c = redis.call('HMGET', K[7], 'max_concurrent', 'max_lifetime', 'epoch', 'set_at', 'fs_window')
  local mc = tonumber(c[1]) or 0
  redis.call('ZRANGEBYSCORE', K[5], '-inf', '(' .. now, 'LIMIT', 0, 1)
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', K[1], '-inf', '+inf', 'LIMIT', 0, 4)) do
    local rec = redis.call('HGET', K[2], id)
    local w = decode(rec)
    local f = unpack_figs(redis.call('HGET', K[3], id))
    if w and f and w.status == 'available' and w.expires >= now and (mc == 0 or f.a < mc) and now >= f.su then
      redis.call('ZADD', K[6], 0, id .. ' ' .. w.gen .. ' ' .. lid)
      f.a, f.l = f.a + 1, f.l + 1
      local est = 30000
      if f.n > 0 then est = math.floor(f.s / f.n) end
      f.pe = math.max(now, f.pe) + est
      local packed = pack_figs(f)
      redis.call('HSET', K[3], id, packed)
      if mc > 0 and f.a >= mc then redis.call('ZREM', K[1], id) else redis.call('ZADD', K[1], score(f), id) end
      redis.call('HSET', K[4], lid, id .. ' ' .. w.gen .. ' ' .. now .. ' ' .. f.l)
      redis.call('ZADD', K[5], now + tonumber(A[3]), lid)
      return { 1, id, rec, packed }
    end
  end
  return { 0 }
end)

redis.register_function('gb_packed_release', function(K, A)
  local lid, now = A[1], tonumber(A[2])
  local raw = redis.call('HGET', K[4], lid)
  if not raw or string.sub(raw, 1, 6) == 'ended:' then return 0 end
  local id, gen, claimed = string.match(raw, '^(%S+) (%S+) (%d+) %d+$')
  if id then
    redis.call('ZREM', K[6], id .. ' ' .. gen .. ' ' .. lid)
    local w = decode(redis.call('HGET', K[2], id))
    local f = unpack_figs(redis.call('HGET', K[3], id))
    local c = redis.call('HMGET', K[7], 'max_concurrent', 'max_lifetime', 'fs_window')
    if w and f and w.gen == gen and f.a > 0 then
      f.a = f.a - 1
      local ms = math.max(0, now - tonumber(claimed))
      local keep = tonumber(c[3]) or 20
      if f.n >= keep then
        local cut = string.find(f.d, ',', 1, true)
        f.s = f.s - tonumber(string.sub(f.d, 1, (cut or 0) - 1)) + ms
        f.d = string.sub(f.d, (cut or #f.d) + 1) .. ',' .. ms
      else
        f.n, f.s = f.n + 1, f.s + ms
        if f.d == '' then f.d = tostring(ms) else f.d = f.d .. ',' .. ms end
      end
      if f.a == 0 and f.pe > now then f.pe = now end
      redis.call('HSET', K[3], id, pack_figs(f))
      if w.status == 'available' then redis.call('ZADD', K[1], score(f), id) end
    end
  end
  redis.call('HSET', K[4], lid, 'ended:' .. (now + 60000))
  return 1
end)
`

// profPackedPopulate writes the packed sketch's figures and index for the
// pool's n workers (w00000 …, registered already) and its config.
func profPackedPopulate(ctx context.Context, rdb *redis.Client, keys []string, n int) error {
	pipe := rdb.Pipeline()
	pipe.Del(ctx, keys[0], keys[2], keys[3], keys[4], keys[5], keys[6])
	for i := range n {
		id := fmt.Sprintf("w%05d", i)
		pipe.HSet(ctx, keys[2], id, "0 0 0 0 0 0|")
		pipe.ZAdd(ctx, keys[0], redis.Z{Score: 0, Member: id})
	}
	pipe.HSet(ctx, keys[6], "max_concurrent", 5, "max_lifetime", 1_000_000, "epoch", "0123456789abcdef", "set_at", 1, "fs_window", 20)
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("writing the packed sketch's keys: %w", err)
	}
	return nil
}
