package workeragent

import (
	"bufio"
	"io"
	"net"
	"testing"
)

// loopbackPair is a connected pair of TCP connections on loopback.
func loopbackPair(tb testing.TB) (net.Conn, net.Conn) {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer l.Close()
	ch := make(chan net.Conn, 1)
	go func() {
		c, _ := l.Accept()
		ch <- c
	}()
	a, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		tb.Fatal(err)
	}
	return a, <-ch
}

// frame1K is one masked binary frame of 1 KiB, as a client sends it.
var frame1K = func() []byte {
	b := []byte{0x82, 0xfe, 0x04, 0x00, 1, 2, 3, 4}
	return append(b, make([]byte, 1024)...)
}()

// benchRelay measures 1 KiB round trips from a client through relay to
// an echo server.
func benchRelay(b *testing.B, join func(proxy, browser net.Conn)) {
	client, proxy := loopbackPair(b)
	toBrowser, browser := loopbackPair(b)
	defer client.Close()
	go func() { _, _ = io.Copy(browser, browser) }() // the echo
	go join(proxy, toBrowser)
	buf := make([]byte, len(frame1K))
	b.ResetTimer()
	for range b.N {
		if _, err := client.Write(frame1K); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(client, buf); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRelayRoundTrip1K: the agent's relay, which reads every frame
// header, against a bare io.Copy both ways, over loopback TCP.
func BenchmarkRelayRoundTrip1K(b *testing.B) {
	b.Run("agent", func(b *testing.B) {
		benchRelay(b, func(p, br net.Conn) {
			newRelay(p, bufio.NewReaderSize(p, relayBuffer), br, bufio.NewReaderSize(br, relayBuffer)).run()
		})
	})
	b.Run("io.Copy", func(b *testing.B) {
		benchRelay(b, func(p, br net.Conn) {
			go func() { _, _ = io.Copy(br, p) }()
			_, _ = io.Copy(p, br)
		})
	})
}
