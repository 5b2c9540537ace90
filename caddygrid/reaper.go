package caddygrid

import (
	"context"

	"go.uber.org/zap"
)

// startReaper runs this app's reaper until Stop.
//
// The reaper package has not landed yet; until it does the grid relies on
// the registry's own healing (claims and heartbeats sweep expired leases,
// claims expire the stale workers they walk past).
func (a *App) startReaper() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	a.mu.Lock()
	a.stopReaper, a.reaperDone = cancel, done
	a.mu.Unlock()
	a.logger.Warn("reaper not available in this build", zap.Duration("reaper_interval", 0))
	go func() {
		defer close(done)
		<-ctx.Done()
	}()
}
