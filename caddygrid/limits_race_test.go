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
	cur.limits.configTime(key(1), "chromium", limitsTimes{}, t0)
	failedAt := t0.Add(time.Minute)
	failed := &App{provisioned: failedAt, logger: zap.NewNop(), prevLimits: cur.limits.snapshot(limitsTimes{})}
	running.add(failed)
	_ = failed.Stop()
	failed.limits.configTime(key(5), "chromium", failed.prevLimits, failedAt) // the late claim, through the still live backend
	_ = failed.Cleanup()
	if _, sup := cur.limits.configTime(key(1), "chromium", limitsTimes{}, t0); !sup.Equal(failedAt) {
		t.Fatalf("the running config's claims after the failed config's late claim supersede %s, want the failed config's %s", sup, failedAt)
	}
}

// Only a config newer than the running one, naming the same Redis and
// prefix, hands its pools back: a successful reload's replaced config, a
// config stopped with nothing after it (caddy stop), or a failed config
// that claimed on another Redis (or prefix: other pools) raises nothing.
func TestHandLimitsBackOnlyFailedSameRedis(t *testing.T) {
	t0 := time.Now().Add(-time.Hour)
	key := limitsKey(registry.ClaimRequest{Policy: registry.LifetimeFirst, Limits: selection.Limits{MaxConcurrent: 5}})
	r1 := backendKey{url: "redis://a:6379/0", prefix: "grid"}
	mk := func(at time.Time, k backendKey) *App {
		a := &App{provisioned: at, key: k, logger: zap.NewNop()}
		a.limits.configTime(key, "chromium", limitsTimes{}, at)
		running.add(a)
		return a
	}
	// A successful reload: the new config starts, the old one goes.
	old := mk(t0, r1)
	cur := mk(t0.Add(time.Minute), r1)
	_ = old.Stop()
	_ = old.Cleanup()
	if got, sup := cur.limits.configTime(key, "chromium", limitsTimes{}, cur.provisioned); !got.Equal(cur.provisioned) || !sup.IsZero() {
		t.Errorf("after a successful reload: %s superseding %s, want the new config's %s superseding nothing", got, sup, cur.provisioned)
	}
	// A failed config on another prefix.
	other := mk(t0.Add(2*time.Minute), backendKey{url: r1.url, prefix: "other"})
	_ = other.Cleanup()
	if got, sup := cur.limits.configTime(key, "chromium", limitsTimes{}, cur.provisioned); !got.Equal(cur.provisioned) || !sup.IsZero() {
		t.Errorf("after a failed config on another prefix: %s superseding %s, want %s superseding nothing", got, sup, cur.provisioned)
	}
	// caddy stop.
	_ = cur.Stop()
	_ = cur.Cleanup()
	if running.current() != nil {
		t.Fatal("apps left running")
	}
}
