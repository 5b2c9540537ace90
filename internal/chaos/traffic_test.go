package chaos

import (
	"bufio"
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
)

// TestDialMarksCutHandshakes: a handshake is marked cut when the server
// ended its connection, with a reset or a FIN, before sending a byte; not
// a partial answer, a refusal, a timeout or nothing listening. A FIN
// after reading the request is also what a panicking handler gets from
// net/http: result tells that one apart by Caddy's log (see caddyPanics).
func TestDialMarksCutHandshakes(t *testing.T) {
	// unreadCloses: accepts, reads the request's first byte, closes; the
	// unread rest makes Linux reset the connection, as for a queued one
	unreadCloses := listen(t, func(c net.Conn) {
		_, _ = c.Read(make([]byte, 1))
		c.Close()
	})
	// resets: accepts, reads, closes with linger 0 (RST)
	resets := listen(t, func(c net.Conn) {
		_, _ = c.Read(make([]byte, 1))
		c.(*net.TCPConn).SetLinger(0)
		c.Close()
	})
	// resetsMidAnswer: reads the request, starts an answer, resets
	resetsMidAnswer := listen(t, func(c net.Conn) {
		_, _ = http.ReadRequest(bufio.NewReader(c))
		_, _ = c.Write([]byte("HTTP/1.1 "))
		c.(*net.TCPConn).SetLinger(0)
		c.Close()
	})
	// closesMidAnswer: reads the request, starts an answer, closes
	closesMidAnswer := listen(t, func(c net.Conn) {
		_, _ = http.ReadRequest(bufio.NewReader(c))
		_, _ = c.Write([]byte("HTTP/1.1 "))
		c.Close()
	})
	// hangs: accepts and never answers
	hangs := listen(t, func(c net.Conn) { time.Sleep(2 * time.Second); c.Close() })
	// readsThenCloses: reads the whole request, closes without answering
	readsThenCloses := listen(t, func(c net.Conn) {
		_, _ = http.ReadRequest(bufio.NewReader(c))
		c.Close()
	})
	refuses := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer refuses.Close()
	gone, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	goneAddr := gone.Addr().String()
	gone.Close()

	tests := []struct {
		name, addr string
		cut, reset bool
	}{
		{"closed with the request unread: a reset", unreadCloses, true, true},
		{"reset before an answer", resets, true, true},
		{"closed after reading the request, no answer", readsThenCloses, true, false},
		{"reset after part of an answer", resetsMidAnswer, false, false},
		{"closed after part of an answer", closesMidAnswer, false, false},
		{"refused with 503", refuses.Listener.Addr().String(), false, false},
		{"no answer within the handshake timeout", hangs, false, false},
		{"nothing listening", goneAddr, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := newTraffic([]string{"ws://" + tt.addr + "/playwright/chromium"}, 500*time.Millisecond)
			o := &outcome{}
			c, err := tr.dial(context.Background(), 0, o)
			if err == nil {
				c.CloseNow()
				t.Fatal("the handshake succeeded")
			}
			if o.cut != tt.cut || o.cutReset != tt.reset {
				t.Errorf("cut = %v, reset = %v; want %v, %v (error: %v)", o.cut, o.cutReset, tt.cut, tt.reset, err)
			}
		})
	}
}

// TestDialMarksHandshakeCutByShutdown: the commoner of a reload's two
// cuts. net/http drops a request it reads once its server's shutdown has
// begun, closing the connection it accepted before without an answer:
// the handshake is cut by a FIN.
func TestDialMarksHandshakeCutByShutdown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	accepted, shuttingDown := make(chan struct{}), make(chan struct{})
	var once sync.Once
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			t.Error("the request was served")
		}),
		// The accepted connection's request is read only once the
		// shutdown has begun.
		ConnState: func(c net.Conn, st http.ConnState) {
			if st == http.StateNew {
				once.Do(func() { close(accepted) })
				<-shuttingDown
			}
		},
	}
	srv.RegisterOnShutdown(func() { close(shuttingDown) })
	go srv.Serve(ln)
	tr := newTraffic([]string{"ws://" + ln.Addr().String() + "/playwright/chromium"}, 10*time.Second)
	o := &outcome{}
	done := dialInBackground(tr, o)
	<-accepted
	go srv.Shutdown(context.Background())
	if err := <-done; err == nil {
		t.Fatal("the handshake succeeded")
	} else if !o.cut || o.cutReset {
		t.Errorf("a handshake dropped by a server shutting down: cut = %v, reset = %v; want true, false (error: %v)", o.cut, o.cutReset, err)
	}
}

// TestDialMarksQueuedHandshakeCut: the other cut of a reload. A handshake
// queued on a listener that never accepted it, which then closes, is
// reset by Linux.
func TestDialMarksQueuedHandshakeCut(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	tr := newTraffic([]string{"ws://" + ln.Addr().String() + "/playwright/chromium"}, 10*time.Second)
	o := &outcome{}
	done := dialInBackground(tr, o)
	testenv.Eventually(t, 5*time.Second, "the handshake's request queued on the listener", func() bool {
		return queuedRequests(t, port) == 1
	})
	ln.Close()
	if err := <-done; err == nil {
		t.Fatal("the handshake succeeded")
	} else if !o.cut || !o.cutReset {
		t.Errorf("a handshake queued on a listener that closed: cut = %v, reset = %v; want true, true (error: %v)", o.cut, o.cutReset, err)
	}
}

// queuedRequests counts the connections to 127.0.0.1:port that the
// kernel established and holds unread data for, from /proc/net/tcp.
func queuedRequests(t *testing.T, port int) int {
	t.Helper()
	data, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(string(data), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) < 5 || f[3] != "01" { // 01: TCP_ESTABLISHED
			continue
		}
		_, hexPort, _ := strings.Cut(f[1], ":")
		_, rx, _ := strings.Cut(f[4], ":") // tx_queue:rx_queue
		p, err := strconv.ParseUint(hexPort, 16, 16)
		if q, qerr := strconv.ParseUint(rx, 16, 64); err == nil && qerr == nil && int(p) == port && q > 0 {
			n++
		}
	}
	return n
}

// listen serves each connection with handle, until the test ends.
func listen(t *testing.T, handle func(net.Conn)) string {
	t.Helper()
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
			go handle(c)
		}
	}()
	return ln.Addr().String()
}

// TestDialLeavesNoConnection: a refused handshake's connection, which
// net/http would keep alive, is closed once dial returns.
func TestDialLeavesNoConnection(t *testing.T) {
	var open atomic.Int32
	refuses := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	refuses.Config.ConnState = func(c net.Conn, st http.ConnState) {
		switch st {
		case http.StateNew:
			open.Add(1)
		case http.StateClosed, http.StateHijacked:
			open.Add(-1)
		}
	}
	refuses.Start()
	defer refuses.Close()
	tr := newTraffic([]string{"ws://" + refuses.Listener.Addr().String() + "/playwright/chromium"}, 5*time.Second)
	for range 3 {
		o := &outcome{}
		if c, err := tr.dial(context.Background(), 0, o); err == nil {
			c.CloseNow()
			t.Fatal("the handshake succeeded")
		} else if o.status != http.StatusServiceUnavailable {
			t.Fatalf("status %d, want 503 (error: %v)", o.status, err)
		}
	}
	testenv.Eventually(t, 5*time.Second, "the refused handshakes' connections closed", func() bool {
		return open.Load() == 0
	})
}

// dialInBackground runs tr.dial for o on its own goroutine and sends its
// error when it returns (a connection it opened is closed at once).
func dialInBackground(tr *traffic, o *outcome) <-chan error {
	done := make(chan error, 1)
	go func() {
		c, err := tr.dial(context.Background(), 0, o)
		if err == nil {
			c.CloseNow()
		}
		done <- err
	}()
	return done
}
