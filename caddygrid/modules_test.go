package caddygrid_test

import (
	"os/exec"
	"strings"
	"testing"
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
	for _, id := range []string{
		"grid",
		"admin.api.grid",
		"http.handlers.browser_grid",
		"http.handlers.browser_grid_ui",
		"http.reverse_proxy.upstreams.browser_grid",
		"http.reverse_proxy.selection_policies.lifetime_first",
		"http.reverse_proxy.selection_policies.vnode",
		"http.reverse_proxy.selection_policies.fair_share",
	} {
		if !listed[id] {
			t.Errorf("caddy list-modules does not list %s", id)
		}
	}
}
