package chaos

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestOneListener: a port with a reload's two listeners (SO_REUSEPORT,
// as Caddy binds them; one on every address, in /proc/net/tcp6 where the
// host has IPv6, one on 127.0.0.1, in /proc/net/tcp) is not yet swapped;
// once one closes, it is.
func TestOneListener(t *testing.T) {
	lc := net.ListenConfig{Control: func(network, address string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
		}); err != nil {
			return err
		}
		return serr
	}}
	old, err := lc.Listen(context.Background(), "tcp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	port := old.Addr().(*net.TCPAddr).Port
	cur, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		t.Fatal(err)
	}
	defer cur.Close()
	if n, err := listeners(port); err != nil || n != 2 {
		t.Fatalf("listeners(%d) = %d, %v; want 2", port, n, err)
	}
	if _, err := oneListener(port, 100*time.Millisecond); err == nil || !strings.Contains(err.Error(), "still has 2 listeners") {
		t.Errorf("oneListener with two listeners: %v, want an error naming them", err)
	}
	old.Close()
	if _, err := oneListener(port, 5*time.Second); err != nil {
		t.Errorf("oneListener once the old listener closed: %v", err)
	}
}

// TestPanicsIn: the handler panics net/http recovered, as Caddy logs them.
func TestPanicsIn(t *testing.T) {
	dir := t.TempDir()
	clean := filepath.Join(dir, "caddy-0.log")
	panicked := filepath.Join(dir, "caddy-1.log")
	line := `{"level":"error","ts":1764000000.1,"logger":"http.stdlib","msg":"http: panic serving 127.0.0.1:41234: runtime error: invalid memory address or nil pointer dereference\ngoroutine 97 [running]:\n..."}`
	if err := os.WriteFile(clean, []byte(`{"level":"info","msg":"serving initial configuration"}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(panicked, []byte(`{"level":"info","msg":"serving initial configuration"}`+"\n"+line+"\n"+line+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if n, _, err := panicsIn([]string{clean}); err != nil || n != 0 {
		t.Errorf("a log without panics: %d, %v; want 0", n, err)
	}
	if n, first, err := panicsIn([]string{clean, panicked}); err != nil || n != 2 || first != line {
		t.Errorf("a log with two panics: %d, %q, %v; want 2 and the first line", n, first, err)
	}
	if _, _, err := panicsIn([]string{filepath.Join(dir, "missing.log")}); err == nil {
		t.Error("a missing log: no error")
	}
}
