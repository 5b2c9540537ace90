package sockets

import (
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
