package caddygrid

import (
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/registry"
	"github.com/browsergrid/caddy-browser-grid/selection"
)

// lfRequest is a lifetime_first claim with max_concurrent mc.
func lfRequest(mc int) registry.ClaimRequest {
	return registry.ClaimRequest{Policy: registry.LifetimeFirst, Limits: selection.Limits{MaxConcurrent: mc}}
}

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
	if got, _ := gen1.configTime(key(2), "p", limitsTimes{}, t0); !got.Equal(t0) {
		t.Fatalf("first config: %s, want its provisioning %s", got, t0)
	}
	var gen2 limitsClock // reload at t0+1h, same limits
	if got, _ := gen2.configTime(key(2), "p", gen1.snapshot(limitsTimes{}), t0.Add(time.Hour)); !got.Equal(t0) {
		t.Fatalf("reload keeping max_concurrent 2: %s, want the first configuration's %s", got, t0)
	}
	var gen3 limitsClock // reload at t0+2h to 3
	if got, _ := gen3.configTime(key(3), "p", gen2.snapshot(limitsTimes{}), t0.Add(2*time.Hour)); !got.Equal(t0.Add(2 * time.Hour)) {
		t.Fatalf("reload to max_concurrent 3: %s, want the reload's time", got)
	}
	var gen4 limitsClock // back to 2 at t0+3h: newest again
	if got, _ := gen4.configTime(key(2), "p", gen3.snapshot(limitsTimes{}), t0.Add(3*time.Hour)); !got.Equal(t0.Add(3 * time.Hour)) {
		t.Fatalf("reload back to max_concurrent 2: %s, want the reload's time", got)
	}
	// Two reloads of an idle instance (no claim in between): the limits
	// keep their first time.
	var idle, gen5 limitsClock
	idle.configures(lfRequest(2), nil)
	gen4.configures(lfRequest(2), nil)
	prev := idle.snapshot(gen4.snapshot(limitsTimes{}))
	if got, _ := gen5.configTime(key(2), "p", prev, t0.Add(4*time.Hour)); !got.Equal(t0.Add(3 * time.Hour)) {
		t.Fatalf("reload after an idle config keeping max_concurrent 2: %s, want gen4's %s", got, t0.Add(3*time.Hour))
	}
	// An idle config that configured other limits (4) in between: the 2
	// brought back is newest, as when that config had claimed with its 4.
	var idle4, gen6 limitsClock
	idle4.configures(lfRequest(4), nil)
	prev = idle4.snapshot(gen4.snapshot(limitsTimes{}))
	if got, _ := gen6.configTime(key(2), "p", prev, t0.Add(5*time.Hour)); !got.Equal(t0.Add(5 * time.Hour)) {
		t.Fatalf("reload back to max_concurrent 2 after an idle config of 4: %s, want the reload's time", got)
	}
	// The same, with another pool (q) keeping max_concurrent 2: the 2
	// brought back to p is newest all the same; q's keeps its time.
	var idle4q, gen7 limitsClock
	idle4q.configures(lfRequest(4), []string{"p"})
	idle4q.configures(lfRequest(2), []string{"q"})
	prev = idle4q.snapshot(gen4.snapshot(limitsTimes{}))
	if got, _ := gen7.configTime(key(2), "p", prev, t0.Add(5*time.Hour)); !got.Equal(t0.Add(5 * time.Hour)) {
		t.Fatalf("reload back to max_concurrent 2 after an idle config of 4 beside a pool of 2: %s, want the reload's time", got)
	}
	// fair_share → another policy (claims) → fair_share with the same
	// options and limits: the first time throughout.
	fsReq := registry.ClaimRequest{Policy: registry.FairShare, Limits: selection.Limits{MaxConcurrent: 2}, FairShare: selection.FairShare{Window: 5}}
	fs := limitsKey(fsReq)
	var f1, f2, f3 limitsClock
	f1.configures(fsReq, nil)
	f1.configTime(fs, "p", limitsTimes{}, t0)
	f2.configures(lfRequest(2), nil)
	f2.configTime(key(2), "p", f1.snapshot(limitsTimes{}), t0.Add(time.Hour))
	if got, _ := f3.configTime(fs, "p", f2.snapshot(f1.snapshot(limitsTimes{})), t0.Add(2*time.Hour)); !got.Equal(t0) {
		t.Fatalf("back to fair_share with the same options: %s, want the first configuration's %s", got, t0)
	}
	if key(2) == key(3) || limitsKey(registry.ClaimRequest{Policy: registry.FairShare, FairShare: selection.FairShare{Window: 5}}) ==
		limitsKey(registry.ClaimRequest{Policy: registry.FairShare, FairShare: selection.FairShare{Window: 6}}) {
		t.Fatal("limitsKey does not tell different limits apart")
	}
}

// TestLimitsHandBackFailedConfig: after a newer config that claimed for a
// pool with limits of its own failed, the running config's claims for
// that pool supersede the failed config's time and keep their own, and
// the next config is handed both; its other pools supersede nothing (the
// failed config stored nothing there); a failed config that claimed only
// with limits inherited from the running config hands nothing back.
func TestLimitsHandBackFailedConfig(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	key := func(mc int) string {
		return limitsKey(registry.ClaimRequest{Policy: registry.LifetimeFirst, Limits: selection.Limits{MaxConcurrent: mc}})
	}
	none := limitsTimes{}
	var running limitsClock
	running.configTime(key(1), "chromium", none, t0)
	running.configTime(key(1), "firefox", none, t0)
	check := func(what string, c *limitsClock, k, pool string, prev limitsTimes, at, want, wantSup time.Time) {
		t.Helper()
		got, sup := c.configTime(k, pool, prev, at)
		if !got.Equal(want) || !sup.Equal(wantSup) {
			t.Fatalf("%s: time %s, supersedes %s; want %s, %s", what, got, sup, want, wantSup)
		}
	}

	failedAt := t0.Add(time.Hour)
	var same limitsClock // claimed with the running config's limits only
	same.configTime(key(1), "chromium", running.snapshot(none), failedAt)
	if p := same.ownPools(); len(p) != 0 {
		t.Fatalf("a config that claimed only with inherited limits reports limits of its own for %v", p)
	}
	var failed limitsClock // claimed for chromium with max_concurrent 5
	check("the failed config's new limits", &failed, key(5), "chromium", running.snapshot(none), failedAt, failedAt, time.Time{})
	failed.configTime(key(1), "firefox", running.snapshot(none), failedAt)
	pools := failed.ownPools()
	if len(pools) != 1 || pools[0] != "chromium" {
		t.Fatalf("the failed config's pools with limits of its own: %v, want [chromium]", pools)
	}

	running.handBack(pools, failedAt)
	check("the running config's chromium limits after the failure", &running, key(1), "chromium", none, t0, t0, failedAt)
	check("chromium limits the running config had not claimed with yet", &running, key(2), "chromium", none, t0, t0, failedAt)
	check("the running config's firefox limits (a pool the failed config stored nothing for)", &running, key(1), "firefox", none, t0, t0, time.Time{})
	running.handBack(pools, t0) // an older failure does not replace it
	prev := running.snapshot(none)
	var next limitsClock // a reload keeping max_concurrent 1
	later := failedAt.Add(time.Hour)
	check("the next config keeping the running chromium limits", &next, key(1), "chromium", prev, later, t0, failedAt)
	check("the next config keeping the running firefox limits", &next, key(1), "firefox", prev, later, t0, time.Time{})
	var idle limitsClock // an idle config in between hands it on
	idle.configures(lfRequest(1), nil)
	check("after an idle config", new(limitsClock), key(1), "chromium", idle.snapshot(prev), failedAt.Add(2*time.Hour), t0, failedAt)
}
