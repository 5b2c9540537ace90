package caddygrid_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"os"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/cmd/fakebrowser/fake"
	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
	"github.com/browsergrid/caddy-browser-grid/internal/wsock"
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

	dialer := &wsock.Dialer{TLSConfig: &tls.Config{RootCAs: roots}, HandshakeTimeout: 20 * time.Second}
	var conn *wsock.Conn
	var err error
	// The site certificate is issued right after start; retry until it is.
	testenv.Eventually(t, 20*time.Second, "a wss:// session", func() bool {
		conn, _, err = dialer.Dial(context.Background(), c.url("/playwright/chromium"))
		return err == nil
	})
	s := &session{conn: conn}
	if err := s.echo("over tls"); err != nil {
		t.Fatal(err)
	}
	if state := conn.NetConn().(*tls.Conn).ConnectionState(); len(state.PeerCertificates) == 0 ||
		state.PeerCertificates[0].Issuer.CommonName == "" {
		t.Errorf("no certificate chain on the client side")
	}
	s.close()
	if srv.Stats().Sessions != 1 {
		t.Errorf("worker served %d sessions, want 1", srv.Stats().Sessions)
	}

	// Without Caddy's root the handshake fails.
	_, _, err = (&wsock.Dialer{TLSConfig: &tls.Config{RootCAs: x509.NewCertPool()}}).Dial(context.Background(), c.url("/playwright/chromium"))
	if err == nil {
		t.Fatal("a client trusting no root connected")
	}
}
