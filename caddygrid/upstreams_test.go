package caddygrid_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"strings"
	"testing"

	"github.com/browsergrid/caddy-browser-grid/cmd/fakebrowser/fake"
	"github.com/browsergrid/caddy-browser-grid/registry"
)

// TestOneUpstreamPerRequest: with 1,000 workers registered, each request
// makes reverse_proxy provision exactly one upstream (the placeholder the
// policy fills), never one per worker: read from reverse_proxy's own debug
// log, which reports how many upstreams the source returned and how many
// the selection chose among, on every attempt.
func TestOneUpstreamPerRequest(t *testing.T) {
	g := newGrid(t)
	// One real fakebrowser behind 1,000 records, so every claim works.
	srv, ep, err := fake.Start("127.0.0.1:0", fake.Options{Path: "/playwright"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	u, err := url.Parse(ep)
	if err != nil {
		t.Fatal(err)
	}
	const workers = 1000
	for i := range workers {
		err := g.reg.Register(context.Background(), registry.Registration{
			Pool: "chromium", ID: fmt.Sprintf("w%04d", i), BrowserType: "chromium",
			Addr: u.Host, Path: u.Path, TTL: workerTTL,
		})
		if err != nil {
			t.Fatalf("registering worker %d: %v", i, err)
		}
	}
	c := startCaddy(t, caddyOpts{redisURL: g.redis.URL(), extraGlobal: "debug", site: `
	route /playwright/* {
		browser_grid chromium
	}`})

	const requests = 5
	for range requests {
		mustDial(t, c.url("/playwright/chromium")).close()
	}

	var provisioned, selected []int
	for _, line := range strings.Split(c.proc.Output(), "\n") {
		var entry struct {
			Msg   string `json:"msg"`
			Count *int   `json:"count"`
			Total *int   `json:"total_upstreams"`
		}
		if json.Unmarshal([]byte(line), &entry) != nil {
			continue
		}
		switch {
		case entry.Msg == "provisioned dynamic upstreams" && entry.Count != nil:
			provisioned = append(provisioned, *entry.Count)
		case entry.Msg == "selected upstream" && entry.Total != nil:
			selected = append(selected, *entry.Total)
		}
	}
	if len(provisioned) != requests || len(selected) != requests {
		t.Fatalf("reverse_proxy logged %d provisionings and %d selections for %d requests; want one each per request",
			len(provisioned), len(selected), requests)
	}
	for i := range requests {
		if provisioned[i] != 1 || selected[i] != 1 {
			t.Errorf("request %d: %d upstreams provisioned, selection among %d; want 1 and 1 with %d workers registered",
				i, provisioned[i], selected[i], workers)
		}
	}
	if n := srv.Stats().Sessions; n != requests {
		t.Errorf("the worker served %d sessions, want %d", n, requests)
	}
}
