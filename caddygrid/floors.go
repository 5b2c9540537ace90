package caddygrid

import (
	"context"
	"time"

	"go.uber.org/zap"

	"github.com/browsergrid/caddy-browser-grid/registry"
)

// Lifetime floors. When Redis loses a pool's data (an empty restart, a
// failover to a replica that missed writes), a worker's lifetime comes
// back from two sources: its agent re-asserts the lifetime of its last
// heartbeat, and this process's renewal re-creates the leases of its live
// sessions, each with the lifetime it was claimed at. The sessions that
// ended since that heartbeat (up to a heartbeat interval of them, or more
// when the agent was cut off) are in neither, and the browser would serve
// them again past max_lifetime. So this process remembers, per worker
// generation, the highest lifetime among the sessions it served there, for
// floorKeep, and re-asserts those floors (registry.AssertLifetimes) when
// it learns of a loss: a claim's EpochError, or a renewal that had to
// re-create leases. The floor is taken at release: a claim undone (never
// served) gave its lifetime back.

// floorKeep is how long a floor is kept after its worker's last session
// here: far longer than an agent's heartbeat interval, whose reply already
// re-asserts everything older.
const floorKeep = 10 * time.Minute

type floorKey struct{ worker, gen string }

type lifeFloor struct {
	life int
	at   time.Time
}

// noteServed remembers the lifetime a served session was claimed at.
func (b *backend) noteServed(c *registry.Claim) {
	if c.Worker.Lifetime <= 0 {
		return
	}
	now := time.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.floors == nil {
		b.floors = map[string]map[floorKey]*lifeFloor{}
	}
	fs := b.floors[c.Pool]
	if fs == nil {
		fs = map[floorKey]*lifeFloor{}
		b.floors[c.Pool] = fs
	}
	k := floorKey{c.Worker.ID, c.Gen}
	if f := fs[k]; f != nil {
		f.life = max(f.life, c.Worker.Lifetime)
		f.at = now
		return
	}
	fs[k] = &lifeFloor{life: c.Worker.Lifetime, at: now}
}

// pruneFloors drops the floors older than floorKeep.
func (b *backend) pruneFloors(now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for pool, fs := range b.floors {
		for k, f := range fs {
			if now.Sub(f.at) > floorKeep {
				delete(fs, k)
			}
		}
		if len(fs) == 0 {
			delete(b.floors, pool)
		}
	}
}

// assertFloors re-asserts the pool's floors after Redis lost its data.
// A failure is logged: the claim or renewal that asked goes on (the
// sessions then count as the agents and the leases re-assert them).
func (b *backend) assertFloors(ctx context.Context, pool string) {
	b.mu.Lock()
	var floors []registry.LifetimeFloor
	for k, f := range b.floors[pool] {
		floors = append(floors, registry.LifetimeFloor{Worker: k.worker, Gen: k.gen, Lifetime: f.life})
	}
	b.mu.Unlock()
	if len(floors) == 0 {
		return
	}
	cctx, cancel := context.WithTimeout(ctx, redisCallTimeout)
	res, err := b.reg.AssertLifetimes(cctx, pool, floors)
	cancel()
	if err != nil {
		metrics.redisErrors.WithLabelValues("assert_lifetimes").Inc()
		b.logger.Error("re-asserting the lifetimes of workers whose sessions this instance served, after Redis lost the pool's data",
			zap.String("pool", pool), zap.Int("workers", len(floors)), zap.Error(err))
		return
	}
	if res.Raised > 0 || res.Kept > 0 {
		b.logger.Warn("Redis lost sessions this instance served; their workers' lifetimes re-asserted",
			zap.String("pool", pool), zap.Int("raised", res.Raised), zap.Int("kept_for_registration", res.Kept))
	}
}
