package caddygrid_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/cmd/fakebrowser/fake"
	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
	"github.com/browsergrid/caddy-browser-grid/registry"
)

// TestClientRefusedEverywhereKeepsNoIdleWorker: a client whose request
// every worker refuses with a 4xx (its own doing: here 403, as a browser
// answers an Origin or token it does not allow) arrives while the pool's
// only other worker is busy. Its retry waits in the queue for the busy
// worker, but the worker that refused it is idle: an honest client
// arriving meanwhile must be served by it at once, not wait behind a
// claim held for a request that worker already answered.
func TestClientRefusedEverywhereKeepsNoIdleWorker(t *testing.T) {
	g := newGrid(t)
	g.workerCap("chromium", "b", 1, fake.Behavior{})
	g.workerCap("chromium", "c", 1, fake.Behavior{})
	c := startCaddy(t, caddyOpts{redisURL: g.redis.URL(), site: `
	route /playwright/* {
		browser_grid chromium {
			select_timeout 4s
		}
	}`})
	busy := mustDial(t, c.url("/playwright/chromium"))
	defer busy.close()

	badDone := make(chan int, 1)
	go func() {
		s, err := dial(context.Background(), c.url("/playwright/chromium?fb-refuse=403"))
		if err == nil {
			s.close()
			badDone <- 101
			return
		}
		code := -1
		if he := refusal(err); he != nil {
			code = he.StatusCode
		}
		badDone <- code
	}()
	time.Sleep(500 * time.Millisecond)
	start := time.Now()
	s, err := dial(context.Background(), c.url("/playwright/chromium"))
	took := time.Since(start)
	code := 101
	if err != nil {
		code = -1
		if he := refusal(err); he != nil {
			code = he.StatusCode
		}
	} else {
		s.close()
	}
	bad := <-badDone
	t.Logf("honest client beside a client every worker refuses: %d in %v; the refused client got %d; c active %d",
		code, took.Round(time.Millisecond), bad, g.info("chromium", "c").Active)
	if code != 101 || took > time.Second {
		t.Errorf("honest client got %d after %v while worker c was idle (held by a request it had refused with 403)", code, took.Round(time.Millisecond))
	}
	if bad != http.StatusForbidden {
		t.Errorf("the refused client got %d, want its 403", bad)
	}
}

// dialCode dials u and returns 101 with the session, or the status it
// was refused with (-1: no HTTP answer).
func dialCode(u string) (*session, int) {
	s, err := dial(context.Background(), u)
	if err == nil {
		return s, http.StatusSwitchingProtocols
	}
	if he := refusal(err); he != nil {
		return nil, he.StatusCode
	}
	return nil, -1
}

// TestQueuedBehindARefusedRetry: a retry past a worker that refused its
// client with a 4xx waits in the queue avoiding that worker. When a slot
// of the avoided worker frees, the client queued behind it must get it:
// the retry, first in line, cannot take it, and must not keep it from
// the others until its select_timeout ends.
func TestQueuedBehindARefusedRetry(t *testing.T) {
	g := newGrid(t)
	g.workerCap("chromium", "c", 2, fake.Behavior{})
	c := startCaddy(t, caddyOpts{redisURL: g.redis.URL(), site: `
	route /playwright/* {
		browser_grid chromium {
			select_timeout 5s
		}
	}`})
	s1 := mustDial(t, c.url("/playwright/chromium"))
	s2 := mustDial(t, c.url("/playwright/chromium"))
	defer s2.close()
	g.workerCap("chromium", "b", 1, fake.Behavior{})
	s3 := mustDial(t, c.url("/playwright/chromium")) // on b: the pool is full
	defer s3.close()
	s1.close() // one slot of c frees
	testenv.Eventually(t, 5*time.Second, "release", func() bool { return g.info("chromium", "c").Active == 1 })

	refused := make(chan int, 1)
	go func() { // takes c's free slot, is refused, waits avoiding c
		s, code := dialCode(c.url("/playwright/chromium?fb-refuse=403"))
		if s != nil {
			s.close()
		}
		refused <- code
	}()
	testenv.Eventually(t, 5*time.Second, "the refused retry queued", func() bool {
		return c.metric(`caddy_grid_queue_depth{pool="chromium"}`) == 1
	})
	// the retry gave c's slot back before it queued: another client takes it
	s4 := mustDial(t, c.url("/playwright/chromium"))
	defer s4.close()
	honest := make(chan int, 1)
	var took time.Duration
	go func() {
		start := time.Now()
		s, code := dialCode(c.url("/playwright/chromium"))
		took = time.Since(start)
		if s != nil {
			s.close()
		}
		honest <- code
	}()
	testenv.Eventually(t, 5*time.Second, "the honest client queued", func() bool {
		return c.metric(`caddy_grid_queue_depth{pool="chromium"}`) == 2
	})
	time.Sleep(200 * time.Millisecond)
	freed := time.Now()
	s2.close() // a slot of c frees: the honest client's to take
	code := <-honest
	wait := time.Since(freed)
	t.Logf("honest client queued behind a retry avoiding c: %d, %v after c freed a slot (%v in all); the refused client got %d",
		code, wait.Round(time.Millisecond), took.Round(time.Millisecond), <-refused)
	if code != http.StatusSwitchingProtocols || wait > 2*time.Second {
		t.Errorf("honest client got %d %v after a slot of c freed: the wake-up went to the retry first in line, which avoids c", code, wait.Round(time.Millisecond))
	}
}

// TestRefusing4xxWorkerInABusyVersionedPool is TestRefusing4xxWorkerInABusyPool
// in a pool whose workers register their Playwright version (one group per
// version): a client without a version may take any group's worker, so
// when the only free one answers 400 its retry must wait for the busy
// healthy worker of the other group, as in a pool of one group.
func TestRefusing4xxWorkerInABusyVersionedPool(t *testing.T) {
	g := newGrid(t)
	p64, p65 := registry.GroupPool("chromium", "1.64"), registry.GroupPool("chromium", "1.65")
	g.workerCap(p65, "b", 1, fake.Behavior{})
	a := g.workerCap(p64, "a-refuses", 1, fake.Behavior{})
	c := startCaddy(t, caddyOpts{redisURL: g.redis.URL(), site: `
	route /playwright/* {
		browser_grid chromium {
			select_timeout 10s
		}
	}`})
	busy, err := dialAs(context.Background(), c.url("/playwright/chromium"), ua165)
	if err != nil {
		t.Fatal(err)
	}
	a.SetBehavior(fake.Behavior{Refuse: http.StatusBadRequest})
	got := make(chan int, 1)
	go func() {
		s, code := dialCode(c.url("/playwright/chromium"))
		if s != nil {
			s.close()
		}
		got <- code
	}()
	time.Sleep(500 * time.Millisecond)
	busy.close() // the healthy worker frees within select_timeout
	code := <-got
	t.Logf("a client while the 1.65 worker was busy and the 1.64 one answers 400: %d", code)
	if code != http.StatusSwitchingProtocols {
		t.Fatalf("got %d: the retry past the 1.64 worker's 400 did not wait for the busy 1.65 worker", code)
	}
	// The late blame reaches the record in the refusing worker's version
	// group (its claim's pool is the group's), in the background, just
	// after the 101.
	testenv.Eventually(t, 2*time.Second, "the 1.64 worker suspect after the 1.65 worker accepted what it refused", func() bool {
		return g.info(p64, "a-refuses").SuspectUntil.After(time.Now())
	})
	if n := c.metric(`caddy_grid_redis_errors_total{op="suspect"}`); n != 0 {
		t.Errorf("redis_errors_total{op=\"suspect\"} = %v", n)
	}
}
