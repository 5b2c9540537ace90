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
	caddy.RegisterModule(new(IWRRSelection))
}

// policyIWRR is the policy's name (Caddy's own weighted_round_robin takes
// the plain name).
const policyIWRR = string(registry.InterleavedWeightedRoundRobin)

// IWRRSelection is poolifier's interleaved weighted round robin as a grid
// policy: turns are dealt in rounds, round r going to the workers whose
// weight is at least r, lighter workers first, so a worker of weight w
// gets w turns in every cycle, spread between the others'. A worker's
// weight is what its agent registered (grid-worker -weight, default its
// capacity). The round robin's cursor lives in Redis, shared by every
// Caddy of the grid. It selects and claims in one atomic Redis call; it
// needs the browser_grid upstream source.
type IWRRSelection struct {
	ClaimOptions

	policyCore
}

// CaddyModule returns the Caddy module information.
func (*IWRRSelection) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.reverse_proxy.selection_policies." + caddy.ModuleID(policyIWRR),
		New: func() caddy.Module { return new(IWRRSelection) },
	}
}

// Provision fills the defaults and finds the grid app.
func (p *IWRRSelection) Provision(ctx caddy.Context) error {
	p.ClaimOptions.setDefaults()
	return p.provision(ctx, policyIWRR, p.ClaimOptions, registry.ClaimRequest{Policy: registry.InterleavedWeightedRoundRobin})
}

// Validate checks the options.
func (p *IWRRSelection) Validate() error {
	if err := p.ClaimOptions.validate(); err != nil {
		return fmt.Errorf("%s: %w", policyIWRR, err)
	}
	return nil
}

// Select claims a worker (see policyCore.selectWorker).
func (p *IWRRSelection) Select(pool reverseproxy.UpstreamPool, r *http.Request, w http.ResponseWriter) *reverseproxy.Upstream {
	return p.selectWorker(pool, r, w, p.ClaimOptions, registry.ClaimRequest{Policy: registry.InterleavedWeightedRoundRobin}, 0)
}

func (p *IWRRSelection) claimOptions() *ClaimOptions { return &p.ClaimOptions }

// UnmarshalCaddyfile sets up the policy from Caddyfile tokens. Syntax:
//
//	lb_policy interleaved_weighted_round_robin {
//	    max_concurrent  <n>
//	    max_lifetime    <n>
//	    max_scan        <n>
//	    select_timeout  <duration>
//	    queue_size      <n>
//	    stagger_drains  [on|off]
//	    client_limit    <n>
//	    client_key      <placeholder>
//	    version_routing [on|off]
//	}
func (p *IWRRSelection) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // consume policy name
	if d.NextArg() {
		return d.ArgErr()
	}
	return p.unmarshalOwn(d, true)
}

func (p *IWRRSelection) unmarshalOwn(d *caddyfile.Dispenser, shared bool) error {
	return unmarshalPolicyBlock(d, &p.ClaimOptions, shared, nil, func(name string) error {
		return d.Errf("unrecognized %s option '%s'", policyIWRR, name)
	})
}

// Interface guards
var (
	_ gridPolicy            = (*IWRRSelection)(nil)
	_ caddy.Provisioner     = (*IWRRSelection)(nil)
	_ caddy.Validator       = (*IWRRSelection)(nil)
	_ caddyfile.Unmarshaler = (*IWRRSelection)(nil)
	_ reverseproxy.Selector = (*IWRRSelection)(nil)
)
