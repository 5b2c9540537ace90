package caddygrid

import (
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/browsergrid/caddy-browser-grid/registry"
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
