package caddygrid

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
	"github.com/browsergrid/caddy-browser-grid/registry"
	"github.com/browsergrid/caddy-browser-grid/selection"
)

// TestRenewalReportsOnlyLiveSessions: the lease keeper snapshots the live
// leases, then renews them in one call. A session that finishes between
// the two meets its own release's tombstone in Redis: that lease is not
// "ended elsewhere" (its slot is free because its session is over), so it
// is neither reported nor counted as lost. A lease released by someone
// else while its session still runs here is: reported once, counted, and
// no longer renewed, while the other live leases are renewed as before.
func TestRenewalReportsOnlyLiveSessions(t *testing.T) {
	r := testenv.StartRedis(t)
	core, logs := observer.New(zap.WarnLevel)
	b, err := newBackend(backendKey{url: r.URL()}, zap.New(core))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Destruct() })
	ctx := context.Background()
	const pool = "ended_elsewhere"
	if err := b.reg.Register(ctx, registry.Registration{
		Pool: pool, ID: "w1", BrowserType: "chromium", Addr: "127.0.0.1:9", TTL: time.Minute,
	}); err != nil {
		t.Fatalf("registering the worker: %v", err)
	}
	claim := func() *registry.Claim {
		t.Helper()
		c, err := b.claim(ctx, registry.ClaimRequest{Pool: pool, Policy: registry.LifetimeFirst,
			Limits: selection.Limits{MaxConcurrent: 10}}, 1)
		if err != nil {
			t.Fatalf("claiming: %v", err)
		}
		return c
	}
	finished, elsewhere, live := claim(), claim(), claim()
	lost := func() float64 {
		var m dto.Metric
		if err := metrics.leasesLost.WithLabelValues(pool).Write(&m); err != nil {
			t.Fatalf("reading leases_lost_total: %v", err)
		}
		return m.GetCounter().GetValue()
	}
	lostBefore := lost()

	snapshot := b.renewals()
	if n := len(snapshot[pool]); n != 3 {
		t.Fatalf("snapshot holds %d leases, want 3", n)
	}
	// Between the snapshot and the renewal: one session finishes here (its
	// own release tombstones its lease), another's lease is released by
	// someone else while the session still runs.
	b.finish(finished, true, false)
	if err := b.reg.Release(ctx, pool, elsewhere.LeaseID); err != nil {
		t.Fatalf("releasing a live session's lease elsewhere: %v", err)
	}
	b.renewBatch(ctx, time.Minute, snapshot)

	var reported []string
	for _, e := range logs.FilterMessageSnippet("ended elsewhere").All() {
		ids, ok := e.ContextMap()["lease_ids"].([]any)
		if !ok {
			t.Fatalf("%q without lease_ids: %v", e.Message, e.ContextMap())
		}
		for _, id := range ids {
			reported = append(reported, fmt.Sprint(id))
		}
	}
	if !slices.Equal(reported, []string{elsewhere.LeaseID}) {
		t.Errorf("leases reported ended elsewhere: %v; want only %s (the session that finished here: %s)",
			reported, elsewhere.LeaseID, finished.LeaseID)
	}
	if d := lost() - lostBefore; d != 1 {
		t.Errorf("leases_lost_total grew by %v, want 1", d)
	}
	// The next renewal renews the live session's lease only.
	var next []string
	for _, l := range b.renewals()[pool] {
		next = append(next, l.ID)
	}
	if !slices.Equal(next, []string{live.LeaseID}) {
		t.Errorf("next renewal renews %v, want only %s", next, live.LeaseID)
	}
}

// TestSessionEndForgetsItsLeaseFirst: a session's end takes its lease out
// of those this process renews before the release reaches Redis, so no
// renewal answer can come back after the release while the lease still
// counts as live here (renewBatch would report it ended elsewhere). Redis
// holds every write while the release is on its way: the lease must be
// forgotten here while Redis still has it live. The check runs within
// half of redisCallTimeout, before a release left waiting would give up
// (an end whose call failed forgets its lease too).
func TestSessionEndForgetsItsLeaseFirst(t *testing.T) {
	r := testenv.StartRedis(t)
	b, err := newBackend(backendKey{url: r.URL()}, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Destruct() })
	admin, err := registry.NewClient(r.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close() })
	ctx := context.Background()
	const pool = "forget_first"
	if err := b.reg.Register(ctx, registry.Registration{
		Pool: pool, ID: "w1", BrowserType: "chromium", Addr: "127.0.0.1:9", TTL: time.Minute,
	}); err != nil {
		t.Fatalf("registering the worker: %v", err)
	}
	c, err := b.claim(ctx, registry.ClaimRequest{Pool: pool, Policy: registry.LifetimeFirst}, 1)
	if err != nil {
		t.Fatalf("claiming: %v", err)
	}
	leases := "{grid:" + pool + "}:leases"
	if err := admin.Do(ctx, "CLIENT", "PAUSE", "60000", "WRITE").Err(); err != nil {
		t.Fatalf("pausing Redis writes: %v", err)
	}
	unpaused := false
	unpause := func() {
		if !unpaused {
			unpaused = true
			if err := admin.Do(ctx, "CLIENT", "UNPAUSE").Err(); err != nil {
				t.Errorf("unpausing Redis writes: %v", err)
			}
		}
	}
	defer unpause()
	done := make(chan struct{})
	go func() {
		defer close(done)
		b.finish(c, true, false)
	}()
	testenv.Eventually(t, redisCallTimeout/2, "the ended session's lease forgotten while its release waits on Redis", func() bool {
		b.mu.Lock()
		_, held := b.leases[pool][c.LeaseID]
		b.mu.Unlock()
		return !held
	})
	if v, err := admin.HGet(ctx, leases, c.LeaseID).Result(); err != nil || !strings.HasPrefix(v, "{") {
		t.Fatalf("lease in Redis while its release waits: %q, %v; want it still live", v, err)
	}
	unpause()
	<-done
	if v, err := admin.HGet(ctx, leases, c.LeaseID).Result(); err != nil || strings.HasPrefix(v, "{") {
		t.Fatalf("lease in Redis after the release: %q, %v; want its tombstone", v, err)
	}
}
