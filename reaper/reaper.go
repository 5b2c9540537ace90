// Package reaper removes the workers whose agents stopped heartbeating,
// with their sessions, in every pool and version group of a registry. It
// is safe to run in many places at once: each removal is one atomic call
// that checks the heartbeat again.
package reaper

import (
	"context"
	"time"

	"go.uber.org/zap"

	"github.com/browsergrid/caddy-browser-grid/registry"
)

// Options configure a reaper.
type Options struct {
	// Interval between passes over every pool.
	Interval time.Duration
	// StaleAfter is the heartbeat age past which a worker is removed.
	StaleAfter time.Duration
	// Kick names a group to look at at once (a claim walked past stale
	// workers there); nil: none.
	Kick <-chan string
	// OnReaped, when set, is told how many workers each pass removed per
	// pool.
	OnReaped func(pool string, n int)
	Log      *zap.Logger
}

// passTimeout bounds one pass over one group.
const passTimeout = 30 * time.Second

// Start runs the reaper until the returned function is called (which
// waits for the pass under way to end, at most a second).
func Start(reg *registry.Registry, o Options) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(o.Interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case g := <-o.Kick:
				reapGroup(ctx, reg, o, g)
			case <-t.C:
				Pass(ctx, reg, o)
			}
		}
	}()
	return func() {
		cancel()
		select {
		case <-done:
		case <-time.After(time.Second):
		}
	}
}

// Pass removes the stale workers of every pool's every group once.
func Pass(ctx context.Context, reg *registry.Registry, o Options) {
	pools, err := reg.Pools(ctx)
	if err != nil {
		o.Log.Warn("listing pools to reap", zap.Error(err))
		return
	}
	for _, p := range pools {
		vs, err := reg.Versions(ctx, p)
		if err != nil {
			o.Log.Warn("listing a pool's groups to reap", zap.String("pool", p), zap.Error(err))
			continue
		}
		reapGroup(ctx, reg, o, p)
		for _, v := range vs.Versions {
			reapGroup(ctx, reg, o, registry.GroupPool(p, v))
		}
	}
}

func reapGroup(ctx context.Context, reg *registry.Registry, o Options, group string) {
	ctx, cancel := context.WithTimeout(ctx, passTimeout)
	defer cancel()
	n, err := reg.Reap(ctx, group, o.StaleAfter)
	if err != nil {
		o.Log.Warn("reaping stale workers", zap.String("pool", group), zap.Error(err))
	}
	if n > 0 {
		o.Log.Info("removed stale workers and their sessions", zap.String("pool", group), zap.Int("workers", n))
		if o.OnReaped != nil {
			pool, _ := registry.SplitGroup(group)
			o.OnReaped(pool, n)
		}
	}
}
