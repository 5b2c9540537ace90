package caddygrid_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/cmd/fakebrowser/fake"
	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
)

// TestQueue: with every slot taken, the next client waits and is served
// when a session closes; a client past queue_size gets 429 at once; a
// client still waiting at select_timeout gets 503; both with Retry-After.
func TestQueue(t *testing.T) {
	g := newGrid(t)
	srv := g.worker("chromium", "w1", fake.Behavior{})
	// Two routes on the same pool: a patient one with a queue of one, and
	// an impatient one.
	c := startCaddy(t, caddyOpts{redisURL: g.redis.URL(), site: `
	route /patient/* {
		browser_grid chromium {
			max_concurrent 1
			select_timeout 60s
			queue_size 1
		}
	}
	route /impatient/* {
		browser_grid chromium {
			max_concurrent 1
			select_timeout 300ms
		}
	}`})
	const depth = `caddy_grid_queue_depth{pool="chromium"}`

	a := mustDial(t, c.url("/patient/chromium"))

	// B waits: the only slot is A's.
	type result struct {
		s   *session
		err error
	}
	bDone := make(chan result, 1)
	go func() {
		s, err := dial(context.Background(), c.url("/patient/chromium"))
		bDone <- result{s, err}
	}()
	testenv.Eventually(t, 10*time.Second, "B queued", func() bool { return c.metric(depth) == 1 })
	select {
	case r := <-bDone:
		t.Fatalf("B finished while A holds the only slot: %v", r.err)
	default:
	}

	// C finds the queue full: 429 at once, with Retry-After.
	_, err := dial(context.Background(), c.url("/patient/chromium"))
	he := refusal(err)
	if he == nil || he.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("C: got %v, want 429", err)
	}
	if ra := he.Header.Get("Retry-After"); ra != "60" {
		t.Errorf("429 Retry-After = %q, want \"60\" (select_timeout)", ra)
	}

	// A closes: B is served.
	a.close()
	var b result
	select {
	case b = <-bDone:
	case <-time.After(30 * time.Second):
		t.Fatal("B still waiting 30s after A closed")
	}
	if b.err != nil {
		t.Fatalf("B: %v", b.err)
	}

	// D waits on the impatient route while B holds the slot: 503.
	_, err = dial(context.Background(), c.url("/impatient/chromium"))
	he = refusal(err)
	if he == nil || he.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("D: got %v, want 503", err)
	}
	if ra := he.Header.Get("Retry-After"); ra != "1" {
		t.Errorf("503 Retry-After = %q, want \"1\" (300ms rounded up)", ra)
	}
	if !strings.Contains(string(he.Body), "no chromium browser became free within 300ms") {
		t.Errorf("503 body %q does not say why", he.Body)
	}
	// E gives up while queued: it leaves the queue and claims nothing.
	ectx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	_, err = dial(ectx, c.url("/patient/chromium"))
	cancel()
	if err == nil {
		t.Fatal("E connected while B holds the only slot")
	}
	testenv.Eventually(t, 10*time.Second, "E gone from the queue", func() bool { return c.metric(depth) == 0 })
	b.s.close()

	if got := srv.Stats().PeakActive; got != 1 {
		t.Errorf("worker peak active = %d, want 1 (max_concurrent)", got)
	}
	testenv.Eventually(t, 10*time.Second, "slot released", func() bool { return g.info("chromium", "w1").Active == 0 })
	for sample, want := range map[string]float64{
		`caddy_grid_rejections_total{code="429",pool="chromium"}`:              1,
		`caddy_grid_rejections_total{code="503",pool="chromium"}`:              1,
		`caddy_grid_selections_total{policy="lifetime_first",pool="chromium"}`: 2,
		`caddy_grid_releases_total{outcome="released",pool="chromium"}`:        2,
		`caddy_grid_active_sessions{pool="chromium"}`:                          0,
		depth: 0,
	} {
		if got := c.metric(sample); got != want {
			t.Errorf("%s = %v, want %v", sample, got, want)
		}
	}
}

// TestRedisDown: with Redis unreachable a client gets 503 with
// Retry-After (not a hang until select_timeout), and Caddy says why.
func TestRedisDown(t *testing.T) {
	g := newGrid(t)
	g.worker("chromium", "w1", fake.Behavior{})
	c := startCaddy(t, caddyOpts{redisURL: g.redis.URL(), site: `
	route /playwright/* {
		browser_grid chromium {
			select_timeout 60s
		}
	}`})
	mustDial(t, c.url("/playwright/chromium")).close()
	g.redis.Stop()

	_, err := dial(context.Background(), c.url("/playwright/chromium"))
	he := refusal(err)
	if he == nil || he.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("with Redis down: got %v, want 503", err)
	}
	if he.Header.Get("Retry-After") == "" {
		t.Error("503 without Retry-After")
	}
	if !c.proc.WaitOutput("Redis unreachable", 5*time.Second) {
		t.Error("Caddy's log does not say Redis is unreachable")
	}
}
