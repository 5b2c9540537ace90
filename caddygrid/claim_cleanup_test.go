package caddygrid_test

import (
	"context"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/cmd/fakebrowser/fake"
	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
)

// TestClaimInFlightAcrossCleanup: a reload that moves the grid to another
// Redis cleans up the old config while a claim on the old Redis is in
// flight. The claim ran in Redis, so its slot is taken; the session it
// made is served and, once closed, its slot is free again at once, not
// after lease_ttl. Before the claim held its own reference on the
// backend, the old config's cleanup closed the Redis client under the
// claim: the client got an error and the lease stayed until lease_ttl.
func TestClaimInFlightAcrossCleanup(t *testing.T) {
	g := newGrid(t)
	w := g.worker("chromium", "w1", fake.Behavior{})
	other := testenv.StartRedis(t)
	p := startRedisProxy(t, g.redis.Addr)
	site := `
	route /playwright/* {
		browser_grid chromium
	}`
	// lease_ttl far above what the test waits: a leaked lease shows.
	const global = "lease_ttl 60s\n\t\treaper_interval 10m"
	c := startCaddy(t, caddyOpts{redisURL: "redis://" + p.addr() + "/0", global: global, site: site})
	mustDial(t, c.url("/playwright/chromium")).close()
	testenv.Eventually(t, 10*time.Second, "the first session released", func() bool {
		return g.info("chromium", "w1").Active == 0
	})

	claimSent := p.holdReplies("_claim")
	done := make(chan dialResult, 1)
	go func() {
		s, err := dial(context.Background(), c.url("/playwright/chromium"))
		done <- dialResult{s, err}
	}()
	var held time.Time
	select {
	case <-claimSent:
		held = time.Now()
	case <-time.After(10 * time.Second):
		t.Fatal("no claim reached Redis")
	}
	// The claim ran in Redis; its reply waits in the proxy while the
	// reload cleans up the config it came from (nothing else is held).
	testenv.Eventually(t, 5*time.Second, "the claim taking the slot", func() bool {
		return g.info("chromium", "w1").Active == 1
	})
	c.reload(caddyOpts{redisURL: other.URL(), global: global, site: site})
	p.release()
	t.Logf("the claim's reply held %s (its deadline is 2s)", time.Since(held).Round(time.Millisecond))

	res := <-done
	t.Logf("the session whose claim was in flight across the cleanup: error %v", res.err)
	if res.err != nil {
		t.Errorf("the session whose claim was in flight: %v; want it served (the claim took a slot)", res.err)
	} else {
		res.s.close()
	}
	if n := w.Stats().Sessions; n != 2 {
		t.Errorf("the worker served %d sessions, want 2", n)
	}
	start := time.Now()
	testenv.Eventually(t, 10*time.Second, "the slot of the claim in flight free again (lease_ttl is 60s)", func() bool {
		info := g.info("chromium", "w1")
		return info.Active == 0
	})
	t.Logf("slot free %s after the session ended", time.Since(start).Round(time.Millisecond))
}
