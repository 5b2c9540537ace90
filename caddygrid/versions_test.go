package caddygrid_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/caddygrid"
	"github.com/browsergrid/caddy-browser-grid/cmd/fakebrowser/fake"
	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
	"github.com/browsergrid/caddy-browser-grid/registry"
)

// dialAs opens a session with a client's User-Agent ("" for none).
func dialAs(ctx context.Context, u, ua string) (*session, error) {
	h := http.Header{}
	if ua != "" {
		h.Set("User-Agent", ua)
	}
	return dialHeader(ctx, u, h)
}

const (
	ua163 = "Playwright/1.63.0 (x64; debian 12) node/20.20"
	ua164 = "Playwright/1.64.1 (x64; debian 12) node/20.20"
	ua165 = "Playwright/1.65.1 (x64; debian 12) node/20.20"
)

// TestVersionRouting: a Playwright client is served by a worker of its
// version only (queueing when they are busy), a version no worker serves
// gets 428 at once naming the pool's versions and charges nobody, a client
// without a version is served by any worker, and version_routing off
// sends every client to any worker.
func TestVersionRouting(t *testing.T) {
	g := newGrid(t)
	p64, p65 := registry.GroupPool("chromium", "1.64"), registry.GroupPool("chromium", "1.65")
	g.worker(p64, "a", fake.Behavior{})
	g.worker(p65, "b", fake.Behavior{})
	site := func(extra string) caddyOpts {
		return caddyOpts{redisURL: g.redis.URL(), site: `
	route /playwright/* {
		browser_grid chromium {
			max_concurrent 1
			select_timeout 20s
			` + extra + `
		}
	}`}
	}
	c := startCaddy(t, site(""))
	u := c.url("/playwright/chromium")
	ctx := context.Background()
	lifetimes := func() [2]int { return [2]int{g.info(p64, "a").Lifetime, g.info(p65, "b").Lifetime} }

	// A 1.65 client gets the 1.65 worker; a second one waits for it, the
	// free 1.64 worker notwithstanding.
	s1, err := dialAs(ctx, u, ua165)
	if err != nil {
		t.Fatal(err)
	}
	if got := lifetimes(); got != [2]int{0, 1} {
		t.Fatalf("lifetimes (1.64, 1.65) after a 1.65 session = %v, want [0 1]", got)
	}
	done := make(chan error, 1)
	go func() {
		s, err := dialAs(ctx, u, ua165)
		if err == nil {
			s.close()
		}
		done <- err
	}()
	testenv.Eventually(t, 10*time.Second, "the second 1.65 client to queue", func() bool {
		return c.metric(`caddy_grid_queue_depth{pool="`+p65+`"}`) == 1
	})
	s1.close()
	if err := <-done; err != nil {
		t.Fatalf("the queued 1.65 client: %v", err)
	}
	if got := lifetimes(); got != [2]int{0, 2} {
		t.Fatalf("lifetimes after two 1.65 sessions = %v, want [0 2]", got)
	}
	s, err := dialAs(ctx, u, ua164)
	if err != nil {
		t.Fatal(err)
	}
	s.close()
	if got := lifetimes(); got != [2]int{1, 2} {
		t.Fatalf("lifetimes after a 1.64 session = %v, want [1 2]", got)
	}

	// 1.63: no worker serves it.
	before := lifetimes()
	start := time.Now()
	_, err = dialAs(ctx, u, ua163)
	took := time.Since(start)
	he := refusal(err)
	if he == nil || he.StatusCode != http.StatusPreconditionRequired {
		t.Fatalf("a 1.63 client: %v, want 428", err)
	}
	for _, want := range []string{"Playwright 1.63", "1.64, 1.65"} {
		if !strings.Contains(string(he.Body), want) {
			t.Errorf("428 body %q does not say %q", he.Body, want)
		}
	}
	t.Logf("428 for 1.63 in %v: %s", took, he.Body)
	testenv.Eventually(t, 10*time.Second, "every claim released", func() bool {
		return g.info(p64, "a").Active == 0 && g.info(p65, "b").Active == 0
	})
	if got := lifetimes(); got != before {
		t.Fatalf("lifetimes after the refused 1.63 client = %v, want %v (no worker charged)", got, before)
	}
	if n := c.metric(`caddy_grid_version_sessions_total{pool="chromium",version="unregistered"}`); n != 1 {
		t.Errorf("unregistered version count %v, want 1", n)
	}
	if n := c.metric(`caddy_grid_version_sessions_total{pool="chromium",version="1.65"}`); n != 2 {
		t.Errorf("1.65 session count %v, want 2", n)
	}

	// No version: any worker (both get one while the other is busy).
	s1, err = dialAs(ctx, u, "")
	if err != nil {
		t.Fatal(err)
	}
	s2, err := dialAs(ctx, u, "")
	if err != nil {
		t.Fatal(err)
	}
	if got := lifetimes(); got != [2]int{before[0] + 1, before[1] + 1} {
		t.Fatalf("lifetimes after two sessions without a version = %v, want one more each than %v", got, before)
	}
	s1.close()
	s2.close()

	// The admin API shows the pool as one, with its versions and each
	// worker's, and drains a worker of a version group by its pool's name.
	code, body := c.admin(http.MethodGet, "/grid/pools/chromium")
	var d caddygrid.PoolDetail
	if err := json.Unmarshal(body, &d); code != http.StatusOK || err != nil {
		t.Fatalf("GET /grid/pools/chromium: %d %s (%v)", code, body, err)
	}
	got := map[string]string{}
	for _, w := range d.WorkerStatuses {
		got[w.ID] = w.PlaywrightVersion
	}
	if !slices.Equal(d.Versions, []string{"1.64", "1.65"}) || got["a"] != "1.64" || got["b"] != "1.65" || len(d.WorkerStatuses) != 2 {
		t.Fatalf("GET /grid/pools/chromium: %s", body)
	}
	code, body = c.admin(http.MethodGet, "/grid/pools")
	if code != http.StatusOK || strings.Count(string(body), `"pool"`) != 1 || !strings.Contains(string(body), `"versions"`) {
		t.Fatalf("GET /grid/pools: %d %s, want the one pool chromium with its versions", code, body)
	}
	if code, body := c.admin(http.MethodPost, "/grid/pools/chromium/workers/b/drain"); code != http.StatusOK {
		t.Fatalf("draining b through the admin API: %d %s", code, body)
	}
	if cmd := g.info(p65, "b").Command; cmd != registry.CommandShutdown {
		t.Fatalf("b's command after the admin drain: %q", cmd)
	}

	// version_routing off: the 1.63 client is served by some worker.
	c.reload(site("version_routing off"))
	before = lifetimes()
	s, err = dialAs(ctx, u, ua163)
	if err != nil {
		t.Fatalf("a 1.63 client with version_routing off: %v, want served", err)
	}
	s.close()
	if got := lifetimes(); got[0]+got[1] != before[0]+before[1]+1 {
		t.Fatalf("lifetimes %v after one session with version_routing off, want one more than %v", got, before)
	}
}

// zrangeCalls reads how many ZRANGE commands Redis has run (the read of a
// pool's versions).
func zrangeCalls(t *testing.T, r *testenv.Redis) int {
	t.Helper()
	s, err := r.Client().Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(s, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_zrange:calls="); ok {
			n, _ := strconv.Atoi(strings.SplitN(rest, ",", 2)[0])
			return n
		}
	}
	return 0
}

// TestUnknownVersionFloodReadsRedisBoundedly: clients of a version no worker
// serves all get 428, but they cannot make an instance read the pool's
// versions from Redis once per request: the reads are bounded per second,
// whatever the request rate.
func TestUnknownVersionFloodReadsRedisBoundedly(t *testing.T) {
	g := newGrid(t)
	g.worker(registry.GroupPool("chromium", "1.64"), "a", fake.Behavior{})
	c := startCaddy(t, caddyOpts{redisURL: g.redis.URL(), site: `
	route /playwright/* {
		browser_grid chromium
	}`})
	u := c.url("/playwright/chromium")
	ctx := context.Background()
	const n = 200
	before, start := zrangeCalls(t, g.redis), time.Now()
	for i := range n {
		_, err := dialAs(ctx, u, fmt.Sprintf("Playwright/1.%d.0 (x64; debian 12) node/20.20", 100+i))
		if he := refusal(err); he == nil || he.StatusCode != http.StatusPreconditionRequired {
			t.Fatalf("request %d: %v, want 428", i, err)
		}
	}
	took := time.Since(start)
	reads := zrangeCalls(t, g.redis) - before
	// One read per versionsRecheck at most, plus the first.
	if limit := int(took/(250*time.Millisecond)) + 2; reads > limit {
		t.Fatalf("%d requests of unknown versions in %v made %d reads of the versions; want at most %d", n, took, reads, limit)
	}
	t.Logf("%d requests of unknown versions in %v: %d reads of the pool's versions", n, took.Round(time.Millisecond), reads)
}
