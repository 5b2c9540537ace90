package caddygrid_test

import (
	"context"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
	"github.com/browsergrid/caddy-browser-grid/registry"
)

// Three sessions served and ended, then Redis loses everything and the
// worker registers again asserting the lifetime of a heartbeat that never
// saw them (0): Caddy's next claim finds the dataset epoch changed and
// re-asserts what it served before it claims, so the browser serves the 2
// sessions left of max_lifetime 5, not 5 more.
func TestLifetimeFloorsSurviveAnEmptyRestart(t *testing.T) {
	g := newGrid(t)
	reg := oneProcessWorker(t, g, "gen-1")
	ctx := context.Background()
	c := startCaddy(t, caddyOpts{redisURL: g.redis.URL(), site: `
	route /playwright/* {
		browser_grid chromium {
			select_timeout 300ms
			max_lifetime 5
		}
	}`})
	for range 3 {
		mustDial(t, c.url("/playwright/chromium")).close()
	}
	testenv.Eventually(t, 5*time.Second, "3 sessions released", func() bool {
		w := g.info("chromium", "w1")
		return w.Active == 0 && w.Lifetime == 3
	})
	if err := g.rdb.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if err := g.reg.Register(ctx, reg); err != nil { // asserting lifetime 0
		t.Fatal(err)
	}
	served := 0
	for range 5 {
		s, err := dial(ctx, c.url("/playwright/chromium"))
		if err != nil {
			break
		}
		served++
		s.close()
		testenv.Eventually(t, 5*time.Second, "the session released", func() bool { return g.info("chromium", "w1").Active == 0 })
	}
	w := g.info("chromium", "w1")
	if served != 2 || w.Lifetime != 5 || w.Command != registry.CommandShutdown {
		t.Errorf("after the loss: %d sessions served, lifetime %d, command %q; want 2, 5 and shutdown", served, w.Lifetime, w.Command)
	}
}
