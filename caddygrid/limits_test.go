package caddygrid_test

import (
	"context"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
	"github.com/browsergrid/caddy-browser-grid/workeragent"
)

// With max_concurrent 1 and two workers, three clients at once: two are
// served, each on its own worker, and the third waits in the queue and
// gets 503 with Retry-After once select_timeout has passed. No browser
// ever holds more than one session, as its agent counts them.
func TestMaxConcurrentServesTwoOfThreeAndTheThirdWaitsThen503(t *testing.T) {
	t.Parallel()
	g := newGrid(t)
	a1, a2 := g.agent("chromium", nil), g.agent("chromium", nil)
	c := startCaddy(t, caddyOpts{redisURL: g.redis.URL(), site: site("max_concurrent 1\n\t\t\tselect_timeout 1s")})
	peaks := samplePeaks(a1, a2)

	type result struct {
		s       *session
		err     error
		elapsed time.Duration
	}
	results := make([]result, 3)
	var wg sync.WaitGroup
	for i := range results {
		wg.Go(func() {
			start := time.Now()
			s, err := dial(context.Background(), c.url("/playwright/chromium"))
			results[i] = result{s, err, time.Since(start)}
		})
	}
	wg.Wait()
	var served []*session
	var refused []result
	for _, r := range results {
		if r.err == nil {
			served = append(served, r.s)
			defer r.s.close()
		} else {
			refused = append(refused, r)
		}
	}
	if len(served) != 2 || len(refused) != 1 {
		t.Fatalf("%d served, %d refused, want 2 and 1: %+v", len(served), len(refused), results)
	}
	r := refusal(refused[0].err)
	if r == nil || r.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("the third client: %v, want 503", refused[0].err)
	}
	if n, err := strconv.Atoi(r.Header.Get("Retry-After")); err != nil || n < 1 {
		t.Errorf("Retry-After %q, want a whole number of seconds", r.Header.Get("Retry-After"))
	}
	if e := refused[0].elapsed; e < 900*time.Millisecond || e > 5*time.Second {
		t.Errorf("the third client was answered after %s, want about select_timeout (1s)", e)
	}
	w1, w2 := g.sessionOf("chromium", served[0]).Worker, g.sessionOf("chromium", served[1]).Worker
	if w1 == w2 {
		t.Errorf("both sessions on worker %s", w1)
	}
	for _, w := range g.workers("chromium") {
		if w.Active > 1 {
			t.Errorf("Redis counts %d sessions on %s, max_concurrent is 1", w.Active, w.ID)
		}
	}
	for id, n := range peaks.finish() {
		if n > 1 {
			t.Errorf("worker %s held %d sessions at once, max_concurrent is 1", id, n)
		}
	}
}

// With max_lifetime 2, a worker serves exactly two sessions; the claim
// of the second starts its replacement (a new worker ID, -respawn), which
// takes the third while the first two still run. The retired worker
// never begins a third session and leaves the registry once drained.
func TestMaxLifetimeRetiresAWorkerAfterItsLastSession(t *testing.T) {
	t.Parallel()
	g := newGrid(t)
	ag := g.agent("chromium", func(c *workeragent.Config) { c.Respawn = true })
	c := startCaddy(t, caddyOpts{redisURL: g.redis.URL(), site: site("max_concurrent 4\n\t\t\tmax_lifetime 2")})

	s1 := mustDial(t, c.url("/playwright/chromium"))
	s2 := mustDial(t, c.url("/playwright/chromium"))
	first := g.sessionOf("chromium", s1).Worker
	if w := g.sessionOf("chromium", s2).Worker; w != first {
		t.Fatalf("the second session went to %s, want the first's worker %s (lifetime first)", w, first)
	}
	s3 := mustDial(t, c.url("/playwright/chromium"))
	second := g.sessionOf("chromium", s3).Worker
	if second == first {
		t.Fatalf("the third session went to %s, which had served its max_lifetime of 2", first)
	}
	for _, b := range ag.status(t).Browsers {
		if b.ID == first && b.Lifetime != 2 {
			t.Errorf("the retired worker served %d sessions, want 2", b.Lifetime)
		}
	}
	for _, s := range []*session{s1, s2, s3} {
		if err := s.echo("still there"); err != nil {
			t.Errorf("a session broke while its worker retired: %v", err)
		}
	}
	s1.close()
	s2.close()
	testenv.Eventually(t, 10*time.Second, "the retired worker leaves the registry", func() bool {
		_, ok := g.worker("chromium", first)
		return !ok
	})
	if _, ok := g.worker("chromium", second); !ok {
		t.Errorf("the replacement %s is not registered", second)
	}
	s3.close()
}
