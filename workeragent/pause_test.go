package workeragent_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
	"github.com/browsergrid/caddy-browser-grid/registry"
)

// startCaddy runs bin/caddy (make build) in front of the Redis: the pool
// "chromium" at /playwright/*, a reaper and stale threshold matching
// fastTimings, and a short select_timeout so a refused session answers
// quickly.
func startCaddy(t *testing.T, r *testenv.Redis) string {
	t.Helper()
	bin := testenv.Bin(t, "caddy")
	dir := t.TempDir()
	admin, port := testenv.FreePort(t), testenv.FreePort(t)
	cfg := fmt.Sprintf(`{
	admin 127.0.0.1:%d
	http_port %d
	auto_https off
	persist_config off
	storage file_system %s
	grid {
		redis %s
		lease_ttl 3s
		stale_threshold 3s
		reaper_interval 500ms
	}
}

http://127.0.0.1:%d {
	route /playwright/* {
		browser_grid chromium {
			select_timeout 300ms
		}
	}
}
`, admin, port, filepath.Join(dir, "storage"), r.URL(), port)
	path := filepath.Join(dir, "Caddyfile")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	testenv.Start(t, []string{"HOME=" + dir, "XDG_DATA_HOME=" + dir, "XDG_CONFIG_HOME=" + dir},
		bin, "run", "--config", path, "--adapter", "caddyfile")
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	if err := testenv.WaitTCP(addr, 20*time.Second); err != nil {
		t.Fatalf("caddy did not start: %v", err)
	}
	return "ws://" + addr + "/playwright/chromium"
}

// tryFigures counts sessions tried through Caddy and those served.
type tryFigures struct {
	tried, served int
	open          []*websocket.Conn
}

// try opens one session through Caddy: served when the upgrade succeeds
// and the browser echoes; a 503 is a refusal; anything else fails the test.
func (f *tryFigures) try(t *testing.T, u string) bool {
	t.Helper()
	f.tried++
	// The timeout bounds the handshake and the echo; the session outlives it.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, resp, err := websocket.Dial(ctx, u, nil)
	if err != nil {
		if resp != nil && resp.StatusCode == http.StatusServiceUnavailable {
			return false
		}
		t.Fatalf("session through caddy: %v", err)
	}
	if err := c.Write(ctx, websocket.MessageText, []byte("ping")); err != nil {
		t.Fatal(err)
	}
	if _, msg, err := c.Read(ctx); err != nil || string(msg) != "ping" {
		t.Fatalf("echo through caddy: %q %v", msg, err)
	}
	f.served++
	f.open = append(f.open, c)
	return true
}

// An agent frozen (SIGSTOP) past its stale threshold and key TTL while its
// worker of capacity 2 holds 2 live sessions through a real Caddy: its
// record is expired meanwhile. Once it resumes it registers again with
// the same generation, so the 2 sessions still count: no further session is
// admitted (active, read through Redis all along, never above 2) and its
// lifetime is kept.
func TestFrozenAgentKeepsItsSessionsCounted(t *testing.T) {
	t.Parallel()
	r := testenv.StartRedis(t)
	reg := newRegistry(t, r)
	p := startWorker(t, r, "-max-concurrent", "2")
	w := waitOne(t, reg, "chromium", "", 15*time.Second)
	u := startCaddy(t, r)

	// Active as Redis holds it, sampled all along.
	var mu sync.Mutex
	maxActive := 0
	sampling, stopSampling := context.WithCancel(context.Background())
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			ctx, cancel := context.WithTimeout(sampling, time.Second)
			if info, err := reg.Worker(ctx, "chromium", w.ID); err == nil {
				mu.Lock()
				maxActive = max(maxActive, info.Active)
				mu.Unlock()
			}
			cancel()
			select {
			case <-sampling.Done():
				return
			case <-tick.C:
			}
		}
	}()
	defer func() { stopSampling(); <-sampled }()

	var f tryFigures
	defer func() {
		for _, c := range f.open {
			c.CloseNow()
		}
	}()
	for range 2 {
		if !f.try(t, u) {
			t.Fatal("a session on an idle worker of capacity 2 was refused")
		}
	}
	testenv.Eventually(t, 10*time.Second, "2 sessions counted", func() bool {
		info, ok := registered(t, reg, "chromium", w.ID)
		return ok && info.Active == 2
	})

	// Frozen past the stale threshold and key TTL: the record is expired.
	pid := p.Cmd.Process.Pid
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	resumed := false
	defer func() {
		if !resumed {
			_ = syscall.Kill(pid, syscall.SIGCONT)
		}
	}()
	testenv.Eventually(t, 20*time.Second, "the frozen worker's record expired", func() bool {
		_, ok := registered(t, reg, "chromium", w.ID)
		return !ok
	})
	if f.try(t, u) {
		t.Fatal("a session was served while the only worker's record was gone")
	}
	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	resumed = true
	var again registry.WorkerInfo
	testenv.Eventually(t, 15*time.Second, "the worker registered again", func() bool {
		var ok bool
		again, ok = registered(t, reg, "chromium", w.ID)
		return ok
	})

	// Traffic after the resume, while the 2 sessions live.
	before := f.served
	for range 4 {
		f.try(t, u)
	}
	over := f.served - before
	stopSampling()
	<-sampled
	mu.Lock()
	peak := maxActive
	mu.Unlock()
	t.Logf("pause scenario: sessions tried %d, served %d, over-admissions %d, peak active in Redis %d (capacity 2), lifetime after re-registration %d",
		f.tried, f.served, over, peak, again.Lifetime)
	if over > 0 || peak > 2 {
		t.Fatalf("over-admission: %d sessions admitted beyond capacity 2, peak active %d", over, peak)
	}
	if again.Active != 2 || again.Lifetime < 2 {
		t.Fatalf("after re-registration: active %d lifetime %d; want 2 and at least 2", again.Active, again.Lifetime)
	}
	testenv.Eventually(t, 5*time.Second, "a 'worker registered again' log line", func() bool {
		_, ok := lastLog(p, "worker registered again", w.ID)
		return ok
	})
}

// Redis restarted empty: the agent registers again and re-asserts the
// lifetime its heartbeats last reported, so the sessions its worker served
// still count toward max_lifetime.
func TestLifetimeSurvivesAnEmptyRedisRestart(t *testing.T) {
	t.Parallel()
	r := testenv.StartRedis(t)
	reg := newRegistry(t, r)
	p := startWorker(t, r, "-max-concurrent", "2")
	w := waitOne(t, reg, "chromium", "", 15*time.Second)
	for range 3 {
		release(t, reg, claim(t, reg, "chromium"))
	}
	// Two heartbeats after the sessions: the agent has seen lifetime 3.
	heartbeatsWhile(t, reg, "chromium", w.ID, 2, func(w registry.WorkerInfo) bool { return w.Lifetime == 3 })

	r.Restart() // same port, empty dataset
	again := waitOne(t, reg, "chromium", "", 20*time.Second)
	if again.ID != w.ID || again.Lifetime != 3 || again.Active != 0 {
		t.Fatalf("after the restart: %s lifetime %d active %d; want %s, 3, 0", again.ID, again.Lifetime, again.Active, w.ID)
	}
	testenv.Eventually(t, 5*time.Second, "a 'worker registered again' log line with lifetime 3", func() bool {
		e, ok := lastLog(p, "worker registered again", w.ID)
		return ok && e["lifetime"] == float64(3)
	})
}

// A draining worker whose record is lost (here removed outright) registers
// again as draining with its live session still counted, and waits for it
// rather than cutting it.
func TestDrainSurvivesALostRecord(t *testing.T) {
	t.Parallel()
	r := testenv.StartRedis(t)
	reg := newRegistry(t, r)
	p := startWorker(t, r)
	w := waitOne(t, reg, "chromium", "", 15*time.Second)
	s := claim(t, reg, "chromium")
	if err := reg.Drain(context.Background(), "chromium", w.ID); err != nil {
		t.Fatal(err)
	}
	waitDraining(t, reg, "chromium", w.ID, 5*time.Second)
	if _, err := reg.Expire(context.Background(), "chromium", w.ID, 0); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, "the worker registered again as draining with its session", func() bool {
		w, ok := registered(t, reg, "chromium", w.ID)
		return ok && w.Status == "draining" && w.Active == 1
	})
	heartbeatsWhile(t, reg, "chromium", w.ID, 2, func(w registry.WorkerInfo) bool { return w.Status == "draining" && w.Active == 1 })
	select {
	case <-p.Done():
		t.Fatal("grid-worker exited with a session still live")
	default:
	}
	release(t, reg, s)
	if code := exitCode(t, p, 15*time.Second); code != 0 {
		t.Fatalf("exit code %d after the drain, want 0", code)
	}
}
