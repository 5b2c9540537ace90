package caddygrid_test

import (
	"encoding/json"
	"net/http"
	"testing"
)

// TestDiscoveryPointsBackThroughTheGrid: the HTTP requests Playwright's
// connect() and connectOverCDP send before the WebSocket are answered by
// the grid itself, pointing back at the endpoint: behind a trusted proxy
// with the scheme and host the client reached, otherwise with the
// request's own; a client cannot make the answer name another host
// without being a trusted proxy. Nothing is claimed, a WebSocket upgrade
// to a discovery path opens no session, and a pool the route does not
// serve gets 400.
func TestDiscoveryPointsBackThroughTheGrid(t *testing.T) {
	t.Parallel()
	g := newGrid(t)
	g.agent("chromium", nil)
	c := startCaddy(t, caddyOpts{redisURL: g.redis.URL(), site: site("max_concurrent 2"),
		options: "servers {\n\t\ttrusted_proxies static 127.0.0.1/32\n\t}"})
	direct := startCaddy(t, caddyOpts{redisURL: g.redis.URL(), site: site("max_concurrent 2")})

	get := func(c *caddy, path string, h http.Header) (int, map[string]string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, c.httpURL(path), nil)
		for k, v := range h {
			req.Header[k] = v
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var m map[string]string
		_ = json.NewDecoder(resp.Body).Decode(&m)
		return resp.StatusCode, m
	}
	forwarded := http.Header{"X-Forwarded-Proto": {"https"}, "X-Forwarded-Host": {"grid.example.com"}}

	if code, m := get(c, "/playwright/chromium/json", nil); code != 200 || m["wsEndpointPath"] != "" || len(m) != 1 {
		t.Errorf("GET /json: %d %v, want {\"wsEndpointPath\": \"\"}", code, m)
	}
	if _, m := get(c, "/playwright/chromium/json/version/", forwarded); m["webSocketDebuggerUrl"] != "wss://grid.example.com/playwright/chromium" {
		t.Errorf("behind a trusted proxy: webSocketDebuggerUrl %q, want wss://grid.example.com/playwright/chromium", m["webSocketDebuggerUrl"])
	}
	want := "ws://" + direct.httpURL("")[len("http://"):] + "/playwright/chromium?browser=chromium"
	if _, m := get(direct, "/playwright/chromium/json/version?browser=chromium", forwarded); m["webSocketDebuggerUrl"] != want {
		t.Errorf("from a client that is no trusted proxy: webSocketDebuggerUrl %q, want %q", m["webSocketDebuggerUrl"], want)
	}
	if code, _ := get(c, "/playwright/opera/json", nil); code != http.StatusBadRequest {
		t.Errorf("GET /json of a pool the route does not serve: %d, want 400", code)
	}
	if _, err := dial(t.Context(), c.url("/playwright/chromium/json")); err == nil {
		t.Error("a WebSocket to the discovery path opened a session")
	}
	if n := g.active("chromium"); n != 0 {
		t.Errorf("discovery left %d sessions", n)
	}
	if w := g.workers("chromium"); len(w) != 1 || w[0].Lifetime != 0 {
		t.Errorf("discovery charged the worker: %+v", w)
	}
}
