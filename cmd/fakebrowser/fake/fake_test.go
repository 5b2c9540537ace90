package fake

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
)

// start runs a Server on a free port; exits records crash requests.
func start(t *testing.T, b Behavior) (*Server, string, chan int) {
	t.Helper()
	exits := make(chan int, 4)
	s, ep, err := Start("127.0.0.1:0", Options{Behavior: b, Exit: func(code int) { exits <- code }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, ep, exits
}

func dial(t *testing.T, ep string) *websocket.Conn {
	t.Helper()
	// The context bounds the handshake only: a dialled connection does not
	// depend on it.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, ep, nil)
	if err != nil {
		t.Fatalf("dialing %s: %v", ep, err)
	}
	t.Cleanup(func() { c.CloseNow() })
	return c
}

// refusedWith dials ep and returns the HTTP response of a refused
// handshake, failing the test when the dial did not end in a refusal.
func refusedWith(t *testing.T, ep string) *http.Response {
	t.Helper()
	c, resp, err := websocket.Dial(context.Background(), ep, nil)
	if err == nil {
		c.CloseNow()
		t.Fatalf("dialing %s: the upgrade was accepted, want a refusal", ep)
	}
	if resp == nil {
		t.Fatalf("dialing %s: %v, want an HTTP refusal", ep, err)
	}
	return resp
}

func roundTrip(t *testing.T, c *websocket.Conn, msg string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Write(ctx, websocket.MessageText, []byte(msg)); err != nil {
		t.Fatalf("write: %v", err)
	}
	typ, got, err := c.Read(ctx)
	if err != nil || typ != websocket.MessageText || string(got) != msg {
		t.Fatalf("echo of %q: %v %q %v", msg, typ, got, err)
	}
}

// readErr reads until the connection fails and returns why.
func readErr(t *testing.T, c *websocket.Conn) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for {
		if _, _, err := c.Read(ctx); err != nil {
			return err
		}
	}
}

func getStats(t *testing.T, ep string) Stats {
	t.Helper()
	u := strings.Replace(ep, "ws://", "http://", 1)
	u = u[:strings.LastIndex(u, "/")] + "/stats"
	resp, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st Stats
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	return st
}

func TestEchoAndStats(t *testing.T) {
	s, ep, _ := start(t, Behavior{})
	if !strings.HasPrefix(ep, "ws://127.0.0.1:") || !strings.HasSuffix(ep, "/playwright") {
		t.Fatalf("endpoint %q", ep)
	}
	a, b := dial(t, ep), dial(t, ep)
	roundTrip(t, a, "one")
	roundTrip(t, a, "two")
	roundTrip(t, b, "three")
	st := getStats(t, ep)
	if st.Sessions != 2 || st.Active != 2 || st.PeakActive != 2 || st.Messages != 3 || st.Bytes != 11 || st.Endpoint != ep {
		t.Fatalf("stats %+v", st)
	}
	if err := a.Close(websocket.StatusNormalClosure, ""); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, "active to drop to 1", func() bool { return s.Stats().Active == 1 })
	if st := s.Stats(); st.Sessions != 2 || st.PeakActive != 2 {
		t.Fatalf("after close: %+v", st)
	}
}

// TestEchoesLargeMessages: a message far above the WebSocket library's
// default read limit (32 KiB) is echoed whole, as a browser answers a
// screenshot; gridbench's bulk echo sends 1 MiB messages.
func TestEchoesLargeMessages(t *testing.T) {
	_, ep, _ := start(t, Behavior{})
	c := dial(t, ep)
	c.SetReadLimit(MaxMessageSize)
	msg := make([]byte, 4<<20)
	for i := range msg {
		msg[i] = byte(i)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Write(ctx, websocket.MessageBinary, msg); err != nil {
		t.Fatalf("write: %v", err)
	}
	typ, got, err := c.Read(ctx)
	if err != nil || typ != websocket.MessageBinary || !bytes.Equal(got, msg) {
		t.Fatalf("echo of %d bytes: %v, %d bytes, %v", len(msg), typ, len(got), err)
	}
}

func TestRefuse(t *testing.T) {
	s, ep, _ := start(t, Behavior{Refuse: 503})
	if resp := refusedWith(t, ep); resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("refused with %s (Retry-After %q), want a 503 with Retry-After", resp.Status, resp.Header.Get("Retry-After"))
	}
	if st := s.Stats(); st.Refused != 1 || st.Sessions != 0 || st.UpgradeRequests != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestHangHoldsTheUpgrade(t *testing.T) {
	s, ep, _ := start(t, Behavior{Hang: true})
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, _, err := websocket.Dial(ctx, ep, nil); err == nil || ctx.Err() == nil {
		t.Fatalf("dial to a hanging server returned %v before the client gave up", err)
	}
	if st := s.Stats(); st.UpgradeRequests != 1 || st.Sessions != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestAcceptDelay(t *testing.T) {
	_, ep, _ := start(t, Behavior{AcceptDelay: 300 * time.Millisecond})
	start := time.Now()
	c := dial(t, ep)
	if waited := time.Since(start); waited < 300*time.Millisecond {
		t.Fatalf("upgrade answered after %s, before the 300ms accept delay", waited)
	}
	roundTrip(t, c, "late")
}

func TestCloseAfterMessages(t *testing.T) {
	_, ep, _ := start(t, Behavior{CloseAfterMessages: 2})
	c := dial(t, ep)
	roundTrip(t, c, "a")
	roundTrip(t, c, "b")
	err := readErr(t, c)
	var ce websocket.CloseError
	if !errors.As(err, &ce) || ce.Code != websocket.StatusNormalClosure || !strings.Contains(ce.Reason, "2 messages") {
		t.Fatalf("after 2 messages: %v, want a normal close naming the count", err)
	}
}

func TestCloseAfterDuration(t *testing.T) {
	_, ep, _ := start(t, Behavior{CloseAfter: 100 * time.Millisecond})
	c := dial(t, ep)
	err := readErr(t, c)
	var ce websocket.CloseError
	if !errors.As(err, &ce) || ce.Code != websocket.StatusNormalClosure || !strings.Contains(ce.Reason, "100ms") {
		t.Fatalf("got %v, want a normal close after 100ms", err)
	}
}

func TestCrashOnSession(t *testing.T) {
	_, ep, exits := start(t, Behavior{CrashOnSession: 2})
	roundTrip(t, dial(t, ep), "first is fine")
	select {
	case code := <-exits:
		t.Fatalf("exited with %d after one session", code)
	default:
	}
	dial(t, ep)
	select {
	case code := <-exits:
		if code != ExitCrash {
			t.Fatalf("exit code %d, want %d", code, ExitCrash)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no crash on the second session")
	}
}

func TestCrashAfterSessions(t *testing.T) {
	_, ep, exits := start(t, Behavior{CrashAfterSessions: 2})
	for i := 0; i < 2; i++ {
		c := dial(t, ep)
		roundTrip(t, c, fmt.Sprint("session ", i))
		if i == 0 {
			c.Close(websocket.StatusNormalClosure, "")
			select {
			case code := <-exits:
				t.Fatalf("exited with %d after one session", code)
			case <-time.After(50 * time.Millisecond):
			}
			continue
		}
		c.Close(websocket.StatusNormalClosure, "")
	}
	select {
	case code := <-exits:
		if code != ExitCrash {
			t.Fatalf("exit code %d", code)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no crash after two sessions ended")
	}
}

func TestControlAndQueryOverrides(t *testing.T) {
	s, ep, _ := start(t, Behavior{})
	base := strings.Replace(ep, "ws://", "http://", 1)
	base = base[:strings.LastIndex(base, "/")]

	resp, err := http.PostForm(base+"/control", url.Values{"refuse": {"502"}, "echo-delay": {"1ms"}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || s.Behavior().Refuse != 502 || s.Behavior().EchoDelay != time.Millisecond {
		t.Fatalf("control answered %d, behavior now %+v", resp.StatusCode, s.Behavior())
	}
	if resp := refusedWith(t, ep); resp.StatusCode != 502 {
		t.Fatalf("after control: refused with %s, want 502", resp.Status)
	}
	// A session may override the behavior for itself.
	c := dial(t, ep+"?fb-refuse=0&fb-close-after-messages=1")
	roundTrip(t, c, "only one")
	if err := readErr(t, c); websocket.CloseStatus(err) != websocket.StatusNormalClosure {
		t.Fatalf("after one message: %v, want the session override of close-after-messages to close it", err)
	}

	for _, bad := range []url.Values{{"refuse": {"101"}}, {"echo-delay": {"-1s"}}, {"nonsense": {"1"}}} {
		resp, err := http.PostForm(base+"/control", bad)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("control %v answered %d, want 400", bad, resp.StatusCode)
		}
	}
	if resp := refusedWith(t, ep+"?fb-refuse=abc"); resp.StatusCode != 400 {
		t.Fatalf("a bad session override: refused with %s, want 400", resp.Status)
	}
	if resp, _ := http.Get(base + "/control"); resp == nil || resp.StatusCode != http.StatusMethodNotAllowed {
		t.Fatal("GET /control was not refused")
	}
}

func TestCloseEndsSessionsWithGoingAway(t *testing.T) {
	s, ep, _ := start(t, Behavior{})
	c := dial(t, ep)
	roundTrip(t, c, "x")
	var wg sync.WaitGroup
	wg.Add(1)
	var err error
	go func() { defer wg.Done(); _, _, err = c.Read(context.Background()) }()
	s.Close()
	wg.Wait()
	if websocket.CloseStatus(err) != websocket.StatusGoingAway {
		t.Fatalf("client got %v, want 1001", err)
	}
}

// closeRecorder's connections note the server's active count at the moment
// the server closes them (before the socket closes, so before the peer can
// see the close).
type closeRecorder struct {
	net.Listener
	s    *Server
	mu   sync.Mutex
	seen []int64
}

func (l *closeRecorder) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &recordedConn{Conn: c, l: l}, nil
}

func (l *closeRecorder) active() []int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.seen)
}

type recordedConn struct {
	net.Conn
	l    *closeRecorder
	once sync.Once
}

func (c *recordedConn) Close() error {
	c.once.Do(func() {
		c.l.mu.Lock()
		c.l.seen = append(c.l.seen, c.l.s.Stats().Active)
		c.l.mu.Unlock()
	})
	return c.Conn.Close()
}

// A session stops counting as active when the server closes its
// connection, not a moment later: a proxy sees the close only then, and
// may hand the slot to the next session at once (gridchaos counted one
// over-admission in stale-5000 when the next session arrived 4 ms after
// the old one's connection closed, its goroutine not yet done).
func TestSessionStopsCountingWhenItsConnectionCloses(t *testing.T) {
	s := New(Options{})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rec := &closeRecorder{Listener: l, s: s}
	ep := s.setEndpoint(l.Addr()) // (Serve sets it too, in its goroutine)
	go s.Serve(rec)
	t.Cleanup(func() { s.Close() })
	a, b := dial(t, ep), dial(t, ep)
	roundTrip(t, a, "one")
	roundTrip(t, b, "two")

	// The client closes (the handshake): the server answers and closes.
	if err := a.Close(websocket.StatusNormalClosure, ""); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, "the server to close the first connection", func() bool { return len(rec.active()) == 1 })
	// The client goes away without a handshake: the server reads EOF and closes.
	b.CloseNow()
	testenv.Eventually(t, 5*time.Second, "the server to close the second connection", func() bool { return len(rec.active()) == 2 })
	if got := rec.active(); !slices.Equal(got, []int64{1, 0}) {
		t.Fatalf("active as the server closed each connection: %v; want [1 0] (a closed session no longer counts)", got)
	}
	if st := s.Stats(); st.Active != 0 || st.PeakActive != 2 || st.Sessions != 2 {
		t.Fatalf("stats after both closed: %+v", st)
	}
}
