package caddygrid_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/cmd/fakebrowser/fake"
	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
)

// TestFailedConfigRequestKeepsRunningLimits: a request of a config whose
// load failed (served by its routes while the load was under way, held
// here at an auth check until the failure rolled Caddy back) does not
// claim through the running config's backend once its config is cleaned
// up: it would bring the failed config's limits, newer than the running
// config's, and they would win in Redis (newest configuration wins) over
// the config the operator is left running. It is refused with a 503 and
// the running config's max_concurrent 1 stays in force.
func TestFailedConfigRequestKeepsRunningLimits(t *testing.T) {
	g := newGrid(t)
	g.worker("chromium", "w1", fake.Behavior{})
	c, f := startFailingLoad(t, g)
	f.releaseLoader()
	if code := <-f.loaded; code == http.StatusOK {
		t.Fatal("the load with a failing loader succeeded")
	}
	f.releaseAuth()
	if res := <-f.done; res.err != nil || res.code != http.StatusServiceUnavailable {
		t.Errorf("the failed config's request after Caddy rolled back: %d %v; want a 503", res.code, res.err)
	}
	testenv.Eventually(t, 10*time.Second, "the worker free", func() bool {
		return g.info("chromium", "w1").Active == 0
	})
	runningLimitsInForce(t, c)
}

// TestFailedConfigServedLimitsDoNotStay: a request of a config whose load
// failed, served while that config was live (its auth check answered
// before the loader failed), stores the failed config's limits in Redis
// with its newer configuration time. Once Caddy rolled back, the running
// config's limits are in force again from its next claim, not the failed
// config's max_concurrent 5 until an operator changes them.
func TestFailedConfigServedLimitsDoNotStay(t *testing.T) {
	g := newGrid(t)
	w := g.worker("chromium", "w1", fake.Behavior{})
	c, f := startFailingLoad(t, g)
	f.serveThenFail(t, g, w, 1)
	runningLimitsInForce(t, c)
	if mc := g.limits("chromium").MaxConcurrent; mc != 1 {
		t.Errorf("the pool's max_concurrent after the running config's claims: %d, want its 1", mc)
	}
}

// runningLimitsInForce checks that the running config's max_concurrent 1
// holds on the pool's one worker: a second session is not served.
func runningLimitsInForce(t *testing.T, c *caddy) {
	t.Helper()
	u := c.url("/playwright/chromium")
	first := mustDial(t, u)
	defer first.close()
	if s, err := dial(context.Background(), u); err == nil {
		s.close()
		t.Fatal("a second session on the worker was served: the failed config's max_concurrent 5 is in force, want the running config's 1")
	}
}

type upgradeResult struct {
	code int
	err  error
}

// failingLoad is a config load under way whose loader will fail, with one
// request of that config held at its auth check.
type failingLoad struct {
	// loaded gets the load's status once the loader answered.
	loaded chan int
	// done gets what the held request's client got once it is let go.
	done                       chan upgradeResult
	releaseAuth, releaseLoader func()
}

// serveThenFail lets the held request of the failed config through: it is
// served (101), the worker w counts it as its sessions-th session and the
// pool stores the failed config's max_concurrent 5. Then the loader fails,
// and serveThenFail returns once the session has ended (w1 free).
func (f *failingLoad) serveThenFail(t *testing.T, g *grid, w *fake.Server, sessions int) {
	t.Helper()
	f.releaseAuth()
	if res := <-f.done; res.err != nil || res.code != http.StatusSwitchingProtocols {
		t.Fatalf("the failed config's request while it was live: %d %v; want it served (101)", res.code, res.err)
	}
	testenv.Eventually(t, 10*time.Second, "the worker counting the session", func() bool {
		return w.Stats().Sessions == int64(sessions)
	})
	if mc := g.limits("chromium").MaxConcurrent; mc != 5 {
		t.Fatalf("the pool's max_concurrent after the failed config's session: %d, want its 5", mc)
	}
	f.releaseLoader()
	if code := <-f.loaded; code == http.StatusOK {
		t.Fatal("the load with a failing loader succeeded")
	}
	testenv.Eventually(t, 10*time.Second, "the worker free", func() bool {
		return g.info("chromium", "w1").Active == 0
	})
}

// startFailingLoad starts Caddy with the running config (max_concurrent 1
// on /playwright/*), then loads a config with max_concurrent 5 on /n/*,
// behind an auth check, whose config loader will answer 400; it returns
// once a request of that config is held at the auth check (the loader is
// held too, so that config is live until releaseLoader).
func startFailingLoad(t *testing.T, g *grid) (*caddy, *failingLoad) {
	t.Helper()
	return startFailingLoadWith(t, g, "", nil)
}

// startFailingLoadWith is startFailingLoad with more routes in the running
// config (runningSites, not in the failed one) and between, when not nil,
// called once Caddy runs the running config, before the failing load.
func startFailingLoadWith(t *testing.T, g *grid, runningSites string, between func(c *caddy)) (*caddy, *failingLoad) {
	t.Helper()
	running := caddyOpts{redisURL: g.redis.URL(), site: `
	route /playwright/* {
		browser_grid chromium {
			max_concurrent 1
			select_timeout 1s
		}
	}` + runningSites}
	c := startCaddy(t, running)
	if between != nil {
		between(c)
	}
	return c, beginFailingLoad(t, c, running)
}

// beginFailingLoad loads into c, running the config running, the failed
// config of startFailingLoad and returns once a request of it is held at
// its auth check.
func beginFailingLoad(t *testing.T, c *caddy, running caddyOpts) *failingLoad {
	t.Helper()
	authAddr, asked, releaseAuth := heldServer(t, http.StatusOK)
	loaderAddr, loaderAsked, releaseLoader := heldServer(t, http.StatusBadRequest)
	failed := running
	failed.site = fmt.Sprintf(`
	route /n/* {
		forward_auth %s {
			uri /check
		}
		browser_grid chromium {
			max_concurrent 5
			select_timeout 2s
		}
	}`, authAddr)
	f := &failingLoad{loaded: make(chan int, 1), done: make(chan upgradeResult, 64),
		releaseAuth: releaseAuth, releaseLoader: releaseLoader}
	go func() {
		code, _ := loadWithFailingLoader(t, c, failed, loaderAddr)
		f.loaded <- code
	}()
	select {
	case <-loaderAsked:
	case <-time.After(20 * time.Second):
		t.Fatal("the failed config's loader was never asked")
	}
	// Both configs' servers accept on the port now: try, each time on a
	// new connection, until a request reaches the failed config's auth
	// check (the running config answers 404).
	noKeepAlive := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	upgrade := func() upgradeResult {
		req, err := http.NewRequest(http.MethodGet, "http://"+c.addr()+"/n/chromium", nil)
		if err != nil {
			return upgradeResult{err: err}
		}
		req.Header.Set("Connection", "Upgrade")
		req.Header.Set("Upgrade", "websocket")
		req.Header.Set("Sec-WebSocket-Version", "13")
		req.Header.Set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
		resp, err := noKeepAlive.Do(req)
		if err != nil {
			return upgradeResult{err: err}
		}
		resp.Body.Close() // a served session ends here
		return upgradeResult{code: resp.StatusCode}
	}
	deadline := time.Now().Add(20 * time.Second)
	for reached := false; !reached; {
		if time.Now().After(deadline) {
			t.Fatal("no request reached the failed config's auth check")
		}
		go func() { f.done <- upgrade() }()
		select {
		case <-asked:
			reached = true
		case res := <-f.done:
			if res.code == http.StatusSwitchingProtocols {
				t.Fatal("a request of the failed config served before its auth check answered")
			}
		}
	}
	return f
}

// TestFailedConfigDoesNotRaiseOtherPools: a failed config that served a
// session on one pool (chromium, its own max_concurrent 5) must not make
// the running config's limits of another pool, which the failed config
// never served (nor even routed to), win over a newer configuration of
// that pool from another Caddy instance sharing the Redis. Instance B is
// loaded after A's running config, before A's failed reload, with
// firefox max_concurrent 3; once A rolled back, A's firefox claims carry
// A's older configuration time and run under B's 3, as they did before
// the failed reload.
func TestFailedConfigDoesNotRaiseOtherPools(t *testing.T) {
	g := newGrid(t)
	w := g.worker("chromium", "w1", fake.Behavior{})
	g.worker("firefox", "f1", fake.Behavior{})
	firefox := func(mc int) string {
		return fmt.Sprintf(`
	route /f/* {
		browser_grid firefox {
			max_concurrent %d
			select_timeout 1s
		}
	}`, mc)
	}
	c, f := startFailingLoadWith(t, g, firefox(1), func(*caddy) {
		time.Sleep(20 * time.Millisecond) // B's configuration is newer by more than a millisecond
		b := startCaddy(t, caddyOpts{redisURL: g.redis.URL(), site: firefox(3)})
		mustDial(t, b.url("/f/firefox")).close()
		if mc := g.limits("firefox").MaxConcurrent; mc != 3 {
			t.Fatalf("firefox max_concurrent after instance B's claim: %d, want B's 3", mc)
		}
	})
	f.serveThenFail(t, g, w, 1)
	s := mustDial(t, c.url("/f/firefox")) // A's claim on firefox, after the rollback
	defer s.close()
	if mc := g.limits("firefox").MaxConcurrent; mc != 3 {
		t.Errorf("firefox max_concurrent after A's claim: %d, want instance B's newer 3 (A's running config is older; its failed reload never touched firefox)", mc)
	}
	// chromium: the fix this guards stays (the running config's 1 again).
	runningLimitsInForce(t, c)
	if out := c.proc.Output(); strings.Count(out, "stored limits of its own") != 1 || !strings.Contains(out, `"pools":["chromium"]`) {
		t.Errorf("want one warning naming the pool chromium only; Caddy's output:\n%s", out)
	}
}

// TestFailedConfigHandsBackToNewerInstance: instance B configures chromium
// (max_concurrent 3) after A's running config (1) and before A's reload
// that fails after serving a session with 5. Once A rolled back, its next
// claim puts its 1 back in place of the failed config's 5, and B's newer
// 3 wins again at B's next claim, for A's claims too: the pool runs as it
// did before the failed reload. (A's running limits once outranked the
// failed config's time instead, and so B's newer ones for good.)
func TestFailedConfigHandsBackToNewerInstance(t *testing.T) {
	g := newGrid(t)
	w := g.worker("chromium", "w1", fake.Behavior{})
	var b *caddy
	c, f := startFailingLoadWith(t, g, "", func(*caddy) {
		time.Sleep(20 * time.Millisecond) // B's configuration is newer by more than a millisecond
		b = startCaddy(t, caddyOpts{redisURL: g.redis.URL(), site: `
	route /playwright/* {
		browser_grid chromium {
			max_concurrent 3
			select_timeout 1s
		}
	}`})
		mustDial(t, b.url("/playwright/chromium")).close()
		if mc := g.limits("chromium").MaxConcurrent; mc != 3 {
			t.Fatalf("max_concurrent after instance B's claim: %d, want B's 3", mc)
		}
	})
	f.serveThenFail(t, g, w, 2)
	runningLimitsInForce(t, c) // A's 1 replaced the failed config's 5
	testenv.Eventually(t, 10*time.Second, "the worker free", func() bool {
		return g.info("chromium", "w1").Active == 0
	})
	mustDial(t, b.url("/playwright/chromium")).close()
	if mc := g.limits("chromium").MaxConcurrent; mc != 3 {
		t.Fatalf("max_concurrent after B's next claim: %d, want B's newer 3 (A's running config is older)", mc)
	}
	u := c.url("/playwright/chromium")
	for i := range 3 {
		s, err := dial(context.Background(), u)
		if err != nil {
			t.Fatalf("A's session %d of 3 under B's max_concurrent 3: %v", i+1, err)
		}
		defer s.close()
	}
	if mc := g.limits("chromium").MaxConcurrent; mc != 3 {
		t.Errorf("max_concurrent after A's claims: %d, want B's 3", mc)
	}
}

// TestTwoFailedReloadsHandBack: two reloads in a row fail after each
// served a session with the same limits of its own (max_concurrent 5),
// with no claim of the running config in between. The second failed
// config's claim finds its limits already stored (by the first, with the
// first's time), so it stored nothing: the pool's limits still carry the
// first failed config's time. The running config's claims must still put
// its max_concurrent 1 back, although they supersede the second failed
// config's time. (They supersede only the newest failed time, and the
// stored limits kept the first's: the failed config's 5 stayed in force.)
func TestTwoFailedReloadsHandBack(t *testing.T) {
	g := newGrid(t)
	w := g.worker("chromium", "w1", fake.Behavior{})
	c, f := startFailingLoad(t, g)
	running := caddyOpts{redisURL: g.redis.URL(), site: `
	route /playwright/* {
		browser_grid chromium {
			max_concurrent 1
			select_timeout 1s
		}
	}`}
	for i := range 2 {
		if i > 0 {
			time.Sleep(20 * time.Millisecond) // the second failed config is newer by more than a millisecond
			f = beginFailingLoad(t, c, running)
		}
		f.serveThenFail(t, g, w, i+1)
	}
	runningLimitsInForce(t, c)
	if mc := g.limits("chromium").MaxConcurrent; mc != 1 {
		t.Errorf("max_concurrent after the running config's claims: %d, want its 1", mc)
	}
}

// firefoxOnlyBesideB starts instance A, whose running config routes
// firefox only (max_concurrent 1), then instance B, configured later, with
// chromium max_concurrent 3; each serves one session. It returns A, A's
// running config and B.
func firefoxOnlyBesideB(t *testing.T, g *grid) (a *caddy, running caddyOpts, b *caddy) {
	t.Helper()
	running = caddyOpts{redisURL: g.redis.URL(), site: `
	route /f/* {
		browser_grid firefox {
			max_concurrent 1
			select_timeout 1s
		}
	}`}
	a = startCaddy(t, running)
	mustDial(t, a.url("/f/firefox")).close()
	time.Sleep(20 * time.Millisecond) // B's configuration is newer by more than a millisecond
	b = startCaddy(t, caddyOpts{redisURL: g.redis.URL(), site: `
	route /playwright/* {
		browser_grid chromium {
			max_concurrent 3
			select_timeout 1s
		}
	}`})
	mustDial(t, b.url("/playwright/chromium")).close()
	return a, running, b
}

// TestFailedConfigPoolNotServedByRunning: a failed config served a session
// on a pool the running config does not route at all (chromium; the
// running config serves firefox only), with its own max_concurrent 5,
// newer than instance B's chromium 3. The running config never claims for
// chromium, so only dropping what the failed config stored hands the pool
// back: B's 3 is in force again from B's next claim, not the failed 5 for
// good.
func TestFailedConfigPoolNotServedByRunning(t *testing.T) {
	g := newGrid(t)
	w := g.worker("chromium", "w1", fake.Behavior{})
	g.worker("firefox", "f1", fake.Behavior{})
	c, running, b := firefoxOnlyBesideB(t, g)
	time.Sleep(20 * time.Millisecond) // the failed config is newer than B's by more than a millisecond
	f := beginFailingLoad(t, c, running)
	f.serveThenFail(t, g, w, 2)
	// The drop runs in the background once Caddy rolled back: B's claims
	// run under the failed 5 until it has.
	testenv.Eventually(t, 10*time.Second, "B's max_concurrent 3 in force on chromium", func() bool {
		mustDial(t, b.url("/playwright/chromium")).close()
		return g.limits("chromium").MaxConcurrent == 3
	})
	if !c.proc.WaitOutput("dropping what it stored", 5*time.Second) {
		t.Error("Caddy did not log that it drops the failed config's limits")
	}
}

// TestFailedConfigQueuedClaimAfterDrop: a request of the failed config
// that is waiting in the queue (no worker free) when Caddy rolls back
// keeps claiming through the backend it holds, with the failed config's
// limits and time. When a worker frees after the drop (ForgetLimits), its
// claim finds no limits stored and stores the failed config's 5 again with
// the failed time, newer than B's 3; the running config never claims for
// chromium, so nothing supersedes them: B's claims ran under 5 for good.
// Such a request is now answered 503 once its config is known failed, as
// one that had not claimed yet (TestFailedConfigRequestKeepsRunningLimits).
func TestFailedConfigQueuedClaimAfterDrop(t *testing.T) {
	g := newGrid(t)
	g.worker("chromium", "w1", fake.Behavior{})
	g.worker("firefox", "f1", fake.Behavior{})
	c, running, b := firefoxOnlyBesideB(t, g)
	if err := g.reg.SetDraining(context.Background(), "chromium", "w1"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	f := beginFailingLoad(t, c, running)
	f.releaseAuth() // its claim finds no worker: it waits in the queue (select_timeout 2s)
	testenv.Eventually(t, 10*time.Second, "the failed config's claim storing its max_concurrent 5", func() bool {
		return g.limits("chromium").MaxConcurrent == 5
	})
	f.releaseLoader()
	if code := <-f.loaded; code == http.StatusOK {
		t.Fatal("the load with a failing loader succeeded")
	}
	if !c.proc.WaitOutput("dropping what it stored", 5*time.Second) {
		t.Fatal("Caddy did not log that it drops the failed config's limits")
	}
	testenv.Eventually(t, 10*time.Second, "the failed config's limits dropped", func() bool {
		return g.limits("chromium").MaxConcurrent == 0
	})
	w2 := g.worker("chromium", "w2", fake.Behavior{})
	if res := <-f.done; res.err != nil || res.code != http.StatusServiceUnavailable {
		t.Errorf("the failed config's queued request after Caddy rolled back: %d %v; want a 503", res.code, res.err)
	}
	if n := w2.Stats().Sessions; n != 0 {
		t.Errorf("the failed config's queued request was served after Caddy rolled back (%d sessions)", n)
	}
	mustDial(t, b.url("/playwright/chromium")).close()
	if mc := g.limits("chromium").MaxConcurrent; mc != 3 {
		t.Errorf("max_concurrent after B's claim: %d, want B's 3 (the failed config's limits came back after the drop)", mc)
	}
}
