package caddygrid_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/cmd/fakebrowser/fake"
)

// stallRelay forwards TCP connections to a real Redis. Once stall is set,
// the connections it accepts from then on are held open and never
// forwarded (a Redis, or a network path to it, that hangs for new
// clients), while the connections already open keep working.
type stallRelay struct {
	l     net.Listener
	to    string
	stall atomic.Bool
	mu    sync.Mutex
	conns []net.Conn
}

func startStallRelay(t *testing.T, to string) *stallRelay {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &stallRelay{l: l, to: to}
	go r.serve()
	t.Cleanup(r.close)
	return r
}

func (r *stallRelay) addr() string { return r.l.Addr().String() }

func (r *stallRelay) serve() {
	for {
		c, err := r.l.Accept()
		if err != nil {
			return
		}
		r.mu.Lock()
		r.conns = append(r.conns, c)
		r.mu.Unlock()
		if r.stall.Load() {
			continue // held open, never answered
		}
		up, err := net.Dial("tcp", r.to)
		if err != nil {
			c.Close()
			continue
		}
		r.mu.Lock()
		r.conns = append(r.conns, up)
		r.mu.Unlock()
		go func() { _, _ = io.Copy(up, c); up.Close() }()
		go func() { _, _ = io.Copy(c, up); c.Close() }()
	}
}

func (r *stallRelay) close() {
	r.l.Close()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range r.conns {
		c.Close()
	}
}

// TestStalledSubscriptionKeepsSelectTimeout: a request that has to wait
// for a worker subscribes to the pool's wake-ups; when Redis hangs for
// that new connection, the request still gets its 503 at select_timeout,
// not after however long the subscription takes.
func TestStalledSubscriptionKeepsSelectTimeout(t *testing.T) {
	g := newGrid(t)
	g.worker("chromium", "w1", fake.Behavior{})
	relay := startStallRelay(t, g.redis.Addr)
	const selectTimeout = time.Second
	c := startCaddy(t, caddyOpts{redisURL: "redis://" + relay.addr() + "/0", site: `
	route /playwright/* {
		browser_grid chromium {
			max_concurrent 1
			select_timeout 1s
		}
	}`})
	// The only slot is taken (over connections opened before the stall).
	held := mustDial(t, c.url("/playwright/chromium"))
	defer held.close()

	relay.stall.Store(true)
	start := time.Now()
	_, err := dial(context.Background(), c.url("/playwright/chromium"))
	took := time.Since(start)
	he := refusal(err)
	if he == nil || he.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("got %v, want 503 (no worker within select_timeout)", err)
	}
	t.Logf("503 after %s (select_timeout %s) with the wake-up subscription stalled", took.Round(time.Millisecond), selectTimeout)
	// The bound is select_timeout plus the claims' round trips.
	if took > selectTimeout+time.Second {
		t.Errorf("the waiting request answered after %s; a stalled subscription must not hold it past select_timeout (%s)", took, selectTimeout)
	}
}
