package registry

import (
	"context"
	"crypto/sha1"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// The Lua scripts run as Redis Functions, all in one library (FUNCTION
// LOAD, FCALL, FCALL_RO; Redis 7.0 or later). Each file's header says its
// KEYS, ARGV, return value and complexity. lua/common.lua's helpers are
// created once, when the library loads, instead of on every call as an
// EVAL script's prologue would be (6–8.5 µs per call,
// docs/perf/registry-profile.md). Each script is a function of (keys,
// args): it first binds common.lua's KEYS, ARGV and K_* locals to the
// call's, then runs the script's body unchanged.
//
// The library's name carries a hash of its source (grid_<hash>, functions
// grid_<hash>_<script>), so two versions of the registry (a rolling
// upgrade) each call their own on one Redis. A library is loaded where a
// call finds it missing (see Registry.fcall): a Redis restarted empty, a
// promoted replica or a Cluster node that never had it loads it on the
// first call there. Old libraries stay until an operator deletes them
// (docs/redis.md).
var (
	//go:embed lua/common.lua
	luaCommon string
	//go:embed lua/register.lua
	luaRegister string
	//go:embed lua/heartbeat.lua
	luaHeartbeat string
	//go:embed lua/update.lua
	luaUpdate string
	//go:embed lua/expire.lua
	luaExpire string
	//go:embed lua/expire_stale.lua
	luaExpireStale string
	//go:embed lua/lease.lua
	luaLease string
	//go:embed lua/claim.lua
	luaClaim string
	//go:embed lua/walk.lua
	luaWalk string
	//go:embed lua/read.lua
	luaRead string
	//go:embed lua/walk_lifetime_first.lua
	luaWalkLifetimeFirst string
	//go:embed lua/walk_vnode.lua
	luaWalkVnode string
	//go:embed lua/walk_fair_share.lua
	luaWalkFairShare string
	//go:embed lua/walk_interleaved_weighted_round_robin.lua
	luaWalkIWRR string
	//go:embed lua/reconcile.lua
	luaReconcile string
	// unlock.lua uses no helper: it touches only the reaper's lock.
	//go:embed lua/unlock.lua
	luaUnlock string
	// forget_limits.lua uses no helper: it touches only the config hash,
	// in a call of its own (never in a batch, so no memo to drop). It only
	// frees memory: allow-oom, as the releases.
	//go:embed lua/forget_limits.lua
	luaForgetLimits string
)

// The registry's scripts, in one library.
var (
	registryScripts = []libScript{
		{name: "register", body: luaRegister},
		{name: "heartbeat", body: luaHeartbeat},
		{name: "update", body: luaUpdate},
		// The scripts that free memory (leases and records) run above
		// maxmemory too (allowOOM), as their EVAL forms did.
		{name: "expire", body: luaExpire, allowOOM: true},
		{name: "expire_stale", body: luaExpireStale, allowOOM: true},
		{name: "lease", body: luaLease, allowOOM: true, batch: true},
		// Claim writes; Pick runs the same body read-only (dry). The walks
		// are made once, at load (claimWalks).
		{name: "claim", prologue: contractLua("claim.lua", claimArgs, claimReply) + claimWalks(), body: contractBody("claim.lua", claimArgs, claimReply, luaClaim), ro: roAlso, batch: true},
		{name: "read", prologue: contractLua("read.lua", readArgs, readReply) + rowsLua("read.lua", readRow), body: contractBody("read.lua", readArgs, readReply, luaRead), ro: roOnly},
		{name: "reconcile", body: luaReconcile},
		{name: "unlock", body: luaUnlock, allowOOM: true},
		{name: "forget_limits", body: luaForgetLimits, allowOOM: true},
	}
	registryLib = newLibrary(registryScripts)

	scriptRegister    = registryLib.function("register")
	scriptHeartbeat   = registryLib.function("heartbeat")
	scriptUpdate      = registryLib.function("update")
	scriptExpire      = registryLib.function("expire")
	scriptExpireStale = registryLib.function("expire_stale")
	scriptLease       = registryLib.function("lease")
	scriptClaim       = registryLib.function("claim")
	scriptRead        = registryLib.function("read")
	scriptReconcile   = registryLib.function("reconcile")
	scriptUnlock      = registryLib.function("unlock")
	scriptForget      = registryLib.function("forget_limits")
)

// walksMark is the line of walk.lua where the policies' walks go.
const walksMark = "-- @walks\n"

// claimWalks is walk.lua with, at walksMark, the walk of every policy in
// the table (registry/policy.go): claim.lua's walk machinery and walks,
// run once when the library loads.
func claimWalks() string {
	var walks strings.Builder
	for _, p := range policies {
		walks.WriteString(p.walk)
	}
	return strings.Replace(luaWalk, walksMark, walks.String(), 1)
}

// claimSource is claim.lua as one EVAL script: common.lua, its contract
// prologue, its walks and its body (what PickScript gives tools that time
// it).
func claimSource() string {
	return luaCommon + contractLua("claim.lua", claimArgs, claimReply) + claimWalks() + contractBody("claim.lua", claimArgs, claimReply, luaClaim)
}

// How a script is registered: FCALL_RO runs only functions flagged
// no-writes, in which Redis refuses any write.
const (
	roNone = iota // writes: FCALL only
	roAlso        // also registered as <name>_ro, no-writes (Pick's dry claim)
	roOnly        // no-writes only (FCALL and FCALL_RO both run it)
)

// libScript is one script of a library.
type libScript struct {
	name string
	// prologue runs once, at load, before the function is made: tables
	// the body reads (the generated contract).
	prologue string
	// body runs on every call, after common.lua's locals are bound.
	body string
	ro   int
	// allowOOM registers the writing function with Redis' allow-oom flag.
	// Redis refuses a function that may write, as a whole, while it is
	// above maxmemory; an EVAL script failed only at its first command
	// that needs memory, so a release (whose first write is a ZREM) went
	// through. Set for the scripts whose work is to free memory (release,
	// undo and expiry of leases, removal of records, the reaper's unlock,
	// the drop of a failed config's limits):
	// with maxmemory-policy noeviction, refusing them too would leave a
	// full Redis with no way to shrink, every ended session holding its
	// slot. (The lease script's renewal runs too: it refreshes expiries
	// and re-creates only leases Redis lost.)
	allowOOM bool
	// batch also registers <name>_many, which runs several calls of the
	// script in one (see manyLua and batch.go).
	batch bool
}

// library is a Function library built from common.lua and scripts.
type library struct {
	name   string // grid_<hash of the source>
	source string // what FUNCTION LOAD gets
	fns    map[string]function
}

// function is one script of a library: the names to FCALL and FCALL_RO
// ("" when it cannot run read-only).
type function struct {
	lib        *library
	name, roFn string
	// many is the name of the function that runs several calls in one
	// ("" when the script has none).
	many string
	// script is the script's own name ("claim", "lease", …).
	script string
}

// keyLine matches common.lua's lines that name the keys
// ("local K_A, K_B = KEYS[1], KEYS[2]").
var keyLine = regexp.MustCompile(`(?m)^local ((?:K_\w+, )*K_\w+) = ((?:KEYS\[\d+\], )*KEYS\[\d+\])$`)

// libNameMark stands for the library's name while its hash is taken.
const libNameMark = "@LIB@"

// newLibrary builds the library of scripts. common.lua is included once,
// as it is (it reads KEYS and ARGV, which here are library locals); bind,
// generated from common.lua's key lines, sets them and the K_* locals at
// the start of every call. A script's body becomes a function of its own,
// so every helper it uses is one of its upvalues (Lua 5.1 allows 60:
// FUNCTION LOAD fails loudly past that, in every test).
func newLibrary(scripts []libScript) *library {
	var set []string
	for _, m := range keyLine.FindAllStringSubmatch(luaCommon, -1) {
		set = append(set, "  "+m[1]+" = "+strings.ReplaceAll(m[2], "KEYS", "keys")+"\n")
	}
	if n := strings.Count(strings.Join(set, ""), "keys["); n != len(poolKeyNames) {
		panic(fmt.Sprintf("registry: common.lua's key lines name %d keys, poolKeys has %d", n, len(poolKeyNames)))
	}
	var b strings.Builder
	b.WriteString("#!lua name=" + libNameMark + "\n")
	b.WriteString("-- generated by registry/scripts.go from registry/lua/*.lua\n")
	b.WriteString("local KEYS, ARGV = {}, {}\n")
	b.WriteString(luaCommon)
	b.WriteString("\nlocal function bind(keys, args)\n  KEYS, ARGV, MEMO = keys, args, args.memo\n")
	b.WriteString(strings.Join(set, ""))
	b.WriteString("end\n")
	for _, s := range scripts {
		fmt.Fprintf(&b, "\n-- %s\ndo\n%s\nlocal function main(keys, args)\nbind(keys, args)\n%s\nend\n", s.name, s.prologue, s.body)
		fn := libNameMark + "_" + s.name
		flags := ""
		if s.allowOOM {
			flags = ", flags = {'allow-oom'}"
		}
		switch s.ro {
		case roNone:
			fmt.Fprintf(&b, "redis.register_function{function_name = '%s', callback = main%s}\n", fn, flags)
		case roAlso:
			fmt.Fprintf(&b, "redis.register_function{function_name = '%s', callback = main%s}\n", fn, flags)
			fmt.Fprintf(&b, "redis.register_function{function_name = '%s_ro', callback = main, flags = {'no-writes'}}\n", fn)
		case roOnly:
			fmt.Fprintf(&b, "redis.register_function{function_name = '%s', callback = main, flags = {'no-writes'}}\n", fn)
		}
		if s.batch {
			fmt.Fprintf(&b, "%sredis.register_function{function_name = '%s_many', callback = many%s}\n", manyLua, fn, flags)
		}
		b.WriteString("end\n")
	}
	sum := sha1.Sum([]byte(b.String()))
	l := &library{name: "grid_" + hex.EncodeToString(sum[:6]), fns: map[string]function{}}
	l.source = strings.ReplaceAll(b.String(), libNameMark, l.name)
	for _, s := range scripts {
		f := function{lib: l, name: l.name + "_" + s.name, script: s.name}
		switch s.ro {
		case roAlso:
			f.roFn = f.name + "_ro"
		case roOnly:
			f.roFn = f.name
		}
		if s.batch {
			f.many = f.name + "_many"
		}
		l.fns[s.name] = f
	}
	return l
}

// manyLua is the function <script>_many: several calls of the script's
// main in one FCALL, in order, each atomic with the others as the whole
// call is. ARGV is the common three (now, channel, pool), then per call
// the number of its own arguments and those arguments. The reply holds
// one item per call: what main returned (false for nothing), or an error
// reply when it failed, so one call's error fails that call alone. A call
// that failed half-way keeps the writes it made, as it would alone
// (Redis does not roll a script back).
const manyLua = `local function many(keys, args)
  -- the batch memo its calls share (common.lua, MEMO)
  local out, i, n, memo = {}, 4, #args, {}
  while i <= n do
    local c = tonumber(args[i])
    if not c or c < 0 or i + c > n then
      return redis.error_reply('batched call ' .. (#out + 1) .. ': bad argument count ' .. tostring(args[i]))
    end
    local one = { args[1], args[2], args[3], memo = memo }
    for j = 1, c do one[3 + j] = args[i + j] end
    i = i + c + 1
    local ok, res = pcall(main, keys, one)
    if not ok then
      -- a runtime error (error(), a Lua fault) is a string: give it
      -- the ERR code a lone call's reply has, so that its code is not
      -- the script's file and line (INFO errorstats counts each code)
      if type(res) ~= 'table' or type(res.err) ~= 'string' then res = { err = 'ERR ' .. tostring(res) } end
    elseif res == nil then
      res = false
    end
    out[#out + 1] = res
  end
  return out
end
`

// manyFn is f's <script>_many as a function to call (see manyLua).
func (f function) manyFn() function { return function{lib: f.lib, name: f.many, script: f.script} }

func (l *library) function(name string) function {
	f, ok := l.fns[name]
	if !ok {
		panic("registry: no script " + name + " in library " + l.name)
	}
	return f
}

// LibraryName is the name of the Function library this version of the
// registry loads (grid_<hash>): FUNCTION LIST LIBRARYNAME grid_ lists
// every version's, FUNCTION DELETE removes an old one.
func LibraryName() string { return registryLib.name }

// functionMissing reports whether err is Redis saying the function called
// does not exist: the library is not loaded there, and nothing ran.
func functionMissing(err error) bool {
	var rerr redis.Error
	return errors.As(err, &rerr) && strings.HasPrefix(rerr.Error(), "ERR Function not found")
}

// load loads the library on the node that serves key: with Cluster, the
// master of key's slot; otherwise the client's server (Sentinel's: the
// master). A library of the same name is the same source (the name holds
// its hash), so one already there counts as loaded (without REPLACE,
// Redis answers that before compiling anything: many callers finding it
// missing at once cost one compilation).
func (l *library) load(ctx context.Context, rdb redis.UniversalClient, key string) error {
	cc, ok := rdb.(*redis.ClusterClient)
	if !ok {
		return l.loadOn(ctx, rdb)
	}
	// The call that found the library missing may have followed a MOVED
	// to a node the client's slot map does not name yet (a slot given to
	// a node added later). ForEachMaster reloads the map first, and the
	// library goes to every master it names, so the node that answered
	// has it whichever it was; only the key's master's failure counts.
	var mu sync.Mutex
	failed := map[string]error{}
	err := cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
		if err := l.loadOn(ctx, c); err != nil {
			mu.Lock()
			failed[c.Options().Addr] = err
			mu.Unlock()
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("reading the Cluster's masters to load function library %s: %w", l.name, err)
	}
	node, err := cc.MasterForKey(ctx, key)
	if err != nil {
		return fmt.Errorf("finding the Cluster master of %s to load function library %s: %w", key, l.name, err)
	}
	return failed[node.Options().Addr]
}

// loadOn loads the library on the server c talks to.
func (l *library) loadOn(ctx context.Context, c redis.Cmdable) error {
	err := c.FunctionLoad(ctx, l.source).Err()
	// Only the library itself counts as loaded: "Function <name> already
	// exists" is another library holding one of its function names, and
	// the call would go on failing (or run that library's code).
	if err != nil && strings.Contains(err.Error(), "Library '"+l.name+"' already exists") {
		return nil
	}
	if err != nil && strings.HasPrefix(err.Error(), "READONLY") {
		return fmt.Errorf("loading function library %s: the server is a read-only replica and its master does not have the library (any write of this registry version through the master loads it): %w", l.name, err)
	}
	if err != nil {
		return fmt.Errorf("loading function library %s: %w", l.name, err)
	}
	return nil
}
