package caddygrid_test

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/browsergrid/caddy-browser-grid/registry"
)

// Whatever an admin caller sends (names that are no pool, IDs of any
// length or encoding, a route with the wrong method), the grid's admin
// routes answer 4xx with an error, never a 5xx, and Caddy goes on serving
// sessions (the harness fails the test on a panic in Caddy's output).
func TestHostileAdminRequestsGet4xxNeverA5xx(t *testing.T) {
	t.Parallel()
	g := newGrid(t)
	ag := g.agent("chromium", nil)
	c := startCaddy(t, caddyOpts{redisURL: g.redis.URL(), site: site("max_concurrent 2")})
	live := mustDial(t, c.url("/playwright/chromium"))
	defer live.close()
	worker := ag.status(t).Browsers[0].ID
	versioned := g.register(registry.Record{ID: "v-1", Pool: "chromium", Version: "1.65", Addr: deadAddr(t)}, 0).ID
	huge := strings.Repeat("x", 10000)

	for _, tc := range []struct{ method, path string }{
		{"GET", "/grid/pools/a%20b"},
		{"GET", "/grid/pools/" + url.PathEscape("{grid}:pools")},
		{"GET", "/grid/pools/" + huge},
		{"GET", "/grid/pools/chromium@x"},
		{"GET", "/grid/pools/chromium@1.65"},
		{"GET", "/grid/pools/chromium@1.65/pick"},
		{"GET", "/grid/pools/chromium@1.65/pick?version=1.65"},
		{"GET", "/grid/pools/%00"},
		{"GET", "/grid/pools/%FF%FE"},
		{"GET", "/grid/pools/chromium/extra"},
		{"GET", "/grid/pools/chromium/pick?version=latest"},
		{"GET", "/grid/pools/a%20b/pick"},
		{"GET", "/grid/sessions?pool=a%20b"},
		{"GET", "/grid/sessions?pool=" + huge},
		{"GET", "/grid/sessions?cursor=x"},
		{"GET", "/grid/sessions?cursor=99.0"},
		{"GET", "/grid/sessions?cursor=-1.5"},
		{"GET", "/grid/sessions/" + huge},
		{"GET", "/grid/sessions/%00"},
		{"GET", "/grid/sessions/a%20b"},
		{"GET", "/grid/sessions/%E2%80%AE"},
		{"DELETE", "/grid/sessions/" + huge},
		{"DELETE", "/grid/sessions/%0D%0Aend"},
		{"DELETE", "/grid/sessions/"},
		{"POST", "/grid/pools/a%20b/workers/" + worker + "/drain"},
		{"POST", "/grid/pools/chromium@1.65/workers/" + worker + "/drain"},
		{"POST", "/grid/pools/chromium@1.65/workers/" + versioned + "/drain"},
		{"POST", "/grid/pools/chromium@x/workers/" + worker + "/drain"},
		{"POST", "/grid/pools/" + huge + "/workers/x/drain"},
		{"POST", "/grid/pools/chromium/workers/a%20b/drain"},
		{"POST", "/grid/pools/chromium/workers/" + huge + "/drain"},
		{"POST", "/grid/pools/chromium/workers/%00/drain"},
		{"GET", "/grid/pools/chromium/workers/" + worker + "/drain"},
		{"DELETE", "/grid/pools/chromium"},
		{"PUT", "/grid/pools"},
		{"PATCH", "/grid/sessions"},
		{"POST", "/grid/sessions/abc"},
		{"GET", "/grid/"},
		{"GET", "/grid/nothing"},
	} {
		code, body := c.admin(tc.method, tc.path)
		shown := tc.path
		if len(shown) > 80 {
			shown = shown[:80] + "…"
		}
		if code < 400 || code >= 500 {
			t.Errorf("%s %s: %d %.200s, want a 4xx", tc.method, shown, code, body)
		}
	}
	// The drains of real workers named in a malformed way drained nothing.
	for _, id := range []string{worker, versioned} {
		if w, ok := g.worker("chromium", id); !ok || w.Status != "available" {
			t.Errorf("worker %s after the hostile requests: %+v, want still available", id, w)
		}
	}
	if err := live.echo("still served"); err != nil {
		t.Errorf("a live session broke: %v", err)
	}
	mustDial(t, c.url("/playwright/chromium")).close()
}

// A client whose upgrade request is malformed in what a browser would
// choke on (no key, a key of the wrong size, another version, a body,
// unparsable extensions, another method) gets a 4xx from the grid, and
// no worker is claimed or made suspect: the browser never sees it.
func TestAMalformedUpgradeIsTheClientsFaultNotTheWorkers(t *testing.T) {
	t.Parallel()
	g := newGrid(t)
	g.agent("chromium", nil)
	c := startCaddy(t, caddyOpts{redisURL: g.redis.URL(), site: site("max_concurrent 2")})
	u := c.httpURL("/playwright/chromium")
	for _, tc := range []struct {
		name   string
		method string
		tweak  func(http.Header)
	}{
		{"no key", "GET", func(h http.Header) { h.Del("Sec-Websocket-Key") }},
		{"short key", "GET", func(h http.Header) { h.Set("Sec-Websocket-Key", "c2hvcnQ=") }},
		{"two keys", "GET", func(h http.Header) { h.Add("Sec-Websocket-Key", "dGhlIHNhbXBsZSBub25jZQ==") }},
		{"key named hop-by-hop", "GET", func(h http.Header) { h.Set("Connection", "Upgrade, Sec-WebSocket-Key") }},
		{"version 8", "GET", func(h http.Header) { h.Set("Sec-Websocket-Version", "8") }},
		{"no version", "GET", func(h http.Header) { h.Del("Sec-Websocket-Version") }},
		{"bad extensions", "GET", func(h http.Header) { h.Set("Sec-Websocket-Extensions", "permessage-deflate; =") }},
		{"quoted extension param", "GET", func(h http.Header) { h.Set("Sec-Websocket-Extensions", `x; a="b c"`) }},
		{"upgrade to h2c", "GET", func(h http.Header) { h.Set("Upgrade", "h2c") }},
		{"POST", "POST", func(http.Header) {}},
	} {
		h := upgradeHeader()
		tc.tweak(h)
		resp, body := get(t, nil, tc.method, u, h)
		if resp.StatusCode < 400 || resp.StatusCode >= 500 {
			t.Errorf("%s: %d %q, want a 4xx", tc.name, resp.StatusCode, body)
		}
	}
	for _, w := range g.workers("chromium") {
		if w.Lifetime != 0 || w.Active != 0 || !w.SuspectUntil.IsZero() {
			t.Errorf("worker %s after malformed upgrades: lifetime %d active %d suspect %v, want untouched",
				w.ID, w.Lifetime, w.Active, w.SuspectUntil)
		}
	}
	if got := c.metric(`caddy_grid_dial_failures_total{pool="chromium"}`); got != 0 {
		t.Errorf("dial failures counted: %v, want 0", got)
	}
	s := mustDial(t, c.url("/playwright/chromium"))
	defer s.close()
	if _, ok, _ := g.reg.GetSession(context.Background(), "chromium", s.resp.Header.Get(registry.HeaderSession)); !ok {
		t.Error("a valid session after the malformed ones is not in Redis")
	}
}
