package caddygrid_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/browsergrid/caddy-browser-grid/cmd/fakebrowser/fake"
)

// TestOneWorkerRefusingEveryUpgradeWithA4xx: a worker that answers every
// upgrade with 400 (a malicious agent host, or a broken browser server)
// is never blamed, since a 4xx reads as the client's fault, and its claim
// is given back with its lifetime: lifetime_first picks it first again for
// every request, and no request is retried on another worker. So one such
// worker refuses every client of the pool while the healthy ones idle.
// Clients must be served by the healthy workers.
func TestOneWorkerRefusingEveryUpgradeWithA4xx(t *testing.T) {
	g := newGrid(t)
	// sorts first: lifetime_first tries workers of equal lifetime in ID order
	bad := g.worker("chromium", "a-refuses", fake.Behavior{Refuse: http.StatusBadRequest})
	g.worker("chromium", "b", fake.Behavior{})
	g.worker("chromium", "c", fake.Behavior{})
	c := startCaddy(t, caddyOpts{redisURL: g.redis.URL(), site: `
	route /playwright/* {
		browser_grid chromium
	}`})
	const clients = 20
	served, codes := 0, map[int]int{}
	for range clients {
		s, err := dial(context.Background(), c.url("/playwright/chromium"))
		if err == nil {
			served++
			s.close()
			continue
		}
		he := refusal(err)
		if he == nil {
			t.Fatal(err)
		}
		codes[he.StatusCode]++
	}
	t.Logf("%d well-formed clients: %d served, refused %v; the refusing worker answered %d upgrades",
		clients, served, codes, bad.Stats().Refused)
	if served != clients {
		t.Errorf("%d of %d clients served while two healthy workers were free: one worker answering 400 to every upgrade refused the rest", served, clients)
	}
}
