package caddygrid_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/cmd/fakebrowser/fake"
	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
)

// A config stores its new limits as it starts (App.storeLimits), before
// it serves anything. When it then fails (a failing admin.config.load
// loader: Caddy goes back to the config that ran before), what it stored
// must be dropped wherever it stored it, whatever config Caddy goes back
// to; otherwise its newer limits stay in force over every instance's.

// mcSite serves pool under /<route>/* with max_concurrent mc.
func mcSite(route, pool string, mc int) string {
	return fmt.Sprintf(`
	route /%s/* {
		browser_grid %s {
			max_concurrent %d
			select_timeout 1s
		}
	}`, route, pool, mc)
}

// servedAtOnce opens n sessions on u at once, holds those served until
// all have answered, and returns how many were served.
func servedAtOnce(u string, n int) int {
	var mu sync.Mutex
	var held []*session
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if s, err := dial(context.Background(), u); err == nil {
				mu.Lock()
				held = append(held, s)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	for _, s := range held {
		s.close()
	}
	return len(held)
}

// failLoad loads o into c through a config loader that fails once every
// app has started, and returns when Caddy has gone back; what the pool
// chromium ran under while o was live is returned.
func failLoad(t *testing.T, g *grid, c *caddy, o caddyOpts) int {
	t.Helper()
	addr, asked, release := heldServer(t, http.StatusBadRequest)
	loaded := make(chan int, 1)
	go func() {
		code, _ := loadWithFailingLoader(t, c, o, addr)
		loaded <- code
	}()
	<-asked // o's apps have all started
	live := g.limits("chromium").MaxConcurrent
	release()
	if code := <-loaded; code == http.StatusOK {
		t.Fatal("the load with a failing loader succeeded")
	}
	return live
}

// TestFailedConfigOnAnotherURLOfTheRedisDropsItsLimits: the failed config
// names the same Redis by another URL (a read_timeout added), so Caddy
// keeps a client of its own for it. Its max_concurrent 5, stored as it
// started, used to stay in force after Caddy went back to the running
// config's 1: 5 of 5 sessions were then served at once on one worker.
func TestFailedConfigOnAnotherURLOfTheRedisDropsItsLimits(t *testing.T) {
	g := newGrid(t)
	g.worker("chromium", "w1", fake.Behavior{})
	running := caddyOpts{redisURL: g.redis.URL(), site: mcSite("playwright", "chromium", 1)}
	c := startCaddy(t, running)
	mustDial(t, c.url("/playwright/chromium")).close()
	failed := caddyOpts{redisURL: g.redis.URL() + "?read_timeout=10s", site: mcSite("n", "chromium", 5)}
	if live := failLoad(t, g, c, failed); live != 5 {
		t.Fatalf("the pool's max_concurrent while the failing config was live: %d, want its 5 (stored as it started)", live)
	}
	time.Sleep(time.Second) // the drop runs in the background
	served := servedAtOnce(c.url("/playwright/chromium"), 5)
	t.Logf("after the failed load: 5 sessions tried at once, %d served; pool max_concurrent %d", served, g.limits("chromium").MaxConcurrent)
	if served != 1 {
		t.Fatalf("%d sessions served at once on one worker, want 1: the failed config's max_concurrent 5 stayed in force", served)
	}
}

// TestFailedFirstGridConfigDropsItsLimits: instance X serves chromium
// with max_concurrent 1; instance Y, running a config without a grid app,
// loads its first grid config (max_concurrent 5), which fails after it
// started. Y's 5 used to stay in force for X: 5 of 5 served at once.
func TestFailedFirstGridConfigDropsItsLimits(t *testing.T) {
	g := newGrid(t)
	g.worker("chromium", "w1", fake.Behavior{})
	x := startCaddy(t, caddyOpts{redisURL: g.redis.URL(), site: mcSite("playwright", "chromium", 1)})
	mustDial(t, x.url("/playwright/chromium")).close()
	plain := caddyOpts{redisURL: g.redis.URL(), site: "\trespond \"no grid here\""}
	y := startCaddy(t, plain)
	loadWithoutGrid(t, y, plain)
	if live := failLoad(t, g, y, caddyOpts{redisURL: g.redis.URL(), site: mcSite("n", "chromium", 5)}); live != 5 {
		t.Fatalf("the pool's max_concurrent while Y's failing config was live: %d, want its 5", live)
	}
	time.Sleep(time.Second)
	served := servedAtOnce(x.url("/playwright/chromium"), 5)
	t.Logf("after Y's failed load: 5 sessions tried at once on X, %d served; pool max_concurrent %d", served, g.limits("chromium").MaxConcurrent)
	if served != 1 {
		t.Fatalf("%d sessions served at once on one worker under X's max_concurrent 1, want 1", served)
	}
}

// loadWithoutGrid loads o into c with its grid app taken out.
func loadWithoutGrid(t *testing.T, c *caddy, o caddyOpts) {
	t.Helper()
	code, body := loadEdited(t, c, o, func(cfg map[string]any) {
		delete(cfg["apps"].(map[string]any), "grid")
	})
	if code != http.StatusOK {
		t.Fatalf("loading the config without a grid app: %d %s", code, body)
	}
}

// TestReplacedConfigStopsStoringLimits: a config naming 12 pools on a
// stalled Redis is replaced at once by one on another Redis. Its storing
// ends with it; it used to go on calling the stalled Redis pool by pool
// (2 s each), logging a warning per pool for 24 s, and would have stored
// the limits of a config no longer running had that Redis come back.
func TestReplacedConfigStopsStoringLimits(t *testing.T) {
	g1, g2 := newGrid(t), newGrid(t)
	g1.worker("chromium", "w1", fake.Behavior{})
	var site strings.Builder
	for i := range 12 {
		g2.worker(fmt.Sprintf("p%d", i), "w1", fake.Behavior{})
		site.WriteString(mcSite(fmt.Sprintf("p%d", i), fmt.Sprintf("p%d", i), 1))
	}
	c := startCaddy(t, caddyOpts{redisURL: g1.redis.URL(), site: mcSite("playwright", "chromium", 1)})
	g2.redis.Stall(10 * time.Second)
	time.Sleep(100 * time.Millisecond)
	c.reload(caddyOpts{redisURL: g2.redis.URL(), site: site.String()})
	c.reload(caddyOpts{redisURL: g1.redis.URL(), site: mcSite("playwright", "chromium", 2)})
	time.Sleep(5 * time.Second)
	if n := strings.Count(c.proc.Output(), "could not store this config's new limits"); n != 0 {
		t.Fatalf("%d warnings of a replaced config's storing within 5 s of its replacement, want 0: it went on calling the stalled Redis", n)
	}
}

// TestQuickSecondReloadKeepsStoringTheFirstsLimits: a reload lowering
// max_concurrent to 1 is followed at once by another that keeps it (and
// changes something else) while the first is still storing (its Redis
// slow to answer). The second takes the limits' time over from the first
// and so has nothing new to store; the first's storing used to end when
// it was replaced, and the pool stayed at the older instance X's 3 until
// Y claimed there: 3 of 3 sessions at once on one worker.
func TestQuickSecondReloadKeepsStoringTheFirstsLimits(t *testing.T) {
	g := newGrid(t)
	g.worker("chromium", "w1", fake.Behavior{})
	p := startRedisProxy(t, g.redis.Addr)
	x := startCaddy(t, caddyOpts{redisURL: g.redis.URL(), site: mcSite("playwright", "chromium", 3)})
	mustDial(t, x.url("/playwright/chromium")).close()
	y := func(mc int, extra string) caddyOpts {
		return caddyOpts{redisURL: "redis://" + p.addr() + "/0", global: "reaper_interval off",
			site: mcSite("playwright", "chromium", mc) + extra}
	}
	c := startCaddy(t, y(3, ""))
	held := p.holdReplies(":versions") // the first reload's store reads the pool's versions
	c.reload(y(1, ""))
	select {
	case <-held:
	case <-time.After(5 * time.Second):
		t.Fatal("the reload's store did not read the pool's versions")
	}
	c.reload(y(1, "\n\trespond /other \"other\""))
	p.release()
	testenv.Eventually(t, 5*time.Second, "Y's newest max_concurrent 1 stored", func() bool {
		return g.limits("chromium").MaxConcurrent == 1
	})
	if served := servedAtOnce(x.url("/playwright/chromium"), 3); served != 1 {
		t.Fatalf("%d sessions served at once on one worker under Y's newest max_concurrent 1, want 1", served)
	}
}
