package caddygrid_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/cmd/fakebrowser/fake"
	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
)

// dropUpgrade sends one WebSocket upgrade request over raw TCP and leaves
// within a few milliseconds: after waiting up to wait for an answer, it
// closes the connection, with a reset (SO_LINGER 0) when reset is set.
func dropUpgrade(addr, path string, wait time.Duration, reset bool) error {
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return fmt.Errorf("dialing caddy: %w", err)
	}
	tc := conn.(*net.TCPConn)
	if reset {
		_ = tc.SetLinger(0)
	}
	req := "GET " + path + " HTTP/1.1\r\n" +
		"Host: " + addr + "\r\n" +
		"Upgrade: websocket\r\n" +
		"Connection: Upgrade\r\n" +
		"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n" +
		"Sec-WebSocket-Version: 13\r\n\r\n"
	if _, err := tc.Write([]byte(req)); err != nil {
		tc.Close()
		return fmt.Errorf("writing the upgrade: %w", err)
	}
	if wait > 0 {
		// The attacker gives up after wait, whatever came back.
		_ = tc.SetReadDeadline(time.Now().Add(wait))
		_, _ = tc.Read(make([]byte, 1))
	}
	return tc.Close()
}

// TestDroppedUpgradesBlameNoWorker: clients that send an upgrade and leave
// (close or reset) within 0-2 ms, before any worker could answer, mark no
// worker suspect and hold no slot, so an honest client right after them
// connects at once instead of waiting out a suspect penalty.
func TestDroppedUpgradesBlameNoWorker(t *testing.T) {
	g := newGrid(t)
	ids := []string{"w1", "w2", "w3", "w4"}
	for _, id := range ids {
		// A browser takes a moment to answer an upgrade; the clients
		// leave inside that moment, before any status exists.
		g.worker("chromium", id, fake.Behavior{AcceptDelay: 20 * time.Millisecond})
	}
	c := startCaddy(t, caddyOpts{redisURL: g.redis.URL(), site: `
	route /playwright/* {
		browser_grid chromium
	}`})
	// One honest session first, so the first request's one-time setup
	// (wake-up subscription, Redis connections) is not measured later.
	mustDial(t, c.url("/playwright/chromium")).close()

	const dropped, senders = 200, 10
	var wg sync.WaitGroup
	errs := make(chan error, dropped)
	for s := range senders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := s; i < dropped; i += senders {
				wait := time.Duration(i%6) * time.Millisecond // 0-5 ms
				if err := dropUpgrade(c.addr(), "/playwright/chromium", wait, i%2 == 0); err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("dropped upgrade: %v", err)
	}

	// Every claim of the dropped requests is given back.
	testenv.Eventually(t, 10*time.Second, "every dropped request's claim given back", func() bool {
		for _, id := range ids {
			if g.info("chromium", id).Active != 0 {
				return false
			}
		}
		info, err := g.reg.Inspect(context.Background(), "chromium")
		return err == nil && info.Leases == 0
	})
	now := time.Now()
	var suspect []string
	for _, id := range ids {
		if w := g.info("chromium", id); w.SuspectUntil.After(now) {
			suspect = append(suspect, id)
		}
	}

	start := time.Now()
	s, err := dial(context.Background(), c.url("/playwright/chromium"))
	took := time.Since(start)
	t.Logf("%d dropped upgrades: %d of %d workers suspect after; honest client connected in %s (error: %v)",
		dropped, len(suspect), len(ids), took.Round(time.Millisecond), err)
	if len(suspect) != 0 {
		t.Errorf("workers %v marked suspect by clients that left; want none", suspect)
	}
	if err != nil {
		t.Fatalf("honest client after the dropped upgrades: %v", err)
	}
	s.close()
	// A suspect penalty lasts 5s; a connect well below it means the
	// honest client waited for nothing.
	if took > 2*time.Second {
		t.Errorf("the honest client took %s to connect after the dropped upgrades; want well under the 5s suspect penalty", took)
	}
}

// TestUpgradeWithBodyRefused: an upgrade request carrying a body the
// client never finishes (garbage chunked encoding, then a close) is
// refused with 400 before any worker is claimed, so it can neither hold a
// slot nor fail an upgrade on a worker's account.
func TestUpgradeWithBodyRefused(t *testing.T) {
	g := newGrid(t)
	g.worker("chromium", "w1", fake.Behavior{})
	c := startCaddy(t, caddyOpts{redisURL: g.redis.URL(), site: `
	route /playwright/* {
		browser_grid chromium
	}`})
	conn, err := net.DialTimeout("tcp", c.addr(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	req := "GET /playwright/chromium HTTP/1.1\r\n" +
		"Host: " + c.addr() + "\r\n" +
		"Upgrade: websocket\r\n" +
		"Connection: Upgrade\r\n" +
		"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n" +
		"Sec-WebSocket-Version: 13\r\n" +
		"Transfer-Encoding: chunked\r\n\r\n" +
		"zz\r\ngarbage"
	if _, err := conn.Write([]byte(req)); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("reading the answer: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("status %d, want 400", resp.StatusCode)
	}
	w := g.info("chromium", "w1")
	if w.Lifetime != 0 || w.Active != 0 || w.SuspectUntil.After(time.Now()) {
		t.Errorf("worker touched by a refused request: lifetime %d, active %d, suspect until %v", w.Lifetime, w.Active, w.SuspectUntil)
	}
	if got := c.metric(`caddy_grid_selections_total{policy="lifetime_first",pool="chromium"}`); got != 0 {
		t.Errorf("%v claims made for a refused request, want 0", got)
	}
}
