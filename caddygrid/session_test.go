package caddygrid_test

import (
	"context"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
	"github.com/browsergrid/caddy-browser-grid/registry"
)

// A client's WebSocket reaches a worker and echoes; the 101 answer names
// the session (Grid-Session), which Redis holds while it is open, counted
// on its worker, and not once it has closed.
func TestASessionThroughTheGridReachesAWorkerAndEnds(t *testing.T) {
	t.Parallel()
	g := newGrid(t)
	g.agent("chromium", nil)
	c := startCaddy(t, caddyOpts{redisURL: g.redis.URL(), site: site("max_concurrent 2")})
	s := mustDial(t, c.url("/playwright/chromium"))
	id := s.resp.Header.Get(registry.HeaderSession)
	if id == "" {
		t.Fatal("the 101 answer names no session")
	}
	sess, ok, err := g.reg.GetSession(context.Background(), "chromium", id)
	if err != nil || !ok {
		t.Fatalf("session %s: %v %v", id, ok, err)
	}
	if g.active("chromium") != 1 {
		t.Fatalf("active %d", g.active("chromium"))
	}
	s.close()
	testenv.Eventually(t, 5*time.Second, "the session ends in Redis", func() bool {
		_, ok, _ := g.reg.GetSession(context.Background(), "chromium", sess.ID)
		return !ok && g.active("chromium") == 0
	})
}
