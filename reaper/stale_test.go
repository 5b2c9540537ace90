package reaper

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
	"github.com/browsergrid/caddy-browser-grid/registry"
	"github.com/browsergrid/caddy-browser-grid/selection"
)

// 5,000 stale workers (a lost zone) beside 10 fresh ones that have been
// serving (issue 9, item 5): claims stay bounded (at most registry.DefaultMaxScan stale workers
// walked and reported, whatever the policy) and lifetime_first claims
// keep being served, while the reaper, every 5 s, and the claims' batched
// expiry remove the 5,000 within a minute.
func TestFiveThousandStaleWorkersGoFast(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	srv := testenv.StartRedis(t)
	rdb, err := registry.NewClient(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rdb.Close() })
	reg := registry.New(rdb, registry.Options{})
	const pool, dead, live = "zone", 5000, 10
	const staleAfter = 2 * time.Second
	var ids []string
	for i := range live {
		id := fmt.Sprintf("alive%d", i)
		ids = append(ids, id)
		if err := reg.Register(ctx, registry.Registration{Pool: pool, ID: id, Addr: "127.0.0.1:2", Path: "/", TTL: time.Hour}); err != nil {
			t.Fatal(err)
		}
	}
	var agents sync.WaitGroup
	agents.Add(1)
	go func() { // the live workers' agents
		defer agents.Done()
		for ctx.Err() == nil {
			for _, id := range ids {
				if _, err := reg.Heartbeat(ctx, pool, id, time.Hour); err != nil && ctx.Err() == nil {
					t.Errorf("heartbeat of %s: %v", id, err)
					return
				}
			}
			time.Sleep(200 * time.Millisecond) // the heartbeat interval
		}
	}()
	defer agents.Wait()
	defer cancel()
	// Serve a few sessions first, so the live workers have a lifetime.
	req := registry.ClaimRequest{Pool: pool, Policy: registry.LifetimeFirst, Limits: selection.Limits{MaxConcurrent: 1, StaleAfter: staleAfter}}
	for range 2 * live {
		c, err := reg.Claim(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if err := reg.Release(ctx, pool, c.LeaseID); err != nil {
			t.Fatal(err)
		}
	}
	// The lost zone: workers that registered and never served (lifetime
	// 0, so lifetime_first walks the serving ones first).
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g; i < dead; i += 8 {
				if err := reg.Register(ctx, registry.Registration{Pool: pool, ID: fmt.Sprintf("dead%04d", i), Addr: "127.0.0.1:1", Path: "/", TTL: time.Hour}); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	// The dead workers' heartbeats are now older than staleAfter.
	registered := time.Now()
	testenv.Eventually(t, 10*time.Second, "the dead workers going stale", func() bool {
		return time.Since(registered) > staleAfter+100*time.Millisecond
	})

	rp := &Reaper{Registry: reg, Interval: 5 * time.Second, StaleAfter: staleAfter}
	start := time.Now()
	go rp.Run(ctx)

	served, refused := 0, map[registry.Policy]int{}
	remaining := func() int {
		n, err := rdb.HLen(ctx, reg.Key(pool, "workers")).Result()
		if err != nil {
			t.Fatal(err)
		}
		return int(n) - live
	}
	for remaining() > 0 {
		if time.Since(start) > time.Minute {
			t.Fatalf("%d stale workers left after a minute", remaining())
		}
		// Every live worker takes a session (lifetime_first finds them
		// first: they have served, or sort first), then one more claim per
		// policy finds every live worker full and walks the stale ones:
		// refused, within the scan bound.
		var held []string
		req.Policy = registry.LifetimeFirst
		for range live {
			c, err := reg.Claim(ctx, req)
			if err != nil {
				t.Fatalf("a claim was refused beside %d live workers with a free slot: %v", live, err)
			}
			served++
			held = append(held, c.LeaseID)
		}
		for _, p := range []registry.Policy{registry.LifetimeFirst, registry.Vnode, registry.FairShare} {
			req.Policy = p
			_, err := reg.Claim(ctx, req)
			var nw *registry.NoWorkerError
			if !errors.As(err, &nw) {
				t.Fatalf("%s claim with every live worker full: %v, want NoWorkerError", p, err)
			}
			refused[p]++
			if d := nw.Decision; d.Scanned > registry.DefaultMaxScan+registry.DefaultMaxScan/4 || len(d.Stale) > registry.DefaultMaxScan {
				t.Fatalf("%s claim scanned %d and reported %d stale workers (max_scan 0): want at most about %d",
					p, d.Scanned, len(d.Stale), registry.DefaultMaxScan)
			}
		}
		for _, l := range held {
			if err := reg.Release(ctx, pool, l); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Logf("%d stale workers gone in %s (reaper every %s); %d sessions served meanwhile, refused: %v",
		dead, time.Since(start).Round(time.Millisecond), rp.Interval, served, refused)
}
