package registry

import (
	_ "embed"
	"strings"

	"github.com/redis/go-redis/v9"
)

// The Lua scripts. Each is lua/common.lua followed by the script's own file;
// every file's header says its KEYS, ARGV, return value and complexity.
// redis.Script runs EVALSHA and falls back to EVAL once per server.
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

	scriptRegister    = redis.NewScript(luaCommon + luaRegister)
	scriptHeartbeat   = redis.NewScript(luaCommon + luaHeartbeat)
	scriptUpdate      = redis.NewScript(luaCommon + luaUpdate)
	scriptExpire      = redis.NewScript(luaCommon + luaExpire)
	scriptExpireStale = redis.NewScript(luaCommon + luaExpireStale)
	scriptLease       = redis.NewScript(luaCommon + luaLease)
	scriptClaim       = redis.NewScript(claimSource())
	scriptRead        = redis.NewScript(luaCommon + contractLua("read.lua", readArgs, readReply) + rowsLua("read.lua", readRow) + luaRead)
	scriptReconcile   = redis.NewScript(luaCommon + luaReconcile)
)

// scriptUnlock has no common prefix: it touches only the reaper's lock.
var (
	//go:embed lua/unlock.lua
	luaUnlock    string
	scriptUnlock = redis.NewScript(luaUnlock)
)

// walksMark is the line of claim.lua where the policies' walks go.
const walksMark = "-- @walks\n"

// claimSource is claim.lua with its contract prologue and, at walksMark,
// the walk of every policy in the table (registry/policy.go).
func claimSource() string {
	var walks strings.Builder
	for _, p := range policies {
		walks.WriteString(p.walk)
	}
	body := strings.Replace(luaClaim, walksMark, walks.String(), 1)
	return luaCommon + contractLua("claim.lua", claimArgs, claimReply) + body
}
