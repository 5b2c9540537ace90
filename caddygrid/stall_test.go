package caddygrid_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/cmd/fakebrowser/fake"
	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
)

// TestRedisStalled: with Redis stalled (DEBUG SLEEP 7: it accepts
// connections and reads commands but answers none) a client gets 503 with
// Retry-After at the claim's 2 s deadline, not at go-redis' read timeout
// nor at select_timeout, and Caddy says why. The read timeout is set to
// 10 s here so that the three are told apart by seconds, not by a margin
// a loaded CI machine can eat (a run with every package testing at once
// once took 2.77 s). TestRedisDown covers a Redis that refuses
// connections.
func TestRedisStalled(t *testing.T) {
	g := newGrid(t)
	g.worker("chromium", "w1", fake.Behavior{})
	c := startCaddy(t, caddyOpts{redisURL: g.redis.URL() + "?read_timeout=10s", site: `
	route /playwright/* {
		browser_grid chromium {
			select_timeout 60s
		}
	}`})
	mustDial(t, c.url("/playwright/chromium")).close()
	testenv.Eventually(t, 10*time.Second, "slot released", func() bool { return g.info("chromium", "w1").Active == 0 })

	g.redis.Stall(7 * time.Second)

	start := time.Now()
	_, err := dial(context.Background(), c.url("/playwright/chromium"))
	took := time.Since(start)
	t.Logf("answer with Redis stalled: %v after %s", err, took.Round(time.Millisecond))
	he := refusal(err)
	if he == nil || he.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("with Redis stalled: got %v, want 503", err)
	}
	if he.Header.Get("Retry-After") == "" {
		t.Error("503 without Retry-After")
	}
	if took > 5*time.Second {
		t.Errorf("503 after %s, want it at the claim's 2s deadline (go-redis' read timeout is 10s here, select_timeout 60s)", took)
	}
	if !c.proc.WaitOutput("Redis unreachable", 5*time.Second) {
		t.Error("Caddy's log does not say Redis is unreachable")
	}
}
