package caddygrid_test

import (
	"context"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/cmd/fakebrowser/fake"
	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
)

// TestLeasesLiveWithTheSocket: a session outlives lease_ttl because its
// Caddy renews the lease; when that Caddy dies (kill -9), the lease is no
// longer renewed and the worker's slot frees itself, here through the
// reaper of another instance sharing the Redis.
func TestLeasesLiveWithTheSocket(t *testing.T) {
	g := newGrid(t)
	g.worker("chromium", "w1", fake.Behavior{})
	opts := caddyOpts{redisURL: g.redis.URL(), global: "lease_ttl 1s\n\t\treaper_interval 200ms", site: `
	route /playwright/* {
		browser_grid chromium
	}`}
	a := startCaddy(t, opts)
	startCaddy(t, opts) // b: its reaper heals what a leaves behind
	ctx := context.Background()
	const expiry = "{grid:chromium}:lease_expiry"

	s := mustDial(t, a.url("/playwright/chromium"))
	leases, err := g.rdb.ZRangeWithScores(ctx, expiry, 0, -1).Result()
	if err != nil || len(leases) != 1 {
		t.Fatalf("leases in Redis: %v, %v; want one", leases, err)
	}
	lease, first := leases[0].Member, leases[0].Score
	// Renewed well past the first expiry: the session outlives lease_ttl.
	testenv.Eventually(t, 10*time.Second, "the lease renewed past its first expiry", func() bool {
		score, err := g.rdb.ZScore(ctx, expiry, lease.(string)).Result()
		return err == nil && score >= first+1500
	})
	if w := g.info("chromium", "w1"); w.Active != 1 {
		t.Fatalf("active %d while the session lives, want 1", w.Active)
	}
	if err := s.echo("still here"); err != nil {
		t.Fatal(err)
	}

	// a dies without releasing anything.
	if err := a.proc.Cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 15*time.Second, "the dead instance's slot freed", func() bool {
		n, _ := g.rdb.ZCard(ctx, expiry).Result()
		return n == 0 && g.info("chromium", "w1").Active == 0
	})
}

// TestLoweredLeaseTTLRenewsInTime: after a reload lowers lease_ttl from
// 30s to 3s, the lease of a session opened under the new config is
// renewed before it lapses, for as long as the socket lives (held past
// twice the new TTL here, with a reaper that frees any lapsed lease at
// once): the renewals follow the shortest TTL in force, not the interval
// the old one set.
func TestLoweredLeaseTTLRenewsInTime(t *testing.T) {
	g := newGrid(t)
	g.worker("chromium", "w1", fake.Behavior{})
	config := func(ttl string) caddyOpts {
		return caddyOpts{redisURL: g.redis.URL(), global: "lease_ttl " + ttl + "\n\t\treaper_interval 200ms", site: `
	route /playwright/* {
		browser_grid chromium
	}`}
	}
	c := startCaddy(t, config("30s"))
	c.reload(config("3s"))
	ctx := context.Background()
	const expiry = "{grid:chromium}:lease_expiry"
	const newTTL = 3 * time.Second

	s := mustDial(t, c.url("/playwright/chromium"))
	defer s.close()
	// Watch the lease for 2.5 times the new TTL: it must never lapse.
	hold := newTTL * 5 / 2
	start := time.Now()
	for time.Since(start) < hold {
		leases, err := g.rdb.ZRangeWithScores(ctx, expiry, 0, -1).Result()
		if err != nil {
			t.Fatal(err)
		}
		now := float64(time.Now().UnixMilli())
		if len(leases) != 1 || leases[0].Score <= now {
			t.Fatalf("after %s: leases %v at %v; want one that has not lapsed", time.Since(start).Round(time.Millisecond), leases, now)
		}
		if w := g.info("chromium", "w1"); w.Active != 1 {
			t.Fatalf("after %s: active %d while the session lives, want 1", time.Since(start).Round(time.Millisecond), w.Active)
		}
		time.Sleep(100 * time.Millisecond) // sampling the lease while the session is held
	}
	if err := s.echo("still here"); err != nil {
		t.Fatal(err)
	}
}
