// Package fake is the server behind cmd/fakebrowser: a deterministic
// WebSocket endpoint that stands in for a browser server in the grid's
// tests and load runs. It accepts WebSockets on one path, echoes every
// message, counts sessions and messages, and misbehaves on request: refuse
// the upgrade, hang before answering, answer slowly, close a session after
// N messages or after a duration, or end the whole process after N
// sessions (the failure-handling rules' "mock worker binary with configurable failure
// modes").
//
// Besides the WebSocket path a Server answers:
//
//	GET  /stats    JSON Stats
//	GET  /health   200 "ok"
//	POST /control  change the Behavior: form or query values named as the
//	               command-line flags (refuse=503, echo-delay=200ms, ...);
//	               answers the new Behavior as JSON
//
// A WebSocket request may also override the Behavior for its own session
// with query parameters named "fb-" + the flag name, for example
// ws://host/playwright?fb-close-after-messages=3.
package fake

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
)

// ExitCrash is the exit code of a process that crashes on request.
const ExitCrash = 3

// MaxMessageSize is the largest message a session reads (and echoes), in
// bytes: a browser's DevTools messages (screenshots, traces) run to
// megabytes, far above the WebSocket library's default of 32 KiB.
const MaxMessageSize = 32 << 20

// Behavior is how the server treats WebSocket sessions. The zero value
// accepts every session at once and echoes forever.
type Behavior struct {
	// Refuse answers every upgrade with this HTTP status instead of 101.
	// Default: 0 (accept).
	Refuse int `json:"refuse,omitempty"`
	// Hang holds every upgrade request open without answering, until the
	// client gives up or the server closes.
	Hang bool `json:"hang,omitempty"`
	// AcceptDelay waits this long before answering an upgrade. Default: 0.
	AcceptDelay time.Duration `json:"accept_delay,omitempty"`
	// EchoDelay waits this long before echoing each message. Default: 0.
	EchoDelay time.Duration `json:"echo_delay,omitempty"`
	// CloseAfterMessages closes a session (code 1000) once it has echoed
	// this many messages. Default: 0 (never).
	CloseAfterMessages int `json:"close_after_messages,omitempty"`
	// CloseAfter closes a session (code 1000) this long after it opened.
	// Default: 0 (never).
	CloseAfter time.Duration `json:"close_after,omitempty"`
	// CloseDelay holds a session's connection this long when it closes
	// (after its peer's close frame or end), still counted, as a browser
	// slow to let a session go. Default: 0.
	CloseDelay time.Duration `json:"close_delay,omitempty"`
	// CrashOnSession ends the process (exit code 3) right after the
	// upgrade of its Nth session, so that session drops mid-flight.
	// Counted per Server. Default: 0 (never).
	CrashOnSession int `json:"crash_on_session,omitempty"`
	// CrashAfterSessions ends the process (exit code 3) when its Nth
	// session has ended, so N sessions are served in full and later dials
	// are refused by the operating system. Default: 0 (never).
	CrashAfterSessions int `json:"crash_after_sessions,omitempty"`
}

// behaviorKeys are the names of Behavior's fields in flags, /control and
// (with the "fb-" prefix) WebSocket query strings.
var behaviorKeys = []string{"refuse", "hang", "accept-delay", "echo-delay", "close-after-messages", "close-after", "close-delay", "crash-on-session", "crash-after-sessions"}

// Apply returns b with the values in v (keys as in behaviorKeys, each with
// prefix) applied; unknown keys with the prefix are an error.
func (b Behavior) Apply(v url.Values, prefix string) (Behavior, error) {
	for key, vals := range v {
		if !strings.HasPrefix(key, prefix) || len(vals) == 0 {
			continue
		}
		name, val := strings.TrimPrefix(key, prefix), vals[len(vals)-1]
		var err error
		switch name {
		case "refuse":
			b.Refuse, err = parseStatus(val)
		case "hang":
			b.Hang, err = strconv.ParseBool(val)
		case "accept-delay":
			b.AcceptDelay, err = parseDuration(val)
		case "echo-delay":
			b.EchoDelay, err = parseDuration(val)
		case "close-after":
			b.CloseAfter, err = parseDuration(val)
		case "close-delay":
			b.CloseDelay, err = parseDuration(val)
		case "close-after-messages":
			b.CloseAfterMessages, err = parseCount(val)
		case "crash-on-session":
			b.CrashOnSession, err = parseCount(val)
		case "crash-after-sessions":
			b.CrashAfterSessions, err = parseCount(val)
		default:
			return b, fmt.Errorf("unknown setting %q (known: %s)", key, strings.Join(behaviorKeys, ", "))
		}
		if err != nil {
			return b, fmt.Errorf("setting %s=%q: %w", key, val, err)
		}
	}
	return b, nil
}

func parseStatus(s string) (int, error) {
	n, err := strconv.Atoi(s)
	if err != nil {
		return 0, err
	}
	if n != 0 && (n < 200 || n > 599 || n == http.StatusSwitchingProtocols) {
		return 0, errors.New("want an HTTP status from 200 to 599, or 0 to accept")
	}
	return n, nil
}

func parseDuration(s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, err
	}
	if d < 0 {
		return 0, errors.New("must not be negative")
	}
	return d, nil
}

func parseCount(s string) (int, error) {
	n, err := strconv.Atoi(s)
	if err != nil {
		return 0, err
	}
	if n < 0 {
		return 0, errors.New("must not be negative")
	}
	return n, nil
}

// Stats are a server's counters since it started.
type Stats struct {
	// Endpoint is the server's ws:// URL (empty before Serve).
	Endpoint string `json:"endpoint"`
	// UpgradeRequests counts requests to the WebSocket path.
	UpgradeRequests int64 `json:"upgrade_requests"`
	// Sessions counts accepted WebSockets.
	Sessions int64 `json:"sessions"`
	// Active is the number of open WebSockets: a session counts from its
	// accept until the server closes its connection (after the close
	// handshake, or when the peer went away), not until its goroutine
	// has finished. A proxy in front sees the close only once the
	// connection is closed, so a slot it frees then and hands on at once
	// is never counted twice.
	Active int64 `json:"active"`
	// PeakActive is the most WebSockets ever open at once.
	PeakActive int64 `json:"peak_active"`
	// Refused counts upgrades answered with Behavior.Refuse.
	Refused int64 `json:"refused"`
	// Messages counts messages received (each is echoed).
	Messages int64 `json:"messages"`
	// Bytes counts payload bytes received.
	Bytes int64 `json:"bytes"`
}

// Options configure a Server.
type Options struct {
	// Path is the WebSocket path. Default: "/playwright".
	Path string
	// Behavior is the initial behavior.
	Behavior Behavior
	// Exit ends the process for the crash behaviors. Default: os.Exit.
	Exit func(code int)
	// Log, when set, is told about every session's start and end.
	Log func(msg string)
}

// Server is one fake browser server.
type Server struct {
	opts Options

	mu       sync.Mutex
	behavior Behavior
	conns    map[*session]struct{}
	endpoint string
	closed   bool
	closing  chan struct{}
	http     *http.Server

	upgrades, sessions, active, peak, refused, messages, bytes atomic.Int64
	ended                                                      atomic.Int64
}

// New returns a Server; it serves nothing before Serve (or use it as an
// http.Handler).
func New(opts Options) *Server {
	if opts.Path == "" {
		opts.Path = "/playwright"
	}
	if !strings.HasPrefix(opts.Path, "/") {
		opts.Path = "/" + opts.Path
	}
	if opts.Exit == nil {
		opts.Exit = os.Exit
	}
	s := &Server{opts: opts, behavior: opts.Behavior, conns: map[*session]struct{}{}, closing: make(chan struct{})}
	s.http = &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second}
	return s
}

// Start listens on addr (host:port; port 0 picks a free one), serves in the
// background, and returns the server's ws:// endpoint.
func Start(addr string, opts Options) (*Server, string, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, "", fmt.Errorf("listening on %s: %w", addr, err)
	}
	s := New(opts)
	ep := s.setEndpoint(l.Addr())
	go s.http.Serve(l)
	return s, ep, nil
}

// Serve accepts connections on l until Close.
func (s *Server) Serve(l net.Listener) error {
	s.setEndpoint(l.Addr())
	err := s.http.Serve(l)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

func (s *Server) setEndpoint(a net.Addr) string {
	host, port, _ := net.SplitHostPort(a.String())
	if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		host = "127.0.0.1"
	}
	ep := "ws://" + net.JoinHostPort(host, port) + s.opts.Path
	s.mu.Lock()
	s.endpoint = ep
	s.mu.Unlock()
	return ep
}

// Endpoint is the ws:// URL clients dial (empty before Start or Serve).
func (s *Server) Endpoint() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.endpoint
}

// Behavior is the current behavior.
func (s *Server) Behavior() Behavior {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.behavior
}

// SetBehavior replaces the behavior for sessions that start from now on
// (and for close-after-messages and echo delays of live ones).
func (s *Server) SetBehavior(b Behavior) {
	s.mu.Lock()
	s.behavior = b
	s.mu.Unlock()
}

// Stats returns the counters.
func (s *Server) Stats() Stats {
	return Stats{
		Endpoint:        s.Endpoint(),
		UpgradeRequests: s.upgrades.Load(),
		Sessions:        s.sessions.Load(),
		Active:          s.active.Load(),
		PeakActive:      s.peak.Load(),
		Refused:         s.refused.Load(),
		Messages:        s.messages.Load(),
		Bytes:           s.bytes.Load(),
	}
}

// Close stops listening and closes every session with 1001 (going away).
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.closing)
	conns := make([]*session, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	err := s.http.Close()
	var wg sync.WaitGroup
	for _, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.closeWithin(websocket.StatusGoingAway, "fakebrowser shutting down", time.Second)
		}()
	}
	wg.Wait()
	return err
}

// ServeHTTP routes the WebSocket path, /stats, /health and /control.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case s.opts.Path:
		s.serveSession(w, r)
	case "/stats":
		writeJSON(w, http.StatusOK, s.Stats())
	case "/health":
		_, _ = w.Write([]byte("ok\n"))
	case "/control":
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", "POST")
			http.Error(w, "POST settings to /control", http.StatusMethodNotAllowed)
			return
		}
		if err := r.ParseForm(); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		s.mu.Lock()
		b, err := s.behavior.Apply(r.Form, "")
		if err == nil {
			s.behavior = b
		}
		s.mu.Unlock()
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		writeJSON(w, http.StatusOK, b)
	default:
		http.Error(w, fmt.Sprintf("fakebrowser: no such path %q (WebSocket path is %q)", r.URL.Path, s.opts.Path), http.StatusNotFound)
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func (s *Server) serveSession(w http.ResponseWriter, r *http.Request) {
	s.upgrades.Add(1)
	b, err := s.Behavior().Apply(r.URL.Query(), "fb-")
	if err != nil {
		http.Error(w, "fakebrowser: "+err.Error(), http.StatusBadRequest)
		return
	}
	if b.Hang {
		select {
		case <-r.Context().Done():
		case <-s.closing:
		}
		return
	}
	if b.AcceptDelay > 0 {
		t := time.NewTimer(b.AcceptDelay)
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
			return
		case <-s.closing:
			t.Stop()
			return
		}
	}
	if b.Refuse != 0 {
		s.refused.Add(1)
		if b.Refuse == http.StatusServiceUnavailable || b.Refuse == http.StatusTooManyRequests {
			w.Header().Set("Retry-After", "1")
		}
		http.Error(w, fmt.Sprintf("fakebrowser: refusing the upgrade with %d as configured", b.Refuse), b.Refuse)
		return
	}
	c, err := s.accept(w, r)
	if err != nil {
		return // Accept answered the client with what was wrong
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		c.closeWithin(websocket.StatusGoingAway, "fakebrowser shutting down", time.Second)
		return
	}
	s.conns[c] = struct{}{}
	s.mu.Unlock()
	n := s.sessions.Add(1)
	c.nc.closeDelay.Store(int64(b.CloseDelay))
	act := c.nc.count()
	for {
		p := s.peak.Load()
		if act <= p || s.peak.CompareAndSwap(p, act) {
			break
		}
	}
	s.logf("session %d opened from %s (active %d)", n, r.RemoteAddr, act)
	if b.CrashOnSession > 0 && n == int64(b.CrashOnSession) {
		s.logf("crashing on session %d as configured", n)
		s.opts.Exit(ExitCrash)
		return
	}
	s.echo(c, b)
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
	c.nc.uncount() // closing the connection did it already, as a rule
	ended := s.ended.Add(1)
	s.logf("session %d closed", n)
	// The setting as it is now, or as this session saw it (a query override).
	if crash := max(s.Behavior().CrashAfterSessions, b.CrashAfterSessions); crash > 0 && ended >= int64(crash) {
		s.logf("crashing after %d sessions as configured", ended)
		s.opts.Exit(ExitCrash)
	}
}

// echo serves one session until it closes.
func (s *Server) echo(c *session, b Behavior) {
	defer c.ws.Close(websocket.StatusNormalClosure, "")
	if b.CloseAfter > 0 {
		t := time.AfterFunc(b.CloseAfter, func() {
			c.closeWithin(websocket.StatusNormalClosure, "fakebrowser: closing after "+b.CloseAfter.String(), 2*time.Second)
		})
		defer t.Stop()
	}
	var (
		echoed int
		// One buffer for every message of the session: the library's Read
		// allocates each message afresh, growing from 512 bytes, which
		// costs a bulk echo about a quarter more CPU.
		buf bytes.Buffer
	)
	for {
		typ, r, err := c.ws.Reader(context.Background())
		if err != nil {
			return
		}
		buf.Reset()
		if _, err := buf.ReadFrom(r); err != nil {
			return
		}
		msg := buf.Bytes()
		s.messages.Add(1)
		s.bytes.Add(int64(len(msg)))
		if b.EchoDelay > 0 {
			t := time.NewTimer(b.EchoDelay)
			select {
			case <-t.C:
			case <-s.closing:
				t.Stop()
				return
			}
		}
		if err := c.ws.Write(context.Background(), typ, msg); err != nil {
			return
		}
		echoed++
		if b.CloseAfterMessages > 0 && echoed >= b.CloseAfterMessages {
			c.closeWithin(websocket.StatusNormalClosure, fmt.Sprintf("fakebrowser: closing after %d messages", echoed), 2*time.Second)
			return
		}
	}
}

// session is one accepted WebSocket and the connection under it.
type session struct {
	ws *websocket.Conn
	nc *sessionConn
}

// sessionConn is a session's connection. Its session stops counting as
// active (Stats.Active) in its first Close, before the socket closes: the
// peer cannot see the session end before the count does.
type sessionConn struct {
	net.Conn
	s       *Server
	counted atomic.Bool
	// closeDelay holds the first Close this long (Behavior.CloseDelay).
	closeDelay atomic.Int64
}

// count adds the session to the active count and returns the new count.
func (c *sessionConn) count() int64 {
	act := c.s.active.Add(1)
	c.counted.Store(true)
	return act
}

// uncount takes the session out of the active count, once.
func (c *sessionConn) uncount() {
	if c.counted.CompareAndSwap(true, false) {
		c.s.active.Add(-1)
	}
}

func (c *sessionConn) Close() error {
	if d := time.Duration(c.closeDelay.Swap(0)); d > 0 {
		time.Sleep(d)
	}
	c.uncount()
	return c.Conn.Close()
}

// accept upgrades the request to a WebSocket session; on failure it has
// answered the client with what was wrong.
func (s *Server) accept(w http.ResponseWriter, r *http.Request) (*session, error) {
	hw := &hijackRecorder{ResponseWriter: w, s: s}
	// A fake browser takes any Origin, as the old server did and as the
	// browser servers it stands in for do: it is a test worker behind the
	// grid, never a page's cross-origin target.
	ws, err := websocket.Accept(hw, r, &websocket.AcceptOptions{InsecureSkipVerify: true})
	if err != nil {
		return nil, err
	}
	ws.SetReadLimit(MaxMessageSize)
	return &session{ws: ws, nc: hw.nc}, nil
}

// closeWithin runs the close handshake with code and reason but drops the
// connection when the peer has not answered within d (the library alone
// would wait up to 5 s for a peer that does not read).
func (c *session) closeWithin(code websocket.StatusCode, reason string, d time.Duration) {
	if c.nc != nil {
		t := time.AfterFunc(d, func() { _ = c.nc.Close() })
		defer t.Stop()
	}
	_ = c.ws.Close(code, reason)
}

// hijackRecorder keeps the connection Accept takes over (as a
// sessionConn: the WebSocket reads, writes and closes through it), so a
// close can be bounded by closing it.
type hijackRecorder struct {
	http.ResponseWriter
	s  *Server
	nc *sessionConn
}

func (h *hijackRecorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	nc, brw, err := http.NewResponseController(h.ResponseWriter).Hijack()
	if err != nil {
		return nil, nil, err
	}
	h.nc = &sessionConn{Conn: nc, s: h.s}
	return h.nc, brw, nil
}

func (h *hijackRecorder) Unwrap() http.ResponseWriter { return h.ResponseWriter }

func (s *Server) logf(format string, args ...any) {
	if s.opts.Log != nil {
		s.opts.Log(fmt.Sprintf(format, args...))
	}
}

// Interface guards.
var (
	_ http.Handler  = (*Server)(nil)
	_ http.Hijacker = (*hijackRecorder)(nil)
)
