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
	Help: "What this instance's reaper did, by kind: worker_expired, bad_record, leases_freed, counters_fixed, orphans_removed (these three add their counts), pool_busy, error.",
}, []string{"kind"})

// startReaper runs this app's reaper (the worker lifecycle's, over the app's Redis)
// until Stop. Reapers on several Caddy instances take turns per pool.
func (a *App) startReaper() {
	r := reaper.New(a.backend.reg)
	r.Interval = time.Duration(a.ReaperInterval)
	r.StaleAfter = time.Duration(a.StaleThreshold)
	r.OnEvent = a.reaperEvent
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	a.mu.Lock()
	a.stopReaper, a.reaperDone = cancel, done
	a.mu.Unlock()
	go func() {
		defer close(done)
		if err := r.Run(ctx); err != nil {
			a.logger.Error("reaper stopped", zap.Error(err))
		}
	}()
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
	if e.Err != nil {
		fields = append(fields, zap.Error(e.Err))
	}
	switch e.Kind {
	case reaper.KindError:
		a.logger.Error("reaper could not clean a pool", fields...)
	case reaper.KindBadRecord, reaper.KindCountersFixed:
		a.logger.Warn("reaper repaired the registry", fields...)
	case reaper.KindPoolBusy:
		a.logger.Debug("reaper skipped a pool another reaper is cleaning", fields...)
	default:
		a.logger.Info("reaper cleaned up", fields...)
	}
}
