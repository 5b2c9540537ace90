package caddygrid

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/browsergrid/caddy-browser-grid/registry"
)

// clientKey expands the client_key placeholder for r. A key that expands
// to nothing (no such header, no authenticated user) falls back to the
// client's IP address, so that leaving the header out does not escape
// the limit; it is never empty.
func clientKey(r *http.Request, tmpl string) string {
	repl, _ := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	if repl != nil {
		if k := repl.ReplaceAll(tmpl, ""); k != "" {
			if tmpl == DefaultClientKey {
				return ipClient(k)
			}
			return k
		}
		if k := repl.ReplaceAll(DefaultClientKey, ""); k != "" {
			return ipClient(k)
		}
	}
	if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil && host != "" {
		return ipClient(host)
	}
	if r.RemoteAddr != "" {
		return r.RemoteAddr
	}
	// No address at all (a unix socket listener): such clients share one
	// budget rather than none.
	return "unknown client"
}

// forgeableClientIP reports whether r's {http.vars.client_ip} is one the
// client can choose: r came from a proxy in the server's trusted_proxies
// and the server is not trusted_proxies_strict, so Caddy took the
// left-most entry of the client IP headers, which the client sends itself
// (a balancer appends the address it saw after it).
func forgeableClientIP(r *http.Request) bool {
	srv, _ := r.Context().Value(caddyhttp.ServerCtxKey).(*caddyhttp.Server)
	trusted, _ := caddyhttp.GetVar(r.Context(), caddyhttp.TrustedProxyVarKey).(bool)
	return srv != nil && trusted && srv.TrustedProxiesStrict == 0
}

// errClientWaiting: the client already has as many requests waiting in
// the pool's queue (this instance's) as its client_limit; nothing claimed.
var errClientWaiting = fmt.Errorf("%w: as many of this client's requests wait for a browser as its client_limit allows", registry.ErrClientLimit)

// ipv6ClientBits is how much of an IPv6 address names one client.
const ipv6ClientBits = 64

// ipClient names the client of an IP address key: the address for IPv4,
// its /64 for IPv6 (a host or a home network is routed a whole /64 and
// takes addresses in it at will, so a budget per address would be no
// limit). A key that is no IP address is returned as it is.
func ipClient(key string) string {
	ip, err := netip.ParseAddr(key)
	if err != nil || !ip.Is6() || ip.Is4In6() {
		return key
	}
	return netip.PrefixFrom(ip.WithZone(""), ipv6ClientBits).Masked().String()
}

// clientLimited counts a claim refused by the client limit and logs it at
// most once a minute per client and pool, naming the client by its hash
// only.
func (b *backend) clientLimited(req registry.ClaimRequest, err error) {
	metrics.clientLimited.WithLabelValues(req.Pool).Inc()
	h := registry.ClientHash(req.ClientKey)
	if !b.firstReport("client_limit", req.Pool, h) {
		return
	}
	var le *registry.ClientLimitError
	live := 0
	if errors.As(err, &le) {
		live = le.Live
	}
	b.logger.Info("client at its client_limit; refused (logged once a minute per client)",
		zap.String("pool", req.Pool), zap.String("client_hash", h),
		zap.Int("live_sessions", live), zap.Int("client_limit", req.ClientLimit))
}

// setLimited records why the client was refused (a *ClientLimitError in err).
func (s *session) setLimited(err error) {
	var le *registry.ClientLimitError
	if errors.Is(err, errClientWaiting) {
		s.mu.Lock()
		s.waiting = true
		s.mu.Unlock()
		return
	}
	if !errors.As(err, &le) {
		return
	}
	s.mu.Lock()
	s.limited = le
	s.mu.Unlock()
}

// limitedMessage is the body of the 429 for a client over its limit.
func (s *session) limitedMessage() string {
	s.mu.Lock()
	le, waiting := s.limited, s.waiting
	s.mu.Unlock()
	if waiting {
		return "client limit reached: as many requests of this client already wait for a browser as its client_limit allows; retry when one has been served"
	}
	if le == nil {
		return "client limit reached for this client; retry when one of its sessions has ended"
	}
	return fmt.Sprintf("client limit reached: %d live sessions of %d allowed for this client; retry when one has ended", le.Live, le.Limit)
}

// clientKeyLine remembers where client_key was given, so that a
// client_key without client_limit fails at adapt time naming its line.
type clientKeyLine struct {
	file string
	line int
}

func checkClientKey(d *caddyfile.Dispenser) *clientKeyLine { return &clientKeyLine{file: d.File()} }

// see notes the line when the dispenser is at a client_key option.
func (k *clientKeyLine) see(d *caddyfile.Dispenser) {
	if d.Val() == "client_key" {
		k.line = d.Line()
	}
}

// check refuses a client_key without client_limit.
func (k *clientKeyLine) check(o ClaimOptions) error {
	if k.line > 0 && o.ClientLimit == 0 {
		return fmt.Errorf("%s:%d - Error during parsing: client_key needs client_limit <n>", k.file, k.line)
	}
	return nil
}
