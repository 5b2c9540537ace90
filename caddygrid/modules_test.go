package caddygrid_test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/browsergrid/caddy-browser-grid/registry"
)

// TestListModules: the caddy users build lists every module of the grid.
func TestListModules(t *testing.T) {
	out, err := exec.Command(caddyBin(t), "list-modules").CombinedOutput()
	if err != nil {
		t.Fatalf("caddy list-modules: %v\n%s", err, out)
	}
	listed := map[string]bool{}
	for _, line := range strings.Split(string(out), "\n") {
		listed[strings.TrimSpace(line)] = true
	}
	ids := []string{
		"grid",
		"admin.api.grid",
		"http.handlers.browser_grid",
		"http.handlers.browser_grid_ui",
		"http.reverse_proxy.upstreams.browser_grid",
	}
	// Every policy of the registry's table is a selection policy module.
	for _, p := range registry.Policies() {
		ids = append(ids, "http.reverse_proxy.selection_policies."+string(p.Name))
	}
	for _, id := range ids {
		if !listed[id] {
			t.Errorf("caddy list-modules does not list %s", id)
		}
	}
}
