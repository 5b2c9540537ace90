package caddygrid_test

import (
	"bytes"
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// redisProxy relays TCP connections to a Redis and counts them (live,
// total). Once told to, it holds the replies on the connection that next
// carries a given command, until release. Only that connection: a call
// still in flight when the hold begins (the previous session's release,
// the reaper's pass a reload waits for, a new connection's HELLO) must
// not be held too, or a claim misses its 2s deadline on a loaded machine
// for want of a connection, or a reload waits for the reaper past it.
type redisProxy struct {
	l      net.Listener
	target string
	n      atomic.Int64
	total  atomic.Int64

	mu      sync.Mutex
	resumed chan struct{} // closed by release
	watch   string
	seen    chan struct{}
}

func startRedisProxy(t *testing.T, target string) *redisProxy {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &redisProxy{l: l, target: target}
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

func (p *redisProxy) addr() string { return p.l.Addr().String() }

// live is the number of connections open now.
func (p *redisProxy) live() int64 { return p.n.Load() }

// holdReplies holds the replies on the next connection to send a command
// containing watch (from before it goes to Redis); the channel closes
// once the command has gone.
func (p *redisProxy) holdReplies(watch string) <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.resumed = make(chan struct{})
	p.watch, p.seen = watch, make(chan struct{})
	return p.seen
}

// release lets the held replies go.
func (p *redisProxy) release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.resumed != nil {
		close(p.resumed)
		p.resumed = nil
	}
}

// matches reports whether b is the watched command, which the connection
// it goes on is then to hold replies for: the channel that release closes.
func (p *redisProxy) matches(b []byte) (chan struct{}, chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.watch == "" || !bytes.Contains(b, []byte(p.watch)) {
		return nil, nil
	}
	p.watch = ""
	return p.resumed, p.seen
}

func (p *redisProxy) serve(c net.Conn) {
	p.n.Add(1)
	p.total.Add(1)
	defer p.n.Add(-1)
	defer c.Close()
	up, err := net.Dial("tcp", p.target)
	if err != nil {
		return
	}
	defer up.Close()
	var mu sync.Mutex
	var hold chan struct{} // this connection's replies wait for it to close
	done := make(chan struct{})
	go func() {
		defer close(done)
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
				break
			}
		}
		if err != nil {
			break
		}
	}
	c.Close()
	<-done
}
