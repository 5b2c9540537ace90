package caddygrid_test

import (
	"context"
	"fmt"
	"net/http"
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
	authAddr, asked, releaseAuth := heldServer(t, http.StatusOK)
	// The config loader of the failed config answers 400, once a request
	// of that config reached its auth check.
	loaderAddr, loaderAsked, releaseLoader := heldServer(t, http.StatusBadRequest)

	running := caddyOpts{redisURL: g.redis.URL(), site: `
	route /playwright/* {
		browser_grid chromium {
			max_concurrent 1
			select_timeout 1s
		}
	}`}
	c := startCaddy(t, running)
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
	loaded := make(chan int, 1)
	go func() {
		code, _ := loadWithFailingLoader(t, c, failed, loaderAddr)
		loaded <- code
	}()
	select {
	case <-loaderAsked:
	case <-time.After(20 * time.Second):
		t.Fatal("the failed config's loader was never asked")
	}
	// Both configs' servers accept on the port now: try, each time on a
	// new connection, until a request reaches the failed config's auth
	// check (the running config answers 404).
	type upgradeResult struct {
		code int
		err  error
	}
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
	done := make(chan upgradeResult, 64)
	deadline := time.Now().Add(20 * time.Second)
	for reached := false; !reached; {
		if time.Now().After(deadline) {
			t.Fatal("no request reached the failed config's auth check")
		}
		go func() { done <- upgrade() }()
		select {
		case <-asked:
			reached = true
		case res := <-done:
			if res.code == http.StatusSwitchingProtocols {
				t.Fatal("a request of the failed config served before its auth check answered")
			}
		}
	}
	releaseLoader()
	if code := <-loaded; code == http.StatusOK {
		t.Fatal("the load with a failing loader succeeded")
	}
	releaseAuth()
	if res := <-done; res.err != nil || res.code != http.StatusServiceUnavailable {
		t.Errorf("the failed config's request after Caddy rolled back: %d %v; want a 503", res.code, res.err)
	}
	testenv.Eventually(t, 10*time.Second, "the worker free", func() bool {
		return g.info("chromium", "w1").Active == 0
	})

	// The running config's max_concurrent 1: a second session is not served.
	u := c.url("/playwright/chromium")
	first := mustDial(t, u)
	defer first.close()
	if s, err := dial(context.Background(), u); err == nil {
		s.close()
		t.Fatal("a second session on the worker was served: the failed config's max_concurrent 5 is in force, want the running config's 1")
	}
}
