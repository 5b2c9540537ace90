package caddygrid_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/cmd/fakebrowser/fake"
	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
)

// TestTwoInstancesShareOneRedis: two Caddy instances on one Redis, 200
// concurrent sessions over 10 workers of max_concurrent 10. The first 100
// fill every slot; the other 100 queue in both instances and are served
// as the first ones close, woken by releases made by either instance. No
// worker ever has more than 10 sessions open, and Redis' counters equal
// the live sessions while they are open and after they close.
func TestTwoInstancesShareOneRedis(t *testing.T) {
	const (
		workers = 10
		maxConc = 10
		slots   = workers * maxConc
	)
	g := newGrid(t)
	servers := make([]*fake.Server, workers)
	ids := make([]string, workers)
	for i := range workers {
		ids[i] = fmt.Sprintf("w%02d", i)
		servers[i] = g.worker("chromium", ids[i], fake.Behavior{})
	}
	site := fmt.Sprintf(`
	route /playwright/* {
		browser_grid chromium {
			policy vnode
			max_concurrent %d
			select_timeout 60s
		}
	}`, maxConc)
	instances := []*caddy{
		startCaddy(t, caddyOpts{redisURL: g.redis.URL(), site: site}),
		startCaddy(t, caddyOpts{redisURL: g.redis.URL(), site: site}),
	}

	// countersMatch compares Redis' active count of every worker with the
	// sessions the worker really has open.
	countersMatch := func(wantTotal int) error {
		total := 0
		for i, id := range ids {
			redisActive := g.info("chromium", id).Active
			live := int(servers[i].Stats().Active)
			if redisActive != live {
				return fmt.Errorf("%s: Redis counts %d active, the worker has %d open", id, redisActive, live)
			}
			total += live
		}
		if total != wantTotal {
			return fmt.Errorf("%d sessions open, want %d", total, wantTotal)
		}
		return nil
	}
	open := func(n int) ([]*session, []error) {
		sessions := make([]*session, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				sessions[i], errs[i] = dial(context.Background(), instances[i%2].url("/playwright/chromium"))
			}()
		}
		wg.Wait()
		return sessions, errs
	}

	// Fill every slot.
	first, errs := open(slots)
	for i, err := range errs {
		if err != nil {
			t.Fatalf("first wave, client %d: %v", i, err)
		}
	}
	if err := countersMatch(slots); err != nil {
		t.Fatal(err)
	}

	// The second wave queues; closing the first wave serves it.
	type result struct {
		sessions []*session
		errs     []error
	}
	second := make(chan result, 1)
	go func() {
		s, e := open(slots)
		second <- result{s, e}
	}()
	testenv.Eventually(t, 20*time.Second, "the second wave queued in both instances", func() bool {
		return instances[0].metric(`caddy_grid_queue_depth{pool="chromium"}`)+
			instances[1].metric(`caddy_grid_queue_depth{pool="chromium"}`) == slots
	})
	for _, s := range first {
		go s.close()
	}
	var r result
	select {
	case r = <-second:
	case <-time.After(60 * time.Second):
		t.Fatal("second wave not served 60s after the first closed")
	}
	for i, err := range r.errs {
		if err != nil {
			t.Fatalf("second wave, client %d: %v", i, err)
		}
	}
	testenv.Eventually(t, 10*time.Second, "counters equal the second wave's sessions", func() bool {
		return countersMatch(slots) == nil
	})
	for _, s := range r.sessions {
		s.close()
	}
	testenv.Eventually(t, 10*time.Second, "every session released", func() bool { return countersMatch(0) == nil })

	lifetimes := 0
	for i, id := range ids {
		if peak := servers[i].Stats().PeakActive; peak > maxConc {
			t.Errorf("%s had %d sessions open at once, above max_concurrent %d", id, peak, maxConc)
		}
		w := g.info("chromium", id)
		lifetimes += w.Lifetime
		if int64(w.Lifetime) != servers[i].Stats().Sessions {
			t.Errorf("%s: lifetime %d, but served %d sessions", id, w.Lifetime, servers[i].Stats().Sessions)
		}
	}
	if lifetimes != 2*slots {
		t.Errorf("lifetimes sum to %d, want %d", lifetimes, 2*slots)
	}
	info, err := g.reg.Inspect(context.Background(), "chromium")
	if err != nil {
		t.Fatal(err)
	}
	if info.Leases != 0 {
		t.Errorf("%d leases left in Redis after every session closed", info.Leases)
	}
}
