package chaos

import (
	"fmt"
	"io"
	"net"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The network faults: a link that stops carrying bytes without closing
// anything (a black hole), and a host of its own (a network namespace)
// whose link can be pulled so that no FIN or reset ever arrives.

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

// netHost is a network namespace joined to the root one by a veth pair:
// a host of its own at inside, reached from the root namespace, which is
// at outside. service is an address of the root namespace's loopback that
// the namespace reaches over the veth: what runs in the root namespace
// serves both there, and cutting the veth cuts only the namespace.
type netHost struct {
	name                     string
	outside, inside, service string
	vethOut                  string
}

var hostSeq atomic.Int64

// newNetHost makes a namespace (root only: ip netns, iproute2).
func newNetHost() (*netHost, error) {
	n := hostSeq.Add(1)
	subnet := 10 + int(time.Now().UnixNano()%200)
	h := &netHost{
		name:    fmt.Sprintf("gridchaos-%d-%d", subnet, n),
		outside: fmt.Sprintf("10.%d.%d.1", 200+int(n%50), subnet), inside: fmt.Sprintf("10.%d.%d.2", 200+int(n%50), subnet),
		service: fmt.Sprintf("10.%d.%d.100", 200+int(n%50), subnet),
		vethOut: fmt.Sprintf("gc%dx%d", subnet, n),
	}
	vethIn := h.vethOut + "i"
	steps := [][]string{
		{"netns", "add", h.name},
		{"link", "add", h.vethOut, "type", "veth", "peer", "name", vethIn},
		{"link", "set", vethIn, "netns", h.name},
		{"addr", "add", h.outside + "/24", "dev", h.vethOut},
		{"link", "set", h.vethOut, "up"},
		{"netns", "exec", h.name, "ip", "addr", "add", h.inside + "/24", "dev", vethIn},
		{"netns", "exec", h.name, "ip", "link", "set", vethIn, "up"},
		{"netns", "exec", h.name, "ip", "link", "set", "lo", "up"},
		{"addr", "add", h.service + "/32", "dev", "lo"},
		{"netns", "exec", h.name, "ip", "route", "add", h.service + "/32", "via", h.outside},
	}
	for _, s := range steps {
		if out, err := exec.Command("ip", s...).CombinedOutput(); err != nil {
			h.remove()
			return nil, fmt.Errorf("ip %s: %w: %s (network namespaces need root and iproute2)", strings.Join(s, " "), err, out)
		}
	}
	return h, nil
}

// cut pulls the host's link: nothing crosses it, nothing is told.
func (h *netHost) cut() error {
	out, err := exec.Command("ip", "link", "set", h.vethOut, "down").CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip link set %s down: %w: %s", h.vethOut, err, out)
	}
	return nil
}

func (h *netHost) remove() {
	_ = exec.Command("ip", "addr", "del", h.service+"/32", "dev", "lo").Run()
	_ = exec.Command("ip", "link", "del", h.vethOut).Run()
	_ = exec.Command("ip", "netns", "del", h.name).Run()
}
