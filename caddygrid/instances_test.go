package caddygrid_test

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
)

// Two Caddy instances share one Redis and two workers with
// max_concurrent 2: eight clients at once, half through each instance,
// are all served in turn, no worker ever holds more than two sessions
// (as its agent counts them), and every slot is free again after.
func TestTwoInstancesOnOneRedisNeverPushAWorkerPastMaxConcurrent(t *testing.T) {
	t.Parallel()
	g := newGrid(t)
	a1, a2 := g.agent("chromium", nil), g.agent("chromium", nil)
	opts := caddyOpts{redisURL: g.redis.URL(), site: site("max_concurrent 2\n\t\t\tselect_timeout 15s")}
	instances := []*caddy{startCaddy(t, opts), startCaddy(t, opts)}
	peaks := samplePeaks(a1, a2)

	errs := make(chan error, 8)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			s, err := dial(context.Background(), instances[i%2].url("/playwright/chromium"))
			if err != nil {
				errs <- fmt.Errorf("client %d: %w", i, err)
				return
			}
			defer s.close()
			for range 3 {
				if err := s.echo(fmt.Sprintf("client %d", i)); err != nil {
					errs <- fmt.Errorf("client %d: %w", i, err)
					return
				}
				time.Sleep(100 * time.Millisecond)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	testenv.Eventually(t, 5*time.Second, "every slot is free", func() bool {
		return a1.active(t) == 0 && a2.active(t) == 0 && g.active("chromium") == 0 && len(g.sessions(t, "chromium")) == 0
	})
	p := peaks.finish()
	if len(p) != 2 {
		t.Errorf("sampled workers %v, want both", p)
	}
	served := 0
	for id, n := range p {
		if n > 2 {
			t.Errorf("worker %s held %d sessions at once, max_concurrent is 2", id, n)
		}
		served += n
	}
	if served < 4 {
		t.Errorf("peaks %v: the workers were never both full, the test did not load them", p)
	}
	life := 0
	for _, a := range []*agent{a1, a2} {
		for _, b := range a.status(t).Browsers {
			life += b.Lifetime
		}
	}
	if life != 8 {
		t.Errorf("the workers served %d sessions, want 8", life)
	}
}

// A freed slot goes to the request that has waited longest, whichever of
// two instances it waits in: one worker of capacity 1, a request waiting
// in instance B, then one in instance A, where the slot frees. Round
// after round, B's is served first. queue_size bounds both instances'
// waiters together.
func TestTheRequestWaitingLongestIsServedFirstAcrossInstances(t *testing.T) {
	t.Parallel()
	g := newGrid(t)
	g.agent("chromium", nil)
	opts := caddyOpts{redisURL: g.redis.URL(), site: site("max_concurrent 1\n\t\t\tselect_timeout 20s\n\t\t\tqueue_size 2")}
	ia, ib := startCaddy(t, opts), startCaddy(t, opts)
	u := func(c *caddy) string { return c.url("/playwright/chromium") }
	holder := mustDial(t, u(ia))
	for round := range 4 {
		type served struct {
			who string
			s   *session
			err error
		}
		got := make(chan served, 2)
		wait := func(who string, c *caddy) {
			s, err := dial(context.Background(), u(c))
			got <- served{who, s, err}
		}
		go wait("B", ib)
		testenv.Eventually(t, 5*time.Second, "B's request is queued", func() bool { return ib.metric(`caddy_grid_queue_depth{pool="chromium"}`) == 1 })
		go wait("A", ia)
		testenv.Eventually(t, 5*time.Second, "A's request is queued", func() bool { return ia.metric(`caddy_grid_queue_depth{pool="chromium"}`) == 1 })
		if round == 0 {
			// the queue holds queue_size 2 across both instances
			_, err := dial(context.Background(), u(ia))
			if r := refusal(err); r == nil || r.StatusCode != http.StatusTooManyRequests || r.Header.Get("Retry-After") == "" {
				t.Fatalf("a third waiter under queue_size 2: %v, want 429 with Retry-After", err)
			}
		}
		holder.close()
		first := <-got
		if first.err != nil {
			t.Fatalf("round %d: %s: %v", round, first.who, first.err)
		}
		if first.who != "B" {
			t.Fatalf("round %d: A's request was served before B's, which waited longer", round)
		}
		first.s.close()
		second := <-got
		if second.err != nil {
			t.Fatalf("round %d: %s: %v", round, second.who, second.err)
		}
		holder = second.s
	}
	holder.close()
}
