package chaos

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// TestDialMarksCutHandshakes: only a handshake whose connection is closed
// or reset before any HTTP answer is marked cut (what a reload's listener
// swap does); a refusal, a timeout and nothing listening are not.
func TestDialMarksCutHandshakes(t *testing.T) {
	// closes: accepts, reads the request's start, closes (EOF)
	closes := listen(t, func(c net.Conn) {
		_, _ = c.Read(make([]byte, 1))
		c.Close()
	})
	// resets: accepts, reads, closes with unread data and linger 0 (RST)
	resets := listen(t, func(c net.Conn) {
		_, _ = c.Read(make([]byte, 1))
		c.(*net.TCPConn).SetLinger(0)
		c.Close()
	})
	// hangs: accepts and never answers
	hangs := listen(t, func(c net.Conn) { time.Sleep(2 * time.Second); c.Close() })
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
		cut        bool
	}{
		{"closed before an answer", closes, true},
		{"reset before an answer", resets, true},
		{"refused with 503", refuses.Listener.Addr().String(), false},
		{"no answer within the handshake timeout", hangs, false},
		{"nothing listening", goneAddr, false},
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
			if o.cut != tt.cut {
				t.Errorf("cut = %v, want %v (error: %v)", o.cut, tt.cut, err)
			}
		})
	}
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
