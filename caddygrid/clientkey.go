package caddygrid

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
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
