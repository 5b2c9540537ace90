package localgrid

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"html"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/internal/netns"
	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
	"github.com/browsergrid/caddy-browser-grid/registry"
)

// The end-to-end tests run the product as a user does: real Redis, real
// grid-worker processes with real Chromium behind Playwright's browser
// server, bin/caddy terminating TLS with its internal CA, and a real
// playwright-core client that trusts only that CA.

func requireParts(t *testing.T) {
	t.Helper()
	testenv.LookPath(t, "redis-server")
	testenv.LookPath(t, "node")
	if _, err := os.Stat("/usr/bin/chromium"); err != nil {
		testenv.Missing(t, "/usr/bin/chromium not installed")
	}
	root := testenv.RepoRoot(t)
	if _, err := os.Stat(filepath.Join(root, "playwright", "node_modules", "playwright-core")); err != nil {
		testenv.Missing(t, "playwright-core not installed in playwright/ (run 'make deps')")
	}
	testenv.Bin(t, "caddy")
	testenv.Bin(t, "grid-worker")
}

func startGrid(t *testing.T, cfg Config) *Grid {
	t.Helper()
	requireParts(t)
	root := testenv.RepoRoot(t)
	cfg.BinDir = filepath.Join(root, "bin")
	cfg.PlaywrightDir = filepath.Join(root, "playwright")
	cfg.Dir = t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	g, err := Start(ctx, cfg)
	if err != nil {
		if g != nil {
			dumpLogs(t, g)
		}
		t.Fatalf("starting the local grid: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			dumpLogs(t, g)
		}
		g.Stop()
	})
	return g
}

func dumpLogs(t *testing.T, g *Grid) {
	files, _ := filepath.Glob(filepath.Join(g.Dir(), "logs", "*.log"))
	for _, f := range files {
		b, _ := os.ReadFile(f)
		s := string(b)
		if len(s) > 3000 {
			s = "…" + s[len(s)-3000:]
		}
		t.Logf("--- %s ---\n%s", filepath.Base(f), s)
	}
}

// client runs playwright/client.mjs against the grid.
func client(t *testing.T, g *Grid, args ...string) *exec.Cmd {
	t.Helper()
	root := testenv.RepoRoot(t)
	cmd := exec.Command("node", append([]string{filepath.Join(root, "playwright", "client.mjs")}, args...)...)
	cmd.Env = append(os.Environ(), "NODE_EXTRA_CA_CERTS="+g.RootCA())
	return cmd
}

type sessionEvent struct {
	Event  string `json:"event"`
	N      int    `json:"n"`
	OK     bool   `json:"ok"`
	Title  string `json:"title"`
	Answer int    `json:"answer"`
	Error  string `json:"error"`
	// Detail is the client's whole error, with the answer's body.
	Detail string `json:"detail"`
}

func parseEvents(t *testing.T, out []byte) []sessionEvent {
	t.Helper()
	var evs []sessionEvent
	for _, line := range strings.Split(string(out), "\n") {
		var ev sessionEvent
		if json.Unmarshal([]byte(line), &ev) == nil && ev.Event == "session" {
			evs = append(evs, ev)
		}
	}
	return evs
}

func activeOf(t *testing.T, g *Grid, pool string) int {
	t.Helper()
	p, err := g.PoolStatus(context.Background(), pool)
	if err != nil {
		t.Fatalf("reading pool: %v", err)
	}
	n := 0
	for _, w := range p.Workers {
		n += w.Active
	}
	return n
}

// holdSession opens one session that stays open until the returned
// function is called (or the process is killed).
func holdSession(t *testing.T, g *Grid, mode, url string) (*exec.Cmd, io.WriteCloser, *bufio.Scanner) {
	t.Helper()
	cmd := client(t, g, mode, "--url", url)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting the Playwright client: %v", err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	sc := bufio.NewScanner(stdout)
	ready := make(chan sessionEvent, 1)
	go func() {
		for sc.Scan() {
			var ev sessionEvent
			if json.Unmarshal(sc.Bytes(), &ev) == nil && (ev.Event == "ready" || ev.Event == "session") {
				ready <- ev
				return
			}
		}
		close(ready)
	}()
	select {
	case ev, ok := <-ready:
		if !ok || ev.Event != "ready" {
			t.Fatalf("the Playwright client did not open its session: %+v", ev)
		}
		if ev.Title != "grid session 1" {
			t.Fatalf("page title read back through the grid = %q, want %q", ev.Title, "grid session 1")
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the Playwright client did not open its session within 60s")
	}
	return cmd, stdin, sc
}

func TestPlaywrightConnectsThroughCaddyOverTLS(t *testing.T) {
	g := startGrid(t, Config{Workers: 1, MaxConcurrent: 2, MaxLifetime: 50})

	cmd, stdin, sc := holdSession(t, g, "hold", g.URL())
	if got := activeOf(t, g, "chromium"); got != 1 {
		t.Fatalf("active sessions during the session = %d, want 1", got)
	}
	stdin.Close()
	var last sessionEvent
	for sc.Scan() {
		if ev := parseEvents(t, sc.Bytes()); len(ev) > 0 {
			last = ev[0]
		}
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("client exited with %v (last event %+v)", err, last)
	}
	if !last.OK || last.Answer != 42 {
		t.Fatalf("session result %+v, want ok with answer 42", last)
	}
	testenv.Eventually(t, 10*time.Second, "the slot to be released after the client closed", func() bool {
		return activeOf(t, g, "chromium") == 0
	})
	p, _ := g.PoolStatus(context.Background(), "chromium")
	if len(p.Workers) != 1 || p.Workers[0].Lifetime != 1 {
		t.Fatalf("after one session the worker's figures are %+v, want lifetime 1", p.Workers)
	}

	// What an operator sees: 'caddy grid status' draws the worker with its
	// lifetime bar at 1 of 50 and no live session.
	out, err := exec.Command(testenv.Bin(t, "caddy"), "grid", "status", "--address", strings.TrimPrefix(g.AdminURL(), "http://")).CombinedOutput()
	if err != nil {
		t.Fatalf("caddy grid status: %v\n%s", err, out)
	}
	for _, want := range []string{"pool chromium: 1 workers", p.Workers[0].ID, " 1/50 ", "0/2"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("caddy grid status does not show %q:\n%s", want, out)
		}
	}

	checkGridPage(t, g, p.Workers[0].ID)
}

// checkGridPage: the live page the demo prints asks for its password, and
// with it serves the page and data naming the worker.
func checkGridPage(t *testing.T, g *Grid, workerID string) {
	t.Helper()
	pem, err := os.ReadFile(g.RootCA())
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pem)
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}, Timeout: 20 * time.Second}
	get := func(path, password string) (int, string) {
		req, err := http.NewRequest(http.MethodGet, g.UIURL()+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		if password != "" {
			req.SetBasicAuth(UIUser, password)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", req.URL, err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	if code, _ := get("", ""); code != http.StatusUnauthorized {
		t.Errorf("the grid page without credentials answered %d, want 401", code)
	}
	if code, body := get("", g.UIPassword()); code != http.StatusOK || !strings.Contains(body, "app.js") {
		t.Errorf("the grid page answered %d:\n%s", code, body)
	}
	testenv.Eventually(t, 20*time.Second, "the grid page's data to show the worker", func() bool {
		code, body := get("data.json", g.UIPassword())
		return code == http.StatusOK && strings.Contains(body, `"pool":"chromium"`) && strings.Contains(body, workerID)
	})
}

func TestKilledClientReleasesItsSlot(t *testing.T) {
	g := startGrid(t, Config{Workers: 1, MaxConcurrent: 2, MaxLifetime: 50})

	cmd, _, _ := holdSession(t, g, "hold", g.URL())
	if got := activeOf(t, g, "chromium"); got != 1 {
		t.Fatalf("active sessions during the session = %d, want 1", got)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 15*time.Second, "the slot of a killed client to be released", func() bool {
		return activeOf(t, g, "chromium") == 0
	})
}

// TestClientsFindTheEndpointOverHTTPS: the ways users connect, each
// with a real client over TLS: Playwright's connect() and connectOverCDP
// to a wss:// URL, the same to an https:// URL (they first read the
// endpoint's /json or /json/version), and Puppeteer's connect() by
// browserURL (no headers) and by browserWSEndpoint. The discovery answers
// point back through the grid, hold no worker's address, and claim
// nothing.
func TestClientsFindTheEndpointOverHTTPS(t *testing.T) {
	g := startGrid(t, Config{Workers: 1, MaxConcurrent: 2, MaxLifetime: 50, Launcher: "playwright"})
	startRouteWorkers(t, g, "cdp", 2)
	ctx := context.Background()
	lifetimes := func() int {
		n := 0
		for _, pool := range []string{"chromium", "chromium-cdp"} {
			p, err := g.PoolStatus(ctx, pool)
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range p.Workers {
				n += w.Lifetime
			}
		}
		return n
	}

	// On the wire, as the clients ask.
	hc := httpsClient(t, g)
	https := strings.Replace(g.URL(), "wss://", "https://", 1)
	cdpHTTPS := strings.Replace(g.CDPURL(), "wss://", "https://", 1)
	before := lifetimes()
	get := func(u string) map[string]string {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, u, nil)
		req.Header.Set("User-Agent", "Playwright/1.65.1 (x64; debian 12) node/20.19")
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var m map[string]string
		if err := json.NewDecoder(resp.Body).Decode(&m); err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %d %v", u, resp.StatusCode, err)
		}
		return m
	}
	if m := get(https + "/json"); m["wsEndpointPath"] != "" || len(m) != 1 {
		t.Errorf("GET /json answered %v, want a wsEndpointPath relative to the endpoint: \"\"", m)
	}
	for _, u := range []string{cdpHTTPS + "/json/version", cdpHTTPS + "/json/version/"} {
		if m := get(u); m["webSocketDebuggerUrl"] != g.CDPURL() {
			t.Errorf("GET %s: webSocketDebuggerUrl %q, want the endpoint through the grid, %s", u, m["webSocketDebuggerUrl"], g.CDPURL())
		}
	}
	if after := lifetimes(); after != before {
		t.Errorf("discovery requests claimed workers: lifetimes %d, then %d", before, after)
	}

	for _, c := range []struct{ mode, url string }{
		{"run", https},
		{"cdp", g.CDPURL()},
		{"cdp", cdpHTTPS},
		{"puppeteer", cdpHTTPS},
		{"puppeteer", g.CDPURL()},
	} {
		out, err := client(t, g, c.mode, "--url", c.url).CombinedOutput()
		evs := parseEvents(t, out)
		if err != nil || len(evs) != 1 || !evs[0].OK {
			t.Errorf("%s to %s: %v\n%s", c.mode, c.url, err, out)
		}
	}
	testenv.Eventually(t, 10*time.Second, "every slot to be released", func() bool {
		return activeOf(t, g, "chromium") == 0 && activeOf(t, g, "chromium-cdp") == 0
	})
	if got := lifetimes() - before; got != 5 {
		t.Errorf("the five sessions charged %d lifetimes", got)
	}
}

// TestRecyclingUnderLoad is the grid's promise: workers reach their
// lifetime, drain and are replaced one at a time, and no client sees it.
func TestRecyclingUnderLoad(t *testing.T) {
	const (
		workers     = 3
		maxLifetime = 5
		sessions    = 40
		clients     = 4
	)
	g := startGrid(t, Config{Workers: workers, MaxConcurrent: 2, MaxLifetime: maxLifetime})

	rdb, err := registry.NewClient(g.RedisURL())
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	reg := registry.New(rdb, registry.Options{})

	// Watch the registry for the whole run.
	var (
		mu          sync.Mutex
		maxDraining int
		seen        = map[string]int{} // worker → highest lifetime
		overLimit   []string
	)
	watchCtx, stopWatch := context.WithCancel(context.Background())
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		for watchCtx.Err() == nil {
			infos, _, err := reg.InspectPool(watchCtx, "chromium")
			if err == nil {
				mu.Lock()
				draining := 0
				for _, w := range allWorkers(infos) {
					// A replaced worker drains beside its serving
					// replacement: it takes nothing from the pool.
					if w.Status == "retiring" || w.Status == "draining" {
						draining++
					}
					if w.Lifetime > seen[w.ID] {
						seen[w.ID] = w.Lifetime
					}
					if w.Lifetime > maxLifetime {
						overLimit = append(overLimit, fmt.Sprintf("%s at %d", w.ID, w.Lifetime))
					}
				}
				if draining > maxDraining {
					maxDraining = draining
				}
				mu.Unlock()
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()

	out, err := client(t, g, "run", "--url", g.URL(), "--sessions", strconv.Itoa(sessions),
		"--concurrency", strconv.Itoa(clients)).CombinedOutput()
	evs := parseEvents(t, out)
	failed := 0
	for _, ev := range evs {
		if !ev.OK {
			failed++
			t.Errorf("session %d failed: %s", ev.N, ev.Error)
		}
	}
	if err != nil || len(evs) != sessions || failed > 0 {
		t.Fatalf("client: %v; %d session results, %d failed, want %d all ok\n%s", err, len(evs), failed, sessions, out)
	}
	stopWatch()
	<-watchDone

	mu.Lock()
	defer mu.Unlock()
	t.Logf("%d sessions, all ok; workers seen %d; most draining at once %d; lifetimes %v", sessions, len(seen), maxDraining, seen)
	if maxDraining > 1 {
		t.Errorf("at some moment %d workers were retiring at once, want at most 1", maxDraining)
	}
	if len(overLimit) > 0 {
		t.Errorf("workers past max_lifetime %d: %v", maxLifetime, overLimit)
	}
	total, retired := 0, 0
	for _, lt := range seen {
		total += lt
		if lt == maxLifetime {
			retired++
		}
	}
	if total != sessions {
		t.Errorf("lifetimes seen add up to %d, want %d sessions (%v)", total, sessions, seen)
	}
	// 40 sessions at 5 per worker: at least 40/5 - 3 = 5 workers reached the
	// limit and were replaced by new ones.
	if want := sessions/maxLifetime - workers; retired < want {
		t.Errorf("%d workers reached the limit of %d, want at least %d (%v)", retired, maxLifetime, want, seen)
	}
	if len(seen) < retired+1 {
		t.Errorf("workers seen %d; every retired worker should have been replaced", len(seen))
	}
	testenv.Eventually(t, 20*time.Second, "every slot to be released and three workers to be available", func() bool {
		p, err := g.PoolStatus(context.Background(), "chromium")
		if err != nil {
			return false
		}
		avail, active := 0, 0
		for _, w := range p.Workers {
			active += w.Active
			if w.Status == "available" {
				avail++
			}
		}
		return active == 0 && avail == workers
	})
}

// allWorkers are the workers of every version group.
func allWorkers(infos []registry.GroupInfo) []registry.WorkerInfo {
	var out []registry.WorkerInfo
	for _, gi := range infos {
		out = append(out, gi.Workers...)
	}
	return out
}

// TestRecyclingContinuousWithDefaults is recycling with every default a
// new operator gets (10 s heartbeats, select_timeout 5s, stagger_drains,
// stale_threshold 30s): two real Chromium workers of max_concurrent 2 and
// max_lifetime 3, three clients opening short sessions back to back. The
// pool restarts its workers at least ten times, one at a time, and no
// client sees a failure.
func TestRecyclingContinuousWithDefaults(t *testing.T) {
	const (
		workers     = 2
		maxLifetime = 3
		sessions    = 39
	)
	g := startGrid(t, Config{Workers: workers, MaxConcurrent: 2, MaxLifetime: maxLifetime, SelectTimeout: 5 * time.Second,
		HeartbeatInterval: 10 * time.Second, StaleThreshold: 30 * time.Second})
	rdb, err := registry.NewClient(g.RedisURL())
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	reg := registry.New(rdb, registry.Options{})

	var (
		mu       sync.Mutex
		seen     = map[string]bool{}
		retiring int
	)
	watchCtx, stopWatch := context.WithCancel(context.Background())
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		for watchCtx.Err() == nil {
			if infos, _, err := reg.InspectPool(watchCtx, "chromium"); err == nil {
				mu.Lock()
				n := 0
				for _, w := range allWorkers(infos) {
					seen[w.ID] = true
					if w.Status == "retiring" || w.Status == "draining" {
						n++
					}
				}
				retiring = max(retiring, n)
				mu.Unlock()
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	start := time.Now()
	out, err := client(t, g, "run", "--url", g.URL(), "--sessions", strconv.Itoa(sessions), "--concurrency", "3",
		"--hold-ms", "200").CombinedOutput()
	took := time.Since(start)
	stopWatch()
	<-watchDone
	evs := parseEvents(t, out)
	failed := 0
	for _, ev := range evs {
		if !ev.OK {
			failed++
			t.Errorf("session %d failed: %s", ev.N, ev.Error)
		}
	}
	if err != nil || len(evs) != sessions || failed > 0 {
		t.Fatalf("client: %v; %d session results, %d failed, want %d all ok\n%s", err, len(evs), failed, sessions, out)
	}
	mu.Lock()
	defer mu.Unlock()
	restarts := len(seen) - workers
	t.Logf("%d sessions in %s, all ok; %d restarts; at most %d retiring at once", sessions, took.Round(time.Millisecond), restarts, retiring)
	if restarts < 10 {
		t.Errorf("%d restarts, want at least 10", restarts)
	}
	if retiring > 1 {
		t.Errorf("%d workers retiring at once, want at most 1", retiring)
	}
}

// TestExposeNetworkReachesTheClientsOwnLoopback: a playwright-server
// worker (agent and browser) on a host of its own, a network namespace
// that cannot reach the client's loopback. A client connected with
// exposeNetwork '<loopback>' loads a page from a server listening only on
// its own 127.0.0.1, through its connection; the same client without it
// gets a connection error.
func TestExposeNetworkReachesTheClientsOwnLoopback(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.Missing(t, "network namespaces need root")
	}
	// The worker joins the pool of the grid's /cdp/ route, where no other
	// worker is.
	g := startGrid(t, Config{Workers: 1, MaxConcurrent: 2, MaxLifetime: 50, Launcher: "playwright"})
	host, err := netns.New()
	if err != nil {
		testenv.Missing(t, "%v", err)
	}
	t.Cleanup(host.Remove)
	// The namespace reaches the grid's Redis through a forwarder on the
	// root namespace's address it can reach.
	fwd, err := net.Listen("tcp", host.Service+":0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fwd.Close() })
	go func() {
		for {
			c, err := fwd.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r, err := net.Dial("tcp", g.RedisAddr())
				if err != nil {
					return
				}
				defer r.Close()
				go func() { _, _ = io.Copy(r, c); r.Close() }()
				_, _ = io.Copy(c, r)
			}()
		}
	}()
	root := testenv.RepoRoot(t)
	bin, _ := filepath.Abs(filepath.Join(g.cfg.BinDir, "grid-worker"))
	testenv.Start(t, []string{"GRID_PLAYWRIGHT_DIR=" + filepath.Join(root, "playwright")}, "ip", "netns", "exec", host.Name, bin,
		"-redis", "redis://"+fwd.Addr().String()+"/0", "-pool", "chromium-cdp", "-launcher", "playwright-server",
		"-host", host.Inside, "-advertise", host.Inside, "-max-concurrent", "2", "-stale-threshold", "10s",
		"-heartbeat-interval", "1s", "-log-format", "console")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := g.WaitPool(ctx, "chromium-cdp", 1); err != nil {
		t.Fatal(err)
	}

	// A page only the client's own loopback serves.
	page, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprint(w, "<title>the client's own loopback</title>")
	})}
	go srv.Serve(page)
	t.Cleanup(func() { srv.Close() })
	_, port, _ := net.SplitHostPort(page.Addr().String())
	at := "http://localhost:" + port + "/"

	out, err := client(t, g, "run", "--url", g.CDPURL(), "--goto", at, "--expose-network", "<loopback>").CombinedOutput()
	evs := parseEvents(t, out)
	if err != nil || len(evs) != 1 || !evs[0].OK || evs[0].Title != "the client's own loopback" {
		t.Fatalf("with exposeNetwork '<loopback>': %v\n%s", err, out)
	}
	out, _ = client(t, g, "run", "--url", g.CDPURL(), "--goto", at).CombinedOutput()
	evs = parseEvents(t, out)
	if len(evs) != 1 || evs[0].OK || !strings.Contains(evs[0].Error, "ERR_CONNECTION_REFUSED") {
		t.Fatalf("without exposeNetwork, the worker's host has nothing on that port: want a connection error, got\n%s", out)
	}
}

// TestPlaywrightTestSuiteThroughTheGrid runs the project's own Playwright
// Test suite (playwright/tests) through the grid as a user's suite runs:
// four test workers over wss://, once with PW_TEST_CONNECT_WS_ENDPOINT
// against shared-browser workers, once with connectOptions against
// playwright-server workers, and the grid's workers recycle during each
// run. Every test passes: screenshot, large body, download, upload,
// trace, video.
func TestPlaywrightTestSuiteThroughTheGrid(t *testing.T) {
	g := startGrid(t, Config{Workers: 2, MaxConcurrent: 2, MaxLifetime: 2, Launcher: "playwright"})
	startRouteWorkers(t, g, "playwright-server", 3, 4)
	ctx := context.Background()
	root := testenv.RepoRoot(t)
	dir := filepath.Join(root, "playwright")
	for _, run := range []struct {
		name, pool string
		env        []string
	}{
		{"shared browsers, PW_TEST_CONNECT_WS_ENDPOINT", "chromium", []string{"PW_TEST_CONNECT_WS_ENDPOINT=" + g.URL()}},
		{"per-session browsers, connectOptions", "chromium-cdp", []string{"GRID_WS_ENDPOINT=" + g.CDPURL()}},
	} {
		t.Run(run.name, func(t *testing.T) {
			before := map[string]bool{}
			p, err := g.PoolStatus(ctx, run.pool)
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range p.Workers {
				before[w.ID] = true
			}
			out := t.TempDir()
			results := filepath.Join(out, "results.json")
			cmd := exec.Command(filepath.Join(dir, "node_modules", ".bin", "playwright"), "test")
			cmd.Dir = dir
			cmd.Env = append(os.Environ(), append(run.env, "NODE_EXTRA_CA_CERTS="+g.RootCA(),
				"GRID_RESULTS="+results, "GRID_OUTPUT="+filepath.Join(out, "output"))...)
			log, err := cmd.CombinedOutput()
			var rep struct {
				Stats struct {
					Expected, Unexpected, Skipped, Flaky int
				} `json:"stats"`
			}
			raw, rerr := os.ReadFile(results)
			if rerr != nil || json.Unmarshal(raw, &rep) != nil {
				t.Fatalf("playwright test wrote no results (%v, %v):\n%s", err, rerr, log)
			}
			t.Logf("%d passed, %d failed, %d skipped, %d flaky", rep.Stats.Expected, rep.Stats.Unexpected, rep.Stats.Skipped, rep.Stats.Flaky)
			if err != nil || rep.Stats.Unexpected > 0 || rep.Stats.Expected != 6 || rep.Stats.Skipped > 0 || rep.Stats.Flaky > 0 {
				t.Fatalf("playwright test: %v\n%s", err, log)
			}
			testenv.Eventually(t, 60*time.Second, "a worker of the pool replaced during the run", func() bool {
				p, err := g.PoolStatus(ctx, run.pool)
				if err != nil {
					return false
				}
				for _, w := range p.Workers {
					if !before[w.ID] {
						return true
					}
				}
				return false
			})
		})
	}
}

// TestLaunchOptionsReachAPerSessionBrowser: a client's allowed launch
// option reaches the browser launched for its session on a
// playwright-server worker (its proxy: a page of a name that resolves
// nowhere comes through it), and one the grid never applies (args, which
// only Playwright's unsafe mode would) is refused with a reason the
// client's error gives.
func TestLaunchOptionsReachAPerSessionBrowser(t *testing.T) {
	g := startGrid(t, Config{Workers: 1, MaxConcurrent: 2, MaxLifetime: 50, Launcher: "playwright"})
	startRouteWorkers(t, g, "playwright-server", 2)
	// A proxy that answers every request with a page naming its host.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "<title>through the proxy to %s</title>", r.URL.Hostname())
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	proxy := "http://" + ln.Addr().String()
	run := func(opts, goto_ string) sessionEvent {
		t.Helper()
		out, _ := client(t, g, "run", "--url", g.CDPURL(), "--goto", goto_, "--header", "x-playwright-launch-options: "+opts).CombinedOutput()
		evs := parseEvents(t, out)
		if len(evs) != 1 {
			t.Fatalf("launch options %s: want one session, got\n%s", opts, out)
		}
		return evs[0]
	}
	if ev := run(`{"proxy":{"server":"`+proxy+`"}}`, "http://grid-proxy-check.invalid/"); !ev.OK || ev.Title != "through the proxy to grid-proxy-check.invalid" {
		t.Fatalf("with a proxy: %+v, want the page through it", ev)
	}
	if ev := run(`{"args":["--disable-web-security"]}`, "http://grid-proxy-check.invalid/"); ev.OK || !strings.Contains(ev.Detail, "the browser flag --disable-web-security in args is not allowed here (launch_args)") {
		t.Fatalf("with args launch_args does not list: %+v, want an error saying so", ev)
	}
}

// TestAllowedFlagsReachTheirSessionsBrowserOnly: a client's args that
// launch_args allows reach its own session's browser, and only its own:
// two sessions with two values of one flag each see theirs, a session
// without args sees the browser's own, and flags launch_args does not
// list are refused with the reason in the client's error. A worker whose
// browser is shared refuses args in the client's error too.
func TestAllowedFlagsReachTheirSessionsBrowserOnly(t *testing.T) {
	g := startGrid(t, Config{Workers: 1, MaxConcurrent: 2, MaxLifetime: 50, Launcher: "playwright", LaunchArgs: []string{"--user-agent"}})
	startRouteWorkers(t, g, "playwright-server", 2)
	// A page whose title is the User-Agent that asked for it.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "<title>%s</title>", html.EscapeString(r.UserAgent()))
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	page := "http://" + ln.Addr().String() + "/"
	run := func(endpoint, opts string) sessionEvent {
		t.Helper()
		args := []string{"run", "--url", endpoint, "--goto", page}
		if opts != "" {
			args = append(args, "--header", "x-playwright-launch-options: "+opts)
		}
		out, _ := client(t, g, args...).CombinedOutput()
		evs := parseEvents(t, out)
		if len(evs) != 1 {
			t.Fatalf("launch options %s: want one session, got\n%s", opts, out)
		}
		return evs[0]
	}
	for _, ua := range []string{"grid-flag-check one", "grid-flag-check 'two' $(id)"} {
		if ev := run(g.CDPURL(), `{"args":["--user-agent=`+ua+`"]}`); !ev.OK || ev.Title != ua {
			t.Fatalf("with --user-agent=%s: %+v, want the page to see it", ua, ev)
		}
	}
	if ev := run(g.CDPURL(), ""); !ev.OK || strings.Contains(ev.Title, "grid-flag-check") {
		t.Fatalf("without args: %+v, want the browser's own User-Agent", ev)
	}
	if ev := run(g.CDPURL(), `{"args":["--user-agent=x","--lang=de"]}`); ev.OK || !strings.Contains(ev.Detail, "the browser flag --lang in args is not allowed here (launch_args): this grid allows --user-agent") {
		t.Fatalf("with a flag launch_args does not list: %+v, want an error saying so", ev)
	}
	if ev := run(g.URL(), `{"args":["--user-agent=x"]}`); ev.OK || !strings.Contains(ev.Detail, "shared by its sessions, so args cannot apply to yours") {
		t.Fatalf("args to a shared browser: %+v, want an error saying they cannot apply", ev)
	}
}

// TestAPlaywrightClientReadsWhyTheGridEndedItsSession: an operator ends a
// live Playwright session through the admin API; the client's next call
// fails with an error that gives the grid's reason, and the slot is free.
func TestAPlaywrightClientReadsWhyTheGridEndedItsSession(t *testing.T) {
	g := startGrid(t, Config{Workers: 1, MaxConcurrent: 2, MaxLifetime: 50})
	_, _, sc := holdSession(t, g, "hold", g.URL())
	var id string
	testenv.Eventually(t, 10*time.Second, "the session is listed", func() bool {
		resp, err := http.Get(g.AdminURL() + "/grid/sessions?pool=chromium")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var page struct {
			Sessions []struct {
				ID string `json:"id"`
			} `json:"sessions"`
		}
		if json.NewDecoder(resp.Body).Decode(&page) != nil || len(page.Sessions) != 1 {
			return false
		}
		id = page.Sessions[0].ID
		return true
	})
	req, _ := http.NewRequest(http.MethodDelete, g.AdminURL()+"/grid/sessions/"+id, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("DELETE /grid/sessions/%s: %s", id, resp.Status)
	}
	ended := make(chan sessionEvent, 1)
	go func() {
		for sc.Scan() {
			var ev sessionEvent
			if json.Unmarshal(sc.Bytes(), &ev) == nil && ev.Event == "session" {
				ended <- ev
				return
			}
		}
		close(ended)
	}()
	select {
	case ev := <-ended:
		if ev.OK || !strings.Contains(ev.Detail, "ended by the operator") {
			t.Fatalf("the client's session after the operator's end: %+v, want an error giving the reason", ev)
		}
		t.Logf("the client's error: %s", ev.Error)
	case <-time.After(15 * time.Second):
		t.Fatal("the client did not see its session end within 15s")
	}
	testenv.Eventually(t, 10*time.Second, "the slot is free", func() bool { return activeOf(t, g, "chromium") == 0 })
}

// startRouteWorkers starts workers numbered ids of launcher in the pool
// the grid's /cdp/ route serves (chromium-cdp), and waits until they
// serve.
func startRouteWorkers(t *testing.T, g *Grid, launcher string, ids ...int) {
	t.Helper()
	g.cfg.Launcher, g.cfg.Pool = launcher, "chromium-cdp"
	for _, i := range ids {
		if err := g.StartWorker(i); err != nil {
			t.Fatal(err)
		}
	}
	g.cfg.Launcher, g.cfg.Pool = "playwright", "chromium"
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := g.WaitPool(ctx, "chromium-cdp", len(ids)); err != nil {
		t.Fatal(err)
	}
}
