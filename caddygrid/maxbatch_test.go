package caddygrid_test

import (
	"strings"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
)

// TestMaxBatchReaches: the grid option max_batch reaches the registry
// that sends the claims, and a reload that changes it (or drops it: the
// default) changes it there, although the registry outlives the reload.
func TestMaxBatchReaches(t *testing.T) {
	g := newGrid(t)
	opts := func(global string) caddyOpts {
		return caddyOpts{redisURL: g.redis.URL(), global: global, site: `
	route /playwright/* {
		browser_grid chromium
	}`}
	}
	c := startCaddy(t, opts("max_batch 1"))
	started := func(want string) {
		t.Helper()
		testenv.Eventually(t, 20*time.Second, "grid started with "+want, func() bool {
			lines := strings.Split(c.proc.Output(), "\n")
			for i := len(lines) - 1; i >= 0; i-- {
				if strings.Contains(lines[i], `"grid started"`) {
					return strings.Contains(lines[i], want)
				}
			}
			return false
		})
	}
	started(`"max_batch":1}`)
	c.reload(opts("max_batch 8"))
	started(`"max_batch":8}`)
	c.reload(opts(""))
	started(`"max_batch":32}`)
}
