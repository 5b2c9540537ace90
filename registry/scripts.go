package registry

import (
	_ "embed"

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
	//go:embed lua/reconcile.lua
	luaReconcile string

	scriptRegister    = redis.NewScript(luaCommon + luaRegister)
	scriptHeartbeat   = redis.NewScript(luaCommon + luaHeartbeat)
	scriptUpdate      = redis.NewScript(luaCommon + luaUpdate)
	scriptExpire      = redis.NewScript(luaCommon + luaExpire)
	scriptExpireStale = redis.NewScript(luaCommon + luaExpireStale)
	scriptLease       = redis.NewScript(luaCommon + luaLease)
	scriptClaim       = redis.NewScript(luaCommon + luaClaim)
	scriptRead        = redis.NewScript(luaCommon + luaRead)
	scriptReconcile   = redis.NewScript(luaCommon + luaReconcile)
)

// scriptUnlock has no common prefix: it touches only the reaper's lock.
var (
	//go:embed lua/unlock.lua
	luaUnlock    string
	scriptUnlock = redis.NewScript(luaUnlock)
)
