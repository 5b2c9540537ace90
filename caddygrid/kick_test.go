package caddygrid_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/cmd/fakebrowser/fake"
	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
	"github.com/browsergrid/caddy-browser-grid/registry"
)

// TestStaleWorkerKicksReaperInCaddy: a claim that walks past a stale
// worker kicks the grid app's reaper, which reaps the pool long before
// its reaper_interval (a minute; the kicked pass waits at most the
// default MinKickGap, 6 s, after the pass Caddy ran at start) and counts
// the pass as kind kicked.
func TestStaleWorkerKicksReaperInCaddy(t *testing.T) {
	g := newGrid(t)
	g.worker("chromium", "w1", fake.Behavior{})
	ctx, cancel := context.WithCancel(context.Background())
	var agent sync.WaitGroup
	agent.Add(1)
	go func() { // w1's agent
		defer agent.Done()
		for ctx.Err() == nil {
			if _, err := g.reg.Heartbeat(ctx, "chromium", "w1", workerTTL); err != nil && ctx.Err() == nil {
				t.Errorf("heartbeat of w1: %v", err)
				return
			}
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond): // the heartbeat interval
			}
		}
	}()
	t.Cleanup(func() { cancel(); agent.Wait() })
	c := startCaddy(t, caddyOpts{redisURL: g.redis.URL(), global: "reaper_interval 1m\n\t\tstale_threshold 1s", site: `
	route /playwright/* {
		browser_grid chromium
	}`})
	// After Caddy's first pass: a worker that never heartbeats, first in
	// lifetime_first's order (equal counts, then by ID), so every claim
	// walks past it.
	if err := g.reg.Register(context.Background(), registry.Registration{
		Pool: "chromium", ID: "a-ghost", BrowserType: "chromium", Addr: "127.0.0.1:9", Path: "/playwright", TTL: workerTTL,
	}); err != nil {
		t.Fatal(err)
	}
	registered := time.Now()
	testenv.Eventually(t, 10*time.Second, "the ghost going stale", func() bool {
		return time.Since(registered) > 1100*time.Millisecond
	})
	const kicked = `caddy_grid_reaper_events_total{kind="kicked"}`
	if n := c.metric(kicked); n != 0 {
		t.Fatalf("%s = %v before any claim met a stale worker, want 0", kicked, n)
	}
	s := mustDial(t, c.url("/playwright/chromium"))
	s.close()
	testenv.Eventually(t, 40*time.Second, "a kicked reaper pass", func() bool {
		return c.metric(kicked) >= 1
	})
	testenv.Eventually(t, 10*time.Second, "the ghost removed", func() bool {
		_, err := g.reg.Worker(context.Background(), "chromium", "a-ghost")
		return errors.Is(err, registry.ErrNotRegistered)
	})
	if _, err := g.reg.Worker(context.Background(), "chromium", "w1"); err != nil {
		t.Fatalf("the fresh worker: %v", err)
	}
}
