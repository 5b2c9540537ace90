package caddygrid_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/cmd/fakebrowser/fake"
	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
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
