package caddygrid_test

import (
	"context"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/cmd/fakebrowser/fake"
	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
	"github.com/browsergrid/caddy-browser-grid/registry"
)

// Through bin/caddy with policy interleaved_weighted_round_robin, workers
// of weight 3 and 1 (the second from its capacity, as grid-worker's
// -weight defaults) take sessions as the rounds deal them: b a a a b a a a.
func TestInterleavedWeightedRoundRobinThroughCaddy(t *testing.T) {
	g := newGrid(t)
	for _, w := range []struct {
		id               string
		weight, capacity int
	}{{"a", 3, 0}, {"b", 0, 1}} {
		srv, ep, err := fake.Start("127.0.0.1:0", fake.Options{Path: "/playwright"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { srv.Close() })
		u, _ := url.Parse(ep)
		err = g.reg.Register(context.Background(), registry.Registration{
			Pool: "chromium", ID: w.id, BrowserType: "chromium", Addr: u.Host, Path: u.Path, TTL: time.Minute,
			Weight: w.weight, Capacity: w.capacity,
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	c := startCaddy(t, caddyOpts{redisURL: g.redis.URL(), site: `
	route /playwright/* {
		browser_grid chromium {
			policy interleaved_weighted_round_robin
		}
	}`})
	var got []string
	for range 8 {
		before := map[string]int{"a": g.info("chromium", "a").Lifetime, "b": g.info("chromium", "b").Lifetime}
		mustDial(t, c.url("/playwright/chromium")).close()
		testenv.Eventually(t, 10*time.Second, "release", func() bool {
			return g.info("chromium", "a").Active+g.info("chromium", "b").Active == 0
		})
		for _, id := range []string{"a", "b"} {
			if g.info("chromium", id).Lifetime > before[id] {
				got = append(got, id)
			}
		}
	}
	if s := strings.Join(got, " "); s != "b a a a b a a a" {
		t.Fatalf("sessions went to %q, want %q", s, "b a a a b a a a")
	}
}
