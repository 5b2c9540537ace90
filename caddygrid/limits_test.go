package caddygrid

import (
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/registry"
	"github.com/browsergrid/caddy-browser-grid/selection"
)

// A config's limits keep the time they were first configured across
// reloads that keep them; a reload that changes them (or brings back
// earlier ones) gives them the reload's time, so the newest configuration
// wins in the registry.
func TestLimitsConfigTime(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	key := func(mc int) string {
		return limitsKey(registry.ClaimRequest{Policy: registry.LifetimeFirst, Limits: selection.Limits{MaxConcurrent: mc}})
	}
	var gen1 limitsClock
	if got := gen1.configTime(key(2), nil, t0); !got.Equal(t0) {
		t.Fatalf("first config: %s, want its provisioning %s", got, t0)
	}
	var gen2 limitsClock // reload at t0+1h, same limits
	if got := gen2.configTime(key(2), gen1.snapshot(nil), t0.Add(time.Hour)); !got.Equal(t0) {
		t.Fatalf("reload keeping max_concurrent 2: %s, want the first configuration's %s", got, t0)
	}
	var gen3 limitsClock // reload at t0+2h to 3
	if got := gen3.configTime(key(3), gen2.snapshot(nil), t0.Add(2*time.Hour)); !got.Equal(t0.Add(2 * time.Hour)) {
		t.Fatalf("reload to max_concurrent 3: %s, want the reload's time", got)
	}
	var gen4 limitsClock // back to 2 at t0+3h: newest again
	if got := gen4.configTime(key(2), gen3.snapshot(nil), t0.Add(3*time.Hour)); !got.Equal(t0.Add(3 * time.Hour)) {
		t.Fatalf("reload back to max_concurrent 2: %s, want the reload's time", got)
	}
	// Two reloads of an idle instance (no claim in between): the limits
	// keep their first time.
	var idle, gen5 limitsClock
	prev := idle.snapshot(gen4.snapshot(nil))
	if got := gen5.configTime(key(2), prev, t0.Add(4*time.Hour)); !got.Equal(t0.Add(3 * time.Hour)) {
		t.Fatalf("reload after an idle config keeping max_concurrent 2: %s, want gen4's %s", got, t0.Add(3*time.Hour))
	}
	if key(2) == key(3) || limitsKey(registry.ClaimRequest{Policy: registry.FairShare, FairShare: selection.FairShare{Window: 5}}) ==
		limitsKey(registry.ClaimRequest{Policy: registry.FairShare, FairShare: selection.FairShare{Window: 6}}) {
		t.Fatal("limitsKey does not tell different limits apart")
	}
}

// TestLimitsOutrankFailedConfig: after a newer config that claimed with
// limits of its own failed, the running config's limits claim as
// configured just after it, and hand that time on to the next config that
// keeps them; a failed config that brought no limits of its own (it
// claimed with the running config's) changes nothing.
func TestLimitsOutrankFailedConfig(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	key := func(mc int) string {
		return limitsKey(registry.ClaimRequest{Policy: registry.LifetimeFirst, Limits: selection.Limits{MaxConcurrent: mc}})
	}
	var running limitsClock
	running.configTime(key(1), nil, t0)

	failedAt := t0.Add(time.Hour)
	var same limitsClock // claimed with the running config's limits only
	same.configTime(key(1), running.snapshot(nil), failedAt)
	if same.brought(failedAt) {
		t.Fatal("a config that claimed only with inherited limits reports limits of its own")
	}
	var failed limitsClock // claimed with max_concurrent 5
	if got := failed.configTime(key(5), running.snapshot(nil), failedAt); !got.Equal(failedAt) || !failed.brought(failedAt) {
		t.Fatalf("the failed config's new limits: %s (brought %v), want its provisioning", got, failed.brought(failedAt))
	}

	running.outrank(failedAt)
	want := failedAt.Add(time.Millisecond)
	if got := running.configTime(key(1), nil, t0); !got.Equal(want) {
		t.Fatalf("the running config's limits after the failure: %s, want just after the failed config's %s", got, want)
	}
	if got := running.configTime(key(2), nil, t0); !got.Equal(want) {
		t.Fatalf("limits the running config had not claimed with yet: %s, want %s", got, want)
	}
	running.outrank(t0)  // an older failure does not lower it
	var next limitsClock // a reload keeping max_concurrent 1
	if got := next.configTime(key(1), running.snapshot(nil), failedAt.Add(time.Hour)); !got.Equal(want) {
		t.Fatalf("the next config keeping the running limits: %s, want the raised %s", got, want)
	}
}
