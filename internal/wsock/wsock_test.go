package wsock

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// echoServer upgrades every request and echoes messages until the peer
// closes; what the server side saw is sent on the returned channel.
func echoServer(t *testing.T, tlsOn bool, setup func(c *Conn)) (*httptest.Server, chan error) {
	t.Helper()
	done := make(chan error, 16)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := Upgrade(w, r)
		if err != nil {
			done <- err
			return
		}
		if setup != nil {
			setup(c)
		}
		for {
			op, msg, err := c.ReadMessage()
			if err != nil {
				c.Close()
				done <- err
				return
			}
			if err := c.WriteMessage(op, msg); err != nil {
				done <- err
				return
			}
		}
	})
	var srv *httptest.Server
	if tlsOn {
		srv = httptest.NewTLSServer(h)
	} else {
		srv = httptest.NewServer(h)
	}
	t.Cleanup(srv.Close)
	return srv, done
}

func wsURL(srv *httptest.Server, path string) string {
	return "ws" + strings.TrimPrefix(srv.URL, "http") + path
}

func TestEchoSizes(t *testing.T) {
	for _, tlsOn := range []bool{false, true} {
		name := "ws"
		if tlsOn {
			name = "wss"
		}
		t.Run(name, func(t *testing.T) {
			srv, done := echoServer(t, tlsOn, nil)
			d := &Dialer{}
			if tlsOn {
				d.TLSConfig = srv.Client().Transport.(*http.Transport).TLSClientConfig
			}
			c, resp, err := d.Dial(context.Background(), wsURL(srv, "/echo"))
			if err != nil {
				t.Fatalf("dial: %v", err)
			}
			if resp.StatusCode != http.StatusSwitchingProtocols {
				t.Fatalf("status %d, want 101", resp.StatusCode)
			}
			rng := rand.New(rand.NewPCG(1, 2))
			for _, n := range []int{0, 1, 125, 126, 127, 65535, 65536, 100_000, 1 << 20} {
				payload := make([]byte, n)
				for i := range payload {
					payload[i] = byte(rng.IntN(256))
				}
				if err := c.WriteMessage(OpBinary, payload); err != nil {
					t.Fatalf("write %d bytes: %v", n, err)
				}
				op, got, err := c.ReadMessage()
				if err != nil {
					t.Fatalf("read %d bytes: %v", n, err)
				}
				if op != OpBinary || !bytes.Equal(got, payload) {
					t.Fatalf("size %d: got op %v and %d bytes back, want binary and the same bytes", n, op, len(got))
				}
			}
			if err := c.WriteText("héllo"); err != nil {
				t.Fatal(err)
			}
			op, got, err := c.ReadMessage()
			if err != nil || op != OpText || string(got) != "héllo" {
				t.Fatalf("text echo: %v %q %v", op, got, err)
			}
			if err := c.Close(); err != nil {
				t.Fatalf("close: %v", err)
			}
			var ce *CloseError
			if err := <-done; !errors.As(err, &ce) || ce.Code != CloseNormal {
				t.Fatalf("server saw %v, want a normal close", err)
			}
		})
	}
}

func TestDialSendsHeaders(t *testing.T) {
	got := make(chan *http.Request, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r
		c, err := (&Upgrader{Header: http.Header{"Sec-Websocket-Protocol": {"grid"}}}).Upgrade(w, r)
		if err == nil {
			c.Close()
		}
	}))
	defer srv.Close()
	d := &Dialer{Header: http.Header{
		"Authorization":          {"Bearer xyz"},
		"Host":                   {"grid.example"},
		"Sec-WebSocket-Protocol": {"grid"},
	}}
	c, resp, err := d.Dial(context.Background(), wsURL(srv, "/a/b?browser=chromium"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := <-got
	if r.Header.Get("Authorization") != "Bearer xyz" || r.Host != "grid.example" {
		t.Fatalf("server saw Authorization %q Host %q", r.Header.Get("Authorization"), r.Host)
	}
	if r.URL.Path != "/a/b" || r.URL.Query().Get("browser") != "chromium" {
		t.Fatalf("server saw %s", r.URL)
	}
	if resp.Header.Get("Sec-WebSocket-Protocol") != "grid" {
		t.Fatalf("response header missing: %v", resp.Header)
	}
}

func TestRefusedUpgradeReportsStatusAndBody(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "3")
		http.Error(w, "no worker free", http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	c, resp, err := Dial(context.Background(), wsURL(srv, "/"), nil)
	if c != nil {
		t.Fatal("got a connection from a refusal")
	}
	var he *HandshakeError
	if !errors.As(err, &he) {
		t.Fatalf("err = %v, want *HandshakeError", err)
	}
	if he.StatusCode != 503 || strings.TrimSpace(string(he.Body)) != "no worker free" || he.Header.Get("Retry-After") != "3" {
		t.Fatalf("refusal = %d %q %v", he.StatusCode, he.Body, he.Header)
	}
	if resp == nil || resp.StatusCode != 503 {
		t.Fatalf("response %v, want the 503", resp)
	}
	if !strings.Contains(err.Error(), "503") || !strings.Contains(err.Error(), "no worker free") {
		t.Fatalf("error text %q does not name the status and body", err)
	}
}

func TestUpgradeRejectsBadHandshakes(t *testing.T) {
	srv, _ := echoServer(t, false, nil)
	cases := []struct {
		name   string
		method string
		header map[string]string
		want   int
	}{
		{"plain GET", "GET", nil, 400},
		{"POST", "POST", map[string]string{"Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13", "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}, 405},
		{"old version", "GET", map[string]string{"Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "8", "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}, 426},
		{"bad key", "GET", map[string]string{"Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13", "Sec-WebSocket-Key": "short"}, 400},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest(tc.method, srv.URL, nil)
			for k, v := range tc.header {
				req.Header.Set(k, v)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != tc.want {
				t.Fatalf("status %d, want %d", resp.StatusCode, tc.want)
			}
		})
	}
}

func TestPingPong(t *testing.T) {
	srv, _ := echoServer(t, false, nil)
	c, _, err := Dial(context.Background(), wsURL(srv, "/"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	pongs := make(chan string, 1)
	c.OnPong(func(p []byte) { pongs <- string(p) })
	if err := c.Ping([]byte("are you there")); err != nil {
		t.Fatal(err)
	}
	// The pong arrives while reading; send a message so ReadMessage returns.
	if err := c.WriteText("after ping"); err != nil {
		t.Fatal(err)
	}
	_, msg, err := c.ReadMessage()
	if err != nil || string(msg) != "after ping" {
		t.Fatalf("read %q %v", msg, err)
	}
	select {
	case p := <-pongs:
		if p != "are you there" {
			t.Fatalf("pong payload %q", p)
		}
	default:
		t.Fatal("no pong was reported before the echo")
	}
	if err := c.Ping(make([]byte, 126)); err == nil {
		t.Fatal("a 126-byte ping was accepted")
	}
}

func TestServerInitiatedClose(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := Upgrade(w, r)
		if err != nil {
			return
		}
		c.CloseWith(4000, "lifetime reached", 2*time.Second)
	}))
	defer srv.Close()
	c, _, err := Dial(context.Background(), wsURL(srv, "/"), nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = c.ReadMessage()
	var ce *CloseError
	if !errors.As(err, &ce) || ce.Code != 4000 || ce.Reason != "lifetime reached" {
		t.Fatalf("err = %v, want close 4000 'lifetime reached'", err)
	}
	if err := c.WriteText("too late"); !errors.Is(err, ErrClosed) {
		t.Fatalf("write after close = %v, want ErrClosed", err)
	}
	c.Close()
}

func TestCloseWhileAnotherGoroutineReads(t *testing.T) {
	srv, done := echoServer(t, false, nil)
	c, _, err := Dial(context.Background(), wsURL(srv, "/"), nil)
	if err != nil {
		t.Fatal(err)
	}
	readErr := make(chan error, 1)
	go func() {
		for {
			if _, _, err := c.ReadMessage(); err != nil {
				readErr <- err
				return
			}
		}
	}()
	if err := c.WriteText("x"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := c.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	if time.Since(start) >= DefaultCloseTimeout {
		t.Fatal("close waited for its timeout instead of the peer's close frame")
	}
	var ce *CloseError
	if err := <-readErr; !errors.As(err, &ce) || ce.Code != CloseNormal {
		t.Fatalf("reader got %v, want the echoed close", err)
	}
	if err := <-done; !errors.As(err, &ce) || ce.Code != CloseNormal {
		t.Fatalf("server got %v", err)
	}
}

func TestReadLimit(t *testing.T) {
	srv, done := echoServer(t, false, func(c *Conn) { c.SetReadLimit(1000) })
	c, _, err := Dial(context.Background(), wsURL(srv, "/"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.WriteMessage(OpBinary, make([]byte, 1000)); err != nil {
		t.Fatal(err)
	}
	if _, got, err := c.ReadMessage(); err != nil || len(got) != 1000 {
		t.Fatalf("a message at the limit: %d bytes, %v", len(got), err)
	}
	if err := c.WriteMessage(OpBinary, make([]byte, 1001)); err != nil {
		t.Fatal(err)
	}
	_, _, err = c.ReadMessage()
	var ce *CloseError
	if !errors.As(err, &ce) || ce.Code != CloseMessageTooBig {
		t.Fatalf("client got %v, want close 1009", err)
	}
	var pe *ProtocolError
	if err := <-done; !errors.As(err, &pe) || pe.Code != CloseMessageTooBig {
		t.Fatalf("server got %v, want a 1009 protocol error", err)
	}
}

func TestAbnormalClosure(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := Upgrade(w, r)
		if err == nil {
			c.Abort()
		}
	}))
	defer srv.Close()
	c, _, err := Dial(context.Background(), wsURL(srv, "/"), nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = c.ReadMessage()
	var ce *CloseError
	if !errors.As(err, &ce) || ce.Code != CloseAbnormal || ce.Err == nil {
		t.Fatalf("err = %v, want an abnormal closure with its cause", err)
	}
	c.Close()
}

func TestDialTimeoutOnHangingServer(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			defer c.Close() // accept, never answer
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, _, err = Dial(ctx, "ws://"+l.Addr().String()+"/", nil)
	if err == nil {
		t.Fatal("dial to a server that never answers succeeded")
	}
	if ctx.Err() == nil {
		t.Fatalf("dial returned %v before its deadline", err)
	}
}

func TestDialBadURLs(t *testing.T) {
	for _, u := range []string{"http://[::1", "ftp://x/", "ws:///path"} {
		if _, _, err := Dial(context.Background(), u, nil); err == nil {
			t.Errorf("Dial(%q) succeeded", u)
		}
	}
}

// rawPair is a server Conn and the raw TCP connection of its client, for
// writing hand-made frames.
func rawPair(t *testing.T) (*Conn, net.Conn) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := l.Accept()
		accepted <- c
	}()
	client, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server := <-accepted
	t.Cleanup(func() { client.Close(); server.Close() })
	return newConn(server, nil, false, 0), client
}

func maskedFrame(fin bool, rsv byte, op Opcode, payload []byte) []byte {
	key := [4]byte{1, 2, 3, 4}
	b := appendHeader(nil, fin, op, len(payload), &key)
	b[0] |= rsv
	start := len(b)
	b = append(b, payload...)
	mask(key, 0, b[start:])
	return b
}

func TestFragmentsAndInterleavedPing(t *testing.T) {
	s, raw := rawPair(t)
	var frames []byte
	frames = append(frames, maskedFrame(false, 0, OpText, []byte("hel"))...)
	frames = append(frames, maskedFrame(true, 0, OpPing, []byte("p"))...)
	frames = append(frames, maskedFrame(false, 0, OpContinuation, []byte("lo "))...)
	frames = append(frames, maskedFrame(true, 0, OpContinuation, []byte("world"))...)
	go raw.Write(frames)
	op, msg, err := s.ReadMessage()
	if err != nil || op != OpText || string(msg) != "hello world" {
		t.Fatalf("got %v %q %v", op, msg, err)
	}
	// The ping was answered with an unmasked pong carrying its payload.
	buf := make([]byte, 3)
	raw.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := io.ReadFull(raw, buf); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf, []byte{0x80 | byte(OpPong), 1, 'p'}) {
		t.Fatalf("pong frame = %x", buf)
	}
}

func TestProtocolViolations(t *testing.T) {
	cases := []struct {
		name  string
		frame []byte
		code  int
	}{
		{"unmasked client frame", appendHeader(nil, true, OpText, 0, nil), CloseProtocolError},
		{"reserved bit", maskedFrame(true, 0x40, OpText, []byte("x")), CloseProtocolError},
		{"unknown opcode", maskedFrame(true, 0, Opcode(0x3), nil), CloseProtocolError},
		{"continuation first", maskedFrame(true, 0, OpContinuation, []byte("x")), CloseProtocolError},
		{"fragmented ping", maskedFrame(false, 0, OpPing, nil), CloseProtocolError},
		{"long ping", maskedFrame(true, 0, OpPing, make([]byte, 126)), CloseProtocolError},
		{"invalid utf-8", maskedFrame(true, 0, OpText, []byte{0xff, 0xfe}), CloseInvalidPayload},
		{"bad close code", maskedFrame(true, 0, OpClose, []byte{0x03, 0xed}), CloseProtocolError}, // 1005
		{"one-byte close", maskedFrame(true, 0, OpClose, []byte{0x03}), CloseProtocolError},
		{"overlong length", append([]byte{0x81, 0x80 | 126, 0, 5}, 1, 2, 3, 4), CloseProtocolError},
		{"new message inside a fragmented one", append(maskedFrame(false, 0, OpText, []byte("a")), maskedFrame(true, 0, OpText, []byte("b"))...), CloseProtocolError},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, raw := rawPair(t)
			go raw.Write(tc.frame)
			_, _, err := s.ReadMessage()
			var pe *ProtocolError
			if !errors.As(err, &pe) || pe.Code != tc.code {
				t.Fatalf("err = %v, want a protocol error with code %d", err, tc.code)
			}
			// The peer is told: a close frame with that code.
			raw.SetReadDeadline(time.Now().Add(2 * time.Second))
			hdr := make([]byte, 4)
			if _, err := io.ReadFull(raw, hdr); err != nil {
				t.Fatal(err)
			}
			if Opcode(hdr[0]&0xf) != OpClose || int(hdr[2])<<8|int(hdr[3]) != tc.code {
				t.Fatalf("peer got frame %x, want close %d", hdr, tc.code)
			}
			// And later reads report the same error.
			if _, _, err2 := s.ReadMessage(); err2 != err {
				t.Fatalf("second read = %v, want %v", err2, err)
			}
		})
	}
}

func TestMaskMatchesBytewiseXOR(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	for i := 0; i < 2000; i++ {
		key := [4]byte{byte(rng.IntN(256)), byte(rng.IntN(256)), byte(rng.IntN(256)), byte(rng.IntN(256))}
		pos := rng.IntN(4)
		b := make([]byte, rng.IntN(100))
		for j := range b {
			b[j] = byte(rng.IntN(256))
		}
		want := append([]byte(nil), b...)
		p := pos
		for j := range want {
			want[j] ^= key[p]
			p = (p + 1) & 3
		}
		if got := mask(key, pos, b); got != p || !bytes.Equal(b, want) {
			t.Fatalf("mask(len %d, pos %d) differs from the byte-wise XOR", len(b), pos)
		}
	}
}

func TestAcceptKeyRFCExample(t *testing.T) {
	// RFC 6455 §1.3's worked example.
	if got := AcceptKey("dGhlIHNhbXBsZSBub25jZQ=="); got != "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=" {
		t.Fatalf("AcceptKey = %s", got)
	}
}

// FuzzReadMessage feeds arbitrary bytes to a server connection: it must
// return messages or an error, never panic or hang.
func FuzzReadMessage(f *testing.F) {
	f.Add(maskedFrame(true, 0, OpText, []byte("hi")))
	f.Add(maskedFrame(true, 0, OpClose, []byte{0x03, 0xe8, 'o', 'k'}))
	f.Add(append(maskedFrame(false, 0, OpBinary, []byte{1}), maskedFrame(true, 0, OpContinuation, []byte{2})...))
	f.Add([]byte{0x82, 0xff, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		c := newConn(fakeNetConn{r: bytes.NewReader(data)}, nil, false, 1<<16)
		for i := 0; i < 100; i++ {
			if _, _, err := c.ReadMessage(); err != nil {
				return
			}
		}
	})
}

// fakeNetConn reads from r and discards writes: enough for the fuzz target,
// which needs no peer.
type fakeNetConn struct {
	net.Conn
	r io.Reader
}

func (f fakeNetConn) Read(p []byte) (int, error)       { return f.r.Read(p) }
func (f fakeNetConn) Write(p []byte) (int, error)      { return len(p), nil }
func (f fakeNetConn) Close() error                     { return nil }
func (f fakeNetConn) SetWriteDeadline(time.Time) error { return nil }
func (f fakeNetConn) SetReadDeadline(time.Time) error  { return nil }
