package chaos

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// The network fault of a link that stops carrying bytes without closing
// anything (a black hole); a host whose link is pulled so that no FIN or
// reset ever arrives is netns.Host.

// blackhole forwards TCP from a listener to a target until it is holed:
// then every connection, old and new, stays open and carries nothing, as
// a partition or a frozen VM does to its peer.
type blackhole struct {
	ln     net.Listener
	target string
	holed  atomic.Bool
	mu     sync.Mutex
	conns  []net.Conn
}

// newBlackhole listens on listen (host:port, port 0: a free one).
func newBlackhole(listen, target string) (*blackhole, error) {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, err
	}
	b := &blackhole{ln: ln, target: target}
	go b.accept()
	return b, nil
}

func (b *blackhole) addr() string { return b.ln.Addr().String() }

func (b *blackhole) hole(on bool) { b.holed.Store(on) }

func (b *blackhole) close() {
	b.ln.Close()
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, c := range b.conns {
		c.Close()
	}
}

func (b *blackhole) accept() {
	for {
		c, err := b.ln.Accept()
		if err != nil {
			return
		}
		b.mu.Lock()
		b.conns = append(b.conns, c)
		b.mu.Unlock()
		go b.forward(c)
	}
}

func (b *blackhole) forward(c net.Conn) {
	for b.holed.Load() {
		time.Sleep(50 * time.Millisecond) // a new connection goes nowhere either
	}
	t, err := net.Dial("tcp", b.target)
	if err != nil {
		c.Close()
		return
	}
	b.mu.Lock()
	b.conns = append(b.conns, t)
	b.mu.Unlock()
	go b.pipe(t, c)
	b.pipe(c, t)
}

// pipe copies src to dst; while holed, what it reads waits and nothing is
// written, so the peer sees no answer and no close.
func (b *blackhole) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		for b.holed.Load() {
			time.Sleep(20 * time.Millisecond)
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				src.Close()
				return
			}
		}
		if err != nil {
			if err == io.EOF {
				if tc, ok := dst.(*net.TCPConn); ok {
					_ = tc.CloseWrite()
					return
				}
			}
			dst.Close()
			return
		}
	}
}
