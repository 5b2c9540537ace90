package caddygrid

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
	"github.com/browsergrid/caddy-browser-grid/registry"
)

// Fuzz targets for what a client controls. `make fuzz` runs each briefly;
// every `go test` runs their seed corpora.

// fuzzSpecs are the ways a handler finds its pool: fixed, from the path or
// ?browser=, and from a placeholder within a browsers list.
var fuzzSpecs = []poolSpec{
	{pool: "chromium"},
	{},
	{pool: "{http.request.uri.query.browser}", browsers: []string{"chromium", "firefox"}},
	{pool: "{http.request.header.X-Browser}"},
}

// FuzzClientRequest feeds raw HTTP/1.1 requests (request line, headers,
// query) to what the browser_grid handler reads before it claims a worker:
// the WebSocket check and the request's pool. Whatever the bytes, nothing
// panics; a request that is not a WebSocket upgrade, or names a pool the
// handler does not serve, gets a 4xx from the handler itself (so no worker
// is claimed, and none can be blamed); one that passes names a valid,
// allowed pool.
func FuzzClientRequest(f *testing.F) {
	for _, seed := range []string{
		"GET /playwright/chromium HTTP/1.1\r\nHost: grid\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
		"GET /session?browser=firefox HTTP/1.1\r\nHost: grid\r\nConnection: keep-alive, Upgrade\r\nUpgrade: WebSocket\r\n\r\n",
		"GET /session?browser=firefox&browser=webkit HTTP/1.1\r\nHost: grid\r\nConnection: upgrade\r\nUpgrade: h2c, websocket\r\n\r\n",
		"GET /playwright/ HTTP/1.1\r\nHost: grid\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nX-Browser: chromium\r\n\r\n",
		"GET /x?browser=%7Bgrid%3Achromium%7D HTTP/1.1\r\nHost: grid\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
		"GET /x?browser=" + strings.Repeat("\xe2\x82\xac", 40) + " HTTP/1.1\r\nHost: grid\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
		"GET /../../chromium/.. HTTP/1.1\r\nHost: grid\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
		"GET /playwright/chromium HTTP/1.0\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
		"GET /playwright/chromium HTTP/1.1\r\nHost: grid\r\n\r\n",
		"POST /playwright/chromium HTTP/1.1\r\nHost: grid\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nContent-Length: 3\r\n\r\nabc",
		"CONNECT /playwright/chromium HTTP/1.1\r\nHost: grid\r\n:protocol: websocket\r\n\r\n",
		"GET * HTTP/1.1\r\nHost: grid\r\nConnection: ,,,\r\nUpgrade: ,\r\n\r\n",
		"GET /playwright/chromium;x=1?browser=&browser=chromium HTTP/1.1\r\nHost: grid\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
	} {
		f.Add(seed)
	}
	h := &Handler{logger: zap.NewNop()}
	f.Fuzz(func(t *testing.T, raw string) {
		r, err := http.ReadRequest(bufio.NewReader(strings.NewReader(raw)))
		if err != nil {
			return // net/http answers 400 itself; the handler never sees it
		}
		for _, spec := range fuzzSpecs {
			req := r.Clone(context.Background())
			caddyhttp.NewTestReplacer(req)
			h.spec = spec
			if !isWebSocket(req) {
				status := rejectStatus(t, h, req)
				if status != http.StatusUpgradeRequired {
					t.Fatalf("not a WebSocket upgrade: handler answered %d, want 426\n%q", status, raw)
				}
				continue
			}
			if req.Method != http.MethodGet && req.Method != http.MethodConnect {
				t.Fatalf("method %q accepted as a WebSocket upgrade\n%q", req.Method, raw)
			}
			pool, err := spec.resolve(req)
			if err != nil {
				if !errors.Is(err, errBadPool) || err.Error() == "" {
					t.Fatalf("resolve error %v does not say the pool was refused\n%q", err, raw)
				}
				if status := rejectStatus(t, h, req); status != http.StatusBadRequest {
					t.Fatalf("pool refused (%v): handler answered %d, want 400\n%q", err, status, raw)
				}
				continue
			}
			if !validPoolName(pool) || !slices.Contains(spec.allowed(), pool) {
				t.Fatalf("spec %+v resolved pool %q, which it does not allow\n%q", spec, pool, raw)
			}
		}
	})
}

// rejectStatus runs the handler on a request it must refuse before
// claiming (it has no proxy, so one it let through would panic) and
// returns the status it answered.
func rejectStatus(t *testing.T, h *Handler, r *http.Request) int {
	t.Helper()
	w := httptest.NewRecorder()
	if err := h.ServeHTTP(w, r, nil); err != nil {
		t.Fatalf("handler error %v for a request it should refuse", err)
	}
	if w.Code < 400 || w.Code > 499 {
		t.Fatalf("handler answered %d, want a 4xx", w.Code)
	}
	return w.Code
}

// FuzzAdminAPI feeds methods, paths and queries to the grid's admin routes
// (/grid/...) of a running grid app on a real Redis holding one worker.
// Nothing panics; every answer is a 2xx with JSON or an API error with a
// 4xx status and a message: bad input never looks like a server failure.
func FuzzAdminAPI(f *testing.F) {
	for _, seed := range []struct{ method, target string }{
		{"GET", "/grid/pools"},
		{"GET", "/grid/pools/chromium"},
		{"GET", "/grid/pools/chromium/"},
		{"GET", "/grid/pools/chromium/pick"},
		{"GET", "/grid/pools/chromium/pick?policy=vnode"},
		{"GET", "/grid/pools/chromium/pick?policy=fair_share&policy=x"},
		{"GET", "/grid/pools/chromium/pick?policy=%00"},
		{"POST", "/grid/pools/chromium/workers/w1/drain"},
		{"POST", "/grid/pools/chromium/workers/%7Bgrid%7D/drain"},
		{"POST", "/grid/pools/chromium/workers//drain"},
		{"DELETE", "/grid/pools/chromium"},
		{"GET", "/grid/pools/%7Bgrid:chromium%7D"},
		{"GET", "/grid/pools/" + strings.Repeat("a", 65)},
		{"GET", "/grid//pools//chromium//pick"},
		{"GET", "/grid/pools/../../config/"},
		{"GET", "/grid/"},
		{"PUT", "/grid/pools/x/workers/y/drain/z"},
	} {
		f.Add(seed.method, seed.target)
	}
	startFuzzApp(f)
	f.Fuzz(func(t *testing.T, method, target string) {
		if !validMethod(method) {
			return // net/http refuses the request line
		}
		u, err := url.ParseRequestURI(target)
		if err != nil || !strings.HasPrefix(u.Path, "/grid/") {
			return // not a request line, or not routed to the grid
		}
		r := httptest.NewRequest(method, "/", nil)
		r.URL, r.RequestURI = u, target
		w := httptest.NewRecorder()
		err = serveAdmin(w, r)
		if err == nil {
			if w.Code/100 != 2 || !json.Valid(w.Body.Bytes()) {
				t.Fatalf("%s %q: %d %q, want 2xx JSON", method, target, w.Code, w.Body.String())
			}
			return
		}
		var ae caddy.APIError
		if !errors.As(err, &ae) || ae.HTTPStatus < 400 || ae.HTTPStatus > 499 || ae.Err == nil || ae.Err.Error() == "" {
			t.Fatalf("%s %q: error %#v, want an API error with a 4xx status and a message", method, target, err)
		}
		if w.Body.Len() > 0 {
			t.Fatalf("%s %q: wrote %q and returned an error", method, target, w.Body.String())
		}
	})
}

// validMethod reports whether net/http accepts m as a request method (a
// token).
func validMethod(m string) bool {
	if m == "" {
		return false
	}
	for _, c := range m {
		if c <= ' ' || c >= 0x7f || strings.ContainsRune("()<>@,;:\\\"/[]?={}", c) {
			return false
		}
	}
	return true
}

// startFuzzApp runs a grid app (no reaper) on a new Redis with one
// registered worker in pool chromium, and makes it the one the admin API
// serves.
func startFuzzApp(f *testing.F) {
	f.Helper()
	srv := testenv.StartRedis(f)
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	f.Cleanup(cancel)
	a := &App{Redis: srv.URL(), DisableReaper: true}
	if err := a.Provision(ctx); err != nil {
		f.Fatal(err)
	}
	if err := a.Start(); err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = a.Stop(); _ = a.Cleanup() })
	if err := a.backend.reg.Register(context.Background(), registry.Registration{
		Pool: "chromium", ID: "w1", Addr: "127.0.0.1:1", Path: "/playwright", TTL: time.Hour,
	}); err != nil {
		f.Fatal(err)
	}
}
