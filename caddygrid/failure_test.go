package caddygrid_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"context"
)

// A registered worker whose address answers nothing (its host is gone,
// a firewall drops it) costs the client nothing but a retry: the client
// is served by a live worker, and the dead one is suspect afterwards, so
// no instance tries it for a while.
func TestAWorkerThatCannotBeReachedIsSkippedAndMadeSuspect(t *testing.T) {
	t.Parallel()
	g := newGrid(t)
	ag := g.agent("chromium", nil)
	dead := g.fakeWorker("chromium", "dead-1", deadAddr(t), 100)
	c := startCaddy(t, caddyOpts{redisURL: g.redis.URL(), site: site("max_concurrent 2")})

	s := mustDial(t, c.url("/playwright/chromium"))
	defer s.close()
	if w, want := g.sessionOf("chromium", s).Worker, ag.status(t).Browsers[0].ID; w != want {
		t.Errorf("served by %s, want the live worker %s", w, want)
	}
	w, ok := g.worker("chromium", dead.ID)
	if !ok {
		t.Fatal("the dead worker left the registry")
	}
	if !w.SuspectUntil.After(time.Now()) {
		t.Errorf("the dead worker is not suspect (suspect until %v)", w.SuspectUntil)
	}
	if w.Active != 0 || w.Lifetime != 100 {
		t.Errorf("the dead worker holds active %d lifetime %d, want its claim given back (0, 100)", w.Active, w.Lifetime)
	}
	if got := c.metric(`caddy_grid_dial_failures_total{pool="chromium"}`); got != 1 {
		t.Errorf("dial failures counted: %v, want 1", got)
	}
}

// When every worker of the pool fails the upgrade, the client gets 502
// with a sentence saying the browsers tried failed, whether there are
// more dead workers than dial_retries or fewer.
func TestWhenEveryWorkerFailsTheClientGets502(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		dead int
	}{{"more than dial_retries", 3}, {"one", 1}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			g := newGrid(t)
			for i := range tc.dead {
				g.fakeWorker("chromium", "dead-"+string(rune('a'+i)), deadAddr(t), 100)
			}
			c := startCaddy(t, caddyOpts{redisURL: g.redis.URL(), site: site("max_concurrent 2\n\t\t\tselect_timeout 2s")})
			start := time.Now()
			_, err := dial(context.Background(), c.url("/playwright/chromium"))
			r := refusal(err)
			if r == nil {
				t.Fatalf("%v, want 502", err)
			}
			if r.StatusCode != http.StatusBadGateway || !strings.Contains(string(r.Body), "failed") {
				t.Errorf("%d %q after %s, want 502 saying the browsers failed", r.StatusCode, r.Body, time.Since(start))
			}
			for _, w := range g.workers("chromium") {
				if !w.SuspectUntil.After(time.Now()) {
					t.Errorf("%s was not made suspect", w.ID)
				}
				if w.Active != 0 {
					t.Errorf("%s holds %d sessions after the failure", w.ID, w.Active)
				}
			}
		})
	}
}

// When one worker fails the upgrade and the others are busy, the client
// is not answered 502: it waits in the queue and is served by the first
// worker that frees up.
func TestAClientWaitsForABusyWorkerWhenAnotherFailed(t *testing.T) {
	t.Parallel()
	g := newGrid(t)
	g.agent("chromium", nil)
	c := startCaddy(t, caddyOpts{redisURL: g.redis.URL(), site: site("max_concurrent 1\n\t\t\tselect_timeout 10s")})
	busy := mustDial(t, c.url("/playwright/chromium"))
	dead := g.fakeWorker("chromium", "dead-1", deadAddr(t), 100)
	go func() {
		time.Sleep(time.Second)
		busy.close()
	}()
	start := time.Now()
	s, err := dial(context.Background(), c.url("/playwright/chromium"))
	if err != nil {
		t.Fatalf("a client behind a busy worker and a dead one: %v, want served once the busy one frees", err)
	}
	defer s.close()
	if took := time.Since(start); took < 500*time.Millisecond {
		t.Errorf("served after %s, before the busy worker freed", took)
	}
	if got := c.metric(`caddy_grid_dial_failures_total{pool="chromium"}`); got != 1 {
		t.Errorf("dial failures counted: %v, want 1 (the waiting client tried the dead worker)", got)
	}
	if w, _ := g.worker("chromium", dead.ID); !w.SuspectUntil.After(start) {
		t.Errorf("the dead worker was not made suspect (suspect until %v)", w.SuspectUntil)
	}
}
