package caddygrid_test

import (
	"context"
	"testing"

	"github.com/browsergrid/caddy-browser-grid/registry"
	"github.com/browsergrid/caddy-browser-grid/workeragent"
)

// TestEachBrowserTypeGoesToItsOwnPool: with the pool taken from the path
// (browsers chromium, firefox and webkit by default), a client of
// /playwright/firefox is served by the firefox worker and one of
// /playwright/webkit by the webkit worker, never the other's.
func TestEachBrowserTypeGoesToItsOwnPool(t *testing.T) {
	t.Parallel()
	g := newGrid(t)
	for _, b := range []string{"chromium", "firefox", "webkit"} {
		g.agent(b, func(c *workeragent.Config) { c.BrowserType = b })
	}
	c := startCaddy(t, caddyOpts{redisURL: g.redis.URL(), site: site("max_concurrent 2")})
	for _, b := range []string{"firefox", "webkit", "chromium"} {
		s := mustDial(t, c.url("/playwright/"+b))
		sess, ok, err := g.reg.GetSession(context.Background(), b, s.resp.Header.Get(registry.HeaderSession))
		if err != nil || !ok {
			t.Fatalf("the %s session is not in pool %s: %v %v", b, b, ok, err)
		}
		ws := g.workers(b)
		if len(ws) != 1 || ws[0].ID != sess.Worker || ws[0].Browser != b {
			t.Errorf("the %s session went to worker %s; the pool's workers: %+v", b, sess.Worker, ws)
		}
		s.close()
	}
}
