package caddygrid_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
	"github.com/browsergrid/caddy-browser-grid/workeragent"
)

// Workers whose agent refuses the claim (here: records naming a browser
// the agent does not run, which it refuses as "gone") do not fail the
// client: Caddy tries the next worker, even with dial_retries 0, since a
// refusal is no failure, and the client is served. No refusing worker is
// made suspect, the refusals are counted by reason, and the agent drops
// those records so that claims stop trying them.
func TestAnAgentsRefusalSendsTheSessionElsewhereAndBlamesNoWorker(t *testing.T) {
	t.Parallel()
	g := newGrid(t)
	ag := g.agent("chromium", nil)
	real := ag.status(t).Browsers[0].ID
	var ghosts []string
	for i := range 3 {
		id := fmt.Sprintf("ghost-%d", i)
		g.fakeWorker("chromium", id, ag.Addr(), 100-i)
		ghosts = append(ghosts, id)
	}
	c := startCaddy(t, caddyOpts{redisURL: g.redis.URL(), site: site("max_concurrent 2\n\t\t\tdial_retries 0")})

	s := mustDial(t, c.url("/playwright/chromium"))
	defer s.close()
	if w := g.sessionOf("chromium", s).Worker; w != real {
		t.Fatalf("served by %s, want the agent's browser %s", w, real)
	}
	for _, id := range ghosts {
		// The agent removes a record at its address it runs no browser
		// for (a previous process's); until then it is no suspect.
		if w, ok := g.worker("chromium", id); ok && w.SuspectUntil.After(time.Now()) {
			t.Errorf("%s refused and is suspect until %s: a refusal blames no worker", id, w.SuspectUntil)
		}
	}
	testenv.Eventually(t, 5*time.Second, "the agent removes the records of browsers it does not run", func() bool {
		for _, id := range ghosts {
			if _, ok := g.worker("chromium", id); ok {
				return false
			}
		}
		return true
	})
	if got := c.metric(`caddy_grid_agent_refusals_total{pool="chromium",reason="gone"}`); got != 3 {
		t.Errorf("refusals counted: %v, want 3", got)
	}
	if got := c.metric(`caddy_grid_dial_failures_total{pool="chromium"}`); got != 0 {
		t.Errorf("dial failures counted: %v, want 0", got)
	}
}

// A worker at its own capacity that Redis counts below it (Redis lost a
// session's claim) refuses the next claim as full: the client is served
// by another worker, the full one is not suspect, and its agent's next
// heartbeat restores Redis' count.
func TestAFullAgentRefusesWhatRedisMiscountedAndIsNotBlamed(t *testing.T) {
	t.Parallel()
	g := newGrid(t)
	slow := func(c *workeragent.Config) {
		c.HeartbeatInterval = 4 * time.Second
		c.StaleThreshold = 10 * time.Second
	}
	full := g.agent("chromium", func(c *workeragent.Config) { slow(c); c.MaxConcurrent = 1 })
	c := startCaddy(t, caddyOpts{redisURL: g.redis.URL(), stale: "10s", site: site("max_concurrent 2\n\t\t\tdial_retries 0")})
	fullID := full.status(t).Browsers[0].ID

	// One session served and ended, one live: the full worker leads
	// lifetime_first's order over the worker started next.
	mustDial(t, c.url("/playwright/chromium")).close()
	testenv.Eventually(t, 5*time.Second, "the first session ends", func() bool { return full.active(t) == 0 })
	live := mustDial(t, c.url("/playwright/chromium"))
	defer live.close()
	rs := g.sessionOf("chromium", live)
	if rs.Worker != fullID {
		t.Fatalf("the live session is on %s, want %s", rs.Worker, fullID)
	}
	other := g.agent("chromium", slow)
	otherID := other.status(t).Browsers[0].ID

	// Redis loses the live session's claim, as after a restore from an
	// older snapshot, until the agent's next heartbeat.
	g.justAfterHeartbeat("chromium", fullID)
	if _, err := g.reg.GiveBack(context.Background(), "chromium", fullID, false, 0, rs.ID); err != nil {
		t.Fatal(err)
	}
	if w, _ := g.worker("chromium", fullID); w.Active != 0 {
		t.Fatalf("Redis still counts %d sessions on %s", w.Active, fullID)
	}

	s := mustDial(t, c.url("/playwright/chromium"))
	defer s.close()
	if w := g.sessionOf("chromium", s).Worker; w != otherID {
		t.Errorf("served by %s, want %s (the full worker refuses)", w, otherID)
	}
	if got := c.metric(`caddy_grid_agent_refusals_total{pool="chromium",reason="full"}`); got != 1 {
		t.Errorf("full refusals counted: %v, want 1", got)
	}
	if n := full.active(t); n != 1 {
		t.Errorf("the full worker's agent relays %d sessions, want 1", n)
	}
	if w, _ := g.worker("chromium", fullID); w.SuspectUntil.After(time.Now()) {
		t.Errorf("the full worker is suspect until %s: a refusal blames no worker", w.SuspectUntil)
	}
	testenv.Eventually(t, 10*time.Second, "the agent's heartbeat restores Redis' count", func() bool {
		w, _ := g.worker("chromium", fullID)
		return w.Active == 1
	})
	if err := live.echo("still served"); err != nil {
		t.Errorf("the live session broke: %v", err)
	}
}
