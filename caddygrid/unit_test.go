package caddygrid

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/browsergrid/caddy-browser-grid/registry"
)

func TestWaitQueue(t *testing.T) {
	t.Run("bounded", func(t *testing.T) {
		var q waitQueue
		a, ok := q.join(2)
		if !ok {
			t.Fatal("first join refused")
		}
		if _, ok := q.join(2); !ok {
			t.Fatal("second join refused")
		}
		if _, ok := q.join(2); ok {
			t.Fatal("third join accepted with limit 2")
		}
		q.leave(a)
		if _, ok := q.join(2); !ok {
			t.Fatal("join refused after a waiter left")
		}
	})
	t.Run("wakes only the head, in order", func(t *testing.T) {
		var q waitQueue
		a, _ := q.join(10)
		b, _ := q.join(10)
		q.wakeHead()
		q.wakeHead() // a second wake-up while one is pending is not queued twice
		if !woken(a) || woken(b) {
			t.Fatal("wakeHead did not wake exactly the head")
		}
		if !q.isHead(a) || q.isHead(b) {
			t.Fatal("isHead wrong")
		}
		q.leave(a)
		if !q.isHead(b) {
			t.Fatal("b is not head after a left")
		}
	})
	t.Run("a retry passes an unusable wake-up past retries that avoid the same", func(t *testing.T) {
		var q waitQueue
		head, _ := q.join(10)
		same1, _ := q.join(10)
		same2, _ := q.join(10)
		other, _ := q.join(10)
		plain, _ := q.join(10)
		q.avoid(head, []string{"c", "a"})
		q.avoid(same1, []string{"a", "c"})
		q.avoid(same2, []string{"c", "a"})
		q.avoid(other, []string{"b"})
		q.wakeNext(head)
		if woken(same1) || woken(same2) || !woken(other) || woken(plain) {
			t.Fatal("the wake-up did not go to the first waiter avoiding other workers")
		}
		q.wakeNext(other)
		if !woken(plain) {
			t.Fatal("an ordinary waiter (avoiding none) did not get the wake-up")
		}
		q.wakeNext(plain) // last: a no-op
	})
	t.Run("an unused wake-up passes on", func(t *testing.T) {
		var q waitQueue
		a, _ := q.join(10)
		b, _ := q.join(10)
		q.wakeHead()
		q.leave(a) // a timed out with a wake-up pending
		if !woken(b) {
			t.Fatal("the wake-up a did not use was lost")
		}
		if q.depth() != 1 {
			t.Fatalf("depth %d, want 1", q.depth())
		}
	})
}

func woken(w *waiter) bool {
	select {
	case <-w.wake:
		return true
	default:
		return false
	}
}

func TestPoolSpecResolve(t *testing.T) {
	cases := []struct {
		name     string
		spec     poolSpec
		url      string
		vars     map[string]any
		want     string
		wantErr  string
		validErr string
	}{
		{name: "fixed", spec: poolSpec{pool: "chromium"}, url: "/playwright/anything", want: "chromium"},
		{name: "query parameter", spec: poolSpec{}, url: "/session?browser=firefox", want: "firefox"},
		{name: "last path segment", spec: poolSpec{}, url: "/playwright/webkit/", want: "webkit"},
		{name: "query wins over path", spec: poolSpec{}, url: "/playwright/webkit?browser=chromium", want: "chromium"},
		{name: "default browsers", spec: poolSpec{}, url: "/playwright/opera", wantErr: `unknown browser "opera"; use one of: chromium, firefox, webkit`},
		{name: "nothing named", spec: poolSpec{pool: "{http.request.uri.query.b}"}, url: "/x", wantErr: "no browser named; use one of: chromium, firefox, webkit"},
		{name: "placeholder within browsers", spec: poolSpec{pool: "{http.request.uri.query.b}", browsers: []string{"a", "b"}}, url: "/x?b=b", want: "b"},
		{name: "placeholder outside browsers", spec: poolSpec{pool: "{http.request.uri.query.b}", browsers: []string{"a"}}, url: "/x?b=c", wantErr: `unknown browser "c"; use one of: a`},
		{name: "hostile name", spec: poolSpec{}, url: "/x?browser=%7Bgrid%3Achromium%7D", wantErr: "unknown browser"},
		{name: "very long name is shortened", spec: poolSpec{}, url: "/x?browser=" + strings.Repeat("a", 500), wantErr: strings.Repeat("a", 64) + "…"},
		{name: "fixed pool not in browsers", spec: poolSpec{pool: "chromium", browsers: []string{"firefox"}}, validErr: `pool "chromium" is not in browsers`},
		{name: "invalid browsers", spec: poolSpec{browsers: []string{"ok", "not ok"}}, validErr: `invalid pool name "not ok"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.spec.validate()
			if tc.validErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.validErr) {
					t.Fatalf("validate() = %v, want %q", err, tc.validErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("validate() = %v", err)
			}
			r := httptest.NewRequest(http.MethodGet, tc.url, nil)
			repl := caddy.NewReplacer()
			repl.Map(func(key string) (any, bool) {
				if q, ok := strings.CutPrefix(key, "http.request.uri.query."); ok {
					return r.URL.Query().Get(q), true
				}
				return nil, false
			})
			r = r.WithContext(context.WithValue(r.Context(), caddy.ReplacerCtxKey, repl))
			got, err := tc.spec.resolve(r)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("resolve() = %q, %v; want error %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("resolve() = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

func TestIsWebSocket(t *testing.T) {
	cases := []struct {
		name   string
		method string
		header map[string]string
		want   bool
	}{
		{"upgrade", http.MethodGet, map[string]string{"Connection": "Upgrade", "Upgrade": "websocket"}, true},
		{"token lists and case", http.MethodGet, map[string]string{"Connection": "keep-alive, upgrade", "Upgrade": "WebSocket"}, true},
		{"plain GET", http.MethodGet, nil, false},
		{"upgrade to something else", http.MethodGet, map[string]string{"Connection": "Upgrade", "Upgrade": "h2c"}, false},
		{"POST upgrade", http.MethodPost, map[string]string{"Connection": "Upgrade", "Upgrade": "websocket"}, false},
		{"no Connection", http.MethodGet, map[string]string{"Upgrade": "websocket"}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest(tc.method, "/", nil)
			for k, v := range tc.header {
				r.Header.Set(k, v)
			}
			if got := isWebSocket(r); got != tc.want {
				t.Fatalf("isWebSocket = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestPointAt(t *testing.T) {
	cases := []struct {
		name, client, worker, wantPath, wantQuery string
	}{
		{"worker path, client query kept", "/playwright/chromium?launch=x", "/playwright", "/playwright", "launch=x"},
		{"worker query replaces the client's", "/playwright/chromium?launch=x", "/devtools/browser/abc?token=t", "/devtools/browser/abc", "token=t"},
		{"empty worker path", "/p/c", "", "/", ""},
		{"escaped worker path", "/p/c", "/a%2Fb", "/a/b", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodGet, tc.client, nil)
			r = r.WithContext(context.WithValue(r.Context(), caddyhttp.VarsCtxKey, map[string]any{}))
			pointAt(r, &registry.Claim{Worker: registry.WorkerInfo{ID: "w", Addr: "127.0.0.1:1", Path: tc.worker}})
			if r.URL.Path != tc.wantPath || r.URL.RawQuery != tc.wantQuery {
				t.Fatalf("upstream URL %q ? %q, want %q ? %q", r.URL.Path, r.URL.RawQuery, tc.wantPath, tc.wantQuery)
			}
			if got := caddyhttp.GetVar(r.Context(), varDial); got != "127.0.0.1:1" {
				t.Fatalf("dial variable %v, want the worker's address", got)
			}
		})
	}
	if got := retryAfterSeconds(300 * time.Millisecond); got != "1" {
		t.Errorf("retryAfterSeconds(300ms) = %s, want 1", got)
	}
	if got := retryAfterSeconds(5*time.Second + time.Millisecond); got != "6" {
		t.Errorf("retryAfterSeconds(5.001s) = %s, want 6", got)
	}
}

func TestClaimOptionsMerge(t *testing.T) {
	policy := ClaimOptions{MaxLifetime: 7}
	policy.merge(ClaimOptions{MaxLifetime: 50, MaxConcurrent: 5, QueueSize: 3})
	policy.setDefaults()
	want := ClaimOptions{MaxLifetime: 7, MaxConcurrent: 5, QueueSize: 3, SelectTimeout: caddy.Duration(DefaultSelectTimeout)}
	if policy != want {
		t.Fatalf("merged %+v, want %+v (the policy's own value wins, defaults fill the rest)", policy, want)
	}
	for _, bad := range []ClaimOptions{{MaxConcurrent: -1}, {MaxLifetime: -1}, {MaxScan: 257}, {QueueSize: -1}, {SelectTimeout: -1}} {
		if err := bad.validate(); err == nil {
			t.Errorf("validate(%+v) accepted it", bad)
		}
	}
}

// FuzzHandlerCaddyfile: whatever the directive's body, parsing returns an
// error or a handler, never a panic.
func FuzzHandlerCaddyfile(f *testing.F) {
	for _, seed := range []string{
		"browser_grid chromium",
		"browser_grid {\n policy vnode {\n virtual_nodes 8\n samples 2\n }\n max_lifetime 5\n}",
		"browser_grid x {\n policy fair_share {\n median\n window 3\n default_estimate 1s\n }\n}",
		"browser_grid {http.request.uri.query.browser} {\n browsers a b\n dial_retries 3\n max_session 1h\n}",
		"browser_grid chromium {\n policy\n}",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, src string) {
		tokens, err := caddyfile.Tokenize([]byte(src), "Caddyfile")
		if err != nil || len(tokens) == 0 {
			return
		}
		h := new(Handler)
		_ = h.UnmarshalCaddyfile(caddyfile.NewDispenser(tokens))
	})
}

// TestAppRedisPlaceholder: {env.X} in the Redis URL is read when the
// config loads; empty, it is an error naming the option.
func TestAppRedisPlaceholder(t *testing.T) {
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	t.Setenv("CADDYGRID_TEST_REDIS", "redis://user:secret@127.0.0.1:1/3")
	a := &App{Redis: "{env.CADDYGRID_TEST_REDIS}"}
	if err := a.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	defer a.Cleanup()
	if a.backend.key.url != "redis://user:secret@127.0.0.1:1/3" {
		t.Errorf("backend URL %q, want the expanded variable", a.backend.key.url)
	}
	if strings.Contains(a.backend.redacted, "secret") {
		t.Errorf("redacted URL %q shows the password", a.backend.redacted)
	}
	empty := &App{Redis: "{env.CADDYGRID_TEST_UNSET}"}
	if err := empty.Provision(ctx); err == nil || !strings.Contains(err.Error(), "redis URL") {
		t.Errorf("an empty Redis URL gave %v, want an error naming it", err)
	}
}

// TestBlames: which failed attempts mark the worker suspect.
func TestBlames(t *testing.T) {
	for _, tc := range []struct {
		name       string
		status     int
		clientGone bool
		want       bool
	}{
		{"no answer, client there (dial refused or timed out, upgrade_timeout)", 0, false, true},
		{"no answer, client gone", 0, true, false},
		{"5xx", http.StatusBadGateway, false, true},
		{"5xx after the client left", http.StatusServiceUnavailable, true, true},
		{"404: the worker does not serve the path", http.StatusNotFound, false, true},
		{"200: no WebSocket server at that address and path", http.StatusOK, false, true},
		{"302: a redirect instead of a handshake", http.StatusFound, false, true},
		{"304, client gone: still the worker's answer", http.StatusNotModified, true, true},
		{"428: the client's version", http.StatusPreconditionRequired, false, false},
		{"400: the client's handshake", http.StatusBadRequest, false, false},
		{"101: served", http.StatusSwitchingProtocols, false, false},
		{"101, client gone", http.StatusSwitchingProtocols, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := blames(tc.status, tc.clientGone); got != tc.want {
				t.Errorf("blames(%d, clientGone=%v) = %v, want %v", tc.status, tc.clientGone, got, tc.want)
			}
		})
	}
}
