package caddygrid_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/browsergrid/caddy-browser-grid/cmd/fakebrowser/fake"
)

// TestClientLimitIPv6Prefix: with the default client key (the client's
// IP address), an IPv6 client must not escape client_limit by using
// another address of its own /64: a host or home network is routed a
// whole /64 and picks addresses from it at will (privacy addresses). The
// clients here reach Caddy through a trusted proxy that names their
// addresses in X-Forwarded-For.
func TestClientLimitIPv6Prefix(t *testing.T) {
	g := newGrid(t)
	workers := []string{"w1", "w2", "w3", "w4"}
	for _, id := range workers {
		g.worker("chromium", id, fake.Behavior{})
	}
	c := startCaddy(t, caddyOpts{redisURL: g.redis.URL(),
		extraGlobal: `
	servers {
		trusted_proxies static 127.0.0.1/32
	}`,
		site: `
	route /playwright/* {
		browser_grid chromium {
			client_limit 1
		}
	}`})
	u := c.url("/playwright/chromium")
	dialFrom := func(addr string) (*session, *refused) {
		h := http.Header{}
		h.Set("X-Forwarded-For", addr)
		s, err := dialHeader(context.Background(), u, h)
		if err != nil {
			he := refusal(err)
			if he == nil {
				t.Fatalf("client %s: %v", addr, err)
			}
			return nil, he
		}
		return s, nil
	}
	tried, served, limited := 0, 0, 0
	var open []*session
	for _, addr := range []string{"2001:db8:1:2::1", "2001:db8:1:2::2", "2001:db8:1:2:aaaa:bbbb:cccc:dddd", "2001:db8:1:3::1"} {
		tried++
		s, he := dialFrom(addr)
		switch {
		case s != nil:
			served++
			open = append(open, s)
		case he.StatusCode == http.StatusTooManyRequests:
			limited++
		default:
			t.Fatalf("client %s: %d %s", addr, he.StatusCode, he.Body)
		}
	}
	for _, s := range open {
		s.close()
	}
	t.Logf("IPv6 clients tried %d (3 of one /64, 1 of another), served %d, 429 %d", tried, served, limited)
	if served != 2 || limited != 2 {
		t.Fatalf("served %d, refused %d; want 2 and 2 (client_limit 1 per /64: one of 2001:db8:1:2::/64, one of 2001:db8:1:3::/64)", served, limited)
	}
}
