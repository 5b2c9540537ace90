package caddygrid_test

import (
	"bufio"
	"context"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"regexp"
	"syscall"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
	"github.com/browsergrid/caddy-browser-grid/registry"
	"github.com/browsergrid/caddy-browser-grid/workeragent"
)

// startCDPWorker starts Debian's Chromium as the agent's cdp launcher
// does (remote debugging on a free loopback port, a fresh profile) and
// registers its browser endpoint in pool as id. It returns a function
// that registers it again, as a restarted agent would (a fresh record: no
// suspect mark).
func (g *grid) startCDPWorker(pool, id string) (register func()) {
	g.t.Helper()
	if _, err := os.Stat(workeragent.DefaultChromium); err != nil {
		testenv.Missing(g.t, "%s not installed", workeragent.DefaultChromium)
	}
	// The profile is removed by hand once the whole browser is gone: its
	// helper processes outlive the main one's kill and keep writing there,
	// which failed t.TempDir's removal (and the test) in CI.
	profile, err := os.MkdirTemp("", "cdp-worker-")
	if err != nil {
		g.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	args := append(append([]string(nil), workeragent.ChromiumFlags...),
		"--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0",
		"--user-data-dir="+profile, "about:blank")
	cmd := exec.CommandContext(ctx, workeragent.DefaultChromium, args...)
	// its own process group, killed whole
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	stderr, err := cmd.StderrPipe()
	if err != nil {
		g.t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		g.t.Fatal(err)
	}
	g.t.Cleanup(func() {
		cancel()
		_ = cmd.Wait()
		// a helper that left the group may still be closing its files
		for i := 0; os.RemoveAll(profile) != nil && i < 50; i++ {
			time.Sleep(100 * time.Millisecond)
		}
	})
	found := make(chan string, 1)
	go func() {
		re := regexp.MustCompile(`DevTools listening on (ws://\S+)`)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if m := re.FindStringSubmatch(sc.Text()); m != nil {
				found <- m[1]
			}
		}
	}()
	var ep string
	select {
	case ep = <-found:
	case <-time.After(30 * time.Second):
		g.t.Fatal("Chromium printed no DevTools endpoint within 30s")
	}
	u, err := url.Parse(ep)
	if err != nil {
		g.t.Fatal(err)
	}
	register = func() {
		g.t.Helper()
		err := g.reg.Register(context.Background(), registry.Registration{
			Pool: pool, ID: id, BrowserType: pool, Addr: u.Host, Path: u.Path, TTL: workerTTL,
		})
		if err != nil {
			g.t.Fatalf("registering %s: %v", id, err)
		}
	}
	register()
	return register
}

// rawUpgrade sends one upgrade request over raw TCP with the given extra
// header lines (before its Upgrade: websocket) and returns the status
// Caddy answers.
func rawUpgrade(t *testing.T, addr, path string, lines ...string) int {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	req := "GET " + path + " HTTP/1.1\r\nHost: " + addr + "\r\nConnection: Upgrade\r\n"
	for _, l := range lines {
		req += l + "\r\n"
	}
	if _, err := conn.Write([]byte(req + "Upgrade: websocket\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(20 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("reading the answer: %v", err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestMalformedHandshakeBlamesNoCDPWorker: Chromium's DevTools server
// answers 500 to a WebSocket handshake without Sec-WebSocket-Key, or
// without, with two, or with another Sec-WebSocket-Version than 13 or 8;
// it closes the connection without an answer when Sec-WebSocket-Extensions
// is empty or does not parse; and it answers a plain GET (200) when the
// Upgrade header it is sent is not websocket (reverse_proxy forwards the
// first of several Upgrade lines, and drops the headers Connection
// names, Sec-WebSocket-Key too). Each is the client's fault, yet reads
// as the worker's: an anonymous client sending such handshakes would mark
// every CDP worker suspect (5s each, dial_retries+1 workers per request)
// and take the pool out of rotation. Such a request must get a 4xx (or,
// with websocket among its Upgrade values, be served) and blame no
// worker.
func TestMalformedHandshakeBlamesNoCDPWorker(t *testing.T) {
	g := newGrid(t)
	register := g.startCDPWorker("chromium", "cdp1")
	c := startCaddy(t, caddyOpts{redisURL: g.redis.URL(), site: `
	route /playwright/* {
		browser_grid chromium {
			select_timeout 1s
		}
	}`})
	const key = "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ=="
	cases := []struct {
		name  string
		lines []string
		// servable: Caddy may also serve it (101), as a websocket upgrade
		servable bool
	}{
		{"no key", []string{"Sec-WebSocket-Version: 13"}, false},
		{"no version", []string{key}, false},
		{"version 99", []string{key, "Sec-WebSocket-Version: 99"}, false},
		{"two versions", []string{key, "Sec-WebSocket-Version: 13", "Sec-WebSocket-Version: 99"}, false},
		{"empty extensions", []string{key, "Sec-WebSocket-Version: 13", "Sec-WebSocket-Extensions:"}, false},
		{"malformed extensions", []string{key, "Sec-WebSocket-Version: 13", "Sec-WebSocket-Extensions: permessage-deflate;"}, false},
		{"another upgrade first", []string{key, "Sec-WebSocket-Version: 13", "Upgrade: h2c"}, true},
		// reverse_proxy drops the headers Connection names (hop-by-hop)
		{"key named in Connection", []string{key, "Sec-WebSocket-Version: 13", "Connection: Sec-WebSocket-Key"}, false},
		{"version named in Connection", []string{key, "Sec-WebSocket-Version: 13", "Connection: Sec-WebSocket-Version"}, false},
	}
	for _, tc := range cases {
		register() // each case starts from a worker nobody blamed
		code := rawUpgrade(t, c.addr(), "/playwright/chromium", tc.lines...)
		w := g.info("chromium", "cdp1")
		suspect := w.SuspectUntil.After(time.Now())
		t.Logf("%s: status %d, worker suspect %v, lifetime %d", tc.name, code, suspect, w.Lifetime)
		if (code < 400 || code >= 500) && !(tc.servable && code == http.StatusSwitchingProtocols) {
			t.Errorf("%s: status %d, want a 4xx (the client's malformed handshake)", tc.name, code)
		}
		if suspect {
			t.Errorf("%s: the Chromium worker was marked suspect for the client's malformed handshake", tc.name)
		}
	}
	// An honest client right after them is served by the worker.
	testenv.Eventually(t, 10*time.Second, "the worker's claims given back", func() bool {
		return g.info("chromium", "cdp1").Active == 0
	})
	code := rawUpgrade(t, c.addr(), "/playwright/chromium", key, "Sec-WebSocket-Version: 13")
	if code != http.StatusSwitchingProtocols {
		t.Errorf("well-formed handshake after them: status %d, want 101", code)
	}
}
