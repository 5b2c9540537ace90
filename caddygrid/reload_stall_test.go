package caddygrid_test

import (
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/cmd/fakebrowser/fake"
	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
)

// TestReloadWithRedisStalled: a reload while Redis is stalled (DEBUG SLEEP:
// connections accepted, no command answered) does not wait for the stall
// nor for go-redis' read timeouts. The old config's reaper is stopped with
// a pass under way (every 100 ms here, so one is always in flight during
// the stall), and Stop used to wait for that pass: its call and then its
// unlock each waited out the read timeout, and the reload returned only
// after about 6 s.
func TestReloadWithRedisStalled(t *testing.T) {
	g := newGrid(t)
	g.worker("chromium", "w1", fake.Behavior{})
	site := func(timeout string) string {
		return `
	route /playwright/* {
		browser_grid chromium {
			select_timeout ` + timeout + `
		}
	}`
	}
	// go-redis' read timeout is 10 s, so a reload that waits for one is
	// told apart from one that does not by seconds.
	opts := caddyOpts{redisURL: g.redis.URL() + "?read_timeout=10s", global: "reaper_interval 100ms", site: site("30s")}
	c := startCaddy(t, opts)
	mustDial(t, c.url("/playwright/chromium")).close()

	g.redis.Stall(8 * time.Second)
	time.Sleep(300 * time.Millisecond) // a reaper pass is now waiting on Redis

	start := time.Now()
	opts.site = site("20s") // a real change: the grid app is replaced
	c.reload(opts)
	took := time.Since(start)
	t.Logf("reload with Redis stalled took %s", took.Round(time.Millisecond))
	if took > 4*time.Second {
		t.Errorf("reload took %s with Redis stalled: it waited on Redis (stall 8s, read timeout 10s)", took.Round(time.Millisecond))
	}

	// Once Redis answers again the new config serves.
	testenv.Eventually(t, 30*time.Second, "a session served after the stall", func() bool {
		s, err := dial(t.Context(), c.url("/playwright/chromium"))
		if err != nil {
			return false
		}
		s.close()
		return true
	})
}
