package caddygrid_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/cmd/fakebrowser/fake"
	"github.com/browsergrid/caddy-browser-grid/registry"
)

// plainOKWorker registers a fakebrowser worker that answers a plain HTTP
// request (no WebSocket upgrade) with 200 "Running", as Playwright's
// browser server does (playwright-core's launchServer: any HTTP request
// that is not an upgrade gets response.end("Running")). Upgrades go to the
// fakebrowser. It returns the count of plain requests that reached it.
func (g *grid) plainOKWorker(pool, id string) *atomic.Int64 {
	g.t.Helper()
	fb := fake.New(fake.Options{Path: "/playwright"})
	var plain atomic.Int64
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		g.t.Fatal(err)
	}
	hs := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
			plain.Add(1)
			_, _ = io.WriteString(w, "Running")
			return
		}
		fb.ServeHTTP(w, r)
	})}
	go func() { _ = hs.Serve(l) }()
	g.t.Cleanup(func() { hs.Close(); fb.Close() })
	err = g.reg.Register(context.Background(), registry.Registration{
		Pool: pool, ID: id, BrowserType: pool, Addr: l.Addr().String(), Path: "/playwright", TTL: workerTTL,
	})
	if err != nil {
		g.t.Fatalf("registering worker %s: %v", id, err)
	}
	return &plain
}

// TestHandComposedPlainRequestsBlameNoWorker: in the hand-composed form
// (no 426 for plain HTTP), an anonymous client sending plain GETs (no
// WebSocket upgrade) to the grid's route must not take workers out of
// rotation. Playwright's server answers such a GET with 200, and a 1xx-3xx
// answer other than 101 is the worker's failure when it answers an
// upgrade; a plain request is no upgrade, so it must claim and blame
// nobody. Before the fix each plain GET marked lb_retries+1 workers
// suspect: 20 GETs took all 3 workers out of rotation.
func TestHandComposedPlainRequestsBlameNoWorker(t *testing.T) {
	g := newGrid(t)
	ids := []string{"w1", "w2", "w3"}
	var plain []*atomic.Int64
	for _, id := range ids {
		plain = append(plain, g.plainOKWorker("chromium", id))
	}
	c := startCaddy(t, caddyOpts{redisURL: g.redis.URL(), site: `
	route /playwright/* {
		reverse_proxy {
			dynamic browser_grid chromium
			lb_policy lifetime_first {
				max_lifetime 100
				select_timeout 2s
			}
			lb_retries 2
			lb_retry_match {
				expression ` + "`type({rp.status_code}) != int || {rp.status_code} >= 500 || {rp.status_code} == 404 || ({rp.status_code} < 400 && {rp.status_code} != 101)`" + `
			}
			header_up Host {upstream_hostport}
		}
	}`})
	u := "http://" + c.addr() + "/playwright/chromium"
	const tries = 20
	codes := map[int]int{}
	for range tries {
		resp, err := http.Get(u)
		if err != nil {
			t.Fatalf("plain GET: %v", err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		codes[resp.StatusCode]++
	}
	reached := int64(0)
	for _, p := range plain {
		reached += p.Load()
	}
	suspect := 0
	for _, id := range ids {
		w := g.info("chromium", id)
		if w.SuspectUntil.After(time.Now()) {
			suspect++
		}
		if w.Lifetime != 0 || w.Active != 0 {
			t.Errorf("worker %s charged by plain GETs: lifetime %d, active %d", id, w.Lifetime, w.Active)
		}
	}
	t.Logf("plain GETs tried %d, answers %v, reached workers %d, workers suspect %d of %d", tries, codes, reached, suspect, len(ids))
	if suspect > 0 {
		t.Errorf("%d of %d workers suspect after %d plain GETs: an anonymous client takes the grid out of rotation", suspect, len(ids), tries)
	}
	if reached > 0 {
		t.Errorf("%d plain GETs reached a worker: a request that is no WebSocket upgrade must not claim one", reached)
	}
	// An honest client is served right after, by a worker that was not
	// taken out of rotation.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := dial(ctx, c.url("/playwright/chromium"))
	if err != nil {
		var he *refused
		if errors.As(err, &he) {
			t.Fatalf("honest client after the plain GETs: %d %s", he.StatusCode, he.Body)
		}
		t.Fatalf("honest client after the plain GETs: %v", err)
	}
	s.close()
}
