package caddygrid

import (
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/browsergrid/caddy-browser-grid/registry"
	"github.com/browsergrid/caddy-browser-grid/selection"
)

// Every policy of the registry's table is a grid policy module under its
// own name, the browser_grid directive's policy option takes every one,
// and a name the table lacks is refused with the table's names.
func TestEveryTablePolicyIsAModule(t *testing.T) {
	for _, p := range registry.Policies() {
		t.Run(string(p.Name), func(t *testing.T) {
			gp, err := newGridPolicy(string(p.Name))
			if err != nil {
				t.Fatal(err)
			}
			if id := gp.CaddyModule().ID; id != caddy.ModuleID("http.reverse_proxy.selection_policies."+string(p.Name)) {
				t.Fatalf("module ID %s", id)
			}
			h := new(Handler)
			d := caddyfile.NewTestDispenser("browser_grid chromium {\n policy " + string(p.Name) + "\n}")
			if err := h.UnmarshalCaddyfile(d); err != nil {
				t.Fatalf("policy %s in browser_grid: %v", p.Name, err)
			}
			if !strings.Contains(string(h.PolicyRaw), `"policy":"`+string(p.Name)+`"`) {
				t.Fatalf("policy JSON %s", h.PolicyRaw)
			}
		})
	}
	d := caddyfile.NewTestDispenser("browser_grid chromium {\n policy weighted_round_robin\n}")
	err := new(Handler).UnmarshalCaddyfile(d)
	if err == nil || !strings.Contains(err.Error(), registry.PolicyNames()) {
		t.Fatalf("an unknown policy: %v, want an error listing %s", err, registry.PolicyNames())
	}
}

// A vnode claim brings no scan budget of its own unless max_scan is set,
// as a lifetime_first claim does: while the pool's ring is being built the
// registry walks idx:lifetime with the request's MaxScan, or
// lifetime_first's default when it is 0 (and gives vnode its own 16
// otherwise). Sending vnode's default made such a claim scan 16 where
// lifetime_first scans 64, and refuse sessions lifetime_first serves
// (registry TestRev2CaddyVnodeBuildingClaimScanBudget).
func TestVnodeRequestLeavesMaxScanToTheRegistry(t *testing.T) {
	for _, tc := range []struct {
		block string
		want  int
	}{{"", 0}, {"max_scan 10", 10}} {
		p := new(VnodeSelection)
		if err := p.UnmarshalCaddyfile(caddyfile.NewTestDispenser("vnode {\n" + tc.block + "\n}")); err != nil {
			t.Fatal(err)
		}
		// as Provision makes it
		p.vnode = selection.Vnode{Limits: selection.Limits{MaxScan: p.MaxScan}}
		p.vnode.SetDefaults()
		req := p.request()
		// selectWorker fills a zero MaxScan from the block's options
		got := req.Limits.MaxScan
		if got == 0 {
			got = p.MaxScan
		}
		if got != tc.want {
			t.Errorf("vnode {%s}: the claim brings max_scan %d, want %d (what a lifetime_first block with the same options brings)",
				tc.block, got, tc.want)
		}
	}
}
