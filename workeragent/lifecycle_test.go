package workeragent_test

// These tests run the real grid-worker binary against a real redis-server,
// with fakebrowser as the browser (chromium_test.go does the same with real
// Chromium). They check what an operator would: what redis shows, the exit
// code, what the logs say, and which processes are left.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
	"github.com/browsergrid/caddy-browser-grid/registry"
	"github.com/browsergrid/caddy-browser-grid/workeragent"
)

// binDir holds grid-worker and, beside it, fakebrowser (where the fake
// launcher looks), built once for this package.
var binDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "workeragent-test-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	root, _ := filepath.Abs("..")
	build := exec.Command("go", "build", "-o", dir+string(filepath.Separator), "./cmd/grid-worker", "./cmd/fakebrowser")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building grid-worker and fakebrowser: %v\n%s", err, out)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func gridWorker() string  { return filepath.Join(binDir, "grid-worker") }
func fakebrowser() string { return filepath.Join(binDir, "fakebrowser") }

// fastTimings keep the lifecycle quick while obeying the worker lifecycle's rules.
var fastTimings = []string{
	"-heartbeat-interval", "200ms", "-key-ttl", "3s", "-stale-threshold", "3s", "-command-ttl", "5s", "-lease-ttl", "3s",
	"-log-format", "json",
}

func startWorker(t *testing.T, r *testenv.Redis, args ...string) *testenv.Process {
	t.Helper()
	all := append([]string{"-redis", r.URL(), "-launcher", "fake"}, fastTimings...)
	return testenv.Start(t, nil, gridWorker(), append(all, args...)...)
}

func newRegistry(t *testing.T, r *testenv.Redis) *registry.Registry {
	t.Helper()
	rdb, err := registry.NewClient(r.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rdb.Close() })
	return registry.New(rdb, registry.Options{})
}

// workers reads the pool's registered workers and fails the test when Redis
// does not answer: an empty answer must mean "none registered", never "could
// not ask", or a check that a worker is gone passes without looking.
func workers(t *testing.T, reg *registry.Registry, pool string) []registry.WorkerInfo {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	info, _, _, err := reg.InspectGroups(ctx, pool) // a Playwright worker registers in its version's group
	if err != nil {
		t.Fatalf("reading the workers of pool %s: %v", pool, err)
	}
	return info.Workers
}

// waitOne waits until the pool holds exactly one worker (other than
// `not`) and returns it.
func waitOne(t *testing.T, reg *registry.Registry, pool, not string, timeout time.Duration) registry.WorkerInfo {
	t.Helper()
	var w registry.WorkerInfo
	testenv.Eventually(t, timeout, "one registered worker in pool "+pool, func() bool {
		ws := workers(t, reg, pool)
		if len(ws) == 1 && ws[0].ID != not {
			w = ws[0]
			return true
		}
		return false
	})
	return w
}

func registered(t *testing.T, reg *registry.Registry, pool, id string) (registry.WorkerInfo, bool) {
	t.Helper()
	for _, w := range workers(t, reg, pool) {
		if w.ID == id {
			return w, true
		}
	}
	return registry.WorkerInfo{}, false
}

// waitDraining waits until worker id of pool is registered as draining.
func waitDraining(t *testing.T, reg *registry.Registry, pool, id string, timeout time.Duration) {
	t.Helper()
	testenv.Eventually(t, timeout, "worker "+id+" draining", func() bool {
		w, ok := registered(t, reg, pool, id)
		return ok && w.Status == "draining"
	})
}

// logEntries parses the agent's JSON log lines.
func logEntries(p *testenv.Process) []map[string]any {
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(p.Output()))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) == nil {
			out = append(out, m)
		}
	}
	return out
}

// lastLog returns the last entry with message msg (and worker_id id when
// id is not empty).
func lastLog(p *testenv.Process, msg, id string) (map[string]any, bool) {
	es := logEntries(p)
	for i := len(es) - 1; i >= 0; i-- {
		if es[i]["msg"] == msg && (id == "" || es[i]["worker_id"] == id) {
			return es[i], true
		}
	}
	return nil, false
}

func countLogs(p *testenv.Process, msg string) int {
	n := 0
	for _, e := range logEntries(p) {
		if e["msg"] == msg {
			n++
		}
	}
	return n
}

// browserOf returns the pid and endpoint the agent logged for worker id.
func browserOf(t *testing.T, p *testenv.Process, id string) (int, *url.URL, []int) {
	t.Helper()
	var e map[string]any
	testenv.Eventually(t, 10*time.Second, "the browser of "+id+" in the log", func() bool {
		var ok bool
		e, ok = lastLog(p, "browser listening", id)
		return ok
	})
	u, err := url.Parse(e["endpoint"].(string))
	if err != nil {
		t.Fatal(err)
	}
	var groups []int
	if gs, ok := e["process_groups"].([]any); ok {
		for _, g := range gs {
			groups = append(groups, int(g.(float64)))
		}
	}
	return int(e["pid"].(float64)), u, groups
}

// alive reports whether pid runs (a zombie is not running).
func alive(pid int) bool {
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return syscall.Kill(pid, 0) == nil
	}
	s := string(raw)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	return len(f) > 0 && f[0] != "Z" && f[0] != "X"
}

// groupMembers lists live processes in any of the process groups.
func groupMembers(groups []int) []int { return workeragent.LiveInGroups(groups) }

func exitCode(t *testing.T, p *testenv.Process, timeout time.Duration) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	code, err := p.ExitCode(ctx)
	if err != nil {
		t.Fatalf("grid-worker did not exit within %s", timeout)
	}
	return code
}

// claim opens a session slot on the pool's only worker, as Caddy would.
func claim(t *testing.T, reg *registry.Registry, pool string) *registry.Claim {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := reg.Claim(ctx, registry.ClaimRequest{Pool: pool, Policy: registry.LifetimeFirst, Holder: "workeragent-test", LeaseTTL: time.Minute})
	if err != nil {
		t.Fatalf("claiming a session: %v", err)
	}
	return c
}

func release(t *testing.T, reg *registry.Registry, c *registry.Claim) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := reg.Release(ctx, c.Pool, c.LeaseID); err != nil {
		t.Fatalf("releasing the session: %v", err)
	}
}

// heartbeatsWhile checks that the worker keeps heartbeating (at least n
// more heartbeats) while cond holds throughout.
func heartbeatsWhile(t *testing.T, reg *registry.Registry, pool, id string, n int, cond func(registry.WorkerInfo) bool) {
	t.Helper()
	var last time.Time
	seen := 0
	testenv.Eventually(t, 10*time.Second, fmt.Sprintf("%d heartbeats of %s", n, id), func() bool {
		w, ok := registered(t, reg, pool, id)
		if !ok {
			t.Fatalf("worker %s disappeared", id)
		}
		if !cond(w) {
			t.Fatalf("worker %s: unexpected state %+v", id, w)
		}
		if w.LastHeartbeat.After(last) {
			if !last.IsZero() {
				seen++
			}
			last = w.LastHeartbeat
		}
		return seen >= n
	})
}

func TestRegistersWithTheRightFigures(t *testing.T) {
	t.Parallel()
	r := testenv.StartRedis(t)
	reg := newRegistry(t, r)
	p := startWorker(t, r, "-pool", "team-x", "-max-concurrent", "3", "-advertise", "worker-a.internal")

	w := waitOne(t, reg, "team-x", "", 15*time.Second)
	pid, ep, _ := browserOf(t, p, w.ID)
	if w.BrowserType != "chromium" || w.Capacity != 3 || w.Path != "/playwright" || w.Status != "available" ||
		w.Active != 0 || w.Lifetime != 0 || w.Pool != "team-x" {
		t.Fatalf("registered record: %+v", w)
	}
	if w.Addr != "worker-a.internal:"+ep.Port() {
		t.Fatalf("addr %q, want the advertised host with the browser's port %s", w.Addr, ep.Port())
	}
	if !strings.Contains(w.ID, "-"+strconv.Itoa(p.Cmd.Process.Pid)+"-") {
		t.Fatalf("worker id %q does not carry the agent's pid %d", w.ID, p.Cmd.Process.Pid)
	}
	// The browser really answers at the registered path.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, "ws://127.0.0.1:"+ep.Port()+w.Path, nil)
	if err != nil {
		t.Fatalf("dialing the registered browser: %v", err)
	}
	c.Write(ctx, websocket.MessageText, []byte("ping"))
	if _, msg, err := c.Read(ctx); err != nil || string(msg) != "ping" {
		t.Fatalf("echo: %q %v", msg, err)
	}
	c.Close(websocket.StatusNormalClosure, "")
	heartbeatsWhile(t, reg, "team-x", w.ID, 2, func(w registry.WorkerInfo) bool { return w.Status == "available" })
	if !alive(pid) {
		t.Fatal("the browser is not running")
	}
}

func TestShutdownCommandDrainsAfterTheLiveSession(t *testing.T) {
	t.Parallel()
	r := testenv.StartRedis(t)
	reg := newRegistry(t, r)
	p := startWorker(t, r)
	w := waitOne(t, reg, "chromium", "", 15*time.Second)
	pid, _, groups := browserOf(t, p, w.ID)

	s := claim(t, reg, "chromium")
	if err := reg.Drain(context.Background(), "chromium", w.ID); err != nil {
		t.Fatal(err)
	}
	waitDraining(t, reg, "chromium", w.ID, 5*time.Second)
	// The live session holds the drain: the worker stays, heartbeating.
	heartbeatsWhile(t, reg, "chromium", w.ID, 3, func(w registry.WorkerInfo) bool { return w.Status == "draining" && w.Active == 1 })
	select {
	case <-p.Done():
		t.Fatal("grid-worker exited with a session still live")
	default:
	}

	release(t, reg, s)
	if code := exitCode(t, p, 15*time.Second); code != 0 {
		t.Fatalf("exit code %d after a drain, want 0", code)
	}
	if _, ok := registered(t, reg, "chromium", w.ID); ok {
		t.Fatal("worker still registered after exit")
	}
	if alive(pid) || len(groupMembers(groups)) > 0 {
		t.Fatalf("browser processes left behind: %v", groupMembers(groups))
	}
	if _, ok := lastLog(p, "drained", w.ID); !ok {
		t.Fatal("no 'drained' log line")
	}
}

func TestRespawnRegistersAsANewWorker(t *testing.T) {
	t.Parallel()
	r := testenv.StartRedis(t)
	reg := newRegistry(t, r)
	p := startWorker(t, r, "-respawn")
	first := waitOne(t, reg, "chromium", "", 15*time.Second)
	pid1, _, _ := browserOf(t, p, first.ID)

	if err := reg.Drain(context.Background(), "chromium", first.ID); err != nil {
		t.Fatal(err)
	}
	second := waitOne(t, reg, "chromium", first.ID, 15*time.Second)
	// Handover: the drained browser's record is removed only after its
	// replacement registered, so the pool shows its retiring worker through
	// the whole drain and restart, never a gap (the agent's own log order).
	// The new record can be read before the agent has logged the old one's
	// removal (CI read the log 1 ms too early once): wait for both lines.
	order := map[string]int{}
	testenv.Eventually(t, 10*time.Second, "the agent to log the old worker's removal", func() bool {
		clear(order)
		for i, e := range logEntries(p) {
			switch {
			case e["msg"] == "worker registered" && e["worker_id"] == second.ID:
				order["new registered"] = i + 1
			case e["msg"] == "worker deregistered" && e["worker_id"] == first.ID:
				order["old deregistered"] = i + 1
			}
		}
		return order["old deregistered"] != 0
	})
	if order["new registered"] == 0 || order["old deregistered"] == 0 || order["old deregistered"] < order["new registered"] {
		t.Fatalf("log order %v: the drained worker must be deregistered after its replacement registered", order)
	}
	pid2, _, _ := browserOf(t, p, second.ID)
	if second.Status != "available" || second.Lifetime != 0 || pid2 == pid1 || alive(pid1) || !alive(pid2) {
		t.Fatalf("after respawn: %+v (browser pids %d -> %d)", second, pid1, pid2)
	}
	select {
	case <-p.Done():
		t.Fatal("grid-worker exited although -respawn was given")
	default:
	}

	p.Cmd.Process.Signal(syscall.SIGTERM)
	if code := exitCode(t, p, 15*time.Second); code != 0 {
		t.Fatalf("exit code %d after SIGTERM, want 0", code)
	}
	if ws := workers(t, reg, "chromium"); len(ws) != 0 {
		t.Fatalf("workers left: %+v", ws)
	}
}

func TestSIGTERMDrainsTheSameWay(t *testing.T) {
	t.Parallel()
	r := testenv.StartRedis(t)
	reg := newRegistry(t, r)
	p := startWorker(t, r, "-respawn") // a signal ends the agent even with -respawn
	w := waitOne(t, reg, "chromium", "", 15*time.Second)
	s := claim(t, reg, "chromium")

	p.Cmd.Process.Signal(syscall.SIGTERM)
	waitDraining(t, reg, "chromium", w.ID, 5*time.Second)
	heartbeatsWhile(t, reg, "chromium", w.ID, 2, func(w registry.WorkerInfo) bool { return w.Status == "draining" && w.Active == 1 })
	release(t, reg, s)
	if code := exitCode(t, p, 15*time.Second); code != 0 {
		t.Fatalf("exit code %d, want 0", code)
	}
	if ws := workers(t, reg, "chromium"); len(ws) != 0 {
		t.Fatalf("workers left: %+v", ws)
	}
}

func TestDrainTimeoutCutsAStuckSession(t *testing.T) {
	t.Parallel()
	r := testenv.StartRedis(t)
	reg := newRegistry(t, r)
	p := startWorker(t, r, "-drain-timeout", "1s")
	w := waitOne(t, reg, "chromium", "", 15*time.Second)
	_, ep, _ := browserOf(t, p, w.ID)

	// A real session on the browser, claimed as Caddy would, never closed.
	conn, _, err := websocket.Dial(context.Background(), ep.String(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.CloseNow()
	claim(t, reg, "chromium")
	if err := reg.Drain(context.Background(), "chromium", w.ID); err != nil {
		t.Fatal(err)
	}
	if code := exitCode(t, p, 15*time.Second); code != 0 {
		t.Fatalf("exit code %d, want 0", code)
	}
	if _, ok := registered(t, reg, "chromium", w.ID); ok {
		t.Fatal("worker still registered")
	}
	e, ok := lastLog(p, "drain timeout; closing the browser with sessions still open", w.ID)
	if !ok || e["active"] != float64(1) {
		t.Fatalf("no drain-timeout log with active 1: %v", e)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, _, err := conn.Read(ctx); err == nil || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the stuck session was not cut: %v", err)
	}
}

func TestKilledBrowserIsDeregisteredWithinOneHeartbeatAndRelaunched(t *testing.T) {
	t.Parallel()
	r := testenv.StartRedis(t)
	reg := newRegistry(t, r)
	// A long TTL, so only the agent can remove the record that fast.
	p := testenv.Start(t, nil, gridWorker(), "-redis", r.URL(), "-launcher", "fake", "-respawn",
		"-heartbeat-interval", "2s", "-key-ttl", "30s", "-stale-threshold", "30s", "-log-format", "json")
	first := waitOne(t, reg, "chromium", "", 15*time.Second)
	pid, _, _ := browserOf(t, p, first.ID)

	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 2*time.Second, "the killed browser's worker deregistered within one heartbeat", func() bool {
		_, ok := registered(t, reg, "chromium", first.ID)
		return !ok
	})
	second := waitOne(t, reg, "chromium", first.ID, 15*time.Second)
	pid2, _, _ := browserOf(t, p, second.ID)
	if !alive(pid2) || second.Status != "available" {
		t.Fatalf("relaunched worker %+v, browser alive %v", second, alive(pid2))
	}
	if _, ok := lastLog(p, "browser exited", first.ID); !ok {
		t.Fatal("no 'browser exited' log line")
	}
}

func TestHungBrowserFailsItsProbeAndIsReplaced(t *testing.T) {
	t.Parallel()
	r := testenv.StartRedis(t)
	reg := newRegistry(t, r)
	p := startWorker(t, r, "-respawn", "-probe-timeout", "300ms", "-probe-failures", "3")
	first := waitOne(t, reg, "chromium", "", 15*time.Second)
	pid, _, _ := browserOf(t, p, first.ID)

	// Frozen, not dead: the process exists, its port accepts, nothing answers.
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	second := waitOne(t, reg, "chromium", first.ID, 15*time.Second)
	if _, ok := lastLog(p, "browser failed its probe; restarting it", first.ID); !ok {
		t.Fatal("no probe-failure log line")
	}
	testenv.Eventually(t, 15*time.Second, "the frozen browser killed", func() bool { return !alive(pid) })
	if pid2, _, _ := browserOf(t, p, second.ID); !alive(pid2) {
		t.Fatal("the replacement browser is not running")
	}
}

// A browser that misses one probe (busy, or frozen for a moment) and
// answers the next keeps running, and so do its sessions: only
// -probe-failures probes in a row restart it. Meanwhile it gets no new
// session: a missed probe takes it out of rotation until it answers.
func TestBrowserMissingOneProbeKeepsItsSessions(t *testing.T) {
	t.Parallel()
	r := testenv.StartRedis(t)
	reg := newRegistry(t, r)
	p := startWorker(t, r, "-probe-timeout", "300ms", "-probe-failures", "3")
	w := waitOne(t, reg, "chromium", "", 15*time.Second)
	pid, ep, _ := browserOf(t, p, w.ID)
	conn, _, err := websocket.Dial(context.Background(), ep.String(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.CloseNow()

	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "one failed probe logged", func() bool {
		return countLogs(p, "browser failed a probe; no new sessions until it answers, restarting it if it fails in a row") >= 1
	})
	testenv.Eventually(t, 2*time.Second, "the worker out of rotation", func() bool {
		got, ok := registered(t, reg, "chromium", w.ID)
		return ok && got.SuspectUntil.After(time.Now())
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	c, err := reg.Claim(ctx, registry.ClaimRequest{Pool: "chromium", Policy: registry.LifetimeFirst, Holder: "workeragent-test", LeaseTTL: time.Minute})
	cancel()
	if err == nil {
		t.Fatalf("a new session was claimed on %s while its browser missed its probe", c.Worker.ID)
	}
	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "the probe answered again", func() bool {
		return countLogs(p, "browser answers its probe again") >= 1
	})
	// Ten more probes: the same browser, registered, its session live.
	for i := 0; i < 10; i++ {
		time.Sleep(200 * time.Millisecond)
		if got, ok := registered(t, reg, "chromium", w.ID); !ok || got.Status != "available" {
			t.Fatalf("after one missed probe the worker is %+v (registered %v); log:\n%s", got, ok, p.Output())
		}
		if !alive(pid) {
			t.Fatal("the browser was stopped after one missed probe")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		err := conn.Write(ctx, websocket.MessageText, []byte("ping"))
		var msg []byte
		if err == nil {
			_, msg, err = conn.Read(ctx)
		}
		cancel()
		if err != nil || string(msg) != "ping" {
			t.Fatalf("the live session was cut after one missed probe: %v", err)
		}
	}
	if n := countLogs(p, "browser failed its probe; restarting it"); n != 0 {
		t.Fatalf("%d restarts logged", n)
	}
	// Answering again, it is back in rotation once the suspicion ran out.
	release(t, reg, claim(t, reg, "chromium"))
}

func TestExecLauncher(t *testing.T) {
	t.Parallel()
	r := testenv.StartRedis(t)
	reg := newRegistry(t, r)
	// $WS_PATH comes from the agent (-ws-path).
	p := startWorker(t, r, "-launcher", "exec", "-ws-path", "/custom", "-exec", "exec "+fakebrowser()+` -addr 127.0.0.1:0 -path "$WS_PATH"`)
	w := waitOne(t, reg, "chromium", "", 15*time.Second)
	if w.Path != "/custom" {
		t.Fatalf("path %q", w.Path)
	}
	p.Stop()
	if code := exitCode(t, p, 15*time.Second); code != 0 {
		t.Fatalf("exit code %d", code)
	}
}

func TestExecEndpointThatNeverAnswersIsDeregistered(t *testing.T) {
	t.Parallel()
	r := testenv.StartRedis(t)
	reg := newRegistry(t, r)
	port := testenv.FreePort(t)
	// Prints an endpoint nobody listens on, then lives on: only the probe
	// can tell. Without -respawn the agent gives up with exit code 1.
	p := startWorker(t, r, "-launcher", "exec", "-probe-timeout", "300ms",
		"-exec", fmt.Sprintf("echo ws://127.0.0.1:%d/nothing; exec sleep 300", port))
	w := waitOne(t, reg, "chromium", "", 15*time.Second)
	pid, _, groups := browserOf(t, p, w.ID)
	if code := exitCode(t, p, 15*time.Second); code != 1 {
		t.Fatalf("exit code %d, want 1", code)
	}
	if !strings.Contains(p.Output(), "stopped answering") {
		t.Fatalf("no reason in the output:\n%s", p.Output())
	}
	if _, ok := registered(t, reg, "chromium", w.ID); ok {
		t.Fatal("still registered")
	}
	if alive(pid) || len(groupMembers(groups)) > 0 {
		t.Fatal("the launched command was left running")
	}
}

func TestRedisDownAtStartRetriesThenFails(t *testing.T) {
	t.Parallel()
	port := testenv.FreePort(t) // nothing listens here
	p := testenv.Start(t, nil, gridWorker(), "-redis", fmt.Sprintf("redis://127.0.0.1:%d/0", port), "-launcher", "fake",
		"-redis-retry-attempts", "3", "-redis-retry-delay", "50ms", "-log-format", "json")
	if code := exitCode(t, p, 30*time.Second); code != 1 {
		t.Fatalf("exit code %d, want 1", code)
	}
	if n := countLogs(p, "redis not reachable; retrying"); n != 2 {
		t.Fatalf("%d retry log lines, want 2 (3 attempts)", n)
	}
	if !strings.Contains(p.Output(), "no answer after 3 attempts") {
		t.Fatalf("the final error does not say why:\n%s", p.Output())
	}
	if countLogs(p, "launching browser") != 0 {
		t.Fatal("a browser was launched without Redis")
	}
}

func TestRedisRestartedMidLifeReregisters(t *testing.T) {
	t.Parallel()
	r := testenv.StartRedis(t)
	reg := newRegistry(t, r)
	p := startWorker(t, r, "-max-concurrent", "2")
	w := waitOne(t, reg, "chromium", "", 15*time.Second)

	r.Restart() // same port, empty dataset
	// A new client: the old one's pooled connections died with the server,
	// and workers() fails on any Redis error.
	reg = newRegistry(t, r)
	again := waitOne(t, reg, "chromium", "", 20*time.Second)
	if again.ID != w.ID || again.Addr != w.Addr || again.Capacity != 2 || again.Status != "available" {
		t.Fatalf("after the restart: %+v, before: %+v", again, w)
	}
	if _, ok := lastLog(p, "worker registered again", w.ID); !ok {
		t.Fatal("no 'registered again' log line")
	}
}

func TestBadFlagsExit2WithAMessage(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		args []string
		env  []string
		want string
	}{
		{"timing rule", []string{"-heartbeat-interval", "30s", "-key-ttl", "20s"}, nil, "timing rule 'heartbeat interval < key TTL' broken: heartbeat-interval 30s >= key-ttl 20s"},
		{"timing rule from env", nil, []string{"HEARTBEAT_INTERVAL=90", "SHUTDOWN_COMMAND_TTL=60"}, "heartbeat interval < shutdown command TTL"},
		{"bad env", nil, []string{"DRAIN_TIMEOUT=forever"}, "DRAIN_TIMEOUT"},
		{"unknown launcher", []string{"-launcher", "docker"}, nil, `-launcher must be playwright, cdp, exec or fake, got "docker"`},
		{"bad redis url", []string{"-redis", "http://nope"}, nil, "-redis"},
		{"missing fakebrowser", []string{"-launcher", "fake", "-fakebrowser", "/nonexistent/fakebrowser"}, nil, "fakebrowser"},
		{"unknown flag", []string{"-heartbeat", "5s"}, nil, "heartbeat"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(gridWorker(), tc.args...)
			cmd.Env = append(os.Environ(), tc.env...)
			out, err := cmd.CombinedOutput()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 2 {
				t.Fatalf("exit %v, want code 2; output:\n%s", err, out)
			}
			if !strings.Contains(string(out), tc.want) {
				t.Fatalf("output does not say %q:\n%s", tc.want, out)
			}
		})
	}
}
