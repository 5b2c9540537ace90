package caddygrid

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"

	"github.com/browsergrid/caddy-browser-grid/registry"
)

// Lifetime floors. When Redis loses a pool's data (an empty restart, a
// restart from an older snapshot, a failover to a replica that missed
// writes: the pool's epoch changes, see claim.lua), a worker's lifetime comes
// back from two sources: its agent re-asserts the lifetime of its last
// heartbeat, and this process's renewal re-creates the leases of its live
// sessions, each with the lifetime it was claimed at. The sessions that
// ended since that heartbeat (up to a heartbeat interval of them, or more
// when the agent was cut off) are in neither, and the browser would serve
// them again past max_lifetime. So this process remembers, per worker
// generation, what the lifetimes of the sessions it served there say Redis
// held, for floorKeep, and re-asserts those floors
// (registry.AssertLifetimes) when a claim learns of the loss
// (registry.EpochError), once per loss and before it claims again, or
// when its epoch watch does (watchEpochs), whichever comes first.
//
// A served claim's lifetime counts every claim made before it, and an
// undo made after it gave one of those back (a client that left before
// its upgrade took no session). So a served claim's floor is its lifetime
// less the claims undone here that surely came before it in Redis (their
// call had returned before its call began) and whose undo surely came
// after it (noted after its call returned); the pool's floor is the
// highest of them. Where the order is not sure the undo is not taken off,
// and another instance's undos are not known here: a floor may so exceed
// the truth, which retires the worker early, never late.

// errReassert fails a claim that must not go on because what Redis lost of
// this instance's sessions could not be written again (a 503: Redis is
// failing).
var errReassert = errors.New("Redis lost the pool's data and this instance could not re-assert its sessions")

// floorKeep is how long a floor is kept after its worker's last session
// here: far longer than an agent's heartbeat interval, whose reply already
// re-asserts everything older.
const floorKeep = 10 * time.Minute

// maxServed and maxUndos bound the served and the undone claims a floor
// keeps (a floor is kept for every worker generation served here in the
// last floorKeep). The oldest served one is then folded into the floor as
// it stands; an undo dropped is no longer taken off (both err high). An
// undo counts only against claims served while it was live, a few at a
// worker's capacity, so a handful of served claims is enough.
const (
	maxServed = 8
	maxUndos  = 64
)

type floorKey struct{ worker, gen string }

// floorClaim is a claim of this process: its lifetime (served ones), when
// its call began and when it returned; for an undo, when it was noted.
type floorClaim struct {
	life        int
	began, done time.Time
	undoneAt    time.Time
}

// lifeFloor is what this process knows of one worker generation's
// lifetime: the served claims that may still change the floor, the floor
// of those folded away (base), and the claims undone here.
type lifeFloor struct {
	base   int
	served []floorClaim
	undos  []floorClaim
	at     time.Time
}

// countedIn reports whether undo u surely gave back one of the claims
// served claim s's lifetime counted: u's claim returned before s's began,
// and u was undone after s's returned.
func countedIn(u, s floorClaim) bool {
	return u.done.Before(s.began) && u.undoneAt.After(s.done)
}

// of is served claim s's floor: its lifetime less the undos counted in it.
func (f *lifeFloor) of(s floorClaim) int {
	n := s.life
	for _, u := range f.undos {
		if countedIn(u, s) {
			n--
		}
	}
	return n
}

// value is the floor: the highest of the served claims'.
func (f *lifeFloor) value() int {
	v := f.base
	for _, s := range f.served {
		v = max(v, f.of(s))
	}
	return v
}

// noteEnded remembers how claim c ended (served or undone), for its
// worker generation's floor. A claim whose lease this process no longer
// knows (its times unknown) is taken as served with nothing undone
// before it, or, undone, not taken off.
func (b *backend) noteEnded(c *registry.Claim, served bool) {
	if c.Worker.Lifetime <= 0 {
		return
	}
	now := time.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	fc := floorClaim{life: c.Worker.Lifetime}
	if l := b.leases[c.Pool][c.LeaseID]; l != nil {
		fc.began, fc.done = l.renewal.Claimed, l.done
	} else if !served {
		return
	}
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
	if !served {
		fc.undoneAt = now
		f.undos = append(f.undos, fc)
		if len(f.undos) > maxUndos {
			f.undos = f.undos[len(f.undos)-maxUndos:]
		}
		return
	}
	f.served = append(f.served, fc)
	if len(f.served) > maxServed {
		f.base = max(f.base, f.of(f.served[0]))
		f.served = f.served[1:]
	}
}

// pruneFloors drops the floors older than floorKeep, and the undos that
// count against none of a floor's served claims (a later served claim was
// claimed after the undo: its lifetime never counted it).
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
				for _, s := range f.served {
					if countedIn(u, s) {
						kept = append(kept, u)
						break
					}
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
// claims waiting for the call in flight, which has its own deadline (not
// the first claim's). It returns an error while the floors are owed: the
// claim must not go on, for it could land on a spent worker.
func (b *backend) assertFloors(ctx context.Context, pool, epoch string) error {
	return b.sharedFloors(ctx, pool, pool+"\x00"+epoch)
}

// retryFloors sends the pool's owed floors again, for the claims and the
// renewal loop that find them owed: one call at a time, the others waiting
// for it, so a recovering Redis gets one copy of the floors, not one per
// claim in flight.
func (b *backend) retryFloors(ctx context.Context, pool string) error {
	return b.sharedFloors(ctx, pool, pool+"\x00owed")
}

// sharedFloors sends the pool's floors in the call of key in flight, or
// in a new one, with a deadline of its own; a caller whose ctx ends first
// stops waiting (a claim answers within its own time, as before the
// calls were shared), the call goes on for the others.
func (b *backend) sharedFloors(ctx context.Context, pool, key string) error {
	ch := b.floorAsserts.DoChan(key, func() (any, error) {
		return nil, b.sendFloors(context.WithoutCancel(ctx), pool)
	})
	select {
	case r := <-ch:
		return r.Err
	case <-ctx.Done():
		return fmt.Errorf("%w: the lifetimes it served in pool %q: %v", errReassert, pool, ctx.Err())
	}
}

// sendFloors sends the pool's floors, and notes them owed when that fails
// (the next claim of the pool and the renewal loop try again).
func (b *backend) sendFloors(ctx context.Context, pool string) error {
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
		return nil
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
		b.logger.Error("re-asserting the lifetimes of workers whose sessions this instance served, after Redis lost the pool's data; claims wait until it succeeds",
			zap.String("pool", pool), zap.Int("workers", len(floors)), zap.Error(err))
		return fmt.Errorf("%w: the lifetimes it served in pool %q: %v", errReassert, pool, err)
	}
	b.floorsDone(pool)
	if res.Raised > 0 || res.Kept > 0 {
		b.logger.Warn("Redis lost sessions this instance served; their workers' lifetimes re-asserted",
			zap.String("pool", pool), zap.Int("raised", res.Raised), zap.Int("kept_for_registration", res.Kept))
	}
	return nil
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

// epochWatch is how often an instance holding floors or live leases reads
// their pools' dataset epochs (watchEpochs): half registry.RestoreHold, so
// that an instance re-asserts before the claims held after a restore go on.
const epochWatch = registry.RestoreHold / 2

// watchEpochs learns of a loss of a pool's data without a claim. With
// several instances sharing Redis, another one may claim first after the
// loss, or this one not at all (its clients gone elsewhere): that claim
// would grant sessions on workers whose served sessions only this
// instance's floors and leases carry. So every epochWatch it reads the
// epochs of the pools it holds floors or live leases in (one pipelined
// read). When an epoch is gone or another, it gives the pool a new one if
// it has none (registry.MarkEpoch, as a claim would: a second loss, even
// before any claim, then shows as another change), then re-asserts both,
// as a claim meeting the change does, and takes the epoch as seen only
// once both succeeded.
func (b *backend) watchEpochs() {
	defer b.wg.Done()
	t := time.NewTicker(epochWatch)
	defer t.Stop()
	for {
		select {
		case <-b.ctx.Done():
			return
		case <-t.C:
		}
		b.checkEpochs(b.ctx)
	}
}

// checkEpochs is one round of watchEpochs.
func (b *backend) checkEpochs(ctx context.Context) {
	b.mu.Lock()
	known := map[string]string{}
	for pool, e := range b.epochs {
		if e != "" && (len(b.floors[pool]) > 0 || len(b.leases[pool]) > 0) {
			known[pool] = e
		}
	}
	b.mu.Unlock()
	if len(known) == 0 {
		return
	}
	pools := make([]string, 0, len(known))
	for pool := range known {
		pools = append(pools, pool)
	}
	cctx, cancel := context.WithTimeout(ctx, redisCallTimeout)
	now, err := b.reg.Epochs(cctx, pools)
	cancel()
	if err != nil {
		// claims and renewals meet the failure and answer for it
		return
	}
	var lost []string
	for _, pool := range pools {
		if now[pool] != known[pool] {
			lost = append(lost, pool)
		}
	}
	if len(lost) == 0 {
		return
	}
	b.logger.Warn("Redis lost the pool's data; re-asserting this instance's sessions before another instance claims",
		zap.Strings("pools", lost))
	// The pool gets its new epoch first, as its next claim would make it
	// (a worker registering again is held from then on): a second loss,
	// even one before any claim, then shows as another change, and one
	// that comes while the sessions below are written shows at the next
	// round.
	// One call per pool, all at once: with many version groups the calls
	// one after another took longer than the hold of a restored pool's
	// claims (registry.RestoreHold) at a few ms of round trip.
	epochs := make([]string, len(lost)) // "": not marked
	var wg sync.WaitGroup
	for i, pool := range lost {
		wg.Go(func() {
			cctx, cancel := context.WithTimeout(ctx, redisCallTimeout)
			defer cancel()
			e, err := b.reg.MarkEpoch(cctx, pool)
			if err != nil {
				// left for the next round
				b.logger.Error("marking the pool's data as lost", zap.String("pool", pool), zap.Error(err))
				return
			}
			epochs[i] = e
		})
	}
	wg.Wait()
	marked := make(map[string]string, len(lost))
	for i, pool := range lost {
		if epochs[i] != "" {
			marked[pool] = epochs[i]
		}
	}
	if len(marked) > 0 { // else Redis is failing: the next round tries again
		b.reassert(ctx, marked)
	}
}

// reassert writes again what Redis lost of this instance's sessions in
// the pools lost (pool → the epoch found there): every live lease, in one
// renewal for all of them (a restart loses every pool at once), then each
// pool's limits and floors. The limits are this instance's last claim's
// there, with their configuration's time, when that configuration still
// runs (not one replaced or failed since, whose limits must not come
// back): the newest configuration's win again whichever instance claims
// first after the loss (the first claim of an older one stored its limits
// over none), and a floor that brings a worker to max_lifetime tells it
// to shut down. The floors are the sessions that ended, which no lease
// carries. Each epoch is taken as seen once leases and floors are
// written, and only by a floors call of that epoch (an owed floors' retry
// may have begun before the loss, and written to the data lost). It returns the first failure (errReassert); one of
// the limits is logged only, as any claim of this instance stores them.
func (b *backend) reassert(ctx context.Context, lost map[string]string) error {
	b.renewOwed.Store(true)
	if !b.renewNow(ctx) {
		return fmt.Errorf("%w: the live sessions' leases could not be written again", errReassert)
	}
	// the pools at once (see checkEpochs), each pool's calls in order;
	// every pool is tried whatever the others' outcome
	var g errgroup.Group
	for pool, e := range lost {
		g.Go(func() error { return b.reassertPool(ctx, pool, e) })
	}
	return g.Wait()
}

// reassertPool is reassert's work in one pool: its limits, then its
// floors (which then see its max_lifetime), then the epoch taken as seen.
func (b *backend) reassertPool(ctx context.Context, pool, e string) error {
	b.mu.Lock()
	last, ok := b.lastPick[pool]
	b.mu.Unlock()
	if cur := running.current(); ok && last.config != nil && cur != nil && last.config == &cur.limits && !last.config.gone.Load() {
		cctx, cancel := context.WithTimeout(ctx, claimCallTimeout)
		if _, _, err := b.reg.StoreLimits(cctx, last.req); err != nil {
			b.logger.Warn("storing the pool's limits again after a loss", zap.String("pool", pool), zap.Error(err))
		}
		cancel()
	}
	if err := b.assertFloors(ctx, pool, e); err != nil {
		return err
	}
	b.setEpoch(pool, e)
	return nil
}
