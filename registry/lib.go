package registry

import (
	"context"
	"crypto/sha1"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// The Lua code runs as one Redis Functions library (Redis 7 or later):
// common.lua, then each file's functions. Its name carries a hash of its
// source, grid_<hash>, so two builds (a rolling upgrade) each call their
// own. A call that finds it missing (a Redis restarted empty, a promoted
// replica, a Cluster node that never had it) loads it there and calls
// again.
var (
	//go:embed lua/common.lua
	luaCommon string
	//go:embed lua/claim.lua
	luaClaim string
	//go:embed lua/agent.lua
	luaAgent string
	//go:embed lua/admin.lua
	luaAdmin string
	//go:embed lua/queue.lua
	luaQueue string
)

// walksMark is the line of claim.lua where the policies' walks go.
const walksMark = "-- @walks\n"

// libName and libSource are the library this build loads.
var libName, libSource = buildLibrary()

func buildLibrary() (name, source string) {
	var walks strings.Builder
	for _, p := range policies {
		walks.WriteString(p.walk)
	}
	if !strings.Contains(luaClaim, walksMark) {
		panic("registry: claim.lua has no " + walksMark)
	}
	body := luaCommon + "\n" + strings.Replace(luaClaim, walksMark, walks.String(), 1) + "\n" + luaAgent + "\n" + luaAdmin + "\n" + luaQueue
	sum := sha1.Sum([]byte(body))
	name = "grid_" + hex.EncodeToString(sum[:6])
	return name, "#!lua name=" + name + "\n" + strings.ReplaceAll(body, "@LIB@", name)
}

// LibraryName is the name of the Function library this build loads:
// FUNCTION LIST LIBRARYNAME grid_ lists every build's, FUNCTION DELETE
// removes an old one.
func LibraryName() string { return libName }

// fcall runs one function of the library on group's keys, loading the
// library where it is missing. ro runs it with FCALL_RO (a no-writes
// function, which a replica may serve).
func (r *Registry) fcall(ctx context.Context, fn, group string, ro bool, args ...any) (any, error) {
	keys := r.keys(group)
	name := libName + "_" + fn
	call := func() (any, error) {
		if ro {
			return r.rdb.FCallRO(ctx, name, keys, args...).Result()
		}
		return r.rdb.FCall(ctx, name, keys, args...).Result()
	}
	res, err := call()
	if err != nil && functionMissing(err) {
		if lerr := r.load(ctx, keys[0]); lerr != nil {
			return nil, lerr
		}
		res, err = call()
	}
	if err != nil && strings.HasPrefix(err.Error(), "GRIDSCHEMA ") {
		return nil, fmt.Errorf("%w: %s", ErrSchema, strings.TrimPrefix(err.Error(), "GRIDSCHEMA "))
	}
	return res, err
}

// functionMissing reports whether err is Redis saying the function called
// does not exist: the library is not loaded there, and nothing ran.
func functionMissing(err error) bool {
	var rerr redis.Error
	return errors.As(err, &rerr) && strings.HasPrefix(rerr.Error(), "ERR Function not found")
}

// load loads the library on the node that serves key; with Cluster, on
// every master, so the node a redirect leads to has it too.
func (r *Registry) load(ctx context.Context, key string) error {
	cc, ok := r.rdb.(*redis.ClusterClient)
	if !ok {
		return loadOn(ctx, r.rdb)
	}
	var mu sync.Mutex
	failed := map[string]error{}
	if err := cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
		if err := loadOn(ctx, c); err != nil {
			mu.Lock()
			failed[c.Options().Addr] = err
			mu.Unlock()
		}
		return nil
	}); err != nil {
		return fmt.Errorf("reading the Cluster's masters to load function library %s: %w", libName, err)
	}
	node, err := cc.MasterForKey(ctx, key)
	if err != nil {
		return fmt.Errorf("finding the Cluster master of %s to load function library %s: %w", key, libName, err)
	}
	return failed[node.Options().Addr]
}

func loadOn(ctx context.Context, c redis.Cmdable) error {
	err := c.FunctionLoad(ctx, libSource).Err()
	if err != nil && strings.Contains(err.Error(), "Library '"+libName+"' already exists") {
		return nil
	}
	if err != nil {
		return fmt.Errorf("loading function library %s: %w", libName, err)
	}
	return nil
}
