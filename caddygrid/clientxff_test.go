package caddygrid_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"

	"github.com/browsergrid/caddy-browser-grid/cmd/fakebrowser/fake"
)

// TestClientLimitBehindBalancerForgedXFF: the documented setup for
// anonymous clients behind a load balancer (docs/security.md: the default
// client_key, the balancer listed in the server's trusted_proxies). The
// balancer appends the address it saw to X-Forwarded-For, as balancers
// do; a client that sends its own X-Forwarded-For first must still be
// named by the address the balancer saw, so it gets client_limit sessions,
// not one budget per address it makes up.
func TestClientLimitBehindBalancerForgedXFF(t *testing.T) {
	g := newGrid(t)
	for i := range 4 {
		g.worker("chromium", fmt.Sprintf("w%d", i), fake.Behavior{})
	}
	// The test's connections come from 127.0.0.1: the balancer.
	c := startCaddy(t, caddyOpts{redisURL: g.redis.URL(), extraGlobal: `servers {
		trusted_proxies static 127.0.0.1/32
	}`, site: `
	route /playwright/* {
		browser_grid chromium {
			max_concurrent 4
			client_limit 2
		}
	}`})
	const real = "203.0.113.7" // the client's address, as the balancer saw it
	var open []*session
	defer func() {
		for _, s := range open {
			s.close()
		}
	}()
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
		open = append(open, s)
		served++
	}
	t.Logf("6 requests from %s, each with another forged X-Forwarded-For entry: %d served, %d refused 429; sessions counted for %s: %d",
		real, served, limited, real, g.clientSessions(t, real))
	if served > 2 {
		t.Errorf("one client behind the balancer holds %d live sessions by forging X-Forwarded-For; client_limit is 2", served)
	}
}
