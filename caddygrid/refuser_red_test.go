package caddygrid_test

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/cmd/fakebrowser/fake"
	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
	"github.com/browsergrid/caddy-browser-grid/registry"
)

// workerCap is grid.worker with a capacity.
func (g *grid) workerCap(pool, id string, capacity int, b fake.Behavior) *fake.Server {
	g.t.Helper()
	srv, ep, err := fake.Start("127.0.0.1:0", fake.Options{Path: "/playwright", Behavior: b})
	if err != nil {
		g.t.Fatal(err)
	}
	g.t.Cleanup(func() { srv.Close() })
	u, err := url.Parse(ep)
	if err != nil {
		g.t.Fatal(err)
	}
	err = g.reg.Register(context.Background(), registry.Registration{
		Pool: pool, ID: id, BrowserType: pool, Addr: u.Host, Path: u.Path, TTL: workerTTL, Capacity: capacity,
	})
	if err != nil {
		g.t.Fatalf("registering worker %s: %v", id, err)
	}
	return srv
}

// TestRefusing4xxWorkerUnderClientLimit: with client_limit 1, a client
// whose upgrade the first worker refuses with a 4xx must still be tried
// on the next free worker, as without a client_limit: the claim held on
// the refusing worker is this same session's, not another live session
// of the client's.
func TestRefusing4xxWorkerUnderClientLimit(t *testing.T) {
	g := newGrid(t)
	bad := g.worker("chromium", "a-refuses", fake.Behavior{Refuse: http.StatusBadRequest})
	g.worker("chromium", "b", fake.Behavior{})
	g.worker("chromium", "c", fake.Behavior{})
	c := startCaddy(t, caddyOpts{redisURL: g.redis.URL(), site: `
	route /playwright/* {
		browser_grid chromium {
			client_limit 1
		}
	}`})
	const clients = 10
	served, codes := 0, map[int]string{}
	for i := range clients {
		s, err := dial(context.Background(), c.url("/playwright/chromium"))
		if err != nil {
			he := refusal(err)
			if he == nil {
				t.Fatal(err)
			}
			codes[i] = strconv.Itoa(he.StatusCode) + " " + strings.TrimSpace(string(he.Body))
			continue
		}
		served++
		s.close()
		// the client's session has ended before it opens the next
		testenv.Eventually(t, 10*time.Second, "release", func() bool {
			return g.info("chromium", "b").Active+g.info("chromium", "c").Active == 0
		})
	}
	t.Logf("%d clients one after another (client_limit 1): %d served, refused %v; the refusing worker answered %d upgrades",
		clients, served, codes, bad.Stats().Refused)
	if served != clients {
		t.Errorf("%d of %d served: the session's own held claim counted against its client_limit 1", served, clients)
	}
	if n := c.metric(`caddy_grid_client_limited_total{pool="chromium"}`); n != 0 {
		t.Errorf("client_limited_total = %v for a client that never held more than one session", n)
	}
	for _, id := range []string{"a-refuses", "b", "c"} {
		if w := g.info("chromium", id); w.Active != 0 {
			t.Errorf("%s: %d active after every session ended", id, w.Active)
		}
	}
}

// TestHeldClaimEndsWhenAnotherWorkerAccepts: a worker that refused one
// upgrade with a 4xx (here a transient 429) is blamed once another worker
// accepts the same request; its held claim must not keep one of its slots,
// and caddy_grid_active_sessions, for the whole of the other worker's
// session.
func TestHeldClaimEndsWhenAnotherWorkerAccepts(t *testing.T) {
	g := newGrid(t)
	a := g.workerCap("chromium", "a", 2, fake.Behavior{Refuse: http.StatusTooManyRequests})
	g.workerCap("chromium", "b", 2, fake.Behavior{})
	c := startCaddy(t, caddyOpts{redisURL: g.redis.URL(), site: `
	route /playwright/* {
		browser_grid chromium
	}`})
	s := mustDial(t, c.url("/playwright/chromium"))
	defer s.close()
	a.SetBehavior(fake.Behavior{})
	if err := s.echo("hello"); err != nil {
		t.Fatal(err)
	}
	// the held claim ends in the background, just after the 101
	testenv.Eventually(t, 2*time.Second, "a's held claim ended", func() bool { return g.info("chromium", "a").Active == 0 })
	wa, wb := g.info("chromium", "a"), g.info("chromium", "b")
	active := c.metric(`caddy_grid_active_sessions{pool="chromium"}`)
	t.Logf("one live socket (on b): a active %d suspect until %v; b active %d; active_sessions %v",
		wa.Active, wa.SuspectUntil, wb.Active, active)
	if wa.Active != 0 {
		t.Errorf("a holds %d of its 2 slots while its only client is served by b", wa.Active)
	}
	if active != 1 {
		t.Errorf("caddy_grid_active_sessions = %v with one live socket", active)
	}
	if !wa.SuspectUntil.After(time.Now()) {
		t.Errorf("a not yet suspect although b accepted the request a refused")
	}
}

// TestRefusing4xxWorkerInABusyPool: one worker answering 400 to every
// upgrade joins a pool whose healthy workers are all busy. A client must
// wait in the queue for a healthy worker, as it would without the broken
// one, and be served within select_timeout when one frees: the broken
// worker, the only one free, must not turn every arrival into a 400. Once
// a healthy worker has accepted what it refused, the broken worker is
// marked suspect, though its claim was given back before the wait: the
// clients arriving next walk past it instead of being refused again.
func TestRefusing4xxWorkerInABusyPool(t *testing.T) {
	g := newGrid(t)
	g.workerCap("chromium", "b", 1, fake.Behavior{})
	g.workerCap("chromium", "c", 1, fake.Behavior{})
	c := startCaddy(t, caddyOpts{redisURL: g.redis.URL(), site: `
	route /playwright/* {
		browser_grid chromium {
			select_timeout 10s
		}
	}`})
	busy := []*session{mustDial(t, c.url("/playwright/chromium")), mustDial(t, c.url("/playwright/chromium"))}
	defer func() {
		for _, s := range busy {
			s.close()
		}
	}()
	bad := g.worker("chromium", "a-refuses", fake.Behavior{Refuse: http.StatusBadRequest})

	const clients = 4
	type result struct {
		s    *session
		code int
	}
	results := make(chan result, clients)
	for range clients {
		go func() {
			s, err := dial(context.Background(), c.url("/playwright/chromium"))
			if err != nil {
				code := -1
				if he := refusal(err); he != nil {
					code = he.StatusCode
				}
				results <- result{code: code}
				return
			}
			results <- result{s: s}
		}()
	}
	// the healthy workers free up one after another, within select_timeout
	time.Sleep(500 * time.Millisecond)
	served, codes := 0, map[int]int{}
	for i := range clients {
		if i < len(busy) {
			busy[i].close()
		}
		r := <-results
		if r.s == nil {
			codes[r.code]++
			continue
		}
		served++
		r.s.close()
	}
	busy = nil
	t.Logf("%d clients while the healthy workers were busy: %d served, refused %v; the broken worker answered %d upgrades, suspect until %v",
		clients, served, codes, bad.Stats().Refused, g.info("chromium", "a-refuses").SuspectUntil)
	if served != clients {
		t.Errorf("%d of %d clients served within select_timeout: a worker answering 400 to everything refused the clients that would have waited for a healthy one", served, clients)
	}
	if served > 0 {
		// marked in the background, just after the 101
		testenv.Eventually(t, 2*time.Second, "the worker answering 400 to every upgrade suspect, after the clients it refused were served by healthy workers", func() bool {
			return g.info("chromium", "a-refuses").SuspectUntil.After(time.Now())
		})
	}
	testenv.Eventually(t, 10*time.Second, "release", func() bool {
		return g.activeSum(t, "a-refuses", "b", "c") == 0
	})
}
