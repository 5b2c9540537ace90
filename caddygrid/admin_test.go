package caddygrid_test

import (
	"context"
	"encoding/json"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/caddygrid"
	"github.com/browsergrid/caddy-browser-grid/cmd/fakebrowser/fake"
	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
	"github.com/browsergrid/caddy-browser-grid/registry"
)

// TestAdminAndMetrics: after a few sessions, the admin endpoints and the
// metrics report exactly what happened; the grid turns away what is not
// a WebSocket (426) and pools it does not serve (400).
func TestAdminAndMetrics(t *testing.T) {
	g := newGrid(t)
	for _, id := range []string{"w1", "w2", "w3"} {
		g.worker("chromium", id, fake.Behavior{})
	}
	c := startCaddy(t, caddyOpts{redisURL: g.redis.URL(), site: `
	route /playwright/* {
		browser_grid chromium {
			max_concurrent 2
			max_lifetime 9
		}
	}
	route /any/* {
		browser_grid {
			browsers chromium firefox
			max_concurrent 2
			max_lifetime 9
		}
	}`})

	// Seven sessions one after another (margin 9/3 = 3: w1 climbs to 6,
	// then w2 takes one), then an eighth that stays open (on w2).
	for range 7 {
		mustDial(t, c.url("/playwright/chromium")).close()
		testenv.Eventually(t, 10*time.Second, "release", func() bool {
			return g.info("chromium", "w1").Active+g.info("chromium", "w2").Active == 0
		})
	}
	live := mustDial(t, c.url("/any/chromium"))
	defer live.close()

	// GET /grid/pools
	code, body := c.admin(http.MethodGet, "/grid/pools")
	if code != http.StatusOK {
		t.Fatalf("GET /grid/pools: %d %s", code, body)
	}
	var pools []caddygrid.PoolSummary
	if err := json.Unmarshal(body, &pools); err != nil {
		t.Fatalf("decoding %s: %v", body, err)
	}
	want := caddygrid.PoolSummary{Pool: "chromium", Workers: 3, Available: 3, Active: 1, Capacity: 6, Leases: 1, LocalSessions: 1}
	if len(pools) != 1 || !reflect.DeepEqual(pools[0], want) {
		t.Errorf("GET /grid/pools = %+v, want [%+v]", pools, want)
	}

	// GET /grid/pools/chromium
	code, body = c.admin(http.MethodGet, "/grid/pools/chromium")
	if code != http.StatusOK {
		t.Fatalf("GET /grid/pools/chromium: %d %s", code, body)
	}
	var pool caddygrid.PoolDetail
	if err := json.Unmarshal(body, &pool); err != nil {
		t.Fatalf("decoding %s: %v", body, err)
	}
	if pool.MaxConcurrent != 2 || pool.MaxLifetime != 9 || len(pool.WorkerStatuses) != 3 {
		t.Fatalf("GET /grid/pools/chromium = %s", body)
	}
	// claimed with lifetime_first only: no optional index is kept (a pool
	// no claim of this version had settled would list all three as "kept")
	if len(pool.Indexes) != 0 {
		t.Errorf("GET /grid/pools/chromium: indexes %+v, want none for a lifetime_first pool", pool.Indexes)
	}
	figures := map[string][2]int{"w1": {6, 0}, "w2": {2, 1}, "w3": {0, 0}}
	for _, w := range pool.WorkerStatuses {
		f := figures[w.ID]
		if w.Lifetime != f[0] || w.Active != f[1] || w.Status != "available" ||
			w.Endpoint != "ws://"+w.Addr+"/playwright" || w.HeartbeatAge == "" {
			t.Errorf("worker %s: %+v; want lifetime %d, active %d, available, its endpoint and heartbeat age", w.ID, w, f[0], f[1])
		}
	}

	// GET /grid/pools/chromium/pick: lifetime-first would take w2 (w1 is in
	// the margin zone), and asking claims nothing.
	code, body = c.admin(http.MethodGet, "/grid/pools/chromium/pick")
	var pick caddygrid.PickResult
	if code != http.StatusOK || json.Unmarshal(body, &pick) != nil || pick.Worker == nil || pick.Worker.ID != "w2" {
		t.Errorf("GET pick: %d %s; want w2", code, body)
	}
	if w := g.info("chromium", "w2"); w.Lifetime != 2 || w.Active != 1 {
		t.Errorf("pick claimed something: w2 lifetime %d active %d", w.Lifetime, w.Active)
	}
	// Every policy of the registry's table can be asked for.
	for _, p := range registry.Policies() {
		code, body = c.admin(http.MethodGet, "/grid/pools/chromium/pick?policy="+string(p.Name))
		if code != http.StatusOK || !strings.Contains(string(body), `"policy": "`+string(p.Name)+`"`) {
			t.Errorf("GET pick?policy=%s: %d %s", p.Name, code, body)
		}
	}

	// POST drain
	code, body = c.admin(http.MethodPost, "/grid/pools/chromium/workers/w3/drain")
	if code != http.StatusOK {
		t.Fatalf("POST drain: %d %s", code, body)
	}
	if cmd := g.info("chromium", "w3").Command; cmd != registry.CommandShutdown {
		t.Errorf("after POST drain w3's command is %q, want %q", cmd, registry.CommandShutdown)
	}
	// it takes no session from now on: the totals count it as draining,
	// its slots out of the capacity
	code, body = c.admin(http.MethodGet, "/grid/pools")
	pools = nil
	if err := json.Unmarshal(body, &pools); code != http.StatusOK || err != nil {
		t.Fatalf("GET /grid/pools after the drain: %d %s", code, body)
	}
	want = caddygrid.PoolSummary{Pool: "chromium", Workers: 3, Available: 2, Draining: 1, Active: 1, Capacity: 4, Leases: 1, LocalSessions: 1}
	if len(pools) != 1 || !reflect.DeepEqual(pools[0], want) {
		t.Errorf("GET /grid/pools after draining w3 = %+v, want [%+v]", pools, want)
	}

	// Errors are caddy.APIError JSON.
	for _, tc := range []struct {
		method, path string
		code         int
		says         string
	}{
		{http.MethodPost, "/grid/pools/chromium/workers/nobody/drain", http.StatusNotFound, `worker \"nobody\" is not registered`},
		{http.MethodGet, "/grid/pools/opera", http.StatusNotFound, `pool \"opera\" has no workers`},
		{http.MethodGet, "/grid/pools/bad%20name", http.StatusBadRequest, "invalid pool name"},
		{http.MethodPost, "/grid/pools", http.StatusMethodNotAllowed, "use GET"},
		{http.MethodGet, "/grid/pools/chromium/workers/w3/drain", http.StatusMethodNotAllowed, "use POST"},
		{http.MethodGet, "/grid/pools/chromium/pick?policy=random", http.StatusBadRequest, `unknown policy \"random\"`},
		{http.MethodGet, "/grid/nothing", http.StatusNotFound, "no grid admin route"},
	} {
		code, body := c.admin(tc.method, tc.path)
		var apiErr struct {
			Error string `json:"error"`
		}
		if code != tc.code || json.Unmarshal(body, &apiErr) != nil || !strings.Contains(string(body), tc.says) {
			t.Errorf("%s %s: %d %s; want %d with an error saying %s", tc.method, tc.path, code, body, tc.code, tc.says)
		}
	}

	// Not a WebSocket: 426 with the Upgrade header. Unknown pool: 400
	// naming the allowed ones.
	resp, err := http.Get("http://" + c.addr() + "/playwright/chromium")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUpgradeRequired || resp.Header.Get("Upgrade") != "websocket" {
		t.Errorf("plain GET: %d (Upgrade %q), want 426 with Upgrade: websocket", resp.StatusCode, resp.Header.Get("Upgrade"))
	}
	_, err = dial(context.Background(), c.url("/any/opera"))
	if he := refusal(err); he == nil || he.StatusCode != http.StatusBadRequest ||
		!strings.Contains(string(he.Body), `unknown browser "opera"; use one of: chromium, firefox`) {
		t.Errorf("unknown pool: %v; want 400 naming chromium and firefox", err)
	}

	// The metrics say the same.
	for sample, want := range map[string]float64{
		`caddy_grid_selections_total{policy="lifetime_first",pool="chromium"}`:              8,
		`caddy_grid_releases_total{outcome="released",pool="chromium"}`:                     7,
		`caddy_grid_active_sessions{pool="chromium"}`:                                       1,
		`caddy_grid_select_duration_seconds_count{policy="lifetime_first",pool="chromium"}`: 8,
		`caddy_grid_scan_depth_count{policy="lifetime_first",pool="chromium"}`:              8,
		`caddy_grid_rejections_total{code="400",pool=""}`:                                   1,
		`caddy_grid_rejections_total{code="426",pool=""}`:                                   1,
		`caddy_grid_queue_depth{pool="chromium"}`:                                           0,
		// every claim and release went in some call to Redis, alone or batched
		`caddy_grid_redis_batch_calls_sum{pool="chromium",script="claim"}`: 8,
		`caddy_grid_redis_batch_calls_sum{pool="chromium",script="lease"}`: 7,
	} {
		if got := c.metric(sample); got != want {
			t.Errorf("%s = %v, want %v", sample, got, want)
		}
	}
}

// GET /grid/pools/{pool}/pick in a pool of Playwright version groups (the
// playwright launcher's workers all register in one): without ?version,
// the worker a client sending no version would get (the groups in the
// order such a claim tries them); with it, the worker a client of that
// version would get. (It answered "worker": null for every such pool: it
// looked only at the pool's workers without a version.)
func TestAdminPickInVersionGroups(t *testing.T) {
	g := newGrid(t)
	p64, p65 := registry.GroupPool("chromium", "1.64"), registry.GroupPool("chromium", "1.65")
	g.worker(p64, "a", fake.Behavior{})
	g.worker(p65, "b", fake.Behavior{})
	c := startCaddy(t, caddyOpts{redisURL: g.redis.URL(), site: `
	route /playwright/* {
		browser_grid chromium {
			max_concurrent 1
		}
	}`})
	pick := func(query string) caddygrid.PickResult {
		t.Helper()
		code, body := c.admin(http.MethodGet, "/grid/pools/chromium/pick"+query)
		var p caddygrid.PickResult
		if code != http.StatusOK || json.Unmarshal(body, &p) != nil {
			t.Fatalf("GET pick%s: %d %s", query, code, body)
		}
		return p
	}
	id := func(p caddygrid.PickResult) string {
		if p.Worker == nil {
			return ""
		}
		return p.Worker.ID
	}
	if p := pick(""); id(p) != "b" || p.Version != "1.65" {
		t.Errorf("pick = %s in %q; want b in 1.65 (the newest version first)", id(p), p.Version)
	}
	s, err := dialAs(context.Background(), c.url("/playwright/chromium"), ua165)
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()
	for _, tc := range []struct{ query, worker, version string }{
		{"", "a", "1.64"}, // b is full: a client without a version gets a
		{"?version=1.65", "", "1.65"},
		{"?version=1.64", "a", "1.64"},
		{"?version=01.064", "a", "1.64"}, // read as a User-Agent's is
		{"?version=1.63&policy=vnode", "", "1.63"},
	} {
		if p := pick(tc.query); id(p) != tc.worker || p.Version != tc.version {
			t.Errorf("pick%s = %q in %q; want %q in %q", tc.query, id(p), p.Version, tc.worker, tc.version)
		}
	}
	if w := g.info(p64, "a"); w.Lifetime != 0 || w.Active != 0 {
		t.Errorf("pick claimed something: a lifetime %d active %d", w.Lifetime, w.Active)
	}
	code, body := c.admin(http.MethodGet, "/grid/pools/chromium/pick?version=1.x")
	if code != http.StatusBadRequest || !strings.Contains(string(body), "invalid Playwright version") {
		t.Errorf("pick?version=1.x: %d %s; want 400 naming the version", code, body)
	}
}
