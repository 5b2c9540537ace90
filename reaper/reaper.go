// Package reaper clears what crashed: workers whose heartbeat stopped,
// leases whose holder stopped renewing them, index entries and counters that
// belong to no worker, and active counts that disagree with the live leases
// (the worker lifecycle's reaper, with the vnode design's expire invariant).
//
// Many reapers may run at once (one per Caddy instance): every removal is
// one registry script that re-checks freshness inside Redis (skip_if_fresh),
// so a heartbeat that lands meanwhile wins and a worker is removed once; and
// a per-pool lock in Redis lets one reaper at a time work on a pool, so
// copies do not repeat each other's work.
package reaper

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/browsergrid/caddy-browser-grid/registry"
	"github.com/browsergrid/caddy-browser-grid/selection"
)

// Defaults (the worker lifecycle: reaper every 300 s, stale threshold 30 s).
const (
	DefaultInterval   = 300 * time.Second
	DefaultStaleAfter = 30 * time.Second
	DefaultLockTTL    = 10 * time.Second
	// minKickGapFloor is the least default MinKickGap, whatever Interval.
	minKickGapFloor = 5 * time.Second
	// maxKickedPools bounds the pools a Reaper remembers between kicked
	// passes; more make the next kicked pass reap every pool.
	maxKickedPools = 1024
)

// Event is one thing a reaper did or met, for logs and metrics.
type Event struct {
	// Kind is one of the Kind* constants.
	Kind string
	Pool string
	// Worker is set for worker_expired and bad_record.
	Worker string
	// Addr and Workers are set for shared_address: the address and the
	// workers registered at it, sorted.
	Addr    string
	Workers []string
	// Count is set for leases_freed, counters_fixed and orphans_removed.
	Count int
	// Err is set for error and bad_record.
	Err error
}

// nextWait is the wait before the next regular pass: 90–100 % of interval,
// never more (an operator's reaper_interval is the longest gap between
// passes, so it bounds how long a stale record stays).
func nextWait(interval time.Duration) time.Duration {
	return interval - time.Duration(rand.Float64()*0.1*float64(interval))
}

// Event kinds.
const (
	KindWorkerExpired  = "worker_expired"  // a stale worker was removed
	KindBadRecord      = "bad_record"      // a record that does not parse was removed
	KindLeasesFreed    = "leases_freed"    // expired leases gave their slots back
	KindCountersFixed  = "counters_fixed"  // active counts or index entries corrected
	KindOrphansRemoved = "orphans_removed" // entries of no worker removed
	KindPoolBusy       = "pool_busy"       // another reaper holds the pool's lock
	KindKicked         = "kicked"          // a pool is reaped early: a claim met stale workers in it (Kick)
	KindError          = "error"           // a pool could not be reaped this time
	// Two or more live, available workers of a pool registered at one
	// address: one browser is sent the sessions of all of them, past its
	// capacity (two agents advertise the same address). Reported, not
	// repaired: which agent is wrong only its operator can tell.
	KindSharedAddress = "shared_address"
)

// Reaper removes what crashed from a registry. Set the fields before Run;
// zero values take the defaults.
type Reaper struct {
	// Registry is the registry to clean. Required.
	Registry *registry.Registry
	// Interval between passes. Default: 300s.
	Interval time.Duration
	// StaleAfter is the heartbeat age past which a worker is removed; it
	// must exceed the agents' heartbeat interval. Default: 30s.
	StaleAfter time.Duration
	// LockTTL bounds how long a reaper that died mid-pass keeps a pool
	// locked; a live pass renews the lock every LockTTL/3. Default: 10s.
	LockTTL time.Duration
	// MinKickGap is the least time from the end of one pass to the start
	// of a kicked one (see Kick): however often claims meet stale workers
	// (one whose record no reaper can remove, say, because its clock
	// disagrees with Redis'), a pool is scanned early at most once per
	// MinKickGap, so kicks add at most Interval/MinKickGap passes per
	// Interval. Default: Interval/10, at least 5s (a kicked pass costs
	// at most ten times the cadence the operator chose; the floor keeps a
	// short Interval from turning kicks into back-to-back scans).
	MinKickGap time.Duration
	// OnEvent, when set, is told about everything the reaper does.
	OnEvent func(Event)

	// kickMu guards kicked, kickAll and wake (Kick may be called before
	// Run, from any goroutine).
	kickMu  sync.Mutex
	kicked  map[string]struct{}
	kickAll bool
	// wake holds one token while kicks wait for Run to notice them.
	wake chan struct{}
	// now is the clock used to pick candidates when Redis' time is not
	// known (Redis decides); tests may replace it.
	now func() time.Time
	// passDone, when set (tests), is told when Run ends a pass, whether it
	// was kicked, and the end that the next kicked pass waits MinKickGap
	// from.
	passDone func(kicked bool, end time.Time)
}

// New returns a Reaper over reg with the defaults.
func New(reg *registry.Registry) *Reaper { return &Reaper{Registry: reg} }

// WorkerRef names a worker of a pool.
type WorkerRef struct{ Pool, ID string }

// Report is what one pass did.
type Report struct {
	// Pools reaped (their lock taken).
	Pools []string
	// Busy pools were skipped: another reaper was working on them.
	Busy []string
	// Expired workers, removed for a stale heartbeat or a lapsed record.
	Expired []WorkerRef
	// BadRecords removed because they do not parse.
	BadRecords []WorkerRef
	// LeasesFreed, CountersFixed and OrphansRemoved add up the pools'
	// registry.Reconcile results.
	LeasesFreed, CountersFixed, OrphansRemoved int
	// Shared lists the addresses at which more than one live, available
	// worker of a pool is registered (KindSharedAddress).
	Shared []SharedAddress
}

// SharedAddress is an address more than one available worker of a pool
// registered.
type SharedAddress struct {
	Pool, Addr string
	Workers    []string // sorted
}

func (r *Reaper) defaults() error {
	if r.Registry == nil {
		return errors.New("reaper: no Registry set")
	}
	if r.Interval <= 0 {
		r.Interval = DefaultInterval
	}
	if r.StaleAfter <= 0 {
		r.StaleAfter = DefaultStaleAfter
	}
	if r.LockTTL <= 0 {
		r.LockTTL = DefaultLockTTL
	}
	if r.MinKickGap <= 0 {
		r.MinKickGap = max(minKickGapFloor, r.Interval/10)
	}
	if r.now == nil {
		r.now = time.Now
	}
	return nil
}

func (r *Reaper) emit(e Event) {
	if r.OnEvent != nil {
		r.OnEvent(e)
	}
}

// RunOnce reaps every pool once. Errors are reported as events too, and
// those of single pools are joined into the returned error; the other
// pools are still reaped.
func (r *Reaper) RunOnce(ctx context.Context) (Report, error) {
	var rep Report
	if err := r.defaults(); err != nil {
		return rep, err
	}
	pools, err := r.Registry.Pools(ctx)
	if err != nil {
		err = fmt.Errorf("reaper: %w", err)
		r.emit(Event{Kind: KindError, Err: err})
		return rep, err
	}
	return r.reapPools(ctx, pools, false)
}

// reapPools reaps pools once each; kicked passes say so first, per pool.
func (r *Reaper) reapPools(ctx context.Context, pools []string, kicked bool) (Report, error) {
	var rep Report
	var errs []error
	for _, pool := range pools {
		if kicked {
			r.emit(Event{Kind: KindKicked, Pool: pool})
		}
		if err := r.reapPool(ctx, pool, &rep); err != nil {
			r.emit(Event{Kind: KindError, Pool: pool, Err: err})
			errs = append(errs, err)
		}
		if ctx.Err() != nil {
			break
		}
	}
	return rep, errors.Join(errs...)
}

func (r *Reaper) reapPool(ctx context.Context, pool string, rep *Report) (err error) {
	unlock, ok, err := r.Registry.ReaperLock(ctx, pool, r.LockTTL)
	if err != nil {
		return fmt.Errorf("reaping pool %q: %w", pool, err)
	}
	if !ok {
		rep.Busy = append(rep.Busy, pool)
		r.emit(Event{Kind: KindPoolBusy, Pool: pool})
		return nil
	}
	defer func() {
		if uerr := unlock(context.WithoutCancel(ctx)); uerr != nil && err == nil {
			err = uerr
		}
	}()
	rep.Pools = append(rep.Pools, pool)

	info, err := r.Registry.Inspect(ctx, pool)
	if err != nil {
		return fmt.Errorf("reaping pool %q: %w", pool, err)
	}
	// Candidates are picked with Redis' clock, read with the pool (the
	// local one only when that is unknown): a Caddy whose clock runs
	// behind Redis' would pick none. registry.Expire re-checks each one
	// inside its script and keeps it when it is fresh. They are expired in batches (registry.ExpireStale: up to 100 per
	// script call, each bounded), so thousands of stale records of a lost
	// zone go in a few dozen calls without blocking Redis.
	now := r.now()
	if !info.Now.IsZero() {
		now = info.Now
	}
	var stale []string
	byAddr := map[string][]string{}
	for _, w := range info.Workers {
		if now.Sub(w.LastHeartbeat) <= r.StaleAfter && !now.After(w.ExpiresAt) {
			// A draining record beside its successor at the same
			// address is an agent's own hand-over, not a conflict.
			if w.Status == selection.Available {
				byAddr[w.Addr] = append(byAddr[w.Addr], w.ID)
			}
			continue
		}
		stale = append(stale, w.ID)
	}
	for _, addr := range slices.Sorted(maps.Keys(byAddr)) {
		ids := byAddr[addr]
		if len(ids) < 2 {
			continue
		}
		slices.Sort(ids)
		rep.Shared = append(rep.Shared, SharedAddress{Pool: pool, Addr: addr, Workers: ids})
		r.emit(Event{Kind: KindSharedAddress, Pool: pool, Addr: addr, Workers: ids})
	}
	removed, err := r.Registry.ExpireStale(ctx, pool, stale, r.StaleAfter)
	for _, id := range removed {
		rep.Expired = append(rep.Expired, WorkerRef{pool, id})
		r.emit(Event{Kind: KindWorkerExpired, Pool: pool, Worker: id})
	}
	if err != nil {
		return fmt.Errorf("reaping pool %q: %w", pool, err)
	}
	// A record that does not parse cannot heartbeat (its agent is told it
	// is not registered and registers again): Expire removes it.
	for _, b := range info.BadRecords {
		removed, err := r.Registry.Expire(ctx, pool, b.ID, r.StaleAfter)
		if err != nil {
			return fmt.Errorf("reaping pool %q: %w", pool, err)
		}
		if removed {
			rep.BadRecords = append(rep.BadRecords, WorkerRef{pool, b.ID})
			r.emit(Event{Kind: KindBadRecord, Pool: pool, Worker: b.ID, Err: errors.New(b.Err)})
		}
	}
	res, err := r.Registry.Reconcile(ctx, pool)
	if err != nil {
		return fmt.Errorf("reaping pool %q: %w", pool, err)
	}
	rep.LeasesFreed += res.LeasesFreed
	rep.CountersFixed += res.CountersFixed
	rep.OrphansRemoved += res.OrphansRemoved
	for _, e := range []Event{
		{Kind: KindLeasesFreed, Pool: pool, Count: res.LeasesFreed},
		{Kind: KindCountersFixed, Pool: pool, Count: res.CountersFixed},
		{Kind: KindOrphansRemoved, Pool: pool, Count: res.OrphansRemoved},
	} {
		if e.Count > 0 {
			r.emit(e)
		}
	}
	return nil
}

// Kick asks Run for an early pass over pool ("": every pool), for when a
// claim met stale workers there. It never blocks; kicks coalesce: the pools
// kicked meanwhile are reaped in one kicked pass, which starts at once
// unless the last pass ended less than MinKickGap ago, then when it has.
// The regular passes keep their Interval; a regular pass that starts
// after a kick serves it. A kicked pass takes each pool's lock like any
// other (a pool another reaper is working on is reported pool_busy).
// Kicks while Run is not running wait for it.
func (r *Reaper) Kick(pool string) {
	r.kickMu.Lock()
	switch {
	case r.kickAll:
	case pool == "" || len(r.kicked) >= maxKickedPools:
		r.kickAll, r.kicked = true, nil
	default:
		if r.kicked == nil {
			r.kicked = map[string]struct{}{}
		}
		r.kicked[pool] = struct{}{}
	}
	wake := r.wakeLocked()
	r.kickMu.Unlock()
	select {
	case wake <- struct{}{}:
	default: // a token is waiting already
	}
}

// wakeLocked returns the wake channel, making it; kickMu held.
func (r *Reaper) wakeLocked() chan struct{} {
	if r.wake == nil {
		r.wake = make(chan struct{}, 1)
	}
	return r.wake
}

// takeKicks returns and forgets the pools kicked so far (all: every pool);
// ok is false when there were none.
func (r *Reaper) takeKicks() (pools []string, all, ok bool) {
	r.kickMu.Lock()
	defer r.kickMu.Unlock()
	pools, all = slices.Sorted(maps.Keys(r.kicked)), r.kickAll
	r.kicked, r.kickAll = nil, false
	return pools, all, all || len(pools) > 0
}

// Run reaps at once and then every Interval until ctx ends: each wait is
// drawn from 90–100 % of Interval, so the reapers of many instances drift
// apart and two passes are never more than Interval apart (a stale worker
// is gone at most Interval plus a pass after it turned stale), and in between the pools Kick names, at
// most once per MinKickGap. Errors are reported through OnEvent; Run
// returns an error only when the Reaper is not usable (no Registry).
func (r *Reaper) Run(ctx context.Context) error {
	if err := r.defaults(); err != nil {
		return err
	}
	r.kickMu.Lock()
	wake := r.wakeLocked()
	r.kickMu.Unlock()
	regular := time.NewTimer(0)
	defer regular.Stop()
	var (
		lastEnd time.Time
		kick    *time.Timer // armed while a kicked pass waits for its turn
		kickC   <-chan time.Time
	)
	defer func() {
		if kick != nil {
			kick.Stop()
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-regular.C:
			// Every pool is reaped: the kicks so far are served.
			r.takeKicks()
			_, _ = r.RunOnce(ctx) // errors went to OnEvent
			lastEnd = time.Now()
			if r.passDone != nil {
				r.passDone(false, lastEnd)
			}
			regular.Reset(nextWait(r.Interval))
		case <-wake:
			if kickC == nil {
				kick = time.NewTimer(max(0, time.Until(lastEnd.Add(r.MinKickGap))))
				kickC = kick.C
			}
		case <-kickC:
			kick, kickC = nil, nil
			pools, all, ok := r.takeKicks()
			if !ok {
				continue // a regular pass served them
			}
			if all {
				var err error
				if pools, err = r.Registry.Pools(ctx); err != nil {
					r.emit(Event{Kind: KindError, Err: fmt.Errorf("reaper: %w", err)})
				}
			}
			_, _ = r.reapPools(ctx, pools, true) // errors went to OnEvent
			lastEnd = time.Now()
			if r.passDone != nil {
				r.passDone(true, lastEnd)
			}
		}
	}
}
