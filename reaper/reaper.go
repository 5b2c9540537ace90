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
	"math/rand/v2"
	"time"

	"github.com/browsergrid/caddy-browser-grid/registry"
)

// Defaults (the worker lifecycle: reaper every 300 s, stale threshold 30 s).
const (
	DefaultInterval   = 300 * time.Second
	DefaultStaleAfter = 30 * time.Second
	DefaultLockTTL    = 60 * time.Second
)

// Event is one thing a reaper did or met, for logs and metrics.
type Event struct {
	// Kind is one of the Kind* constants.
	Kind string
	Pool string
	// Worker is set for worker_expired and bad_record.
	Worker string
	// Count is set for leases_freed, counters_fixed and orphans_removed.
	Count int
	// Err is set for error and bad_record.
	Err error
}

// Event kinds.
const (
	KindWorkerExpired  = "worker_expired"  // a stale worker was removed
	KindBadRecord      = "bad_record"      // a record that does not parse was removed
	KindLeasesFreed    = "leases_freed"    // expired leases gave their slots back
	KindCountersFixed  = "counters_fixed"  // active counts or index entries corrected
	KindOrphansRemoved = "orphans_removed" // entries of no worker removed
	KindPoolBusy       = "pool_busy"       // another reaper holds the pool's lock
	KindError          = "error"           // a pool could not be reaped this time
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
	// locked. Default: 60s.
	LockTTL time.Duration
	// OnEvent, when set, is told about everything the reaper does.
	OnEvent func(Event)
	// now is the clock used to pick candidates (Redis decides); tests may
	// replace it.
	now func() time.Time
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
	var errs []error
	for _, pool := range pools {
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
	// Candidates are picked with the local clock; registry.Expire re-checks
	// each one against Redis' clock inside its script and keeps it when it
	// is fresh, so a skewed clock here costs a script call, never a worker.
	// They are expired in batches (registry.ExpireStale: up to 100 per
	// script call, each bounded), so thousands of stale records of a lost
	// zone go in a few dozen calls without blocking Redis.
	now := r.now()
	var stale []string
	for _, w := range info.Workers {
		if now.Sub(w.LastHeartbeat) <= r.StaleAfter && !now.After(w.ExpiresAt) {
			continue
		}
		stale = append(stale, w.ID)
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

// Run reaps at once and then every Interval (±10% so that many reapers
// drift apart) until ctx ends. Errors are reported through OnEvent; Run
// returns an error only when the Reaper is not usable (no Registry).
func (r *Reaper) Run(ctx context.Context) error {
	if err := r.defaults(); err != nil {
		return err
	}
	for {
		_, _ = r.RunOnce(ctx) // errors went to OnEvent
		wait := r.Interval + time.Duration((rand.Float64()*0.2-0.1)*float64(r.Interval))
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}
