package caddygrid_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/cmd/fakebrowser/fake"
	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
)

// TestReloadWithLiveSessions: sessions open across 'caddy reload' keep
// working (stream_close_delay defaults to an hour), and each claim is
// released exactly once when its socket closes, whichever config claimed
// it. A config with a short stream_close_delay closes its sessions that
// long after being replaced, and releases them exactly once too.
//
// "Exactly once" is read from two independent counts: the release
// counter of Caddy's metrics (one per ended claim) and the session
// durations Redis records per worker (one per release of a live lease;
// a second release of the same lease would record nothing but would show
// in the counter).
func TestReloadWithLiveSessions(t *testing.T) {
	g := newGrid(t)
	servers := []*fake.Server{g.worker("chromium", "w1", fake.Behavior{}), g.worker("chromium", "w2", fake.Behavior{})}
	config := func(maxLifetime int, extra string) caddyOpts {
		return caddyOpts{redisURL: g.redis.URL(), site: fmt.Sprintf(`
	route /playwright/* {
		browser_grid chromium {
			policy fair_share
			max_lifetime %d
			%s
		}
	}`, maxLifetime, extra)}
	}
	c := startCaddy(t, config(100, ""))
	open := func(n int) []*session {
		out := make([]*session, n)
		for i := range out {
			out[i] = mustDial(t, c.url("/playwright/chromium"))
		}
		return out
	}
	liveSessions := func() int64 { return servers[0].Stats().Active + servers[1].Stats().Active }
	// settled: every session closed, each released once.
	settled := func(sessions int) func() bool {
		return func() bool {
			active, durations, lifetimes := 0, 0, 0
			for _, id := range []string{"w1", "w2"} {
				w := g.info("chromium", id)
				active += w.Active
				durations += len(w.Durations)
				lifetimes += w.Lifetime
			}
			return active == 0 && durations == sessions && lifetimes == sessions
		}
	}
	released := func() float64 {
		return c.metric(`caddy_grid_releases_total{outcome="released",pool="chromium"}`)
	}

	// Three sessions on the first config survive a reload to the second.
	old := open(3)
	c.reload(config(100, "stream_close_delay 300ms"))
	for i, s := range old {
		if err := s.echo("after reload"); err != nil {
			t.Fatalf("session %d opened before the reload: %v", i, err)
		}
	}
	fresh := open(2)
	for _, s := range append(old, fresh...) {
		s.close()
	}
	testenv.Eventually(t, 10*time.Second, "five sessions released once each", settled(5))
	if got := released(); got != 5 {
		t.Fatalf("releases after five sessions = %v, want 5", got)
	}

	// Two sessions on the second config (stream_close_delay 300ms) are
	// closed by Caddy 300ms after a reload to a third, and released.
	doomed := open(2)
	c.reload(config(100, ""))
	for i, s := range doomed {
		i, s := i, s
		testenv.Eventually(t, 10*time.Second, fmt.Sprintf("session %d closed by the replaced config", i), func() bool {
			return s.echo("still there?") != nil
		})
	}
	testenv.Eventually(t, 10*time.Second, "seven sessions released once each", settled(7))
	testenv.Eventually(t, 5*time.Second, "the release counter", func() bool { return released() == 7 })
	if liveSessions() != 0 {
		t.Errorf("%d sessions still open on the workers", liveSessions())
	}
	if got := c.metric(`caddy_grid_releases_total{outcome="undone",pool="chromium"}`); got != 0 {
		t.Errorf("undone claims = %v, want 0", got)
	}
	info, err := g.reg.Inspect(t.Context(), "chromium")
	if err != nil {
		t.Fatal(err)
	}
	if info.Leases != 0 {
		t.Errorf("%d leases left in Redis", info.Leases)
	}
}
