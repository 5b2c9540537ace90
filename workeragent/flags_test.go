package workeragent

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
)

// TestFlagServersAreSharedByTheirFlagsAndBounded: a per-session worker's
// launcher runs a browser server for each set of flags in use, one the
// sessions with the same flags share and sessions with other flags do
// not; once their sessions end, at most two of them wait for more, and
// the launcher's stop takes them all.
func TestFlagServersAreSharedByTheirFlagsAndBounded(t *testing.T) {
	node := testenv.LookPath(t, "node")
	root := testenv.RepoRoot(t)
	if _, err := os.Stat(filepath.Join(root, "playwright", "node_modules", "playwright-core")); err != nil {
		testenv.Missing(t, "playwright-core in playwright/node_modules")
	}
	if _, err := os.Stat(DefaultChromium); err != nil {
		testenv.Missing(t, "Chromium at %s", DefaultChromium)
	}
	cfg := Config{Launcher: LauncherPlaywrightServer, BrowserType: "chromium", Node: node, FFmpeg: "none",
		LaunchScript: filepath.Join(root, "playwright", "launch-server.mjs"), Host: "127.0.0.1", WSPath: "/playwright", StartTimeout: 30 * time.Second}
	launch, err := playwrightLauncher(cfg, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	b, err := launch(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer b.Stop(5 * time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	get := func(args ...string) (string, func()) {
		t.Helper()
		addr, release, err := b.FlagServer(ctx, args)
		if err != nil {
			t.Fatalf("FlagServer(%v): %v", args, err)
		}
		return addr, release
	}
	a1, r1 := get("--lang=de")
	a2, r2 := get("--lang=de")
	b1, r3 := get("--lang=fr")
	if a1 != a2 || a1 == b1 || a1 == dialAddr(b.Endpoint) {
		t.Fatalf("servers: %s and %s for --lang=de, %s for --lang=fr, %s without flags; want one for each set of flags", a1, a2, b1, b.Endpoint.Host)
	}
	if n := runServers(t, b.Pid); n != 3 {
		t.Fatalf("%d run-servers with two sets of flags in use, want 3", n)
	}
	r1()
	r2()
	r3()
	for _, lang := range []string{"es", "it", "pt"} {
		_, release := get("--lang=" + lang)
		release()
	}
	testenv.Eventually(t, 10*time.Second, "at most two idle flag servers are kept", func() bool { return runServers(t, b.Pid) == 3 })
	if err := b.Stop(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	if n := runServers(t, b.Pid); n != 0 {
		t.Fatalf("%d run-servers left after the browser stopped", n)
	}
}

// runServers counts the live run-server processes whose parent is pid,
// or whose parent's parent is (setpriv execs node in its place).
func runServers(t *testing.T, pid int) int {
	ents, _ := os.ReadDir("/proc")
	n := 0
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		cmd, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		stat, _ := os.ReadFile("/proc/" + e.Name() + "/stat")
		s := string(stat)
		i := strings.LastIndexByte(s, ')')
		if i < 0 || !strings.Contains(string(cmd), "run-server") {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) > 1 && f[0] != "Z" && f[1] == strconv.Itoa(pid) {
			n++
		}
	}
	return n
}
