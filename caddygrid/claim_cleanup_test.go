package caddygrid_test

import (
	"bytes"
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/cmd/fakebrowser/fake"
	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
)

// TestClaimInFlightAcrossCleanup: a reload that moves the grid to another
// Redis cleans up the old config while a claim on the old Redis is in
// flight. The claim ran in Redis, so its slot is taken; the session it
// made is served and, once closed, its slot is free again at once, not
// after lease_ttl. Before the claim held its own reference on the
// backend, the old config's cleanup closed the Redis client under the
// claim: the client got an error and the lease stayed until lease_ttl.
func TestClaimInFlightAcrossCleanup(t *testing.T) {
	g := newGrid(t)
	w := g.worker("chromium", "w1", fake.Behavior{})
	other := testenv.StartRedis(t)
	p := startHoldProxy(t, g.redis.Addr)
	site := `
	route /playwright/* {
		browser_grid chromium
	}`
	// lease_ttl far above what the test waits: a leaked lease shows.
	const global = "lease_ttl 60s\n\t\treaper_interval 10m"
	c := startCaddy(t, caddyOpts{redisURL: "redis://" + p.addr() + "/0", global: global, site: site})
	mustDial(t, c.url("/playwright/chromium")).close()
	testenv.Eventually(t, 10*time.Second, "the first session released", func() bool {
		return g.info("chromium", "w1").Active == 0
	})

	claimSent := p.holdReplies("_claim")
	done := make(chan dialResult, 1)
	go func() {
		s, err := dial(context.Background(), c.url("/playwright/chromium"))
		done <- dialResult{s, err}
	}()
	var held time.Time
	select {
	case <-claimSent:
		held = time.Now()
	case <-time.After(10 * time.Second):
		t.Fatal("no claim reached Redis")
	}
	// The claim ran in Redis; its reply waits in the proxy while the
	// reload cleans up the config it came from (nothing else is held).
	testenv.Eventually(t, 5*time.Second, "the claim taking the slot", func() bool {
		return g.info("chromium", "w1").Active == 1
	})
	c.reload(caddyOpts{redisURL: other.URL(), global: global, site: site})
	p.release()
	t.Logf("the claim's reply held %s (its deadline is 2s)", time.Since(held).Round(time.Millisecond))

	res := <-done
	t.Logf("the session whose claim was in flight across the cleanup: error %v", res.err)
	if res.err != nil {
		t.Errorf("the session whose claim was in flight: %v; want it served (the claim took a slot)", res.err)
	} else {
		res.s.close()
	}
	if n := w.Stats().Sessions; n != 2 {
		t.Errorf("the worker served %d sessions, want 2", n)
	}
	start := time.Now()
	testenv.Eventually(t, 10*time.Second, "the slot of the claim in flight free again (lease_ttl is 60s)", func() bool {
		info := g.info("chromium", "w1")
		return info.Active == 0
	})
	t.Logf("slot free %s after the session ended", time.Since(start).Round(time.Millisecond))
}

// holdProxy relays TCP connections to a Redis; once told to, it holds
// the replies on the connection that next carries a given command, until
// release. Only that connection: a call still in flight when the hold
// begins (the previous session's release, the reaper's pass the reload
// waits for, a new connection's HELLO) must not be held too, or the
// claim misses its 2s deadline on a loaded machine for want of a
// connection, or the reload waits for the reaper past it.
type holdProxy struct {
	l      net.Listener
	target string

	mu      sync.Mutex
	resumed chan struct{} // closed by release
	watch   string
	seen    chan struct{}
}

func startHoldProxy(t *testing.T, target string) *holdProxy {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &holdProxy{l: l, target: target}
	t.Cleanup(func() {
		l.Close()
		p.release()
	})
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go p.serve(c)
		}
	}()
	return p
}

func (p *holdProxy) addr() string { return p.l.Addr().String() }

// holdReplies holds the replies on the next connection to send a command
// containing watch (from before it goes to Redis); the channel closes
// once the command has gone.
func (p *holdProxy) holdReplies(watch string) <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.resumed = make(chan struct{})
	p.watch, p.seen = watch, make(chan struct{})
	return p.seen
}

// release lets the held replies go.
func (p *holdProxy) release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.resumed != nil {
		close(p.resumed)
		p.resumed = nil
	}
}

// matches reports whether b is the watched command, which the connection
// it goes on is then to hold replies for: the channel that release closes.
func (p *holdProxy) matches(b []byte) (chan struct{}, chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.watch == "" || !bytes.Contains(b, []byte(p.watch)) {
		return nil, nil
	}
	p.watch = ""
	return p.resumed, p.seen
}

func (p *holdProxy) serve(c net.Conn) {
	defer c.Close()
	up, err := net.Dial("tcp", p.target)
	if err != nil {
		return
	}
	defer up.Close()
	var mu sync.Mutex
	var hold chan struct{} // this connection's replies wait for it to close
	go func() {
		defer up.Close()
		buf := make([]byte, 64<<10)
		for {
			n, err := c.Read(buf)
			if n > 0 {
				resumed, seen := p.matches(buf[:n])
				if resumed != nil {
					mu.Lock()
					hold = resumed
					mu.Unlock()
				}
				if _, werr := up.Write(buf[:n]); werr != nil {
					return
				}
				if seen != nil {
					close(seen)
				}
			}
			if err != nil {
				return
			}
		}
	}()
	buf := make([]byte, 64<<10)
	for {
		n, err := up.Read(buf)
		if n > 0 {
			mu.Lock()
			h := hold
			mu.Unlock()
			if h != nil {
				<-h
			}
			if _, werr := c.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
