package caddygrid_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
	"github.com/browsergrid/caddy-browser-grid/workeragent"
)

// An operator lowers max_concurrent from 2 to 1 by 'caddy reload' while
// a worker holds two sessions: both go on; new clients are held to the
// new limit (503 while the worker holds one or more), and the agent
// itself refuses a claim past the new limit even when Redis counts the
// worker lower than it is.
func TestLoweringMaxConcurrentByReloadHoldsNewClaimsAndKeepsOpenSessions(t *testing.T) {
	t.Parallel()
	g := newGrid(t)
	ag := g.agent("chromium", func(c *workeragent.Config) {
		// Heartbeats far apart, so that Redis' count stays as the test
		// leaves it for the claim that follows.
		c.HeartbeatInterval = 4 * time.Second
		c.StaleThreshold = 10 * time.Second
	})
	opts := caddyOpts{redisURL: g.redis.URL(), stale: "10s", site: site("max_concurrent 2\n\t\t\tselect_timeout 1s")}
	c := startCaddy(t, opts)
	u := c.url("/playwright/chromium")
	s1, s2 := mustDial(t, u), mustDial(t, u)
	peaks := samplePeaks(ag)

	opts.site = site("max_concurrent 1\n\t\t\tselect_timeout 1s")
	c.reload(opts)
	for _, s := range []*session{s1, s2} {
		if err := s.echo("after the reload"); err != nil {
			t.Fatalf("a session open across the reload broke: %v", err)
		}
	}
	wantBusy := func(what string) {
		t.Helper()
		_, err := dial(context.Background(), u)
		if r := refusal(err); r == nil || r.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("%s: %v, want 503 (max_concurrent is 1 now)", what, err)
		}
	}
	wantBusy("a new client while the worker holds two")
	s2.close()
	testenv.Eventually(t, 5*time.Second, "the second session ends", func() bool { return ag.active(t) == 1 && g.active("chromium") == 1 })
	wantBusy("a new client while the worker holds one")

	// Redis loses s1's claim until the agent's next heartbeat: the claim
	// that follows reaches the agent, which holds it to the limit the
	// claim carries.
	rs := g.sessionOf("chromium", s1)
	g.justAfterHeartbeat("chromium", rs.Worker)
	if _, err := g.reg.GiveBack(context.Background(), "chromium", rs.Worker, false, 0, rs.ID); err != nil {
		t.Fatal(err)
	}
	wantBusy("a new client Redis lets through")
	if got := c.metric(`caddy_grid_agent_refusals_total{pool="chromium",reason="full"}`); got != 1 {
		t.Errorf("the agent refused %v claims as full, want 1", got)
	}
	if err := s1.echo("still here"); err != nil {
		t.Errorf("the first session broke: %v", err)
	}
	s1.close()
	testenv.Eventually(t, 5*time.Second, "the worker is idle", func() bool { return ag.active(t) == 0 })
	s3 := mustDial(t, u)
	defer s3.close()
	wantBusy("a second client at once under the new limit")
	for id, n := range peaks.finish() {
		if n > 2 {
			t.Errorf("worker %s held %d sessions at once", id, n)
		}
	}
}
