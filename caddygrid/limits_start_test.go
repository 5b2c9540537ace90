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
)

// TestLoweredMaxConcurrentHoldsForQueuedRequests: a reload that lowers
// max_concurrent applies to the requests already waiting in the queue.
// They were made under the replaced config, whose claims bring its
// limits; the new limits used to be stored only at the new config's first
// claim, so a waiting request woken before then claimed under the old
// ones. Here one worker (no cap of its own, as with grid-worker's default
// -max-concurrent 0) holds 3 sessions under max_concurrent 3, 3 more
// requests wait, the config is reloaded with max_concurrent 1, and the 3
// sessions close: the worker used to take all 3 waiting requests at once.
// Now it takes one, and the others follow one at a time. Run for a
// worker of the pool itself and for one in a Playwright version's group.
func TestLoweredMaxConcurrentHoldsForQueuedRequests(t *testing.T) {
	for _, tc := range []struct{ name, pool string }{
		{"pool", "chromium"},
		{"version group", registry.GroupPool("chromium", "1.65")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := newGrid(t)
			g.worker(tc.pool, "w1", fake.Behavior{})
			c := startCaddy(t, mcConfig(g.redis.URL(), 3))
			// Three requests wait in the queue under max_concurrent 3.
			held, w := queueBehind(t, c, 3)

			c.reload(mcConfig(g.redis.URL(), 1))
			for _, s := range held {
				s.close()
			}
			// The waiting requests are woken as the sessions end; under
			// max_concurrent 1 one is served now and the others wait.
			testenv.Eventually(t, 10*time.Second, "a waiting request served", func() bool {
				n, errs := w.counts()
				return n > 0 || len(errs) > 0
			})
			time.Sleep(time.Second) // the other waiters had their chance to claim
			open, errs := w.counts()
			active := g.info(tc.pool, "w1").Active
			t.Logf("after the reload to max_concurrent 1 and 3 closes: %d waiting requests served, %d failed, worker active %d", open, len(errs), active)
			if len(errs) > 0 {
				t.Fatalf("waiting requests failed: %v", errs)
			}
			if open != 1 || active != 1 {
				t.Fatalf("%d waiting requests served at once, worker active %d: max_concurrent 1 was not in force for the requests queued before the reload", open, active)
			}
			if lim := g.limits(tc.pool); lim.MaxConcurrent != 1 {
				t.Fatalf("the pool runs under max_concurrent %d, want 1", lim.MaxConcurrent)
			}
			// The other two are served one after another as each session
			// closes.
			for want := 2; want <= 3; want++ {
				w.closeLast()
				testenv.Eventually(t, 10*time.Second, fmt.Sprintf("waiting request %d served", want), func() bool {
					n, _ := w.counts()
					return n == want
				})
				if active := g.info(tc.pool, "w1").Active; active != 1 {
					t.Fatalf("worker active %d with waiting request %d served, want 1", active, want)
				}
			}
		})
	}
}

// TestQueuedRequestsOfAReplacedConfigBringTheNewLimits: requests of a
// config a reload replaced claim with the running config's limits. Here
// the new config's max_concurrent 1 is stored as it starts, and then
// Redis loses its data (a restart that comes back empty): the pool has no
// limits until a claim stores some. The first claims after the loss are
// those of the requests that waited since before the reload; they used to
// store the replaced config's max_concurrent 3, and the worker took all 3
// of them at once.
func TestQueuedRequestsOfAReplacedConfigBringTheNewLimits(t *testing.T) {
	g := newGrid(t)
	srv, ep, err := fake.Start("127.0.0.1:0", fake.Options{Path: "/playwright"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	u0, err := url.Parse(ep)
	if err != nil {
		t.Fatal(err)
	}
	reg := registry.Registration{Pool: "chromium", ID: "w1", BrowserType: "chromium", Addr: u0.Host, Path: u0.Path, TTL: workerTTL}
	if err := g.reg.Register(t.Context(), reg); err != nil {
		t.Fatal(err)
	}
	c := startCaddy(t, mcConfig(g.redis.URL(), 3))
	held, w := queueBehind(t, c, 3)
	c.reload(mcConfig(g.redis.URL(), 1))
	if mc := g.limits("chromium").MaxConcurrent; mc != 1 {
		t.Fatalf("max_concurrent after the reload: %d, want 1", mc)
	}
	// Redis loses everything; the worker's agent registers it again.
	if err := g.rdb.FlushAll(t.Context()).Err(); err != nil {
		t.Fatal(err)
	}
	if err := g.reg.Register(t.Context(), reg); err != nil {
		t.Fatal(err)
	}
	for _, s := range held {
		s.close()
	}
	testenv.Eventually(t, 10*time.Second, "a waiting request served", func() bool {
		n, _ := w.counts()
		return n > 0
	})
	time.Sleep(2 * time.Second) // the other waiters had their chance to claim
	open, _ := w.counts()
	t.Logf("after the reload to max_concurrent 1, Redis losing its data and 3 closes: %d waiting requests served at once; pool max_concurrent %d",
		open, g.limits("chromium").MaxConcurrent)
	if open != 1 {
		t.Fatalf("%d waiting requests served at once on one worker, want 1 under the running config's max_concurrent 1", open)
	}
}

// TestReplacedFairShareRequestKeepsItsOwnOptions: a fair_share request of
// a replaced config, when the running config claims with another policy,
// keeps its own limits and time (it cannot take the running config's
// without bringing its own fair-share options). Instance 1 runs
// fair_share with window 7, instance 2, newer, with window 9; a request
// waits on instance 1 while it is reloaded to lifetime_first with
// max_concurrent 2 (newest, so in force). The waiting
// request used to claim with the new config's time and its own window 7,
// and so stored window 7, a config nobody runs, over instance 2's 9.
func TestReplacedFairShareRequestKeepsItsOwnOptions(t *testing.T) {
	g := newGrid(t)
	g.worker("chromium", "w1", fake.Behavior{})
	config := func(policy string, maxConcurrent int) caddyOpts {
		return caddyOpts{redisURL: g.redis.URL(), site: fmt.Sprintf(`
	route /playwright/* {
		browser_grid chromium {
			%s
			max_concurrent %d
			select_timeout 20s
		}
	}`, policy, maxConcurrent)}
	}
	fairShare := func(window int) string { return fmt.Sprintf("policy fair_share {\n\t\t\t\twindow %d\n\t\t\t}", window) }
	c1 := startCaddy(t, config(fairShare(7), 1))
	mustDial(t, c1.url("/playwright/chromium")).close()
	time.Sleep(20 * time.Millisecond) // instance 2's configuration is newer by more than a millisecond
	c2 := startCaddy(t, config(fairShare(9), 1))
	held := mustDial(t, c2.url("/playwright/chromium")) // the worker is full
	window := func() string {
		w, _ := g.rdb.HGet(t.Context(), g.reg.Key("chromium", "config"), "fs_window").Result()
		return w
	}
	if w := window(); w != "9" {
		t.Fatalf("stored fair-share window after instance 2's claim: %q, want 9", w)
	}
	waiting := make(chan *session, 1)
	go func() {
		s, _ := dial(t.Context(), c1.url("/playwright/chromium"))
		waiting <- s
	}()
	testenv.Eventually(t, 10*time.Second, "a request waiting on instance 1", func() bool {
		return c1.metric(`caddy_grid_queue_depth{pool="chromium"}`) == 1
	})
	c1.reload(config("policy lifetime_first", 2))
	held.close()
	select {
	case s := <-waiting:
		if s == nil {
			t.Fatal("the waiting request was not served")
		}
		s.close()
	case <-time.After(25 * time.Second):
		t.Fatal("the waiting request was not served")
	}
	if w := window(); w != "9" {
		t.Fatalf("stored fair-share window after the waiting request's claim: %q, want instance 2's 9 (the only fair_share config running)", w)
	}
}

// mcConfig serves chromium on /playwright/* with max_concurrent mc and a
// select_timeout long enough for requests to wait through a reload.
func mcConfig(redisURL string, mc int) caddyOpts {
	return caddyOpts{redisURL: redisURL, site: fmt.Sprintf(`
	route /playwright/* {
		browser_grid chromium {
			max_concurrent %d
			select_timeout 20s
		}
	}`, mc)}
}

// waiting is what requests started by queueBehind got so far.
type waiting struct {
	mu     sync.Mutex
	served []*session
	failed []error
}

// counts returns how many were served and the errors of those that failed.
func (w *waiting) counts() (int, []error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.served), append([]error(nil), w.failed...)
}

// closeLast closes the session served last.
func (w *waiting) closeLast() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.served[len(w.served)-1].close()
}

// queueBehind opens n sessions on c's chromium pool, then starts n more
// requests and returns once they wait in the queue (the worker full). The
// held sessions are returned; the waiting requests' sessions are closed
// when the test ends.
func queueBehind(t *testing.T, c *caddy, n int) ([]*session, *waiting) {
	t.Helper()
	u := c.url("/playwright/chromium")
	var held []*session
	for range n {
		held = append(held, mustDial(t, u))
	}
	ctx, cancel := context.WithCancel(t.Context())
	w := &waiting{}
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := dial(ctx, u)
			w.mu.Lock()
			defer w.mu.Unlock()
			if err != nil {
				w.failed = append(w.failed, err)
				return
			}
			w.served = append(w.served, s)
		}()
	}
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		for _, s := range w.served {
			s.close()
		}
	})
	testenv.Eventually(t, 10*time.Second, fmt.Sprintf("%d requests queued", n), func() bool {
		return c.metric(`caddy_grid_queue_depth{pool="chromium"}`) == float64(n)
	})
	return held, w
}
