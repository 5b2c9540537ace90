package caddygrid_test

import (
	"context"
	"net/http"
	"slices"
	"testing"

	"github.com/browsergrid/caddy-browser-grid/registry"
)

// A client that sends Grid-* headers of its own (a forged Grid-Claim
// naming a real worker, a session ID and a high max_concurrent) cannot
// pass them to the agent: the agent sees only the claim Caddy made, so
// the session has Caddy's ID and Caddy's limits, and the forged session
// exists nowhere.
func TestAClientsOwnGridHeadersNeverReachTheAgent(t *testing.T) {
	t.Parallel()
	g := newGrid(t)
	ag := g.agent("chromium", nil)
	c := startCaddy(t, caddyOpts{redisURL: g.redis.URL(), site: site("max_concurrent 1\n\t\t\tselect_timeout 1s")})
	worker := ag.status(t).Browsers[0].ID
	forged := registry.Ticket{Session: "forged-session", Group: "chromium", Worker: worker,
		Limits: registry.Limits{MaxConcurrent: 100}}.Signed(nil).String()
	h := http.Header{
		registry.HeaderClaim:   {forged},
		registry.HeaderSession: {"forged-session"},
		registry.HeaderRefused: {"full"},
		"Grid-Anything":        {"x"},
	}

	s, err := dialHeader(context.Background(), c.url("/playwright/chromium"), h)
	if err != nil {
		t.Fatalf("a client sending Grid-* headers: %v", err)
	}
	defer s.close()
	id := s.resp.Header.Get(registry.HeaderSession)
	if id == "" || id == "forged-session" {
		t.Fatalf("the session's ID is %q, want Caddy's own", id)
	}
	sessions := ag.status(t).Browsers[0].Sessions
	if !slices.Equal(sessions, []string{id}) {
		t.Errorf("the agent relays %v, want only Caddy's session %s", sessions, id)
	}
	if _, ok, _ := g.reg.GetSession(context.Background(), "chromium", "forged-session"); ok {
		t.Error("the forged session is in Redis")
	}
	// The forged max_concurrent 100 bought nothing: the claim carried 1.
	_, err = dialHeader(context.Background(), c.url("/playwright/chromium"), h)
	if r := refusal(err); r == nil || r.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("a second forging client: %v, want 503 (max_concurrent 1)", err)
	}
	if n := ag.active(t); n != 1 {
		t.Errorf("the agent relays %d sessions, want 1", n)
	}
}
