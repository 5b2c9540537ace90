package caddygrid_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/caddygrid"
	"github.com/browsergrid/caddy-browser-grid/cmd/fakebrowser/fake"
	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
)

// TestReloadWithLiveSessions: sessions open across 'caddy reload' keep
// working (stream_close_delay defaults to an hour), and each claim is
// released exactly once when its socket closes, whichever config claimed
// it. A config with a short stream_close_delay closes its sessions that
// long after being replaced, and releases them exactly once too.
//
// "Exactly once" is read from two independent counts: the release
// counter of Caddy's metrics (one per ended claim) and the session
// durations Redis records per worker (one per release of a live lease;
// a second release of the same lease would record nothing but would show
// in the counter).
func TestReloadWithLiveSessions(t *testing.T) {
	g := newGrid(t)
	servers := []*fake.Server{g.worker("chromium", "w1", fake.Behavior{}), g.worker("chromium", "w2", fake.Behavior{})}
	config := func(maxLifetime int, extra string) caddyOpts {
		return caddyOpts{redisURL: g.redis.URL(), site: fmt.Sprintf(`
	route /playwright/* {
		browser_grid chromium {
			policy fair_share
			max_lifetime %d
			%s
		}
	}`, maxLifetime, extra)}
	}
	c := startCaddy(t, config(100, ""))
	open := func(n int) []*session {
		out := make([]*session, n)
		for i := range out {
			out[i] = mustDial(t, c.url("/playwright/chromium"))
		}
		return out
	}
	liveSessions := func() int64 { return servers[0].Stats().Active + servers[1].Stats().Active }
	// settled: every session closed, each released once.
	settled := func(sessions int) func() bool {
		return func() bool {
			active, durations, lifetimes := 0, 0, 0
			for _, id := range []string{"w1", "w2"} {
				w := g.info("chromium", id)
				active += w.Active
				durations += len(w.Durations)
				lifetimes += w.Lifetime
			}
			return active == 0 && durations == sessions && lifetimes == sessions
		}
	}
	released := func() float64 {
		return c.metric(`caddy_grid_releases_total{outcome="released",pool="chromium"}`)
	}

	// Three sessions on the first config survive a reload to the second.
	old := open(3)
	c.reload(config(100, "stream_close_delay 300ms"))
	for i, s := range old {
		if err := s.echo("after reload"); err != nil {
			t.Fatalf("session %d opened before the reload: %v", i, err)
		}
	}
	fresh := open(2)
	for _, s := range append(old, fresh...) {
		s.close()
	}
	testenv.Eventually(t, 10*time.Second, "five sessions released once each", settled(5))
	if got := released(); got != 5 {
		t.Fatalf("releases after five sessions = %v, want 5", got)
	}

	// Two sessions on the second config (stream_close_delay 300ms) are
	// closed by Caddy 300ms after a reload to a third, and released.
	doomed := open(2)
	c.reload(config(100, ""))
	for i, s := range doomed {
		i, s := i, s
		testenv.Eventually(t, 10*time.Second, fmt.Sprintf("session %d closed by the replaced config", i), func() bool {
			return s.echo("still there?") != nil
		})
	}
	testenv.Eventually(t, 10*time.Second, "seven sessions released once each", settled(7))
	testenv.Eventually(t, 5*time.Second, "the release counter", func() bool { return released() == 7 })
	if liveSessions() != 0 {
		t.Errorf("%d sessions still open on the workers", liveSessions())
	}
	if got := c.metric(`caddy_grid_releases_total{outcome="undone",pool="chromium"}`); got != 0 {
		t.Errorf("undone claims = %v, want 0", got)
	}
	info, err := g.reg.Inspect(t.Context(), "chromium")
	if err != nil {
		t.Fatal(err)
	}
	if info.Leases != 0 {
		t.Errorf("%d leases left in Redis", info.Leases)
	}
}

// TestFailedReloadKeepsAdminAPI: a reload that fails leaves the running
// config in place, and the admin API keeps answering from it: whether the
// new config fails to provision (a Redis URL that expands to nothing) or
// to start (a site on a port already taken; Caddy starts its apps in
// random order, so the new grid app may have started, and been stopped
// again, before the http app failed).
func TestFailedReloadKeepsAdminAPI(t *testing.T) {
	g := newGrid(t)
	g.worker("chromium", "w1", fake.Behavior{})
	good := caddyOpts{redisURL: g.redis.URL(), site: `
	route /playwright/* {
		browser_grid chromium
	}`}
	c := startCaddy(t, good)
	checkAdmin := func(when string) {
		t.Helper()
		code, body := c.admin(http.MethodGet, "/grid/pools")
		if code != http.StatusOK {
			t.Fatalf("GET /grid/pools %s: %d %s; want 200 from the running config", when, code, body)
		}
		var pools []caddygrid.PoolSummary
		if err := json.Unmarshal(body, &pools); err != nil {
			t.Fatalf("decoding %s: %v", body, err)
		}
		if len(pools) != 1 || pools[0].Pool != "chromium" || pools[0].Workers != 1 {
			t.Fatalf("pools %s: %+v; want chromium with 1 worker", when, pools)
		}
	}
	checkAdmin("before any reload")

	unprovisionable := good
	unprovisionable.redisURL = "{env.CADDYGRID_TEST_UNSET_REDIS_URL}"
	code, out := c.tryReload(unprovisionable)
	if code == 0 || !strings.Contains(out, "empty after expanding placeholders") {
		t.Fatalf("reload with a Redis URL that expands to nothing: exit %d, want a failure naming it:\n%s", code, out)
	}
	checkAdmin("after a reload that failed to provision")

	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	unstartable := good
	// Its lease_ttl must not outlive the failed reload.
	unstartable.global = "lease_ttl 5m"
	unstartable.sites = fmt.Sprintf("http://%s {\n\trespond ok\n}\n", taken.Addr())
	// Each try starts the apps in a new random order; ten tries leave
	// about one chance in a thousand that the grid app never started
	// before the http app failed.
	for i := range 10 {
		code, out := c.tryReload(unstartable)
		if code == 0 || !strings.Contains(out, "address already in use") {
			t.Fatalf("reload with a site on a taken port: exit %d, want a failure naming it:\n%s", code, out)
		}
		checkAdmin(fmt.Sprintf("after reload %d that failed to start", i+1))
	}
	// The running config still serves sessions, with its own lease_ttl
	// (30s by default), not the failed config's 5m.
	s := mustDial(t, c.url("/playwright/chromium"))
	defer s.close()
	leases, err := g.rdb.ZRangeWithScores(context.Background(), "{grid:chromium}:lease_expiry", 0, -1).Result()
	if err != nil || len(leases) != 1 {
		t.Fatalf("leases: %v, %v; want one", leases, err)
	}
	if left := time.Until(time.UnixMilli(int64(leases[0].Score))); left > time.Minute {
		t.Errorf("the session's lease expires in %s: the failed config's lease_ttl 5m is in force, want the running config's 30s", left.Round(time.Second))
	}
}

// TestRetryAfterConfigCleanup: a request of the old config is still
// waiting for its first worker's upgrade when a reload replaces and cleans
// up that config (Caddy does not wait for its requests); the worker never
// answers, so reverse_proxy retries through the old config's policy. The
// retry claims through the backend the session holds and reaches another
// worker; nothing panics.
func TestRetryAfterConfigCleanup(t *testing.T) {
	g := newGrid(t)
	g.worker("chromium", "w1", fake.Behavior{Hang: true})
	config := func(upgradeTimeout string) caddyOpts {
		return caddyOpts{redisURL: g.redis.URL(), site: fmt.Sprintf(`
	route /playwright/* {
		browser_grid chromium {
			upgrade_timeout %s
		}
	}`, upgradeTimeout)}
	}
	c := startCaddy(t, config("3s"))

	type result struct {
		s   *session
		err error
	}
	done := make(chan result, 1)
	go func() {
		s, err := dial(context.Background(), c.url("/playwright/chromium"))
		done <- result{s, err}
	}()
	testenv.Eventually(t, 10*time.Second, "the hanging worker claimed", func() bool {
		return g.info("chromium", "w1").Active == 1
	})
	good := g.worker("chromium", "w2", fake.Behavior{})
	c.reload(config("10s"))

	res := <-done
	if res.err != nil {
		t.Fatalf("the request that retried after its config was cleaned up: %v", res.err)
	}
	res.s.close()
	if good.Stats().Sessions != 1 {
		t.Errorf("the healthy worker served %d sessions, want 1", good.Stats().Sessions)
	}
	if out := c.proc.Output(); strings.Contains(out, "panic") {
		t.Errorf("caddy panicked:\n%s", out)
	}
	testenv.Eventually(t, 10*time.Second, "every claim settled", func() bool {
		return g.info("chromium", "w1").Active == 0 && g.info("chromium", "w2").Active == 0
	})
}

// TestRequestReachingACleanedUpConfig: a request still on its way to the
// grid handler when a reload replaces and cleans up its config (Caddy does
// not wait for its requests; here an auth check holds it) is served
// through the running config's backend when that names the same Redis and
// prefix, not refused; when the running config names another prefix, it
// is refused with a 503 and claims nothing from either.
func TestRequestReachingACleanedUpConfig(t *testing.T) {
	t.Run("same Redis", func(t *testing.T) {
		g, w, res := requestAcrossCleanup(t, "")
		if res.err != nil {
			t.Fatalf("the request whose config was cleaned up on its way: %v", res.err)
		}
		res.s.close()
		if w.Stats().Sessions != 1 {
			t.Errorf("the worker served %d sessions, want 1", w.Stats().Sessions)
		}
		testenv.Eventually(t, 10*time.Second, "the claim released", func() bool {
			return g.info("chromium", "w1").Active == 0
		})
	})
	t.Run("another prefix", func(t *testing.T) {
		g, w, res := requestAcrossCleanup(t, "prefix other")
		if res.err == nil {
			res.s.close()
			t.Fatal("the request was served; want a 503: its config's Redis is no longer in use")
		}
		if !strings.Contains(res.err.Error(), "503") || !strings.Contains(res.err.Error(), "configuration was replaced") {
			t.Fatalf("the request: %v; want a 503 saying the configuration was replaced", res.err)
		}
		if n := w.Stats().Sessions; n != 0 || g.info("chromium", "w1").Lifetime != 0 {
			t.Errorf("worker sessions %d, lifetime %d; want nothing claimed", n, g.info("chromium", "w1").Lifetime)
		}
	})
}

type dialResult struct {
	s   *session
	err error
}

// requestAcrossCleanup holds a session's request at an auth check in
// front of browser_grid, reloads Caddy to a config with newGlobal in its
// grid option (and a longer select_timeout, so the old config is cleaned
// up), then lets the request go on, and returns what the client got.
func requestAcrossCleanup(t *testing.T, newGlobal string) (*grid, *fake.Server, dialResult) {
	g := newGrid(t)
	w := g.worker("chromium", "w1", fake.Behavior{})
	authAddr, asked, release := heldServer(t, http.StatusOK)
	config := func(global, selectTimeout string) caddyOpts {
		return caddyOpts{redisURL: g.redis.URL(), global: global, site: fmt.Sprintf(`
	route /playwright/* {
		forward_auth %s {
			uri /check
		}
		browser_grid chromium {
			select_timeout %s
		}
	}`, authAddr, selectTimeout)}
	}
	c := startCaddy(t, config("", "5s"))
	done := make(chan dialResult, 1)
	go func() {
		s, err := dial(context.Background(), c.url("/playwright/chromium"))
		done <- dialResult{s, err}
	}()
	select {
	case <-asked:
	case <-time.After(10 * time.Second):
		t.Fatal("the request never reached the auth check")
	}
	c.reload(config(newGlobal, "6s"))
	release()
	return g, w, <-done
}
