package caddygrid

import (
	"fmt"
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/browsergrid/caddy-browser-grid/registry"
	"github.com/browsergrid/caddy-browser-grid/selection"
)

func init() {
	caddy.RegisterModule(new(FairShareSelection))
}

// FairShareSelection is the fair-share policy (poolifier's strategy): each worker's
// queue is predicted to end at max(now, its predicted end) plus its
// estimated session length (the moving average, or median, of its last
// window sessions), and the worker whose predicted end comes first takes
// the session. It selects and claims in one atomic Redis call; it needs
// the browser_grid upstream source.
type FairShareSelection struct {
	ClaimOptions

	// Window is how many recent session durations make a worker's
	// estimate, 1-1000. Default: 20.
	Window int `json:"window,omitempty"`
	// Median estimates with the moving median instead of the moving
	// average. Default: false.
	Median bool `json:"median,omitempty"`
	// DefaultEstimate is the estimate for a worker without history, in
	// whole milliseconds. Default: 30s.
	DefaultEstimate caddy.Duration `json:"default_estimate,omitempty"`

	policyCore
	fair selection.FairShare
}

// CaddyModule returns the Caddy module information.
func (*FairShareSelection) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.reverse_proxy.selection_policies." + policyFairShare,
		New: func() caddy.Module { return new(FairShareSelection) },
	}
}

// Provision fills the defaults (window 20, default estimate 30s) and finds
// the grid app.
func (p *FairShareSelection) Provision(ctx caddy.Context) error {
	p.ClaimOptions.setDefaults()
	p.fair = selection.FairShare{
		Limits:  selection.Limits{MaxScan: p.MaxScan},
		Window:  p.Window,
		Median:  p.Median,
		Default: time.Duration(p.DefaultEstimate),
	}
	p.fair.SetDefaults()
	return p.provision(ctx, policyFairShare, p.ClaimOptions, registry.ClaimRequest{Policy: registry.FairShare, FairShare: p.fair})
}

// Validate checks the options.
func (p *FairShareSelection) Validate() error {
	if err := p.ClaimOptions.validate(); err != nil {
		return fmt.Errorf("%s: %w", policyFairShare, err)
	}
	if err := p.fair.Validate(); err != nil {
		return fmt.Errorf("%s: %w", policyFairShare, err)
	}
	return nil
}

// Select claims a worker (see policyCore.selectWorker).
func (p *FairShareSelection) Select(pool reverseproxy.UpstreamPool, r *http.Request, w http.ResponseWriter) *reverseproxy.Upstream {
	return p.selectWorker(pool, r, w, p.ClaimOptions, registry.ClaimRequest{Policy: registry.FairShare, FairShare: p.fair}, 0)
}

func (p *FairShareSelection) claimOptions() *ClaimOptions { return &p.ClaimOptions }

// UnmarshalCaddyfile sets up the policy from Caddyfile tokens. Syntax:
//
//	lb_policy fair_share {
//	    window           <1-1000>
//	    median
//	    default_estimate <duration>
//	    max_concurrent   <n>
//	    max_lifetime     <n>
//	    max_scan         <n>
//	    select_timeout   <duration>
//	    queue_size       <n>
//	    stagger_drains   [on|off]
//	    client_limit     <n>
//	    client_key       <placeholder>
//	    version_routing  [on|off]
//	}
func (p *FairShareSelection) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // consume policy name
	if d.NextArg() {
		return d.ArgErr()
	}
	return p.unmarshalOwn(d, true)
}

func (p *FairShareSelection) unmarshalOwn(d *caddyfile.Dispenser, shared bool) error {
	return unmarshalPolicyBlock(d, &p.ClaimOptions, shared, nil, func(name string) error {
		switch name {
		case "window":
			n, err := intArg(d, name, 1, selection.MaxWindow)
			if err != nil {
				return err
			}
			p.Window = n
		case "median":
			if d.NextArg() {
				return d.ArgErr()
			}
			p.Median = true
		case "default_estimate":
			if !d.NextArg() {
				return d.ArgErr()
			}
			val := d.Val()
			if d.NextArg() {
				return d.ArgErr()
			}
			dur, err := caddy.ParseDuration(val)
			if err != nil {
				return d.Errf("invalid default_estimate '%s': %v", val, err)
			}
			if dur <= 0 || dur%time.Millisecond != 0 {
				return d.Errf("invalid default_estimate '%s': must be more than 0, in whole milliseconds", val)
			}
			p.DefaultEstimate = caddy.Duration(dur)
		default:
			return d.Errf("unrecognized %s option '%s'", policyFairShare, name)
		}
		return nil
	})
}

// Interface guards
var (
	_ gridPolicy            = (*FairShareSelection)(nil)
	_ caddy.Provisioner     = (*FairShareSelection)(nil)
	_ caddy.Validator       = (*FairShareSelection)(nil)
	_ caddyfile.Unmarshaler = (*FairShareSelection)(nil)
	_ reverseproxy.Selector = (*FairShareSelection)(nil)
)
