package caddygrid_test

import (
	"context"
	"fmt"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/cmd/fakebrowser/fake"
	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
	"github.com/browsergrid/caddy-browser-grid/registry"
	"github.com/browsergrid/caddy-browser-grid/selection"
)

// TestReloadLoweringMaxLifetimeKeepsServing is issue 9's first report,
// against bin/caddy: three workers, max_lifetime 20, 8 sessions, then
// 'caddy reload' with max_lifetime 5. The pool used to serve 8 more
// sessions and then answer 503 for good (the worker at 8/5 was never told
// to drain and stagger_drains held the others back behind it). Now the
// workers' heartbeats tell the one past the limit to drain, the others
// follow one at a time, and every session is served. The agents are
// simulated in the test: they heartbeat, and on a shutdown command mark
// their worker draining and, once idle, register it again as new.
func TestReloadLoweringMaxLifetimeKeepsServing(t *testing.T) {
	g := newGrid(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const pool = "chromium"
	var mu sync.Mutex
	regs := map[string]registry.Registration{}
	for _, id := range []string{"w1", "w2", "w3"} {
		srv, ep, err := fake.Start("127.0.0.1:0", fake.Options{Path: "/playwright"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { srv.Close() })
		u, err := url.Parse(ep)
		if err != nil {
			t.Fatal(err)
		}
		reg := registry.Registration{Pool: pool, ID: id, BrowserType: pool, Addr: u.Host, Path: u.Path, TTL: time.Minute}
		if err := g.reg.Register(ctx, reg); err != nil {
			t.Fatal(err)
		}
		regs[id] = reg
	}
	restarts, overlaps := 0, 0
	var agents sync.WaitGroup
	agents.Add(1)
	go func() {
		defer agents.Done()
		for ctx.Err() == nil {
			restarting := 0
			mu.Lock()
			for id, reg := range regs {
				hb, err := g.reg.Heartbeat(ctx, pool, id, time.Minute)
				if err != nil {
					continue // the test is ending
				}
				w, err := g.reg.Worker(ctx, pool, id)
				if err != nil {
					continue
				}
				if hb.Command == registry.CommandShutdown && w.Status != selection.Draining {
					_ = g.reg.SetDraining(ctx, pool, id)
					w.Status = selection.Draining
				}
				if w.Status == selection.Draining && w.Active == 0 {
					// the agent restarts its browser: a new registration
					_ = g.reg.Deregister(ctx, pool, id)
					_ = g.reg.Register(ctx, reg)
					restarts++
				}
			}
			// One atomic read of the pool (a small pool is one chunk).
			if info, err := g.reg.Inspect(ctx, pool); err == nil {
				for _, w := range info.Workers {
					if w.Status == selection.Draining || w.Command == registry.CommandShutdown {
						restarting++
					}
				}
			}
			if restarting > 1 {
				overlaps++
			}
			mu.Unlock()
			time.Sleep(50 * time.Millisecond) // the agents' heartbeat interval
		}
	}()
	defer agents.Wait()
	defer cancel()

	config := func(maxLifetime int) caddyOpts {
		return caddyOpts{redisURL: g.redis.URL(), site: fmt.Sprintf(`
	route /playwright/* {
		browser_grid chromium {
			max_lifetime %d
		}
	}`, maxLifetime)}
	}
	c := startCaddy(t, config(20))
	session := func(i int) {
		t.Helper()
		s, err := dial(ctx, c.url("/playwright/chromium"))
		if err != nil {
			t.Fatalf("session %d: %v", i, err)
		}
		s.close()
	}
	for i := range 8 {
		session(i)
	}
	c.reload(config(5))
	for i := 8; i < 40; i++ {
		session(i)
	}
	mu.Lock()
	defer mu.Unlock()
	if restarts < 3 {
		t.Errorf("%d restarts after max_lifetime 20 -> 5 and 32 sessions, want at least 3", restarts)
	}
	if overlaps > 0 {
		t.Errorf("two workers restarting at once in %d heartbeat rounds", overlaps)
	}
	testenv.Eventually(t, 5*time.Second, "no session left", func() bool {
		info, err := g.reg.Inspect(ctx, pool)
		return err == nil && info.Leases == 0
	})
}
