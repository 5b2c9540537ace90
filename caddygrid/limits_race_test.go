package caddygrid

import (
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/browsergrid/caddy-browser-grid/registry"
	"github.com/browsergrid/caddy-browser-grid/selection"
)

// A failed config's request that claims after Caddy stopped the config's
// app but before its Cleanup dropped the backend (Caddy stops the started
// apps, then cancels the config; its servers may still answer meanwhile)
// still counts: its limits were stored with the failed config's time.
func TestFailedConfigClaimBetweenStopAndCleanup(t *testing.T) {
	t0 := time.Now().Add(-time.Hour)
	key := func(mc int) string {
		return limitsKey(registry.ClaimRequest{Policy: registry.LifetimeFirst, Limits: selection.Limits{MaxConcurrent: mc}})
	}
	cur := &App{provisioned: t0, logger: zap.NewNop()}
	running.add(cur)
	defer running.remove(cur)
	cur.limits.configTime(key(1), nil, t0)
	failedAt := t0.Add(time.Minute)
	failed := &App{provisioned: failedAt, logger: zap.NewNop(), prevLimits: cur.limits.snapshot(nil)}
	running.add(failed)
	_ = failed.Stop()
	failed.limits.configTime(key(5), failed.prevLimits, failedAt) // the late claim, through the still live backend
	_ = failed.Cleanup()
	if got := cur.limits.configTime(key(1), nil, t0); !got.After(failedAt) {
		t.Fatalf("the running config's limits after the failed config's late claim: %s, want after the failed config's %s", got, failedAt)
	}
}
