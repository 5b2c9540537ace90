package caddygrid

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/browsergrid/caddy-browser-grid/reaper"
)

// reaperEvents counts what the reapers of this process did.
var reaperEvents = prometheus.NewCounterVec(prometheus.CounterOpts{
	Namespace: "caddy", Subsystem: "grid", Name: "reaper_events_total",
	Help: "What this instance's reaper did, by kind: worker_expired, bad_record, leases_freed, counters_fixed, orphans_removed (these three add their counts), pool_busy, kicked (a pool reaped early because a claim met stale workers in it), shared_address (available workers of a pool registered at one address, once per pass), error.",
}, []string{"kind"})

// startReaper runs this app's reaper (the worker lifecycle's, over the app's Redis)
// until Stop. Reapers on several Caddy instances take turns per pool. A
// claim of this process that meets stale workers kicks it (staleSeen): the
// pool is reaped early, at most once per the reaper's MinKickGap, so a lost
// zone goes within seconds of turning stale whatever the pass's phase.
func (a *App) startReaper() {
	b := a.backend
	r := reaper.New(b.reg)
	r.Interval = time.Duration(a.ReaperInterval)
	r.StaleAfter = time.Duration(a.StaleThreshold)
	r.OnEvent = a.reaperEvent
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	a.mu.Lock()
	a.stopReaper, a.reaperDone = cancel, done
	a.mu.Unlock()
	b.reapers.Store(r, struct{}{})
	go func() {
		defer close(done)
		defer b.reapers.Delete(r)
		if err := r.Run(ctx); err != nil {
			a.logger.Error("reaper stopped", zap.Error(err))
		}
	}()
}

// staleSeen is the registry's OnStale: a claim walked past stale workers
// of pool, so the reapers on this backend are kicked (Kick never blocks).
func (b *backend) staleSeen(pool string) {
	b.reapers.Range(func(k, _ any) bool {
		k.(*reaper.Reaper).Kick(pool)
		return true
	})
}

// reaperEvent logs and counts one thing the reaper did.
func (a *App) reaperEvent(e reaper.Event) {
	n := float64(e.Count)
	if n == 0 {
		n = 1
	}
	reaperEvents.WithLabelValues(e.Kind).Add(n)
	fields := []zap.Field{zap.String("kind", e.Kind), zap.String("pool", e.Pool)}
	if e.Worker != "" {
		fields = append(fields, zap.String("worker_id", e.Worker))
	}
	if e.Count != 0 {
		fields = append(fields, zap.Int("count", e.Count))
	}
	if e.Addr != "" {
		fields = append(fields, zap.String("addr", e.Addr), zap.Strings("worker_ids", e.Workers))
	}
	if e.Err != nil {
		fields = append(fields, zap.Error(e.Err))
	}
	switch e.Kind {
	case reaper.KindError:
		a.logger.Error("reaper could not clean a pool", fields...)
	case reaper.KindBadRecord, reaper.KindCountersFixed:
		a.logger.Warn("reaper repaired the registry", fields...)
	case reaper.KindSharedAddress:
		a.logger.Warn("workers of a pool are registered at one address: its browser is sent the sessions of all of them, past its capacity; two agents advertise the same address (grid-worker -advertise, PRIVATE_HOSTNAME)", fields...)
	case reaper.KindPoolBusy:
		a.logger.Debug("reaper skipped a pool another reaper is cleaning", fields...)
	case reaper.KindKicked:
		a.logger.Debug("reaping a pool early: a claim met stale workers in it", fields...)
	default:
		a.logger.Info("reaper cleaned up", fields...)
	}
}
