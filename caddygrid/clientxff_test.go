package caddygrid_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/cmd/fakebrowser/fake"
)

// forgedXFFSessions opens 6 sessions as one client behind the balancer
// (connections from 127.0.0.1), each with another forged first
// X-Forwarded-For entry, and returns how many were served; they stay open
// until the test ends.
func forgedXFFSessions(t *testing.T, g *grid, c *caddy) int {
	t.Helper()
	const real = "203.0.113.7" // the client's address, as the balancer saw it
	served, limited := 0, 0
	for i := range 6 {
		h := http.Header{}
		// what reaches Caddy: the client's forged value, then the
		// balancer's own entry
		h.Set("X-Forwarded-For", fmt.Sprintf("198.51.100.%d, %s", i+1, real))
		s, err := dialHeader(context.Background(), c.url("/playwright/chromium"), h)
		if err != nil {
			if he := refusal(err); he != nil && he.StatusCode == http.StatusTooManyRequests {
				limited++
				continue
			}
			t.Fatalf("session %d: %v", i, err)
		}
		t.Cleanup(s.close)
		served++
	}
	t.Logf("6 requests from %s, each with another forged X-Forwarded-For entry: %d served, %d refused 429; sessions counted for %s: %d",
		real, served, limited, real, g.clientSessions(t, real))
	return served
}

// xffSite limits each client to 2 live sessions, named by the default key.
const xffSite = `
	route /playwright/* {
		browser_grid chromium {
			max_concurrent 4
			client_limit 2
		}
	}`

// TestClientLimitBehindBalancerForgedXFF: the documented setup for
// anonymous clients behind a load balancer (docs/security.md: the default
// client_key, the balancer listed in the server's trusted_proxies, with
// trusted_proxies_strict). The balancer appends the address it saw to
// X-Forwarded-For, as balancers do; a client that sends its own
// X-Forwarded-For first is still named by the address the balancer saw,
// so it gets client_limit sessions, not one budget per address it makes
// up. Without trusted_proxies_strict Caddy's client IP is that forged
// entry: the grid warns.
func TestClientLimitBehindBalancerForgedXFF(t *testing.T) {
	g := newGrid(t)
	for i := range 4 {
		g.worker("chromium", fmt.Sprintf("w%d", i), fake.Behavior{})
	}
	warning := "set trusted_proxies_strict on the server"
	c := startCaddy(t, caddyOpts{redisURL: g.redis.URL(), extraGlobal: `servers {
		trusted_proxies static 127.0.0.1/32
		trusted_proxies_strict
	}`, site: xffSite})
	if served := forgedXFFSessions(t, g, c); served > 2 {
		t.Errorf("one client behind the balancer holds %d live sessions by forging X-Forwarded-For; client_limit is 2", served)
	}
	if strings.Contains(c.proc.Output(), warning) {
		t.Errorf("the strict server warned that its client IP can be forged")
	}

	// Without trusted_proxies_strict: the operator is told.
	g2 := newGrid(t)
	for i := range 4 {
		g2.worker("chromium", fmt.Sprintf("w%d", i), fake.Behavior{})
	}
	c2 := startCaddy(t, caddyOpts{redisURL: g2.redis.URL(), extraGlobal: `servers {
		trusted_proxies static 127.0.0.1/32
	}`, site: xffSite})
	forgedXFFSessions(t, g2, c2)
	if !c2.proc.WaitOutput(warning, 5*time.Second) {
		t.Errorf("a server whose client IP a client can forge (no trusted_proxies_strict) logged no warning with client_limit")
	}
	if n := strings.Count(c2.proc.Output(), warning); n > 1 {
		t.Errorf("the warning was logged %d times, want once", n)
	}
}
