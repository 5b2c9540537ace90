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
// generation, the lifetime of the last session it served there, for
// floorKeep, and re-asserts those floors (registry.AssertLifetimes) when a
// claim learns of the loss (registry.EpochError), once per loss and before
// it claims again. The floor is taken at release, and the claims undone
// here are taken off it: a claim's lifetime counts the claims made before
// it, and an undo made after it gives one of those back (a client that
// left before its upgrade took no session). Another instance's undos are
// not known here, so a floor may still be above the truth by those, which
// retires the worker early rather than late.

// floorKeep is how long a floor is kept after its worker's last session
// here: far longer than an agent's heartbeat interval, whose reply already
// re-asserts everything older.
const floorKeep = 10 * time.Minute

// maxUndos bounds the undone claims a floor remembers.
const maxUndos = 64

type floorKey struct{ worker, gen string }

type undone struct {
	life int
	at   time.Time
}

// lifeFloor is what this process knows of one worker generation's
// lifetime: the served session claimed with the highest lifetime (top,
// whose claim completed here at topAt) and the claims undone here since.
type lifeFloor struct {
	top   int
	topAt time.Time
	undos []undone
	at    time.Time
}

// value is the floor: top, less the claims counted in it that were undone
// after it was claimed.
func (f *lifeFloor) value() int {
	n := f.top
	for _, u := range f.undos {
		if u.life < f.top && u.at.After(f.topAt) {
			n--
		}
	}
	return n
}

// floor returns the floor of c's worker generation, made when missing.
// Under b.mu.
func (b *backend) floor(c *registry.Claim, now time.Time) *lifeFloor {
	if b.floors == nil {
		b.floors = map[string]map[floorKey]*lifeFloor{}
	}
	fs := b.floors[c.Pool]
	if fs == nil {
		fs = map[floorKey]*lifeFloor{}
		b.floors[c.Pool] = fs
	}
	k := floorKey{c.Worker.ID, c.Gen}
	f := fs[k]
	if f == nil {
		f = &lifeFloor{}
		fs[k] = f
	}
	f.at = now
	return f
}

// noteEnded remembers how claim c ended: served, its lifetime is the new
// top when it is the highest (or, being equal, claimed later: the number
// came again after undos); undone, it is taken off the floor.
func (b *backend) noteEnded(c *registry.Claim, served bool) {
	if c.Worker.Lifetime <= 0 {
		return
	}
	now := time.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	// when the claim completed here (a lease of this process: its claim
	// time is taken as the claim call returned)
	var claimed time.Time
	if l := b.leases[c.Pool][c.LeaseID]; l != nil {
		claimed = l.done
	}
	f := b.floor(c, now)
	if !served {
		f.undos = append(f.undos, undone{life: c.Worker.Lifetime, at: now})
		if len(f.undos) > maxUndos {
			f.undos = f.undos[len(f.undos)-maxUndos:]
		}
		return
	}
	if c.Worker.Lifetime > f.top || (c.Worker.Lifetime == f.top && claimed.After(f.topAt)) {
		f.top, f.topAt = c.Worker.Lifetime, claimed
	}
}

// pruneFloors drops the floors older than floorKeep, and the undos no
// floor can count any more.
func (b *backend) pruneFloors(now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for pool, fs := range b.floors {
		for k, f := range fs {
			if now.Sub(f.at) > floorKeep {
				delete(fs, k)
				continue
			}
			kept := f.undos[:0]
			for _, u := range f.undos {
				if u.at.After(f.topAt) {
					kept = append(kept, u)
				}
			}
			f.undos = kept
		}
		if len(fs) == 0 {
			delete(b.floors, pool)
		}
	}
}

// assertFloors re-asserts the pool's floors after Redis lost its data
// (epoch: the dataset epoch a claim found): once per loss, concurrent
// claims waiting for the call in flight. A failure is logged and left
// owed: the next claim of the pool (and the renewal loop) tries again.
func (b *backend) assertFloors(ctx context.Context, pool, epoch string) {
	_, _, _ = b.floorAsserts.Do(pool+"\x00"+epoch, func() (any, error) {
		b.sendFloors(ctx, pool)
		return nil, nil
	})
}

// sendFloors sends the pool's floors, and notes them owed when that fails.
func (b *backend) sendFloors(ctx context.Context, pool string) {
	b.mu.Lock()
	var floors []registry.LifetimeFloor
	for k, f := range b.floors[pool] {
		if v := f.value(); v > 0 {
			floors = append(floors, registry.LifetimeFloor{Worker: k.worker, Gen: k.gen, Lifetime: v})
		}
	}
	b.mu.Unlock()
	if len(floors) == 0 {
		b.floorsDone(pool)
		return
	}
	cctx, cancel := context.WithTimeout(ctx, redisCallTimeout)
	res, err := b.reg.AssertLifetimes(cctx, pool, floors)
	cancel()
	if err != nil {
		metrics.redisErrors.WithLabelValues("assert_lifetimes").Inc()
		b.mu.Lock()
		if b.floorsOwed == nil {
			b.floorsOwed = map[string]bool{}
		}
		b.floorsOwed[pool] = true
		b.mu.Unlock()
		b.logger.Error("re-asserting the lifetimes of workers whose sessions this instance served, after Redis lost the pool's data; trying again before the next claim",
			zap.String("pool", pool), zap.Int("workers", len(floors)), zap.Error(err))
		return
	}
	b.floorsDone(pool)
	if res.Raised > 0 || res.Kept > 0 {
		b.logger.Warn("Redis lost sessions this instance served; their workers' lifetimes re-asserted",
			zap.String("pool", pool), zap.Int("raised", res.Raised), zap.Int("kept_for_registration", res.Kept))
	}
}

func (b *backend) floorsDone(pool string) {
	b.mu.Lock()
	delete(b.floorsOwed, pool)
	b.mu.Unlock()
}

// owedFloors returns the pools whose floors a failed call left owed.
func (b *backend) owedFloors() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var ps []string
	for p := range b.floorsOwed {
		ps = append(ps, p)
	}
	return ps
}
