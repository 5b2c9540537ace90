package chaos

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/coder/websocket"
)

// outcome is one client session as the client saw it.
type outcome struct {
	// frontend is the index of the Caddy instance it went through.
	frontend int
	start    time.Time
	// opened is when the handshake and the first echo succeeded (zero
	// when the session never opened).
	opened time.Time
	end    time.Time
	// err is what the client saw go wrong (nil: served in full).
	err error
	// status is the HTTP status of a refused handshake (0 otherwise).
	status int
	// broke: the session opened, then failed before the client closed it.
	broke bool
	// cut: Caddy ended the handshake's connection, with a reset or a
	// FIN, before sending a byte (not refused, not timed out), as a
	// reload does to a few (see endedBeforeAnyByte); cutReset: with a
	// reset.
	cut, cutReset bool
	// swapCut: excused as cut by a reload's listener swap (see
	// run.swaps).
	swapCut bool
	// excused: the failure is on the component the scenario killed or
	// stalled (see scenario.excuse).
	excused bool
	hold    bool
}

// traffic runs the scenario's clients: holders keep long sessions open
// until released, churners open short sessions back to back.
type traffic struct {
	frontends []string
	// down[i] set: frontend i is out of rotation (as a load balancer's
	// health check would take a dead instance out).
	down []atomic.Bool
	rr   atomic.Uint64

	mu       sync.Mutex
	outcomes []*outcome

	handshake time.Duration
	stopChurn chan struct{}
	release   chan struct{}
	wg        sync.WaitGroup
	relOnce   sync.Once
	stopOnce  sync.Once
}

func newTraffic(frontends []string, handshake time.Duration) *traffic {
	return &traffic{
		frontends: frontends, down: make([]atomic.Bool, len(frontends)), handshake: handshake,
		stopChurn: make(chan struct{}), release: make(chan struct{}),
	}
}

// pick returns the next frontend in rotation: one draw of the shared
// counter, then the frontends from there (drawing once per frontend
// looked at would let other clients' draws in between, so a pick could
// look at a down frontend twice and miss the live one).
func (tr *traffic) pick() int {
	n := uint64(len(tr.frontends))
	from := tr.rr.Add(1)
	for k := range n {
		i := int((from + k) % n)
		if !tr.down[i].Load() {
			return i
		}
	}
	return int(from % n)
}

// pinned, when ≥ 0, sends a client through that frontend only.
func (tr *traffic) session(ctx context.Context, pinned int, hold time.Duration, holder bool, opened chan<- struct{}) *outcome {
	fe := pinned
	if fe < 0 {
		fe = tr.pick()
	}
	o := &outcome{frontend: fe, start: time.Now(), hold: holder}
	// Published once finished, so readers never see it change.
	defer func() {
		o.end = time.Now()
		tr.mu.Lock()
		tr.outcomes = append(tr.outcomes, o)
		tr.mu.Unlock()
	}()

	c, err := tr.dial(ctx, fe, o)
	if err != nil {
		o.err = fmt.Errorf("opening a session: %w", err)
		return o
	}
	defer c.CloseNow()
	upgraded := time.Now()
	if err := echo(c, "hello"); err != nil {
		// the worker took the session (101), then it broke: a worker
		// stopped between the two holds it
		o.err, o.opened, o.broke = fmt.Errorf("first echo: %w", err), upgraded, true
		return o
	}
	o.opened = time.Now()
	if opened != nil {
		opened <- struct{}{}
	}
	// Hold the session, echoing every 300 ms so that a broken one is
	// noticed when it breaks.
	var until <-chan time.Time
	if !holder {
		until = time.After(hold)
	}
	tick := time.NewTicker(300 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-until:
			return tr.closeOK(o, c)
		case <-tr.release:
			if holder {
				return tr.closeOK(o, c)
			}
		case <-tick.C:
			if err := echo(c, "ping"); err != nil {
				o.err, o.broke = fmt.Errorf("session broke after %s: %w", time.Since(o.opened).Round(time.Millisecond), err), true
				return o
			}
		}
	}
}

// dial runs the handshake through frontend fe within tr.handshake; a
// refusal's HTTP status goes to o.status.
func (tr *traffic) dial(ctx context.Context, fe int, o *outcome) (*websocket.Conn, error) {
	// The timeout bounds the handshake only: the connection outlives it.
	ctx, cancel := context.WithTimeout(ctx, tr.handshake)
	defer cancel()
	// A transport of its own, to see the connection: a refused
	// handshake's connection, kept alive in its pool, is closed when dial
	// returns (a client's next handshake opens a new one).
	var hc handshakeConn
	tp := http.DefaultTransport.(*http.Transport).Clone()
	tp.DialContext = hc.dial
	defer tp.CloseIdleConnections()
	c, resp, err := websocket.Dial(ctx, tr.frontends[fe], &websocket.DialOptions{HTTPClient: &http.Client{Transport: tp}})
	if err != nil && resp != nil && resp.StatusCode != 101 {
		o.status = resp.StatusCode
	}
	if err != nil && resp == nil && ctx.Err() == nil {
		o.cut, o.cutReset = hc.endedBeforeAnyByte()
	}
	return c, err
}

// handshakeConn keeps the handshake's TCP connection, to ask the kernel
// how it ended once the handshake failed: before the transport closes
// it (which can come before or after Dial returns), or after.
type handshakeConn struct {
	mu     sync.Mutex
	tc     *net.TCPConn
	looked bool
	ended  bool
	reset  bool
}

func (h *handshakeConn) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, network, addr)
	if errors.Is(err, syscall.ECONNRESET) {
		// The kernel completed the connection, queued it, then reset it
		// before connect returned: as endedBeforeAnyByte's reset.
		h.mu.Lock()
		h.looked, h.ended, h.reset = true, true, true
		h.mu.Unlock()
	}
	if err != nil {
		return nil, err
	}
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return c, nil
	}
	h.mu.Lock()
	h.tc, h.looked = tc, false
	h.mu.Unlock()
	return lookingConn{tc, h}, nil
}

// endedBeforeAnyByte: see the function of that name; read once, the
// first time it is asked (by the connection's Close or by dial).
func (h *handshakeConn) endedBeforeAnyByte() (ended, reset bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.looked && h.tc != nil {
		h.looked = true
		h.ended, h.reset = endedBeforeAnyByte(h.tc)
	}
	return h.ended, h.reset
}

// lookingConn reads how the connection ended before closing it.
type lookingConn struct {
	*net.TCPConn
	h *handshakeConn
}

func (c lookingConn) Close() error {
	c.h.endedBeforeAnyByte()
	return c.TCPConn.Close()
}

func (tr *traffic) closeOK(o *outcome, c *websocket.Conn) *outcome {
	if err := echo(c, "bye"); err != nil {
		o.err, o.broke = fmt.Errorf("session broke at its end: %w", err), true
		return o
	}
	closeWithin(c, 2*time.Second)
	return o
}

// closeWithin runs the close handshake, but drops the connection if the
// peer has not answered within d (the library alone waits up to 5 s).
func closeWithin(c *websocket.Conn, d time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	go c.Close(websocket.StatusNormalClosure, "")
	// The peer's answering close frame ends this read; a read that runs
	// out of time drops the connection, which ends Close as well.
	for {
		if _, _, err := c.Read(ctx); err != nil {
			return
		}
	}
}

func echo(c *websocket.Conn, msg string) error {
	// A read that runs out of time closes the connection, as a broken
	// session should be.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Write(ctx, websocket.MessageText, []byte(msg)); err != nil {
		return fmt.Errorf("writing: %w", err)
	}
	_, got, err := c.Read(ctx)
	if err != nil {
		return fmt.Errorf("reading the echo: %w", err)
	}
	if string(got) != msg {
		return fmt.Errorf("echo %q, want %q", got, msg)
	}
	return nil
}

// hold opens n long sessions (through frontend pinned, or in rotation
// when pinned < 0) and waits until all have opened or failed; they stay
// open until releaseHolders. It returns how many opened.
func (tr *traffic) hold(n, pinned int) int {
	opened := make(chan struct{}, n)
	done := make(chan struct{}, n)
	for range n {
		tr.wg.Add(1)
		go func() {
			defer tr.wg.Done()
			o := tr.session(context.Background(), pinned, 0, true, opened)
			if o.opened.IsZero() {
				done <- struct{}{}
			}
		}()
	}
	got := 0
	for range n {
		select {
		case <-opened:
			got++
		case <-done:
		}
	}
	return got
}

// churn starts n clients, each opening sessions of holdFor back to back
// until stopChurnNow. After a refusal a client waits 100 ms before trying
// again (as a client's retry loop would).
func (tr *traffic) churn(n int, holdFor time.Duration) {
	for range n {
		tr.wg.Add(1)
		go func() {
			defer tr.wg.Done()
			for {
				select {
				case <-tr.stopChurn:
					return
				default:
				}
				o := tr.session(context.Background(), -1, holdFor, false, nil)
				if o.err != nil {
					select {
					case <-tr.stopChurn:
						return
					case <-time.After(100 * time.Millisecond):
					}
				}
			}
		}()
	}
}

// stop ends the churn, releases the holders and waits for every client.
func (tr *traffic) stop() {
	tr.stopOnce.Do(func() { close(tr.stopChurn) })
	tr.relOnce.Do(func() { close(tr.release) })
	tr.wg.Wait()
}

// snapshot returns the sessions finished so far.
func (tr *traffic) snapshot() []*outcome {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return append([]*outcome(nil), tr.outcomes...)
}
