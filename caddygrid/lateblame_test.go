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

// TestLateBlameDoesNotDelayTheHandshake: the late blame (Registry.Suspect)
// of a worker whose claim was given back before the wait must not hold
// back the 101 of the worker that accepted: with Redis stalled for 3 s
// just after the healthy worker was claimed, the client still gets its
// answer when that worker gives it (here after 1 s). The control has no
// refusing worker, so nothing to blame.
func TestLateBlameDoesNotDelayTheHandshake(t *testing.T) {
	t.Run("passed", func(t *testing.T) { lateBlameHandshake(t, true) })
	t.Run("control", func(t *testing.T) { lateBlameHandshake(t, false) })
}

func lateBlameHandshake(t *testing.T, withBad bool) {
	g := newGrid(t)
	b := g.workerCap("chromium", "b", 1, fake.Behavior{})
	c := startCaddy(t, caddyOpts{redisURL: g.redis.URL(), site: `
	route /playwright/* {
		browser_grid chromium {
			select_timeout 20s
		}
	}`})
	busy := mustDial(t, c.url("/playwright/chromium"))
	var bad *fake.Server
	if withBad {
		bad = g.worker("chromium", "a-refuses", fake.Behavior{Refuse: http.StatusBadRequest})
	}

	type result struct {
		s   *session
		err error
		at  time.Time
	}
	res := make(chan result, 1)
	go func() {
		s, err := dial(context.Background(), c.url("/playwright/chromium"))
		res <- result{s, err, time.Now()}
	}()
	if withBad {
		testenv.Eventually(t, 5*time.Second, "the refusal", func() bool { return bad.Stats().Refused >= 1 })
	}
	time.Sleep(300 * time.Millisecond) // the retry waits in the queue now
	b.SetBehavior(fake.Behavior{AcceptDelay: time.Second})
	busy.close()
	testenv.Eventually(t, 5*time.Second, "b claimed by the waiting client", func() bool {
		return g.info("chromium", "b").Active == 1 && b.Stats().UpgradeRequests >= 2
	})
	claimed := time.Now()
	g.redis.Stall(3 * time.Second)
	r := <-res
	if r.err != nil {
		t.Fatal(r.err)
	}
	defer r.s.close()
	took := r.at.Sub(claimed)
	t.Logf("b accepts after 1 s; the client got its 101 %v after b was claimed (Redis stalled 3 s)", took.Round(10*time.Millisecond))
	if took > 2*time.Second {
		t.Errorf("handshake held back %v by a synchronous Redis call on the 101 path (b accepted after 1 s)", took.Round(10*time.Millisecond))
	}
}

// TestLateBlameVersionedPool: the late blame reaches the record in the
// refusing worker's version group (c.Pool is the group's).
func TestLateBlameVersionedPool(t *testing.T) {
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
			defer s.close()
		}
		got <- code
	}()
	time.Sleep(500 * time.Millisecond)
	busy.close()
	code := <-got
	if code != http.StatusSwitchingProtocols {
		t.Fatalf("the waiting client got %d, want 101 from the 1.65 worker once it freed", code)
	}
	// marked in the background, just after the 101
	testenv.Eventually(t, 2*time.Second, "the 1.64 worker suspect after the 1.65 worker accepted what it refused", func() bool {
		return g.info(p64, "a-refuses").SuspectUntil.After(time.Now())
	})
	if n := c.metric(`caddy_grid_redis_errors_total{op="suspect"}`); n != 0 {
		t.Errorf("redis_errors_total{op=\"suspect\"} = %v", n)
	}
}
