package caddygrid_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/browsergrid/caddy-browser-grid/cmd/fakebrowser/fake"
	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
)

// TestWSSWithInternalCA: wss://localhost with 'tls internal'; a client
// that trusts only Caddy's local root reaches a worker through the grid,
// and one that trusts nothing of Caddy's is turned away by TLS.
func TestWSSWithInternalCA(t *testing.T) {
	g := newGrid(t)
	srv := g.worker("chromium", "w1", fake.Behavior{})
	c := startCaddy(t, caddyOpts{redisURL: g.redis.URL(), tls: true, site: `
	route /playwright/* {
		browser_grid chromium
	}`})

	var pem []byte
	testenv.Eventually(t, 20*time.Second, "Caddy's local root certificate", func() bool {
		var err error
		pem, err = os.ReadFile(c.rootCA())
		return err == nil && len(pem) > 0
	})
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		t.Fatalf("no certificate in %s", c.rootCA())
	}

	// A transport of its own: HTTP/1.1 only, as a WebSocket handshake needs.
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}}
	var conn *websocket.Conn
	var resp *http.Response
	var err error
	// The site certificate is issued right after start; retry until it is.
	testenv.Eventually(t, 20*time.Second, "a wss:// session", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		conn, resp, err = websocket.Dial(ctx, c.url("/playwright/chromium"), &websocket.DialOptions{HTTPClient: client})
		return err == nil
	})
	s := &session{conn: conn}
	if err := s.echo("over tls"); err != nil {
		t.Fatal(err)
	}
	if resp.TLS == nil || len(resp.TLS.PeerCertificates) == 0 || resp.TLS.PeerCertificates[0].Issuer.CommonName == "" {
		t.Errorf("no certificate chain on the client side")
	}
	s.close()
	if srv.Stats().Sessions != 1 {
		t.Errorf("worker served %d sessions, want 1", srv.Stats().Sessions)
	}

	// Without Caddy's root the handshake fails.
	untrusting := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: x509.NewCertPool()}}}
	_, _, err = websocket.Dial(context.Background(), c.url("/playwright/chromium"), &websocket.DialOptions{HTTPClient: untrusting})
	if err == nil {
		t.Fatal("a client trusting no root connected")
	}
}
