package caddygrid

import (
	"errors"
	"fmt"
	"net/http"
	"path"
	"slices"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
)

func init() {
	caddy.RegisterModule(UpstreamSource{})
}

// DefaultBrowsers are the pools a request may name when the pool comes
// from the request (a placeholder, or no pool configured) and no browsers
// list is given: Playwright's three browser types.
var DefaultBrowsers = []string{"chromium", "firefox", "webkit"}

// maxPoolName bounds a pool name (it becomes part of Redis keys).
const maxPoolName = 64

// errBadPool is the reason a request's pool was refused.
var errBadPool = errors.New("pool not allowed")

// validPoolName reports whether s is usable as a pool: 1-64 of
// letters, digits, '-', '_' and '.'.
func validPoolName(s string) bool {
	if s == "" || len(s) > maxPoolName {
		return false
	}
	for _, c := range s {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '_', c == '.':
		default:
			return false
		}
	}
	return true
}

// poolSpec is how a request's pool is found: a fixed name, a placeholder,
// or (empty) the ?browser= query parameter, else the last segment of the
// path, as in the lifetime-first rule's grid and wss://host/playwright/chromium. A pool that
// comes from the request must be one of the allowed browsers.
type poolSpec struct {
	pool     string
	browsers []string
}

// dynamic reports whether the pool depends on the request.
func (p poolSpec) dynamic() bool {
	return p.pool == "" || strings.Contains(p.pool, "{")
}

// allowed is the list a request's pool is checked against.
func (p poolSpec) allowed() []string {
	if len(p.browsers) > 0 {
		return p.browsers
	}
	if p.dynamic() {
		return DefaultBrowsers
	}
	return []string{p.pool}
}

func (p poolSpec) validate() error {
	for _, b := range p.browsers {
		if !validPoolName(b) {
			return fmt.Errorf("browsers: invalid pool name %q: use 1-%d letters, digits, '-', '_' or '.'", b, maxPoolName)
		}
	}
	if !p.dynamic() {
		if !validPoolName(p.pool) {
			return fmt.Errorf("invalid pool name %q: use 1-%d letters, digits, '-', '_' or '.'", p.pool, maxPoolName)
		}
		if len(p.browsers) > 0 && !slices.Contains(p.browsers, p.pool) {
			return fmt.Errorf("pool %q is not in browsers %v", p.pool, p.browsers)
		}
	}
	return nil
}

// resolve returns the request's pool, or an error naming the allowed
// pools (the text a client sees with 400).
func (p poolSpec) resolve(r *http.Request) (string, error) {
	var name string
	switch {
	case p.pool == "":
		name = r.URL.Query().Get("browser")
		if name == "" {
			name = path.Base(strings.TrimSuffix(r.URL.Path, "/"))
		}
	case strings.Contains(p.pool, "{"):
		repl, _ := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
		if repl == nil {
			repl = caddy.NewReplacer()
		}
		name = repl.ReplaceAll(p.pool, "")
	default:
		name = p.pool
	}
	allowed := p.allowed()
	if !validPoolName(name) || !slices.Contains(allowed, name) {
		shown := name
		if len(shown) > maxPoolName {
			shown = shown[:maxPoolName] + "…"
		}
		if name == "" {
			return "", fmt.Errorf("%w: no browser named; use one of: %s", errBadPool, strings.Join(allowed, ", "))
		}
		return "", fmt.Errorf("%w: unknown browser %q; use one of: %s", errBadPool, shown, strings.Join(allowed, ", "))
	}
	return name, nil
}

// UpstreamSource is the dynamic upstream source of the grid
// (`dynamic browser_grid [<pool>]`). It finds the request's pool and
// returns a single upstream whose address is a placeholder: the grid
// policy claims a worker in Select and fills it, so a request provisions
// one upstream however large the pool. Passive health checks must not be
// used with it (every worker shares that one upstream's record); the grid
// marks failing workers suspect in Redis instead.
type UpstreamSource struct {
	// Pool names the pool of workers; placeholders are expanded per
	// request, e.g. "{http.request.uri.query.browser}". Default: the
	// ?browser= query parameter, else the last path segment.
	Pool string `json:"pool,omitempty"`
	// Browsers lists the pools a request may name when the pool comes
	// from the request. Default: chromium, firefox, webkit.
	Browsers []string `json:"browsers,omitempty"`

	spec poolSpec
}

// CaddyModule returns the Caddy module information.
func (UpstreamSource) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.reverse_proxy.upstreams.browser_grid",
		New: func() caddy.Module { return new(UpstreamSource) },
	}
}

// Provision prepares the pool lookup.
func (u *UpstreamSource) Provision(caddy.Context) error {
	u.spec = poolSpec{pool: u.Pool, browsers: u.Browsers}
	return nil
}

// Validate checks the pool and browsers names.
func (u *UpstreamSource) Validate() error {
	if err := u.spec.validate(); err != nil {
		return fmt.Errorf("browser_grid upstreams: %w", err)
	}
	return nil
}

// dialPlaceholder is the upstream's address: the claimed worker's.
const dialPlaceholder = "{http.vars." + varDial + "}"

// GetUpstreams resolves the request's pool into its attempt and returns
// the one upstream that dials the worker Select claims.
func (u *UpstreamSource) GetUpstreams(r *http.Request) ([]*reverseproxy.Upstream, error) {
	if attemptOf(r) == nil {
		pool, err := u.spec.resolve(r)
		a := newAttempt(r, pool, DefaultDialRetries)
		if err != nil {
			a.fail(outcomeBadPool, err.Error())
		}
	}
	// A new Upstream per call: reverse_proxy writes to the upstreams it
	// provisions, so sharing one between requests would race.
	return []*reverseproxy.Upstream{{Dial: dialPlaceholder}}, nil
}

// UnmarshalCaddyfile sets up the source from Caddyfile tokens. Syntax:
//
//	dynamic browser_grid [<pool>] {
//	    browsers <pool...>
//	}
func (u *UpstreamSource) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // consume source name
	if d.NextArg() {
		u.Pool = d.Val()
		if d.NextArg() {
			return d.ArgErr()
		}
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		switch d.Val() {
		case "browsers":
			if u.Browsers != nil {
				return d.Err("browsers already specified")
			}
			u.Browsers = d.RemainingArgs()
			if len(u.Browsers) == 0 {
				return d.ArgErr()
			}
			for _, b := range u.Browsers {
				if !validPoolName(b) {
					return d.Errf("invalid browsers pool name '%s': use 1-%d letters, digits, '-', '_' or '.'", b, maxPoolName)
				}
			}
		default:
			return d.Errf("unrecognized browser_grid upstreams option '%s'", d.Val())
		}
	}
	if u.Pool != "" && !strings.Contains(u.Pool, "{") && !validPoolName(u.Pool) {
		return d.Errf("invalid pool name '%s': use 1-%d letters, digits, '-', '_' or '.'", u.Pool, maxPoolName)
	}
	return nil
}

// Interface guards
var (
	_ caddy.Provisioner           = (*UpstreamSource)(nil)
	_ caddy.Validator             = (*UpstreamSource)(nil)
	_ reverseproxy.UpstreamSource = (*UpstreamSource)(nil)
	_ caddyfile.Unmarshaler       = (*UpstreamSource)(nil)
)
