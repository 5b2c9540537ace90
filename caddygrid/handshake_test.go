package caddygrid_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
	"github.com/browsergrid/caddy-browser-grid/workeragent"
)

// A browser opened in a web page, or curl, at the grid's URL gets 426
// Upgrade Required with a sentence saying to connect with a WebSocket
// client, and the Upgrade header naming websocket; no worker is claimed.
func TestAPlainGETIsToldToConnectWithAWebSocket(t *testing.T) {
	t.Parallel()
	g := newGrid(t)
	g.agent("chromium", nil)
	c := startCaddy(t, caddyOpts{redisURL: g.redis.URL(), site: site("max_concurrent 2")})
	for _, method := range []string{http.MethodGet, http.MethodPost, http.MethodHead} {
		resp, body := get(t, nil, method, c.httpURL("/playwright/chromium"), nil)
		if resp.StatusCode != http.StatusUpgradeRequired {
			t.Errorf("%s: status %d, want 426; body %q", method, resp.StatusCode, body)
		}
		if method != http.MethodHead && !strings.Contains(body, "WebSocket") {
			t.Errorf("%s: body %q does not say to connect with a WebSocket", method, body)
		}
		if got := resp.Header.Get("Upgrade"); !strings.EqualFold(got, "websocket") {
			t.Errorf("%s: Upgrade header %q, want websocket", method, got)
		}
	}
	if n := len(g.sessions(t, "chromium")); n != 0 {
		t.Errorf("%d sessions in Redis after plain requests, want none", n)
	}
}

// A client that speaks HTTP/2 to a TLS site (curl's default, Go's
// ForceAttemptHTTP2) gets the same 426 and its sentence over HTTP/2, not
// a stream reset or protocol error: the answer carries no header HTTP/2
// forbids (Connection, Upgrade).
func TestAnHTTP2RequestIsAnswered426NotAProtocolError(t *testing.T) {
	t.Parallel()
	g := newGrid(t)
	g.agent("chromium", nil)
	c := startCaddy(t, caddyOpts{redisURL: g.redis.URL(), tls: true, site: site("max_concurrent 2")})
	u := fmt.Sprintf("https://localhost:%d/playwright/chromium", c.httpPort)

	t.Run("go", func(t *testing.T) {
		client := &http.Client{Transport: &http.Transport{
			ForceAttemptHTTP2: true,
			TLSClientConfig:   &tls.Config{RootCAs: c.rootCAs(), ServerName: "localhost"},
		}}
		resp, body := get(t, client, http.MethodGet, u, nil)
		if resp.ProtoMajor != 2 {
			t.Fatalf("answered over %s, want HTTP/2", resp.Proto)
		}
		if resp.StatusCode != http.StatusUpgradeRequired || !strings.Contains(body, "WebSocket") {
			t.Errorf("status %d body %q, want 426 saying to use a WebSocket", resp.StatusCode, body)
		}
		for _, h := range []string{"Connection", "Upgrade", "Keep-Alive", "Transfer-Encoding"} {
			if v := resp.Header.Get(h); v != "" {
				t.Errorf("HTTP/2 answer carries the connection-specific header %s: %q (RFC 9113 8.2.2)", h, v)
			}
		}
	})

	t.Run("curl", func(t *testing.T) {
		curl := testenv.LookPath(t, "curl")
		root := filepath.Join(c.dir, "storage", "pki", "authorities", "local", "root.crt")
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		out, err := exec.CommandContext(ctx, curl, "-sS", "--http2", "--cacert", root,
			"-w", "\n%{http_code} %{http_version}", u).CombinedOutput()
		if err != nil {
			t.Fatalf("curl --http2: %v\n%s", err, out)
		}
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		if got := lines[len(lines)-1]; got != "426 2" {
			t.Errorf("curl got %q (status, HTTP version), want \"426 2\"\n%s", got, out)
		}
		if !strings.Contains(string(out), "WebSocket") {
			t.Errorf("curl's body does not say to use a WebSocket:\n%s", out)
		}
	})
}

// A client that names a pool the route does not serve, or no valid pool
// at all, gets 400 with a sentence that names what it asked for and the
// pools it may ask for; nothing is claimed.
func TestARequestForAPoolTheRouteDoesNotServeIsToldWhichItDoes(t *testing.T) {
	t.Parallel()
	g := newGrid(t)
	g.agent("chromium", nil)
	c := startCaddy(t, caddyOpts{redisURL: g.redis.URL(), site: site("max_concurrent 2")})
	for _, tc := range []struct {
		path, names string
	}{
		{"/playwright/opera", `"opera"`},
		{"/playwright/x?browser=netscape", `"netscape"`},
		{"/playwright/chrom%20ium", `"chrom ium"`},
		{"/playwright/" + strings.Repeat("a", 300), strings.Repeat("a", 64)},
		{"/playwright/", `"playwright"`},
	} {
		_, err := dial(context.Background(), c.url(tc.path))
		r := refusal(err)
		if r == nil {
			t.Errorf("%s: %v, want a 400", tc.path, err)
			continue
		}
		body := string(r.Body)
		if r.StatusCode != http.StatusBadRequest || !strings.Contains(body, tc.names) || !strings.Contains(body, "chromium") {
			t.Errorf("%s: %d %q, want 400 naming %s and the served pools", tc.path, r.StatusCode, body, tc.names)
		}
	}
	if n := len(g.sessions(t, "chromium")); n != 0 {
		t.Errorf("%d sessions in Redis, want none", n)
	}
}

// A Playwright client of a version no worker serves gets 428 at once,
// naming its version and the versions the pool's workers serve; a client
// of a served version reaches a worker of that version.
func TestAPlaywrightClientOfAVersionNoWorkerServesGets428(t *testing.T) {
	t.Parallel()
	g := newGrid(t)
	fb := testenv.Bin(t, "fakebrowser")
	ag := g.agent("chromium", func(c *workeragent.Config) {
		c.Launcher = workeragent.LauncherExec
		// The version line is what launch-server.mjs prints; the fake
		// browser then serves as a Playwright 1.65 server would.
		c.Exec = `echo '{"playwrightVersion":"1.65.0"}'; exec ` + fb + ` -addr "$BROWSER_HOST:$BROWSER_PORT" -path "$WS_PATH"`
	})
	c := startCaddy(t, caddyOpts{redisURL: g.redis.URL(), site: site("max_concurrent 2")})

	_, err := dialHeader(context.Background(), c.url("/playwright/chromium"),
		http.Header{"User-Agent": {"Playwright/1.63.0 (x64; debian 12) node/20.20"}})
	r := refusal(err)
	if r == nil {
		t.Fatalf("a Playwright 1.63 client: %v, want 428", err)
	}
	body := string(r.Body)
	if r.StatusCode != http.StatusPreconditionRequired || !strings.Contains(body, "1.65") || !strings.Contains(body, "1.63") {
		t.Errorf("a Playwright 1.63 client got %d %q, want 428 naming 1.63 and the served 1.65", r.StatusCode, body)
	}

	s, err := dialHeader(context.Background(), c.url("/playwright/chromium"),
		http.Header{"User-Agent": {"Playwright/1.65.2 (x64; debian 12) node/20.20"}})
	if err != nil {
		t.Fatalf("a Playwright 1.65 client: %v", err)
	}
	defer s.close()
	rs := g.sessionOf("chromium", s)
	if rs.Version != "1.65" {
		t.Errorf("the 1.65 client's session is in version group %q, want 1.65", rs.Version)
	}
	if got := ag.status(t).Browsers[0].ID; rs.Worker != got {
		t.Errorf("session on worker %s, want the 1.65 worker %s", rs.Worker, got)
	}
}
