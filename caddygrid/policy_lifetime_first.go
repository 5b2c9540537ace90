package caddygrid

import (
	"fmt"
	"net/http"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/browsergrid/caddy-browser-grid/registry"
)

func init() {
	caddy.RegisterModule(new(LifetimeFirstSelection))
}

// LifetimeFirstSelection is the lifetime-first rule as a policy: it
// pushes one worker toward max_lifetime at a time (highest lifetime first,
// outside a safety margin of max_lifetime/workers), so workers drain and
// restart one after another instead of all together. It selects and
// claims in one atomic Redis call; it needs the browser_grid upstream
// source.
type LifetimeFirstSelection struct {
	ClaimOptions

	policyCore
}

// CaddyModule returns the Caddy module information.
func (*LifetimeFirstSelection) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.reverse_proxy.selection_policies." + policyLifetimeFirst,
		New: func() caddy.Module { return new(LifetimeFirstSelection) },
	}
}

// Provision fills the defaults and finds the grid app.
func (p *LifetimeFirstSelection) Provision(ctx caddy.Context) error {
	p.ClaimOptions.setDefaults()
	return p.provision(ctx, policyLifetimeFirst, p.ClaimOptions, registry.ClaimRequest{Policy: registry.LifetimeFirst})
}

// Validate checks the options.
func (p *LifetimeFirstSelection) Validate() error {
	if err := p.ClaimOptions.validate(); err != nil {
		return fmt.Errorf("%s: %w", policyLifetimeFirst, err)
	}
	return nil
}

// Select claims a worker (see policyCore.selectWorker).
func (p *LifetimeFirstSelection) Select(pool reverseproxy.UpstreamPool, r *http.Request, w http.ResponseWriter) *reverseproxy.Upstream {
	return p.selectWorker(pool, r, w, p.ClaimOptions, registry.ClaimRequest{Policy: registry.LifetimeFirst}, 0)
}

func (p *LifetimeFirstSelection) claimOptions() *ClaimOptions { return &p.ClaimOptions }

// UnmarshalCaddyfile sets up the policy from Caddyfile tokens. Syntax:
//
//	lb_policy lifetime_first {
//	    max_concurrent <n>
//	    max_lifetime   <n>
//	    max_scan       <n>
//	    select_timeout <duration>
//	    queue_size     <n>
//	    stagger_drains [on|off]
//	    client_limit   <n>
//	    client_key     <placeholder>
//	    version_routing [on|off]
//	}
func (p *LifetimeFirstSelection) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // consume policy name
	if d.NextArg() {
		return d.ArgErr()
	}
	return p.unmarshalOwn(d, true)
}

func (p *LifetimeFirstSelection) unmarshalOwn(d *caddyfile.Dispenser, shared bool) error {
	return unmarshalPolicyBlock(d, &p.ClaimOptions, shared, nil, func(name string) error {
		return d.Errf("unrecognized %s option '%s'", policyLifetimeFirst, name)
	})
}

// Interface guards
var (
	_ gridPolicy            = (*LifetimeFirstSelection)(nil)
	_ caddy.Provisioner     = (*LifetimeFirstSelection)(nil)
	_ caddy.Validator       = (*LifetimeFirstSelection)(nil)
	_ caddyfile.Unmarshaler = (*LifetimeFirstSelection)(nil)
	_ reverseproxy.Selector = (*LifetimeFirstSelection)(nil)
)
