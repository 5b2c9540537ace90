package caddygrid_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/cmd/fakebrowser/fake"
	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
	"github.com/browsergrid/caddy-browser-grid/registry"
)

// deadWorker registers a worker whose address accepts no connections.
func (g *grid) deadWorker(pool, id string) {
	g.t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		g.t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	err = g.reg.Register(context.Background(), registry.Registration{
		Pool: pool, ID: id, BrowserType: pool, Addr: addr, Path: "/playwright", TTL: workerTTL,
	})
	if err != nil {
		g.t.Fatal(err)
	}
}

// TestFailingWorkersAreInvisible: a worker that cannot be dialed and one
// that refuses every upgrade come first in lifetime-first order, yet every
// client gets a session from the healthy workers, and neither failing
// worker is charged any lifetime.
func TestFailingWorkersAreInvisible(t *testing.T) {
	g := newGrid(t)
	g.deadWorker("chromium", "w0")
	refuser := g.worker("chromium", "w1", fake.Behavior{Refuse: http.StatusServiceUnavailable})
	good := []*fake.Server{g.worker("chromium", "w2", fake.Behavior{}), g.worker("chromium", "w3", fake.Behavior{})}
	c := startCaddy(t, caddyOpts{redisURL: g.redis.URL(), site: `
	route /playwright/* {
		browser_grid chromium {
			max_lifetime 100
			dial_retries 2
		}
	}`})

	const clients = 12
	for i := range clients {
		s, err := dial(context.Background(), c.url("/playwright/chromium"))
		if err != nil {
			t.Fatalf("client %d: %v", i, err)
		}
		s.close()
	}
	testenv.Eventually(t, 10*time.Second, "sessions released", func() bool {
		return g.info("chromium", "w2").Active+g.info("chromium", "w3").Active == 0
	})
	for _, id := range []string{"w0", "w1"} {
		if w := g.info("chromium", id); w.Lifetime != 0 || w.Active != 0 {
			t.Errorf("failing worker %s charged: lifetime %d, active %d; want 0, 0", id, w.Lifetime, w.Active)
		}
	}
	if refuser.Stats().Refused == 0 {
		t.Error("the refusing worker was never tried; the test proves nothing")
	}
	served := int64(0)
	for _, s := range good {
		served += s.Stats().Sessions
	}
	lifetimes := g.info("chromium", "w2").Lifetime + g.info("chromium", "w3").Lifetime
	if served != clients || lifetimes != clients {
		t.Errorf("healthy workers served %d sessions with lifetimes summing to %d; want %d and %d", served, lifetimes, clients, clients)
	}
	retries := c.metric(`caddy_grid_dial_retries_total{pool="chromium"}`)
	undone := c.metric(`caddy_grid_releases_total{outcome="undone",pool="chromium"}`)
	if retries < 2 || retries != undone {
		t.Errorf("dial_retries_total = %v, undone = %v; want at least 2 (one per failing worker), and equal", retries, undone)
	}
	if got := c.metric(`caddy_grid_releases_total{outcome="released",pool="chromium"}`); got != clients {
		t.Errorf("released = %v, want %d", got, clients)
	}
}

// TestAllWorkersFailing: when every attempt fails on the workers' side,
// the client gets the last worker's refusal and nothing stays claimed.
func TestAllWorkersFailing(t *testing.T) {
	g := newGrid(t)
	for i := range 3 {
		g.worker("chromium", fmt.Sprintf("w%d", i), fake.Behavior{Refuse: http.StatusBadGateway})
	}
	c := startCaddy(t, caddyOpts{redisURL: g.redis.URL(), site: `
	route /playwright/* {
		browser_grid chromium {
			dial_retries 1
		}
	}`})
	_, err := dial(context.Background(), c.url("/playwright/chromium"))
	if he := refusal(err); he == nil || he.StatusCode != http.StatusBadGateway {
		t.Fatalf("got %v, want the workers' 502", err)
	}
	testenv.Eventually(t, 5*time.Second, "claims given back", func() bool {
		for i := range 3 {
			if w := g.info("chromium", fmt.Sprintf("w%d", i)); w.Active != 0 || w.Lifetime != 0 {
				return false
			}
		}
		return true
	})
	if got := c.metric(`caddy_grid_releases_total{outcome="undone",pool="chromium"}`); got != 2 {
		t.Errorf("undone claims = %v, want 2 (first try and one retry)", got)
	}
}

// TestClientSideRefusalBlamesNoWorker: a worker that refuses a client's
// handshake with a 4xx (here 428, what Playwright's server answers a
// client of another version) would be refused by every worker alike, so
// the client gets the 428 at once, the claim is given back, and no worker
// is marked suspect: one bad client cannot take workers from the others.
func TestClientSideRefusalBlamesNoWorker(t *testing.T) {
	g := newGrid(t)
	refuser := g.worker("chromium", "w1", fake.Behavior{Refuse: http.StatusPreconditionRequired})
	g.worker("chromium", "w2", fake.Behavior{Refuse: http.StatusPreconditionRequired})
	c := startCaddy(t, caddyOpts{redisURL: g.redis.URL(), site: `
	route /playwright/* {
		browser_grid chromium {
			dial_retries 2
		}
	}`})
	_, err := dial(context.Background(), c.url("/playwright/chromium"))
	if he := refusal(err); he == nil || he.StatusCode != http.StatusPreconditionRequired {
		t.Fatalf("got %v, want the worker's 428", err)
	}
	testenv.Eventually(t, 5*time.Second, "the claim given back", func() bool {
		w := g.info("chromium", "w1")
		return w.Active == 0 && w.Lifetime == 0
	})
	if n := refuser.Stats().Refused; n != 1 {
		t.Errorf("the refusing worker was asked %d times, want once (no retry of a client-side refusal)", n)
	}
	for _, id := range []string{"w1", "w2"} {
		if w := g.info("chromium", id); !w.SuspectUntil.IsZero() && w.SuspectUntil.After(time.Now()) {
			t.Errorf("worker %s marked suspect until %s by a client's bad handshake", id, w.SuspectUntil)
		}
	}
	if got := c.metric(`caddy_grid_dial_retries_total{pool="chromium"}`); got != 0 {
		t.Errorf("dial_retries_total = %v, want 0", got)
	}
}

// TestHangingWorker: a worker that never answers the upgrade costs one
// upgrade_timeout, then the session moves on and the claim is given back.
func TestHangingWorker(t *testing.T) {
	g := newGrid(t)
	g.worker("chromium", "w1", fake.Behavior{Hang: true})
	good := g.worker("chromium", "w2", fake.Behavior{})
	c := startCaddy(t, caddyOpts{redisURL: g.redis.URL(), site: `
	route /playwright/* {
		browser_grid chromium {
			upgrade_timeout 300ms
		}
	}`})
	s := mustDial(t, c.url("/playwright/chromium"))
	s.close()
	if good.Stats().Sessions != 1 {
		t.Fatalf("the healthy worker served %d sessions, want 1", good.Stats().Sessions)
	}
	testenv.Eventually(t, 5*time.Second, "claims settled", func() bool {
		return g.info("chromium", "w2").Active == 0
	})
	if w := g.info("chromium", "w1"); w.Lifetime != 0 || w.Active != 0 {
		t.Errorf("hanging worker charged: lifetime %d, active %d", w.Lifetime, w.Active)
	}
	if w := g.info("chromium", "w1"); !w.SuspectUntil.After(time.Now().Add(-time.Minute)) {
		t.Errorf("hanging worker not marked suspect (suspect until %v)", w.SuspectUntil)
	}
}

// TestReaperRunsInCaddy: a worker that stopped heartbeating is removed by
// the reaper the grid app runs, and the metrics count it.
func TestReaperRunsInCaddy(t *testing.T) {
	g := newGrid(t)
	err := g.reg.Register(context.Background(), registry.Registration{
		Pool: "chromium", ID: "ghost", BrowserType: "chromium", Addr: "127.0.0.1:9", Path: "/playwright", TTL: workerTTL,
	})
	if err != nil {
		t.Fatal(err)
	}
	c := startCaddy(t, caddyOpts{redisURL: g.redis.URL(), global: "reaper_interval 200ms\n\t\tstale_threshold 1s", site: `
	route /playwright/* {
		browser_grid chromium
	}`})
	testenv.Eventually(t, 20*time.Second, "the reaper removing the silent worker", func() bool {
		_, err := g.reg.Worker(context.Background(), "chromium", "ghost")
		return errors.Is(err, registry.ErrNotRegistered)
	})
	testenv.Eventually(t, 5*time.Second, "the reaper's metric", func() bool {
		return c.metric(`caddy_grid_reaper_events_total{kind="worker_expired"}`) == 1
	})
}

// TestNonHandshakeAnswerIsTheWorkersFailure: a worker that answers the
// upgrade with a 2xx or 3xx serves something else than a browser at that
// address and path, and would answer every client the same: the session
// moves on to another worker, the claim is given back (lifetime too), the
// worker is marked suspect so it stops being chosen, and the answer is
// counted by status and logged. A client-side 4xx (428) is counted too,
// blaming nobody.
func TestNonHandshakeAnswerIsTheWorkersFailure(t *testing.T) {
	g := newGrid(t)
	// Lifetime-first order among equals is by ID: w1 and w2 come first.
	ok200 := g.worker("chromium", "w1", fake.Behavior{Refuse: http.StatusOK})
	redirect := g.worker("chromium", "w2", fake.Behavior{Refuse: http.StatusFound})
	good := g.worker("chromium", "w3", fake.Behavior{})
	c := startCaddy(t, caddyOpts{redisURL: g.redis.URL(), site: `
	route /playwright/* {
		browser_grid chromium {
			dial_retries 2
		}
	}`})
	const clients = 5
	for i := range clients {
		s, err := dial(context.Background(), c.url("/playwright/chromium"))
		if err != nil {
			t.Fatalf("client %d: %v", i, err)
		}
		s.close()
	}
	if good.Stats().Sessions != clients {
		t.Fatalf("the healthy worker served %d sessions, want %d", good.Stats().Sessions, clients)
	}
	// Each was tried once: then suspect, skipped by the next clients.
	for _, w := range []*fake.Server{ok200, redirect} {
		if n := w.Stats().Refused; n != 1 {
			t.Errorf("a worker answering without a handshake was tried %d times, want once (then suspect)", n)
		}
	}
	for _, id := range []string{"w1", "w2"} {
		w := g.info("chromium", id)
		if w.Lifetime != 0 || w.Active != 0 {
			t.Errorf("worker %s charged: lifetime %d, active %d", id, w.Lifetime, w.Active)
		}
		if !w.SuspectUntil.After(time.Now()) {
			t.Errorf("worker %s not marked suspect after answering the upgrade without a handshake", id)
		}
	}
	for _, code := range []string{"200", "302"} {
		if n := c.metric(`caddy_grid_upgrade_refused_total{code="` + code + `",pool="chromium"}`); n != 1 {
			t.Errorf("upgrade_refused_total{code=%s} = %v, want 1", code, n)
		}
	}
	if out := c.proc.Output(); !strings.Contains(out, `"status":200`) || !strings.Contains(out, `"status":302`) {
		t.Errorf("no log line names the statuses 200 and 302:\n%s", out)
	}

	// A client-side 4xx goes back to the client, blames nobody, and is
	// counted and logged with its status.
	g2 := newGrid(t)
	g2.worker("chromium", "w1", fake.Behavior{Refuse: http.StatusPreconditionRequired})
	c2 := startCaddy(t, caddyOpts{redisURL: g2.redis.URL(), site: `
	route /playwright/* {
		browser_grid chromium
	}`})
	if _, err := dial(context.Background(), c2.url("/playwright/chromium")); refusal(err) == nil || refusal(err).StatusCode != http.StatusPreconditionRequired {
		t.Fatalf("got %v, want the worker's 428", err)
	}
	testenv.Eventually(t, 5*time.Second, "the 428 counted", func() bool {
		return c2.metric(`caddy_grid_upgrade_refused_total{code="428",pool="chromium"}`) == 1
	})
	if w := g2.info("chromium", "w1"); w.SuspectUntil.After(time.Now()) {
		t.Errorf("worker marked suspect by a client-side 428")
	}
	if out := c2.proc.Output(); !strings.Contains(out, `"status":428`) {
		t.Errorf("no log line names the status 428:\n%s", out)
	}
}
