package caddygrid_test

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/cmd/fakebrowser/fake"
	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
)

// rawHold sends one upgrade over raw TCP with extra header lines and
// returns Caddy's status; a session (101) stays open until the test ends.
func rawHold(t *testing.T, addr, path string, lines ...string) int {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	req := "GET " + path + " HTTP/1.1\r\nHost: " + addr + "\r\nUpgrade: websocket\r\n" +
		"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
	for _, l := range lines {
		req += l + "\r\n"
	}
	if _, err := conn.Write([]byte(req + "\r\n")); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(20 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("reading the answer: %v", err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		conn.Close()
		return resp.StatusCode
	}
	t.Cleanup(func() { conn.Close() })
	return resp.StatusCode
}

// client_limit keyed by a header forward_auth sets (the recipe of
// examples/client-limit.Caddyfile): a client that names that header in
// its Connection header (hop-by-hop, dropped before the request goes to a
// worker) is still counted by it. The handshake check dropped it from the
// request itself, before the key was read, so the key fell back to the
// client's address: a second budget per address.
func TestClientKeyFromAHeaderTheClientCallsHopByHop(t *testing.T) {
	g := newGrid(t)
	ids := []string{"w1", "w2", "w3"}
	for _, id := range ids {
		g.worker("chromium", id, fake.Behavior{})
	}
	authPort := testenv.PickPorts(t, 1)[0]
	c := startCaddy(t, caddyOpts{redisURL: g.redis.URL(), site: fmt.Sprintf(`
	forward_auth 127.0.0.1:%d {
		uri /verify
		copy_headers X-User
	}
	route /playwright/* {
		browser_grid chromium {
			select_timeout 300ms
			client_limit 1
			client_key {http.request.header.X-User}
		}
	}`, authPort), sites: fmt.Sprintf(`
http://127.0.0.1:%d {
	@alice header X-Token alice
	handle @alice {
		header X-User alice
		respond 200
	}
	respond 401
}
`, authPort)})
	tok := "X-Token: alice"
	if code := rawHold(t, c.addr(), "/playwright/chromium", "Connection: Upgrade", tok); code != http.StatusSwitchingProtocols {
		t.Fatalf("alice's first session: %d", code)
	}
	for _, conn := range []string{"Connection: Upgrade", "Connection: Upgrade, X-User", "Connection: X-User, Upgrade"} {
		if code := rawHold(t, c.addr(), "/playwright/chromium", conn, tok); code != http.StatusTooManyRequests {
			t.Errorf("alice's second session with %q: %d, want 429 (client_limit 1)", conn, code)
		}
	}
	if n := g.activeSum(t, ids...); n != 1 {
		t.Errorf("alice holds %d sessions, want 1", n)
	}
}
