package workeragent

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
	"github.com/browsergrid/caddy-browser-grid/registry"
)

// TestFlagServersAreSharedByTheirFlagsAndBounded: a per-session worker's
// launcher runs a browser server for each set of flags in use, one the
// sessions with the same flags share and sessions with other flags do
// not; once their sessions end, at most two of them wait for more, the
// others' folders go with them, and the launcher's stop takes them all.
func TestFlagServersAreSharedByTheirFlagsAndBounded(t *testing.T) {
	b := startFlagLauncher(t)
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
	a1, r1 := get("--accept-lang=de")
	a2, r2 := get("--accept-lang=de")
	b1, r3 := get("--accept-lang=fr")
	if a1 != a2 || a1 == b1 || a1 == dialAddr(b.Endpoint) {
		t.Fatalf("servers: %s and %s for --accept-lang=de, %s for --accept-lang=fr, %s without flags; want one for each set of flags", a1, a2, b1, b.Endpoint.Host)
	}
	if n := runServers(t, b.Pid); n != 3 {
		t.Fatalf("%d run-servers with two sets of flags in use, want 3", n)
	}
	r1()
	r2()
	r3()
	for _, lang := range []string{"es", "it", "pt"} {
		_, release := get("--accept-lang=" + lang)
		release()
	}
	testenv.Eventually(t, 10*time.Second, "at most two idle flag servers are kept", func() bool { return runServers(t, b.Pid) == 3 })
	// and only theirs of the flag servers' folders, none holding another's
	dirs, _ := filepath.Glob(filepath.Join(filepath.Dir(b.Dir), "flags-*"))
	testenv.Eventually(t, 5*time.Second, "the closed flag servers' folders are removed", func() bool {
		dirs, _ = filepath.Glob(filepath.Join(filepath.Dir(b.Dir), "flags-*"))
		return len(dirs) == 2
	})
	for _, d := range dirs {
		if nested, _ := filepath.Glob(filepath.Join(d, "flags-*")); len(nested) > 0 {
			t.Errorf("%s holds %v", d, nested)
		}
	}
	if err := b.Stop(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	if n := runServers(t, b.Pid); n != 0 {
		t.Fatalf("%d run-servers left after the browser stopped", n)
	}
}

// TestALateReleaseLeavesTheNextServerOfItsFlagsAlone: when the browser
// server of a session's flags dies under it, and a new session of the
// same flags gets a new one, the first session's end does not count
// against the new server, which serves on.
func TestALateReleaseLeavesTheNextServerOfItsFlagsAlone(t *testing.T) {
	b := startFlagLauncher(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	before := runServerPids(b.Pid)
	_, releaseA, err := b.FlagServer(ctx, []string{"--accept-lang=de"})
	if err != nil {
		t.Fatal(err)
	}
	for p := range runServerPids(b.Pid) {
		if !before[p] {
			_ = syscall.Kill(p, syscall.SIGKILL) // the server of session A dies
		}
	}
	testenv.Eventually(t, 10*time.Second, "the killed server is gone", func() bool { return runServers(t, b.Pid) == 1 })
	time.Sleep(500 * time.Millisecond) // for the launcher to hear of it
	addrB, releaseB, err := b.FlagServer(ctx, []string{"--accept-lang=de"})
	if err != nil {
		t.Fatal(err)
	}
	defer releaseB()
	releaseA()                                     // session A ends after B began
	for _, lang := range []string{"x", "y", "z"} { // enough idle servers to evict one
		_, release, err := b.FlagServer(ctx, []string{"--accept-lang=" + lang})
		if err != nil {
			t.Fatal(err)
		}
		release()
	}
	time.Sleep(time.Second)
	c, err := net.DialTimeout("tcp", addrB, time.Second)
	if err != nil {
		t.Fatalf("session B's server %s was closed under it: %v", addrB, err)
	}
	c.Close()
}

// startFlagLauncher starts a per-session Chromium launcher, stopped when
// the test ends.
func startFlagLauncher(t *testing.T) *Browser {
	t.Helper()
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
	t.Cleanup(func() { _ = b.Stop(5 * time.Second) })
	return b
}

// runServers counts the live run-server processes whose parent is pid
// (setpriv execs node in its own place).
func runServers(t *testing.T, pid int) int {
	return len(runServerPids(pid))
}

// runServerPids are the live run-server processes whose parent is pid.
func runServerPids(pid int) map[int]bool {
	ents, _ := os.ReadDir("/proc")
	out := map[int]bool{}
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
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
			out[p] = true
		}
	}
	return out
}

// TestTheAgentPassesOnlyFlagsThatActOnTheBrowserAlone: the agent
// applies the flags the claim carries (Caddy checked them against its
// route's launch_args), whatever the request says; none beyond
// registry.PassableArgs (one that writes a file where its value says
// could overwrite the wrapper that launches the next browser with
// flags), none to a browser that cannot take them, and a client's args
// that reach it without the claim's are refused, not dropped.
func TestTheAgentPassesOnlyFlagsThatActOnTheBrowserAlone(t *testing.T) {
	req := func(args string) *http.Request {
		r := httptest.NewRequest(http.MethodGet, "/playwright", nil)
		if args != "" {
			r.Header.Set("X-Playwright-Launch-Options", `{"args":`+args+`}`)
		}
		return r
	}
	for _, tc := range []struct {
		launcher, browser string
		claim             []string // the claim's flags
		args              string   // the request's
		want              string   // the flags applied, or what the refusal says
	}{
		{LauncherPlaywrightServer, "chromium", []string{"--accept-lang=de"}, `["--accept-lang=de"]`, "--accept-lang=de"},
		{LauncherPlaywrightServer, "chromium", []string{"--accept-lang=de"}, `["--accept-lang=fr","--window-size=8,6"]`, "--accept-lang=de"},
		{LauncherPlaywrightServer, "chromium", nil, `["--accept-lang=de"]`, "args are not allowed here: this route passes no flags"},
		{LauncherPlaywrightServer, "chromium", []string{"--accept-lang=de", "--log-net-log=/tmp/x"}, "", "--log-net-log is not a flag the grid passes"},
		{LauncherPlaywrightServer, "chromium", []string{"--no-sandbox"}, "", "--no-sandbox is not a flag the grid passes"},
		{LauncherPlaywrightServer, "firefox", []string{"--accept-lang=de"}, "", "this worker's browser is firefox"},
		{LauncherPlaywright, "chromium", []string{"--accept-lang=de"}, "", "shared by its sessions, so args cannot apply"},
		{LauncherCDP, "chromium", []string{"--accept-lang=de"}, "", "takes no flags from a client"},
		{LauncherPlaywrightServer, "chromium", nil, "", ""},
	} {
		f := &front{a: &Agent{cfg: Config{Launcher: tc.launcher, BrowserType: tc.browser}}}
		args, msg := f.launchRequest(req(tc.args), registry.Ticket{Args: tc.claim})
		refusal := strings.Contains(tc.want, " ") // the wants of refusals are sentences
		if got := strings.Join(args, " "); refusal && !strings.Contains(msg, tc.want) || !refusal && (msg != "" || got != tc.want) {
			t.Errorf("%s %s, claim %q, request %s: flags %q, refusal %q; want %q", tc.launcher, tc.browser, tc.claim, tc.args, got, msg, tc.want)
		}
	}
}
