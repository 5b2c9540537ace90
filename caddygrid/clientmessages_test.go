package caddygrid_test

import (
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
)

// TestPlaywrightShowsTheGridsReasonInItsError: a real Playwright client
// refused by the grid (no browser free within select_timeout, the client
// at its client_limit, a launch option the grid does not allow) shows the
// grid's sentence in its own error.
func TestPlaywrightShowsTheGridsReasonInItsError(t *testing.T) {
	t.Parallel()
	node := testenv.LookPath(t, "node")
	root := testenv.RepoRoot(t)
	if _, err := os.Stat(filepath.Join(root, "playwright", "node_modules", "playwright-core")); err != nil {
		testenv.Missing(t, "playwright-core not installed in playwright/ (run 'make deps')")
	}
	g := newGrid(t)
	g.agent("chromium", nil)
	c := startCaddy(t, caddyOpts{redisURL: g.redis.URL(), site: site(
		"max_concurrent 1\n\t\t\tselect_timeout 1s\n\t\t\tclient_limit 1\n\t\t\tclient_key {http.request.header.X-Client}")})
	h := http.Header{}
	h.Set("X-Client", "alice")
	held, err := dialHeader(context.Background(), c.url("/playwright/chromium"), h)
	if err != nil {
		t.Fatal(err)
	}
	defer held.close()

	playwright := func(headers ...string) string {
		t.Helper()
		args := []string{filepath.Join(root, "playwright", "client.mjs"), "run", "--url", c.url("/playwright/chromium"), "--timeout", "15000"}
		for _, h := range headers {
			args = append(args, "--header", h)
		}
		out, _ := exec.Command(node, args...).CombinedOutput()
		return string(out)
	}
	for _, tc := range []struct {
		name    string
		headers []string
		says    string
	}{
		{"no browser free", []string{"X-Client: bob"}, "no chromium browser became free within 1s"},
		{"at its client_limit", []string{"X-Client: alice"}, "client limit reached"},
		{"a launch option not allowed", []string{"X-Client: bob", `x-playwright-launch-options: {"headless":false}`}, "the launch option headless is not allowed here"},
	} {
		if out := playwright(tc.headers...); !strings.Contains(out, tc.says) {
			t.Errorf("%s: the Playwright client's error does not say %q:\n%s", tc.name, tc.says, out)
		}
	}
}
