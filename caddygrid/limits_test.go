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
