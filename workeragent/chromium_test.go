package workeragent_test

// Real Chromium through the agent's two real launchers, checked with a real
// playwright-core client (playwright/worker-check.mjs) connecting straight
// to the endpoint the agent registered.

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
	"github.com/browsergrid/caddy-browser-grid/registry"
)

func requireChromium(t *testing.T) (node, root string) {
	t.Helper()
	node = testenv.LookPath(t, "node")
	if _, err := os.Stat("/usr/bin/chromium"); err != nil {
		testenv.Missing(t, "/usr/bin/chromium not installed")
	}
	root = testenv.RepoRoot(t)
	if _, err := os.Stat(filepath.Join(root, "playwright", "node_modules", "playwright-core")); err != nil {
		testenv.Missing(t, "playwright/node_modules/playwright-core not installed (npm ci in playwright/)")
	}
	return node, root
}

type checkResult struct {
	OK      bool   `json:"ok"`
	Title   string `json:"title"`
	Answer  int    `json:"answer"`
	Text    string `json:"text"`
	Version string `json:"version"`
	Error   string `json:"error"`
}

func runCheck(t *testing.T, node, root, mode, endpoint string) checkResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, filepath.Join(root, "playwright", "worker-check.mjs"), mode, endpoint, "60000")
	cmd.Dir = filepath.Join(root, "playwright")
	out, err := cmd.Output()
	var res checkResult
	if jerr := json.Unmarshal(out, &res); jerr != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("worker-check printed %q (%v); stderr:\n%s", out, err, stderr)
	}
	if err != nil || !res.OK {
		t.Fatalf("worker-check %s %s failed: %v %+v", mode, endpoint, err, res)
	}
	return res
}

func chromiumWorker(t *testing.T, launcher string) (*testenv.Process, *registry.Registry, registry.WorkerInfo, []int, string, string) {
	t.Helper()
	node, root := requireChromium(t)
	r := testenv.StartRedis(t)
	reg := newRegistry(t, r)
	p := testenv.Start(t, nil, gridWorker(), "-redis", r.URL(), "-launcher", launcher,
		"-launch-script", filepath.Join(root, "playwright", "launch-server.mjs"),
		"-heartbeat-interval", "1s", "-key-ttl", "15s", "-stale-threshold", "15s", "-start-timeout", "60s",
		"-max-concurrent", "2", "-log-format", "json")
	w := waitOne(t, reg, "chromium", "", 60*time.Second)
	_, _, groups := browserOf(t, p, w.ID)
	return p, reg, w, groups, node, root
}

// stopAndCheckNothingLeft sends SIGTERM and checks the agent drains,
// deregisters, exits 0 and leaves no browser process behind.
func stopAndCheckNothingLeft(t *testing.T, p *testenv.Process, reg *registry.Registry, w registry.WorkerInfo, groups []int) {
	t.Helper()
	if len(groupMembers(groups)) == 0 {
		t.Fatalf("no running processes found in the browser's groups %v before stopping", groups)
	}
	p.Cmd.Process.Signal(syscall.SIGTERM)
	if code := exitCode(t, p, 30*time.Second); code != 0 {
		t.Fatalf("exit code %d, want 0", code)
	}
	if _, ok := registered(t, reg, "chromium", w.ID); ok {
		t.Fatal("still registered after exit")
	}
	if left := groupMembers(groups); len(left) > 0 {
		t.Fatalf("browser processes %v left behind (groups %v)", left, groups)
	}
}

func TestPlaywrightLauncherServesAPlaywrightClient(t *testing.T) {
	p, reg, w, groups, node, root := chromiumWorker(t, "playwright")
	if w.Path != "/playwright" || w.Capacity != 2 || !strings.HasPrefix(w.Addr, "127.0.0.1:") {
		t.Fatalf("registered %+v", w)
	}
	// Playwright runs Chromium in a process group of its own: the agent
	// must know both groups to leave nothing behind.
	if len(groups) < 2 {
		t.Fatalf("process groups %v: want the launcher's and Chromium's", groups)
	}
	res := runCheck(t, node, root, "connect", "ws://"+w.Addr+w.Path)
	if res.Title != "worker check" || res.Answer != 42 || res.Text != "hello from the worker" || res.Version == "" {
		t.Fatalf("check result %+v", res)
	}
	// The client's close ended its session, not the browser.
	heartbeatsWhile(t, reg, "chromium", w.ID, 1, func(w registry.WorkerInfo) bool { return w.Status == "available" })
	runCheck(t, node, root, "connect", "ws://"+w.Addr+w.Path)
	stopAndCheckNothingLeft(t, p, reg, w, groups)
}

func TestCDPLauncherServesConnectOverCDP(t *testing.T) {
	p, reg, w, groups, node, root := chromiumWorker(t, "cdp")
	if !strings.HasPrefix(w.Path, "/devtools/browser/") || len(w.Path) <= len("/devtools/browser/") {
		t.Fatalf("registered path %q, want Chromium's browser WebSocket path", w.Path)
	}
	res := runCheck(t, node, root, "cdp", "ws://"+w.Addr+w.Path)
	if res.Title != "worker check" || res.Answer != 42 || res.Text != "hello from the worker" {
		t.Fatalf("check result %+v", res)
	}
	heartbeatsWhile(t, reg, "chromium", w.ID, 1, func(w registry.WorkerInfo) bool { return w.Status == "available" })
	stopAndCheckNothingLeft(t, p, reg, w, groups)
}
