package caddygrid_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/cmd/fakebrowser/fake"
	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
	"github.com/browsergrid/caddy-browser-grid/registry"
)

// TestStaircase runs the lifetime-first rule's example through Caddy: four workers,
// max_lifetime 20, sessions one after another. Margin = 20/4 = 5, so the
// first worker takes sessions until 15, then the next, and so on; once all
// four sit at 15 the fallback fills the first to 20, which drains it, and
// no other worker is told to. Once it is gone (its agent deregisters it
// after draining) the second climbs to 20 and drains.
func TestStaircase(t *testing.T) {
	g := newGrid(t)
	ids := []string{"w1", "w2", "w3", "w4"}
	servers := map[string]*fake.Server{}
	for _, id := range ids {
		servers[id] = g.worker("chromium", id, fake.Behavior{})
	}
	c := startCaddy(t, caddyOpts{redisURL: g.redis.URL(), site: `
	route /playwright/* {
		browser_grid chromium {
			max_lifetime 20
		}
	}`})

	lifetimes := func() []int {
		var out []int
		for _, id := range ids {
			out = append(out, g.info("chromium", id).Lifetime)
		}
		return out
	}
	idle := func() bool {
		for _, id := range ids {
			if g.info("chromium", id).Active != 0 {
				return false
			}
		}
		return true
	}
	want := map[int][]int{
		10: {10, 0, 0, 0},
		15: {15, 0, 0, 0},
		20: {15, 5, 0, 0},
		45: {15, 15, 15, 0},
		60: {15, 15, 15, 15},
		65: {20, 15, 15, 15},
		70: {20, 15, 15},
	}
	for n := 1; n <= 70; n++ {
		s := mustDial(t, c.url("/playwright/chromium"))
		s.close()
		testenv.Eventually(t, 10*time.Second, fmt.Sprintf("session %d released", n), idle)
		if w, ok := want[n]; ok {
			if got := lifetimes(); fmt.Sprint(got) != fmt.Sprint(w) {
				t.Fatalf("after %d sessions lifetimes are %v, want the staircase %v", n, got, w)
			}
		}
		if n == 64 || n == 65 {
			cmd := g.info("chromium", "w1").Command
			if n == 64 && cmd != "" {
				t.Fatalf("w1 told to %q at lifetime 19", cmd)
			}
			if n == 65 && cmd != registry.CommandShutdown {
				t.Fatalf("w1 at lifetime 20 has command %q, want %q", cmd, registry.CommandShutdown)
			}
		}
		if n == 65 {
			for _, id := range ids[1:] {
				if cmd := g.info("chromium", id).Command; cmd != "" {
					t.Fatalf("%s has command %q while w1 drains; want only one worker draining", id, cmd)
				}
			}
			// What w1's agent does once drained.
			if err := g.reg.Deregister(context.Background(), "chromium", "w1"); err != nil {
				t.Fatal(err)
			}
			ids = ids[1:]
		}
	}
	if cmd := g.info("chromium", "w2").Command; cmd != registry.CommandShutdown {
		t.Fatalf("w2 at lifetime 20 has command %q, want %q", cmd, registry.CommandShutdown)
	}
	// The workers served exactly what Redis counted.
	for i, id := range ids {
		if got := servers[id].Stats().Sessions; int(got) != want[70][i] {
			t.Errorf("%s served %d sessions, Redis counts %d", id, got, want[70][i])
		}
	}
	if got := servers["w1"].Stats().Sessions; got != 20 {
		t.Errorf("w1 served %d sessions before draining, want 20", got)
	}
}
