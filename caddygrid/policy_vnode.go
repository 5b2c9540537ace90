package caddygrid

import (
	"fmt"
	"net/http"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"go.uber.org/zap"

	"github.com/browsergrid/caddy-browser-grid/registry"
	"github.com/browsergrid/caddy-browser-grid/selection"
)

func init() {
	caddy.RegisterModule(new(VnodeSelection))
}

// VnodeSelection is the ring of virtual nodes with power-of-K choices of
// the vnode design: each worker owns virtual_nodes positions on a hash ring, a
// decision draws samples random pivots, walks to the first usable worker
// after each, and takes the one with the fewest live sessions (plus a
// random jitter below slot_jitter). It selects and claims in one atomic
// Redis call; it needs the browser_grid upstream source.
type VnodeSelection struct {
	ClaimOptions

	// VirtualNodes is V, the ring positions of a worker, 1-64 (4-32
	// recommended). It is only range-checked: each worker registers its
	// own positions (grid-worker -virtual-nodes, default 8), and claims
	// walk those. Default: 8.
	VirtualNodes int `json:"virtual_nodes,omitempty"`
	// Samples is K, the independent pivots of one decision, 1-8. 1 skips
	// the comparison of live sessions. Default: 2.
	Samples int `json:"samples,omitempty"`
	// SlotJitter adds a random integer in [0, slot_jitter) to each
	// candidate's live sessions before comparing, 0-64; 0 disables it.
	// Default: 4.
	SlotJitter *int `json:"slot_jitter,omitempty"`

	policyCore
	vnode selection.Vnode
}

// CaddyModule returns the Caddy module information.
func (*VnodeSelection) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.reverse_proxy.selection_policies." + policyVnode,
		New: func() caddy.Module { return new(VnodeSelection) },
	}
}

// Provision fills the defaults (the vnode design: V 8, K 2, max_scan 16,
// slot_jitter 4) and finds the grid app.
func (p *VnodeSelection) Provision(ctx caddy.Context) error {
	p.ClaimOptions.setDefaults()
	// selection.Vnode reads a zero SlotJitter as "default" and -1 as
	// "none"; here nil is the default and 0 is none.
	jitter := 0
	if p.SlotJitter != nil {
		jitter = *p.SlotJitter
		if jitter == 0 {
			jitter = -1
		}
	}
	p.vnode = selection.Vnode{
		Limits:       selection.Limits{MaxScan: p.MaxScan},
		VirtualNodes: p.VirtualNodes,
		Samples:      p.Samples,
		SlotJitter:   jitter,
	}
	p.vnode.SetDefaults()
	if err := p.provision(ctx, policyVnode, p.ClaimOptions, p.request()); err != nil {
		return err
	}
	if p.VirtualNodes != 0 {
		// Accepted so that configs that set it keep loading, but a worker's
		// ring positions are the ones its agent registered: say so, rather
		// than let an operator believe the ring follows this value.
		p.logger.Warn("virtual_nodes has no effect: each worker's ring positions are the ones its agent registered (grid-worker -virtual-nodes, default 8)",
			zap.Int("virtual_nodes", p.VirtualNodes))
	}
	return nil
}

// Validate checks the options against the vnode design's ranges.
func (p *VnodeSelection) Validate() error {
	if err := p.ClaimOptions.validate(); err != nil {
		return fmt.Errorf("%s: %w", policyVnode, err)
	}
	if p.SlotJitter != nil && (*p.SlotJitter < 0 || *p.SlotJitter > selection.MaxSlotJitter) {
		return fmt.Errorf("%s: slot_jitter %d: must be 0-%d", policyVnode, *p.SlotJitter, selection.MaxSlotJitter)
	}
	if err := p.vnode.Validate(); err != nil {
		return fmt.Errorf("%s: %w", policyVnode, err)
	}
	return nil
}

// Select claims a worker (see policyCore.selectWorker).
func (p *VnodeSelection) Select(pool reverseproxy.UpstreamPool, r *http.Request, w http.ResponseWriter) *reverseproxy.Upstream {
	return p.selectWorker(pool, r, w, p.ClaimOptions, p.request(), p.vnode.Samples)
}

// request is the policy's part of a claim. Limits.MaxScan stays the
// configured max_scan (0: none): selectWorker and the registry default
// it, and the registry's lifetime_first fallback, while the pool's ring
// is being built, uses lifetime_first's default rather than vnode's 16.
func (p *VnodeSelection) request() registry.ClaimRequest {
	return registry.ClaimRequest{Policy: registry.Vnode, Vnode: p.vnode}
}

func (p *VnodeSelection) claimOptions() *ClaimOptions { return &p.ClaimOptions }

// UnmarshalCaddyfile sets up the policy from Caddyfile tokens. Syntax:
//
//	lb_policy vnode {
//	    virtual_nodes <1-64>
//	    samples       <1-8>
//	    slot_jitter   <0-64>
//	    max_scan      <1-256>
//	    max_concurrent <n>
//	    max_lifetime   <n>
//	    select_timeout <duration>
//	    queue_size     <n>
//	    stagger_drains [on|off]
//	    client_limit   <n>
//	    client_key     <placeholder>
//	    version_routing [on|off]
//	}
func (p *VnodeSelection) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // consume policy name
	if d.NextArg() {
		return d.ArgErr()
	}
	return p.unmarshalOwn(d, true)
}

func (p *VnodeSelection) unmarshalOwn(d *caddyfile.Dispenser, shared bool) error {
	// max_scan is a shared option that vnode also takes in its own block.
	isMaxScan := func(name string) bool { return name == "max_scan" }
	return unmarshalPolicyBlock(d, &p.ClaimOptions, shared, isMaxScan, func(name string) error {
		var err error
		switch name {
		case "virtual_nodes":
			p.VirtualNodes, err = intArg(d, name, 1, selection.MaxVirtualNodes)
		case "samples":
			p.Samples, err = intArg(d, name, 1, selection.MaxSamples)
		case "slot_jitter":
			var n int
			n, err = intArg(d, name, 0, selection.MaxSlotJitter)
			p.SlotJitter = &n
		default:
			return d.Errf("unrecognized %s option '%s'", policyVnode, name)
		}
		return err
	})
}

// Interface guards
var (
	_ gridPolicy            = (*VnodeSelection)(nil)
	_ caddy.Provisioner     = (*VnodeSelection)(nil)
	_ caddy.Validator       = (*VnodeSelection)(nil)
	_ caddyfile.Unmarshaler = (*VnodeSelection)(nil)
	_ reverseproxy.Selector = (*VnodeSelection)(nil)
)
