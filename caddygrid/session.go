package caddygrid

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/browsergrid/caddy-browser-grid/registry"
)

// Request variables the grid sets (readable as {http.vars.<name>}).
const (
	// varSession holds the *session of the request.
	varSession = "browser_grid.session"
	// varDial is the chosen worker's host:port; the upstream the
	// browser_grid source returns dials {http.vars.browser_grid.dial}.
	varDial = "browser_grid.dial"
	// varWorker is the chosen worker's ID (for logs and headers).
	varWorker = "browser_grid.worker_id"
	// varPool is the pool of the request.
	varPool = "browser_grid.pool"
)

// statusPlaceholder holds the status the worker answered the upgrade with
// (reverse_proxy sets it when an answer arrives).
const statusPlaceholder = "http.reverse_proxy.status_code"

// dialPlaceholder is the Dial of the one upstream the browser_grid source
// returns; reverse_proxy replaces it after Select has set the variable.
const dialPlaceholder = "{http.vars." + varDial + "}"

// session is one client request's claim state, shared by the browser_grid
// handler, the upstream source and the selection policy through the
// request's variables. Select may run several times for one request (once
// per retry); the session makes sure each claim ends exactly once.
type session struct {
	repl *caddy.Replacer

	mu       sync.Mutex
	pool     string
	start    time.Time // first Select
	deadline time.Time
	b        *backend // holds a reference while a claim is live
	claim    *registry.Claim
	outcome  outcome
	attempts int
	finished bool
	// retryAfter is what the Retry-After header says on 429 and 503.
	retryAfter time.Duration
	// limited says why a client over its client_limit was refused.
	limited *registry.ClientLimitError
	// waiting: refused because the client's requests already fill its
	// client_limit's places in the queue.
	waiting bool
	// refusal is the 428 answer's body (outcomeUnknownVersion).
	refusal string
	// held are the claims of earlier attempts whose worker answered the
	// upgrade with a 4xx (clientRefused). Such an answer is the client's
	// doing when every worker gives it, the worker's when another accepts
	// the same request: the claims are held, their workers avoided by the
	// retries, and ended (their workers blamed) as soon as a later attempt
	// is answered 101 (upgraded, in the browser_grid directive), otherwise
	// with the session, blamed only when a later attempt was served
	// (finish).
	held []heldClaim
	// refusedWith is the status of the last attempt held (0: none); kept
	// after finish, for the answer (outcomeRefused).
	refusedWith int
	// passed are the held claims given back, unblamed, before the retry
	// waited in the queue (giveBackHeld): their workers are still avoided,
	// and blamed (Registry.Suspect, their lease being gone) once another
	// worker accepts the request (upgraded).
	passed []heldClaim
}

// heldClaim is a claim a worker refused with status (see session.held).
type heldClaim struct {
	c      *registry.Claim
	status int
}

// hold keeps c, refused with status, until the session ends.
func (s *session) hold(c *registry.Claim, status int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.held = append(s.held, heldClaim{c: c, status: status})
	s.refusedWith = status
}

// refusedStatus is the status the last held attempt was refused with (0:
// none).
func (s *session) refusedStatus() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.refusedWith
}

// avoided returns the IDs of the workers whose claims the session holds
// (the workers a retry must not try again), and the status the last of
// them answered (0: none held).
func (s *session) avoided() ([]string, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.held) == 0 && len(s.passed) == 0 {
		return nil, 0
	}
	ids := make([]string, 0, len(s.passed)+len(s.held))
	for _, h := range s.passed {
		ids = append(ids, h.c.Worker.ID)
	}
	for _, h := range s.held {
		ids = append(ids, h.c.Worker.ID)
	}
	return ids, s.refusedWith
}

// heldCount is how many claims the session holds (see session.held).
func (s *session) heldCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.held)
}

// giveBackHeld gives back the held claims, unblamed, when the retry is
// about to wait in the queue: a worker that answered a 4xx is idle for
// everyone else, and a request every worker refuses (the client's doing)
// must not keep slots from the others for its select_timeout. Their
// workers stay avoided (avoided), and are blamed once another worker
// accepts the request (passed). It returns how many were given back.
func (s *session) giveBackHeld() int {
	s.mu.Lock()
	held, b := s.held, s.b
	if s.finished || b == nil || len(held) == 0 {
		s.mu.Unlock()
		return 0
	}
	s.held = nil
	s.passed = append(s.passed, held...)
	// a client leaving meanwhile finishes the session, dropping its
	// reference: keep one of our own while ending the claims
	b, err := b.retain()
	s.mu.Unlock()
	if err != nil {
		return 0 // the backend is gone: the held leases expire by themselves
	}
	defer b.drop()
	for _, h := range held {
		b.upgradeRefused(h.c, h.status, false)
		b.finish(h.c, false, false)
	}
	return len(held)
}

// sessionFrom returns the request's session, or nil.
func sessionFrom(r *http.Request) *session {
	s, _ := caddyhttp.GetVar(r.Context(), varSession).(*session)
	return s
}

// newSession attaches a session to the request. Its claim ends when the
// request ends at the latest: net/http cancels a request's context when
// ServeHTTP returns, also for a hijacked (upgraded) connection, and
// reverse_proxy's ServeHTTP returns only when the upgraded socket closed.
// The browser_grid handler ends it earlier, right after the proxy returns.
func newSession(r *http.Request, pool string) *session {
	repl, _ := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	s := &session{repl: repl, pool: pool}
	caddyhttp.SetVar(r.Context(), varSession, s)
	if pool != "" {
		caddyhttp.SetVar(r.Context(), varPool, pool)
	}
	// The context ends when the client leaves (net/http cancels it as soon
	// as it reads EOF or a reset) or when the request is over (the
	// browser_grid handler has then finished the session already). Either
	// way nothing here says the worker failed: a client that leaves
	// mid-upgrade must not take workers out of rotation, so only a status
	// the worker itself answered (5xx, 404) blames it.
	context.AfterFunc(r.Context(), func() { s.finish(true) })
	return s
}

// setOutcome records why the request got no worker (the first reason wins).
func (s *session) setOutcome(o outcome, retryAfter time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.outcome == outcomeNone {
		s.outcome = o
		s.retryAfter = retryAfter
	}
}

func (s *session) getOutcome() (outcome, time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.outcome, s.retryAfter
}

// takeFailed detaches the claim of a previous attempt (Select running
// again means that attempt failed: reverse_proxy retries only after a dial
// error or a refused upgrade).
func (s *session) takeFailed() (*registry.Claim, *backend) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, b := s.claim, s.b
	s.claim = nil
	return c, b
}

// heldBackend is the backend the session holds a reference on (taken by
// its first claim), or nil.
func (s *session) heldBackend() *backend {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b
}

// adopt makes c the session's live claim; the caller holds a reference
// on b for it. The session keeps that reference when it holds none yet
// (kept: the caller must not drop it). When the request already ended
// (the client left while the claim was in flight), the claim is undone at
// once and adopt reports false.
func (s *session) adopt(b *backend, c *registry.Claim) (ok, kept bool) {
	s.mu.Lock()
	if s.finished {
		s.mu.Unlock()
		b.finish(c, false, false)
		return false, false
	}
	if s.b == nil {
		s.b, kept = b, true
	}
	s.claim = c
	s.attempts++
	s.mu.Unlock()
	// The status of an earlier attempt must not be read as this one's:
	// reverse_proxy sets it only when a worker answers.
	if s.repl != nil {
		s.repl.Delete(statusPlaceholder)
	}
	return true, kept
}

// finish ends the live claim exactly once: released when the worker
// answered the upgrade with 101 (the session was served; its lifetime
// stays counted), undone otherwise. The worker is marked suspect only for
// its own failure (see blames); clientGone says the client left, so an
// attempt without an answer is not the worker's fault.
func (s *session) finish(clientGone bool) {
	s.mu.Lock()
	if s.finished {
		s.mu.Unlock()
		return
	}
	s.finished = true
	// passed claims are not blamed here: without the browser_grid
	// handler to see the 101, this is when the socket closes, which may
	// be hours after the refusal (see upgraded).
	c, b, held := s.claim, s.b, s.held
	s.claim, s.b, s.held, s.passed = nil, nil, nil, nil
	s.mu.Unlock()
	if b == nil {
		return
	}
	defer b.drop()
	status := s.upstreamStatus()
	if c == nil {
		status = 0 // the last attempt claimed nothing: no answer of its own
	}
	served := status == http.StatusSwitchingProtocols
	// A worker that refused what another then accepted refused on its
	// own side (see session.held).
	for _, h := range held {
		b.upgradeRefused(h.c, h.status, served)
		b.finish(h.c, false, served)
	}
	if c == nil {
		return
	}
	suspect := blames(status, clientGone)
	b.upgradeRefused(c, status, suspect)
	b.finish(c, served, suspect)
}

// upgraded ends the held claims as soon as the live claim's worker has
// accepted the upgrade (101): their workers refused what another accepted,
// so they are blamed now, and their slots are not kept for the whole of a
// session served elsewhere (finish would end them only when the socket
// closes). The workers of claims given back before a wait (passed) are
// marked suspect too. The Redis calls run in the background: nothing in
// the answer to the client waits for them.
func (s *session) upgraded() {
	if s.upstreamStatus() != http.StatusSwitchingProtocols {
		return
	}
	s.mu.Lock()
	if s.finished || s.claim == nil || len(s.held)+len(s.passed) == 0 || s.b == nil {
		s.mu.Unlock()
		return
	}
	held, passed, live := s.held, s.passed, s.claim.Worker.ID
	s.held, s.passed = nil, nil
	b, err := s.b.retain()
	s.mu.Unlock()
	if err != nil {
		return // the backend is gone: the held leases expire by themselves
	}
	go func() {
		defer b.drop()
		for _, h := range held {
			b.upgradeRefused(h.c, h.status, true)
			b.finish(h.c, false, true)
		}
		for _, h := range passed {
			// past MaxAvoid refusals the retry may come back to a worker
			// it passed: never blame the one serving the session
			if h.c.Worker.ID != live {
				b.blameLate(h.c, h.status)
			}
		}
	}()
}

// upgradeWriter tells the session when the proxy writes the answer to the
// client: the upgrade was accepted when the worker answered 101
// (session.upgraded). Hijack and Flush reach the server's writer through
// Unwrap.
type upgradeWriter struct {
	*caddyhttp.ResponseWriterWrapper
	s    *session
	once bool
}

func (w *upgradeWriter) WriteHeader(code int) {
	if !w.once {
		w.once = true
		w.s.upgraded()
	}
	w.ResponseWriterWrapper.WriteHeader(code)
}

// blames reports whether a failed attempt that ended with upstream status
// (0: no answer) is the worker's fault: it refused on its own side (5xx,
// 404), or it gave no answer (a refused or timed-out dial, no answer
// within upgrade_timeout) while the client was still there. A client that
// left, reset or was refused for its own request (other 4xx) blames
// nobody.
func blames(status int, clientGone bool) bool {
	if status == http.StatusSwitchingProtocols {
		return false
	}
	return workerRefused(status) || (status == 0 && !clientGone)
}

// clientRefused reports whether an upgrade answered with status was
// refused in a way that may be the client's doing: a 4xx but 404 (the
// worker's, see workerRefused) and 428 (a Playwright client whose version
// the server does not speak: its answer goes to the client as it is).
// Such an attempt is tried on another worker without blaming the first
// (see session.held).
func clientRefused(status int) bool {
	return status >= 400 && status < 500 && status != http.StatusNotFound && status != http.StatusPreconditionRequired
}

// workerRefused reports whether an upgrade answered with status failed
// because of the worker rather than the client (see retryMatchExpr): 5xx,
// 404, or an answer that is no handshake at all (1xx but 101, 2xx, 3xx:
// something else than a browser serves that address and path, and would
// answer every client the same).
func workerRefused(status int) bool {
	return status >= 500 || status == http.StatusNotFound ||
		(status > 0 && status < 400 && status != http.StatusSwitchingProtocols)
}

// upstreamStatus is the status the last upstream answered (0: none).
func (s *session) upstreamStatus() int {
	if s.repl == nil {
		return 0
	}
	v, ok := s.repl.Get(statusPlaceholder)
	if !ok {
		return 0
	}
	switch n := v.(type) {
	case int:
		return n
	case string:
		i, _ := strconv.Atoi(n)
		return i
	}
	return 0
}

// pointAt makes the upstream request go to the claimed worker: the dial
// variable, the worker's WebSocket path, and its query when it has one
// (otherwise the client's query string is kept).
func pointAt(r *http.Request, c *registry.Claim) {
	caddyhttp.SetVar(r.Context(), varDial, c.Worker.Addr)
	caddyhttp.SetVar(r.Context(), varWorker, c.Worker.ID)
	p := c.Worker.Path
	if p == "" {
		p = "/"
	}
	var q string
	hasQuery := false
	if i := strings.IndexByte(p, '?'); i >= 0 {
		p, q, hasQuery = p[:i], p[i+1:], true
	}
	if u, err := url.Parse(p); err == nil && u.Path != "" {
		r.URL.Path, r.URL.RawPath = u.Path, u.RawPath
	} else {
		r.URL.Path, r.URL.RawPath = p, ""
	}
	if hasQuery {
		r.URL.RawQuery = q
	}
}

// retryAfterSeconds renders a duration for the Retry-After header: whole
// seconds, rounded up, at least 1.
func retryAfterSeconds(d time.Duration) string {
	s := int((d + time.Second - 1) / time.Second)
	if s < 1 {
		s = 1
	}
	return strconv.Itoa(s)
}
