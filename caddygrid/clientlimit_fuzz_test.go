package caddygrid

import (
	"bufio"
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/browsergrid/caddy-browser-grid/registry"
)

// FuzzClientKey feeds raw requests to what client_limit reads from them:
// whatever the client sends (or leaves out), its key is never empty (an
// empty one would escape the limit) and what reaches Redis is a 32-digit
// lowercase hex hash that holds none of the raw key.
func FuzzClientKey(f *testing.F) {
	for _, seed := range []string{
		"GET /playwright/chromium HTTP/1.1\r\nHost: grid\r\nX-Client: alice\r\n\r\n",
		"GET /playwright/chromium HTTP/1.1\r\nHost: grid\r\n\r\n",
		"GET /playwright/chromium HTTP/1.1\r\nHost: grid\r\nX-Client: \r\n\r\n",
		"GET /playwright/chromium HTTP/1.1\r\nHost: grid\r\nX-Client: a b\r\nX-Client: {http.request.remote.host}\r\n\r\n",
		"GET /x HTTP/1.1\r\nHost: grid\r\nX-Client: " + strings.Repeat("\xff", 300) + "\r\n\r\n",
	} {
		f.Add(seed, "10.1.2.3:5555")
	}
	templates := []string{DefaultClientKey, "{http.request.header.X-Client}", "{http.auth.user.id}", "fixed"}
	f.Fuzz(func(t *testing.T, raw, remote string) {
		r, err := http.ReadRequest(bufio.NewReader(strings.NewReader(raw)))
		if err != nil {
			return
		}
		for _, tmpl := range templates {
			req := r.Clone(context.Background())
			req.RemoteAddr = remote
			caddyhttp.NewTestReplacer(req)
			key := clientKey(req, tmpl)
			if key == "" {
				t.Fatalf("empty client key for template %q, remote %q\n%q", tmpl, remote, raw)
			}
			h := registry.ClientHash(key)
			if len(h) != 32 || strings.Trim(h, "0123456789abcdef") != "" {
				t.Fatalf("client hash %q is not 32 lowercase hex digits", h)
			}
			if len(key) >= 4 && strings.Contains(h, key) {
				t.Fatalf("client hash %q holds the raw key %q", h, key)
			}
		}
	})
}
