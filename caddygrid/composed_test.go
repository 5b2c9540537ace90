package caddygrid_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/cmd/fakebrowser/fake"
	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
)

// TestHandComposed: the grid's parts inside a plain reverse_proxy (the
// upstream source, a grid policy, Caddy's own retries) do what the
// browser_grid directive does: claim, skip a refusing worker without
// charging it, and release every claim when its socket closes.
func TestHandComposed(t *testing.T) {
	g := newGrid(t)
	refuser := g.worker("chromium", "w0", fake.Behavior{Refuse: http.StatusBadGateway})
	g.worker("chromium", "w1", fake.Behavior{})
	g.worker("chromium", "w2", fake.Behavior{})
	c := startCaddy(t, caddyOpts{redisURL: g.redis.URL(), site: `
	route /playwright/* {
		reverse_proxy {
			dynamic browser_grid chromium
			lb_policy lifetime_first {
				max_lifetime 4
			}
			lb_retries 2
			lb_retry_match {
				expression ` + "`type({rp.status_code}) != int || {rp.status_code} >= 500 || {rp.status_code} == 404`" + `
			}
		}
	}`})

	// Margin 4/3 = 1: w1 takes three sessions, then w2 three (w0 refuses
	// and is skipped).
	for range 6 {
		mustDial(t, c.url("/playwright/chromium")).close()
	}
	testenv.Eventually(t, 10*time.Second, "every claim released", func() bool {
		for _, id := range []string{"w0", "w1", "w2"} {
			if g.info("chromium", id).Active != 0 {
				return false
			}
		}
		return true
	})
	for id, want := range map[string]int{"w0": 0, "w1": 3, "w2": 3} {
		if got := g.info("chromium", id).Lifetime; got != want {
			t.Errorf("%s lifetime %d, want %d", id, got, want)
		}
	}
	if refuser.Stats().Refused == 0 {
		t.Error("the refusing worker was never tried; the test proves nothing")
	}
	// The counter moves right after Redis answers the release, so it may
	// trail the worker's count by a moment.
	testenv.Eventually(t, 5*time.Second, "six released claims counted", func() bool {
		return c.metric(`caddy_grid_releases_total{outcome="released",pool="chromium"}`) == 6
	})
	info, err := g.reg.Inspect(t.Context(), "chromium")
	if err != nil {
		t.Fatal(err)
	}
	if info.Leases != 0 {
		t.Errorf("%d leases left", info.Leases)
	}
}
