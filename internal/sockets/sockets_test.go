package sockets

import (
	"fmt"
	"net"
	"os"
	"syscall"
	"testing"
	"time"
)

// TestReadPortAndOwned: a listener of this process, one client connected
// to it. ReadPort finds the listener's inode and one established
// connection accepted on the port (not the client's own side, whose local
// port is another), then none once the client closed; Owned finds the
// listener among this process group's sockets and not among another
// group's (a container runtime's port proxy is not the browser).
func TestReadPortAndOwned(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := l.Accept()
		if err == nil {
			accepted <- c
		}
	}()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s := <-accepted
	defer s.Close()

	p, err := ReadPort(os.Getpid(), port)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Listening) != 1 || p.Established != 1 {
		t.Fatalf("port %d with one listener and one client: %+v, want 1 listening inode and 1 established", port, p)
	}
	pgid, err := syscall.Getpgid(0)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := Owned(p.Listening, []int{pgid}); err != nil || !ok {
		t.Errorf("the listener is this process's: Owned = %v, %v", ok, err)
	}
	if ok, err := Owned(p.Listening, []int{1 << 30}); err != nil || ok {
		t.Errorf("no process is in group %d: Owned = %v, %v", 1<<30, ok, err)
	}

	c.Close()
	s.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		p, err = ReadPort(os.Getpid(), port)
		if err == nil && p.Established == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the client closed: %+v (%v), want 0 established", p, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestReadPortExceptLeavesOutTheCallersOwnClients: two clients of one
// listener, the first counted as the caller's own (an agent probing the
// browser it counts): only the second is a client of the server. With
// every socket of this process left out, none is.
func TestReadPortExceptLeavesOutTheCallersOwnClients(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port
	var clients, served []net.Conn
	for range 2 {
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		s, err := l.Accept()
		if err != nil {
			t.Fatal(err)
		}
		clients, served = append(clients, c), append(served, s)
		defer c.Close()
		defer s.Close()
	}
	inode := func(c net.Conn) uint64 { return inodeOf(t, c) }
	p, err := ReadPortExcept(os.Getpid(), port, func() map[uint64]bool { return map[uint64]bool{inode(clients[0]): true} })
	if err != nil {
		t.Fatal(err)
	}
	if p.Established != 1 {
		t.Fatalf("two clients, one of them the caller's: %d established, want 1", p.Established)
	}
	if _, err := SelfSockets(); err != nil {
		t.Fatal(err)
	}
	if p, err = ReadPortExcept(os.Getpid(), port, selfSockets); err != nil || p.Established != 0 {
		t.Fatalf("every client the caller's: %+v (%v), want 0 established", p, err)
	}
	if p, err = ReadPort(os.Getpid(), port); err != nil || p.Established != 2 {
		t.Fatalf("ReadPort: %+v (%v), want 2 established", p, err)
	}
}

func selfSockets() map[uint64]bool {
	m, _ := SelfSockets()
	return m
}

func inodeOf(t *testing.T, c net.Conn) uint64 {
	t.Helper()
	f, err := c.(*net.TCPConn).File()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// A client of another process may use the same local address as one of
// the caller's sockets connected elsewhere (a socket's local address is
// unique only with its peer): it is still counted. A red team's find: the
// agent's Redis connection sharing a port with a Caddy session on one host.
func TestReadPortExceptMatchesBothEnds(t *testing.T) {
	var listeners []net.Listener
	for range 2 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		listeners = append(listeners, l)
	}
	reuse := func(_, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1) })
		if err != nil {
			return err
		}
		return serr
	}
	// the caller's socket, to the second listener, from some port of a
	// loopback address nothing else uses (another program's connection
	// from the same port of 127.0.0.1 would refuse the second bind)
	from := &net.TCPAddr{IP: net.IPv4(127, 23, 45, 67)}
	mineConn, err := (&net.Dialer{Control: reuse, LocalAddr: from}).Dial("tcp", listeners[1].Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer mineConn.Close()
	s1, err := listeners[1].Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer s1.Close()
	// "another process's" session to the first listener, from that same port
	other, err := (&net.Dialer{Control: reuse, LocalAddr: mineConn.LocalAddr()}).Dial("tcp", listeners[0].Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	s0, err := listeners[0].Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer s0.Close()
	port := listeners[0].Addr().(*net.TCPAddr).Port
	mine := map[uint64]bool{inodeOf(t, mineConn): true}
	p, err := ReadPortExcept(os.Getpid(), port, func() map[uint64]bool { return mine })
	if err != nil || p.Established != 1 {
		t.Fatalf("a client sharing its local address with the caller's socket elsewhere: %+v (%v), want 1 established", p, err)
	}
}

// A dual-stack listener's end of an IPv4 connection is in tcp6, with an
// IPv4-mapped peer, while the caller's end is in tcp: still its own.
func TestReadPortExceptSeesItselfThroughADualStackListener(t *testing.T) {
	l, err := net.Listen("tcp", "[::]:0")
	if err != nil {
		t.Fatalf("this test needs IPv6 sockets: %v", err)
	}
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port
	c, err := net.Dial("tcp4", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if p, err := ReadPort(os.Getpid(), port); err != nil || p.Established != 1 {
		t.Fatalf("ReadPort: %+v (%v), want 1 established", p, err)
	}
	mine := map[uint64]bool{inodeOf(t, c): true}
	if p, err := ReadPortExcept(os.Getpid(), port, func() map[uint64]bool { return mine }); err != nil || p.Established != 0 {
		t.Fatalf("the caller's own IPv4 client of a dual-stack listener: %+v (%v), want 0 established", p, err)
	}
}
