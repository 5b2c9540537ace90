package caddygrid

import (
	"encoding/json"
	"net/http"
	"strings"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// Endpoint discovery: what clients ask over plain HTTP before they open
// the WebSocket. Playwright's connect() to an http(s):// endpoint reads
// <endpoint>/json for the WebSocket's path, which it appends to the
// endpoint's own; connectOverCDP and Puppeteer's browserURL read
// <endpoint>/json/version for webSocketDebuggerUrl. Both answers point
// back at the endpoint through the grid: nothing is claimed, and no
// worker's address is told.

// discoveryKind names what a discovery request asks.
type discoveryKind int

const (
	notDiscovery discoveryKind = iota
	playwrightDiscovery
	cdpDiscovery
)

// discoveryOf reports what r asks and the endpoint's path it asks it of.
func discoveryOf(r *http.Request) (discoveryKind, string) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		return notDiscovery, ""
	}
	p := r.URL.Path
	if base, ok := strings.CutSuffix(strings.TrimSuffix(p, "/"), "/json/version"); ok {
		return cdpDiscovery, base
	}
	if base, ok := strings.CutSuffix(p, "/json"); ok {
		return playwrightDiscovery, base
	}
	return notDiscovery, ""
}

// discover answers a discovery request for the endpoint at base.
func (h *Handler) discover(w http.ResponseWriter, r *http.Request, kind discoveryKind, base string) error {
	var body any
	switch kind {
	case playwrightDiscovery:
		// Appended to the endpoint's path: the WebSocket goes to the
		// endpoint itself.
		body = map[string]string{"wsEndpointPath": ""}
	default:
		u := wsScheme(r) + "://" + clientHost(r) + base
		if r.URL.RawQuery != "" {
			u += "?" + r.URL.RawQuery
		}
		body = map[string]string{
			"Browser":              "Browser Grid",
			"Protocol-Version":     "1.3",
			"webSocketDebuggerUrl": u,
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	return json.NewEncoder(w).Encode(body)
}

// fromTrustedProxy reports whether r came through one of the server's
// trusted_proxies, whose forwarded headers Caddy then believes.
func fromTrustedProxy(r *http.Request) bool {
	trusted, _ := caddyhttp.GetVar(r.Context(), caddyhttp.TrustedProxyVarKey).(bool)
	return trusted
}

// wsScheme is wss when the client reached Caddy over TLS, itself or
// through a trusted proxy that says so.
func wsScheme(r *http.Request) string {
	if fromTrustedProxy(r) {
		if p := r.Header.Get("X-Forwarded-Proto"); p != "" {
			if strings.EqualFold(strings.TrimSpace(strings.Split(p, ",")[0]), "https") {
				return "wss"
			}
			return "ws"
		}
	}
	if r.TLS != nil {
		return "wss"
	}
	return "ws"
}

// clientHost is the host and port the client reached: the request's, or
// a trusted proxy's X-Forwarded-Host.
func clientHost(r *http.Request) string {
	if fromTrustedProxy(r) {
		if h := strings.TrimSpace(strings.Split(r.Header.Get("X-Forwarded-Host"), ",")[0]); h != "" && validHost(h) {
			return h
		}
	}
	return r.Host
}

// validHost accepts what may stand between :// and the path of a URL
// this grid hands out: a host name or IP, and a port.
func validHost(h string) bool {
	for i := 0; i < len(h); i++ {
		c := h[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte(".-:[]_", c) >= 0) {
			return false
		}
	}
	return h != ""
}
