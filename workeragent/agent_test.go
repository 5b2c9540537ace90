package workeragent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"

	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
	"github.com/browsergrid/caddy-browser-grid/registry"
)

// testAgent is an agent running fakebrowser on a Redis of its own, and a
// registry to claim its workers as Caddy would.
type testAgent struct {
	*Agent
	reg  *registry.Registry
	srv  *testenv.Redis
	done chan error
	stop context.CancelFunc
}

func startAgent(t testing.TB, tweak func(*Config)) *testAgent {
	t.Helper()
	srv := testenv.StartRedis(t)
	cfg := Defaults()
	cfg.RedisURL = srv.URL()
	cfg.Launcher = LauncherFake
	cfg.Fakebrowser = testenv.Bin(t, "fakebrowser")
	cfg.HeartbeatInterval = 200 * time.Millisecond
	cfg.StaleThreshold = time.Second
	cfg.DrainTimeout = 2 * time.Second
	cfg.IDPrefix = "t"
	if tweak != nil {
		tweak(&cfg)
	}
	a, err := New(cfg, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	rdb, err := registry.NewClient(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ta := &testAgent{Agent: a, reg: registry.New(rdb, registry.Options{}), srv: srv, done: make(chan error, 1), stop: cancel}
	go func() { ta.done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		a.Abort()
		select {
		case <-ta.done:
		case <-time.After(20 * time.Second):
			t.Error("the agent did not stop")
		}
		rdb.Close()
	})
	testenv.Eventually(t, 10*time.Second, "the worker registers", func() bool { return len(ta.workersIn()) == 1 })
	return ta
}

// workersIn reads the pool's workers from Redis.
func (ta *testAgent) workersIn() []registry.WorkerInfo {
	info, err := ta.reg.Inspect(context.Background(), "chromium")
	if err != nil {
		return nil
	}
	return info.Workers
}

func (ta *testAgent) worker(t *testing.T, id string) registry.WorkerInfo {
	t.Helper()
	for _, w := range ta.workersIn() {
		if w.ID == id {
			return w
		}
	}
	t.Fatalf("worker %s not registered", id)
	return registry.WorkerInfo{}
}

var seq atomic.Int64

// claim claims a worker as Caddy would and returns the ticket to present.
func (ta *testAgent) claim(t *testing.T, l registry.Limits) (registry.Claim, registry.Ticket) {
	t.Helper()
	c, _, err := ta.reg.Claim(context.Background(), registry.ClaimRequest{
		Group: "chromium", Policy: registry.LifetimeFirst, Limits: l, Session: fmt.Sprintf("s%d", seq.Add(1)), StaleAfter: time.Minute,
	})
	if err != nil {
		t.Fatalf("claim: %v", err)
	}
	return c, registry.Ticket{Session: c.Session, Group: c.Group, Worker: c.Worker.ID, Limits: l}.Signed(ta.secret)
}

// dial opens a session at the agent with ticket.
func dial(ctx context.Context, c registry.Claim, tk registry.Ticket) (*websocket.Conn, *http.Response, error) {
	h := http.Header{}
	h.Set(registry.HeaderClaim, tk.String())
	return websocket.Dial(ctx, "ws://"+c.Worker.Addr+c.Worker.Path, &websocket.DialOptions{HTTPHeader: h})
}

func open(t *testing.T, ta *testAgent, l registry.Limits) (*websocket.Conn, registry.Claim) {
	t.Helper()
	c, tk := ta.claim(t, l)
	ws, _, err := dial(context.Background(), c, tk)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { ws.CloseNow() })
	echo(t, ws)
	return ws, c
}

func echo(t *testing.T, ws *websocket.Conn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := ws.Write(ctx, websocket.MessageText, []byte("ping")); err != nil {
		t.Fatalf("write: %v", err)
	}
	if _, b, err := ws.Read(ctx); err != nil || string(b) != "ping" {
		t.Fatalf("echo: %q %v", b, err)
	}
}

func TestTheAgentRelaysASessionAndEndsItInRedis(t *testing.T) {
	ta := startAgent(t, nil)
	ws, c := open(t, ta, registry.Limits{})
	testenv.Eventually(t, 5*time.Second, "the heartbeat reports the session live", func() bool {
		s, ok, _ := ta.reg.GetSession(context.Background(), "chromium", c.Session)
		return ok && s.State == "live"
	})
	ws.Close(websocket.StatusNormalClosure, "")
	testenv.Eventually(t, 5*time.Second, "the end is written", func() bool {
		w := ta.worker(t, c.Worker.ID)
		_, ok, _ := ta.reg.GetSession(context.Background(), "chromium", c.Session)
		return w.Active == 0 && w.Lifetime == 1 && !ok
	})
}

func TestTheAgentRefusesWhatTheClaimsLimitsForbid(t *testing.T) {
	ta := startAgent(t, func(c *Config) { c.MaxConcurrent = 4 })
	l := registry.Limits{MaxConcurrent: 1}
	_, first := open(t, ta, l)
	// Redis loses the session's count (as a restore from an older
	// snapshot would): the next claim reaches the agent, which refuses it.
	ta.reg.GiveBack(context.Background(), "chromium", first.Worker.ID, false, 0, first.Session)
	c, tk := ta.claim(t, l)
	_, resp, err := dial(context.Background(), c, tk)
	if err == nil || resp == nil || resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get(registry.HeaderRefused) != registry.RefusedFull {
		t.Fatalf("second session at max_concurrent 1: %v %+v", err, resp)
	}
	testenv.Eventually(t, 5*time.Second, "the refused claim is given back", func() bool {
		w := ta.worker(t, c.Worker.ID)
		return w.Active == 1 && w.Lifetime == 1
	})
}

func TestAClaimWithoutATicketIsRefused(t *testing.T) {
	ta := startAgent(t, nil)
	w := ta.workersIn()[0]
	for _, h := range []string{"", "v=1;session=x", "v=9;session=x;group=chromium;worker=" + w.ID + ";max-concurrent=0;max-lifetime=0;max-session=0;idle-timeout=0"} {
		hd := http.Header{}
		if h != "" {
			hd.Set(registry.HeaderClaim, h)
		}
		_, resp, err := websocket.Dial(context.Background(), "ws://"+w.Addr+w.Path, &websocket.DialOptions{HTTPHeader: hd})
		if err == nil || resp == nil || resp.StatusCode != http.StatusBadRequest {
			t.Fatalf("claim %q: %v %+v", h, err, resp)
		}
	}
}

// TestAClaimIsTakenOnceAndOnlyWhileFresh: a claim seen on the network and
// sent again, while its session runs or after it ended, is refused with
// 400 and ends nothing; so is a claim issued outside the ticket window
// (a replay, or clocks far apart). The signed claims of an agent with a
// worker secret cannot be altered to dodge this.
func TestAClaimIsTakenOnceAndOnlyWhileFresh(t *testing.T) {
	ta := startAgent(t, func(c *Config) { c.WorkerSecret = "s3cret" })
	c, tk := ta.claim(t, registry.Limits{})
	ws, _, err := dial(context.Background(), c, tk)
	if err != nil {
		t.Fatal(err)
	}
	echo(t, ws)
	refused := func(what string, tk registry.Ticket) {
		t.Helper()
		_, resp, err := dial(context.Background(), c, tk)
		if err == nil || resp == nil || resp.StatusCode != http.StatusBadRequest {
			t.Fatalf("%s: %v %+v, want 400", what, err, resp)
		}
	}
	refused("the live session's claim again", tk)
	echo(t, ws)
	testenv.Eventually(t, 5*time.Second, "the live session still counted", func() bool {
		s, ok, _ := ta.reg.GetSession(context.Background(), "chromium", c.Session)
		return ok && s.State == "live" && ta.worker(t, c.Worker.ID).Active == 1
	})
	ws.Close(websocket.StatusNormalClosure, "")
	testenv.Eventually(t, 5*time.Second, "the session ends", func() bool { return ta.worker(t, c.Worker.ID).Active == 0 })
	refused("an ended session's claim again", tk)

	c2, _ := ta.claim(t, registry.Limits{})
	old := registry.Ticket{Session: c2.Session, Group: c2.Group, Worker: c2.Worker.ID,
		Issued: time.Now().Add(-registry.TicketWindow - time.Second)}.Signed(ta.secret)
	refused("a claim issued before the window", old)
	ahead := old
	ahead.Issued = time.Now().Add(registry.TicketWindow + time.Second)
	refused("a claim issued after the window", ahead.Signed(ta.secret))
	moved := old
	moved.Issued = time.Now()
	refused("an old claim with its time changed but not its signature", moved)
}

func TestAWorkerAtItsLifetimeIsReplacedBeforeItDrains(t *testing.T) {
	ta := startAgent(t, func(c *Config) { c.Respawn = true })
	l := registry.Limits{MaxLifetime: 2}
	open(t, ta, l)
	ws, c := open(t, ta, l)
	if !c.Last {
		t.Fatal("the second claim is not the worker's last")
	}
	// The replacement serves while the old browser still holds a session.
	testenv.Eventually(t, 10*time.Second, "a replacement registers", func() bool {
		ws := ta.workersIn()
		return len(ws) == 2 && slices.ContainsFunc(ws, func(w registry.WorkerInfo) bool { return w.ID != c.Worker.ID && w.Status == "available" })
	})
	if st := ta.worker(t, c.Worker.ID).Status; st != "replaced" {
		t.Fatalf("old worker %s", st)
	}
	next, nc := open(t, ta, l)
	if nc.Worker.ID == c.Worker.ID {
		t.Fatal("a session went to the retiring worker")
	}
	ws.Close(websocket.StatusNormalClosure, "")
	testenv.Eventually(t, 10*time.Second, "the old worker goes once drained", func() bool { return len(ta.workersIn()) == 1 })
	echo(t, next)
}

func TestTheAgentEndsASessionWithAReason(t *testing.T) {
	ta := startAgent(t, nil)
	for _, tc := range []struct {
		name   string
		ticket func(*registry.Ticket)
		act    func(c registry.Claim)
		reason string
	}{
		{"max_session", func(t *registry.Ticket) { t.MaxSession = 300 * time.Millisecond }, nil, "max_session"},
		{"idle_timeout", func(t *registry.Ticket) { t.IdleTimeout = 300 * time.Millisecond }, nil, "idle_timeout"},
		{"operator", nil, func(c registry.Claim) {
			testenv.Eventually(t, 5*time.Second, "the session is live", func() bool {
				s, _, _ := ta.reg.GetSession(context.Background(), "chromium", c.Session)
				return s.State == "live"
			})
			ta.reg.EndSession(context.Background(), "chromium", c.Session, CloseNormal, "ended by the operator")
		}, "ended by the operator"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, tk := ta.claim(t, registry.Limits{})
			if tc.ticket != nil {
				tc.ticket(&tk)
				tk = tk.Signed(nil)
			}
			ws, _, err := dial(context.Background(), c, tk)
			if err != nil {
				t.Fatal(err)
			}
			defer ws.CloseNow()
			if tc.act != nil {
				tc.act(c)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_, _, err = ws.Read(ctx)
			var ce websocket.CloseError
			if !errors.As(err, &ce) || !strings.Contains(ce.Reason, tc.reason) {
				t.Fatalf("read: %v, want a close frame naming %q", err, tc.reason)
			}
		})
	}
}

func TestAfterRedisLostItsDataTheAgentRegistersItsSessionsAgain(t *testing.T) {
	ta := startAgent(t, nil)
	_, c := open(t, ta, registry.Limits{})
	ta.srv.Restart()
	testenv.Eventually(t, 10*time.Second, "the worker is back with its session", func() bool {
		ws := ta.workersIn()
		if len(ws) != 1 || ws[0].Active != 1 || ws[0].Lifetime != 1 {
			return false
		}
		_, ok, _ := ta.reg.GetSession(context.Background(), "chromium", c.Session)
		return ok
	})
}

func TestAnOperatorsDrainReachesTheAgentAtOnce(t *testing.T) {
	ta := startAgent(t, func(c *Config) { c.HeartbeatInterval = 5 * time.Second; c.StaleThreshold = 15 * time.Second })
	id := ta.workersIn()[0].ID
	start := time.Now()
	if ok, err := ta.reg.Drain(context.Background(), "chromium", id); !ok || err != nil {
		t.Fatal(ok, err)
	}
	select {
	case err := <-ta.done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(4 * time.Second):
		t.Fatal("the agent did not drain and exit before its next heartbeat")
	}
	ta.done <- nil
	if len(ta.workersIn()) != 0 || time.Since(start) > 4*time.Second {
		t.Fatalf("after the drain: %+v in %s", ta.workersIn(), time.Since(start))
	}
}

// TestABrowserPastItsDiskBoundRetires: a browser's temporary files (a
// shared browser keeps its sessions' videos, traces and downloads until it
// closes) are bounded: past -disk-max the browser retires, its live
// session finishing, and its replacement starts with an empty folder.
func TestABrowserPastItsDiskBoundRetires(t *testing.T) {
	ta := startAgent(t, func(c *Config) { c.Respawn = true; c.DiskMax = 1 << 20 })
	ws, c := open(t, ta, registry.Limits{})
	ta.mu.Lock()
	first := ta.current
	ta.mu.Unlock()
	if first == nil || first.proc.Dir == "" {
		t.Fatal("the browser has no folder of its own")
	}
	if err := os.WriteFile(filepath.Join(first.proc.Dir, "video.webm"), make([]byte, 2<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, "a replacement registered", func() bool {
		for _, w := range ta.workersIn() {
			if w.ID != c.Worker.ID && w.Status == "available" {
				return true
			}
		}
		return false
	})
	echo(t, ws) // the live session goes on
	ws.Close(websocket.StatusNormalClosure, "")
	testenv.Eventually(t, 5*time.Second, "the old browser and its folder gone", func() bool {
		_, err := os.Stat(first.proc.Dir)
		return os.IsNotExist(err) && len(ta.workersIn()) == 1
	})
}

// TestAClientThatStopsReadingStillGetsItsLimits: a client that floods
// its browser and reads nothing back fills every buffer on the way, so
// the agent's writes toward it block. Its max_session still ends the
// session at once (within a second of close grace), not when the
// connection times out (-proxy-timeout, 15 s), and the agent's heartbeats
// go on meanwhile.
func TestAClientThatStopsReadingStillGetsItsLimits(t *testing.T) {
	ta := startAgent(t, nil)
	c, _, err := ta.reg.Claim(context.Background(), registry.ClaimRequest{
		Group: "chromium", Policy: registry.LifetimeFirst, Session: fmt.Sprintf("s%d", seq.Add(1)), StaleAfter: time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	tk := registry.Ticket{Session: c.Session, Group: c.Group, Worker: c.Worker.ID, MaxSession: time.Second}.Signed(ta.secret)
	ws, _, err := dial(context.Background(), c, tk)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.CloseNow()
	start := time.Now()
	go func() {
		msg := make([]byte, 64<<10)
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			err := ws.Write(ctx, websocket.MessageBinary, msg)
			cancel()
			if err != nil {
				return
			}
		}
	}()
	before := testutil.ToFloat64(ta.metrics.heartbeats)
	testenv.Eventually(t, 10*time.Second, "the session ends in Redis", func() bool {
		_, ok, _ := ta.reg.GetSession(context.Background(), "chromium", c.Session)
		return !ok
	})
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("the session ended %s after it opened, want about max_session (1s) and the close grace", took.Round(100*time.Millisecond))
	}
	if testutil.ToFloat64(ta.metrics.heartbeats) == before {
		t.Error("no heartbeat went out while the client read nothing")
	}
}

// TestABrowserTakesAClaimThatArrivesWhileItRegisters: a browser's record
// is claimable as soon as Redis holds it, before the agent has heard
// Redis' answer; a claim that arrives in between is served, and the
// record stays.
func TestABrowserTakesAClaimThatArrivesWhileItRegisters(t *testing.T) {
	ta := startAgent(t, func(c *Config) {
		addr := strings.TrimSuffix(strings.TrimPrefix(c.RedisURL, "redis://"), "/0")
		c.RedisURL = "redis://" + slowAnswers(t, addr, 250*time.Millisecond) + "/0"
	})
	// startAgent returns once the record is in Redis: the agent is still
	// waiting for Register's answer.
	ws, c := open(t, ta, registry.Limits{})
	echo(t, ws)
	if got := ta.worker(t, c.Worker.ID).Active; got != 1 {
		t.Fatalf("the worker's record counts %d sessions, want 1", got)
	}
}

// slowAnswers forwards TCP to target and delivers target's bytes delay
// late, as a distant Redis does.
func slowAnswers(t *testing.T, target string, delay time.Duration) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			t.Cleanup(func() { c.Close(); s.Close() })
			go io.Copy(s, c)
			type chunk struct {
				b   []byte
				due time.Time
			}
			q := make(chan chunk, 1024)
			go func() {
				defer close(q)
				for {
					b := make([]byte, 32<<10)
					n, err := s.Read(b)
					if n > 0 {
						q <- chunk{b[:n], time.Now().Add(delay)}
					}
					if err != nil {
						return
					}
				}
			}()
			go func() {
				for ch := range q {
					time.Sleep(time.Until(ch.due))
					if _, err := c.Write(ch.b); err != nil {
						return
					}
				}
				c.Close()
			}()
		}
	}()
	return ln.Addr().String()
}

// TestASessionHoldsItsSlotUntilTheBrowserLetsItGo: a browser slow to let
// a session go (here 300 ms after its client left) still holds it, so the
// next session is not admitted over max_concurrent meanwhile: the
// browser never holds two sessions at once under a cap of one.
func TestASessionHoldsItsSlotUntilTheBrowserLetsItGo(t *testing.T) {
	ta := startAgent(t, func(c *Config) {
		c.MaxConcurrent = 1
		c.FakeArgs = "-close-delay 300ms"
	})
	backend := ta.status().Browsers[0].Backend
	for i := range 3 {
		ws, _ := open(t, ta, registry.Limits{})
		ws.Close(websocket.StatusNormalClosure, "")
		deadline := time.Now().Add(5 * time.Second)
		for {
			_, _, err := ta.reg.Claim(context.Background(), registry.ClaimRequest{
				Group: "chromium", Policy: registry.LifetimeFirst, Session: fmt.Sprintf("probe%d-%d", i, seq.Add(1)), StaleAfter: time.Minute,
			})
			if err == nil {
				break // the slot is free: give the probe back below
			}
			if !errors.Is(err, registry.ErrNoWorker) || time.Now().After(deadline) {
				t.Fatalf("session %d: the slot did not come back: %v", i+1, err)
			}
			time.Sleep(5 * time.Millisecond)
		}
		// the freed slot, taken as a new session would
		resp, err := http.Get("http://" + backend + "/stats")
		if err != nil {
			t.Fatal(err)
		}
		var st struct {
			Active     int `json:"active"`
			PeakActive int `json:"peak_active"`
		}
		err = json.NewDecoder(resp.Body).Decode(&st)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		if st.Active != 0 {
			t.Fatalf("after session %d the slot was free while the browser still held %d sessions", i+1, st.Active)
		}
		testenv.Eventually(t, 5*time.Second, "the probe claim is reported ended", func() bool {
			return ta.worker(t, ta.workersIn()[0].ID).Active == 0
		})
	}
}
