package caddygrid_test

import (
	"strings"
	"testing"

	fake "github.com/browsergrid/caddy-browser-grid/cmd/fakebrowser/fake"
)

// TestVnodeVirtualNodesWarns: the vnode policy's virtual_nodes is accepted
// (configs that set it keep loading) but changes nothing, since each worker
// registers its own ring positions. An operator who sets it is told so in
// Caddy's log; one who does not set it sees no such line. Sessions are
// served either way.
func TestVnodeVirtualNodesWarns(t *testing.T) {
	g := newGrid(t)
	g.worker("chromium", "w1", fake.Behavior{})
	const warning = "virtual_nodes has no effect"
	for _, tc := range []struct {
		name, block string
		warned      bool
	}{
		{"set", "policy vnode {\n\t\t\t\tvirtual_nodes 16\n\t\t\t}", true},
		{"unset", "policy vnode {\n\t\t\t\tsamples 2\n\t\t\t}", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := startCaddy(t, caddyOpts{redisURL: g.redis.URL(), site: `
	route /playwright/* {
		browser_grid chromium {
			` + tc.block + `
		}
	}`})
			s := mustDial(t, c.url("/playwright/chromium"))
			if err := s.echo("hello"); err != nil {
				t.Fatalf("session through the vnode policy: %v", err)
			}
			s.close()
			out := c.proc.Output()
			if got := strings.Contains(out, warning); got != tc.warned {
				t.Errorf("log has %q: %v, want %v\n%s", warning, got, tc.warned, out)
			}
			if tc.warned && !strings.Contains(out, `"virtual_nodes":16`) {
				t.Errorf("the warning does not name the configured value 16:\n%s", out)
			}
		})
	}
}
