package workeragent

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"

	"github.com/browsergrid/caddy-browser-grid/registry"
)

// The front is the agent's one listener: every session's connection comes
// through it on its way to a browser, which listens on loopback only. It
// also serves /metrics, /ready and /status.

// upgradeTimeout bounds the browser's answer to a forwarded upgrade.
const upgradeTimeout = 30 * time.Second

// flagServerTimeout bounds the start of a browser server for a session's
// flags: under Caddy's default upgrade_timeout (10s), so a slow start is
// this agent's answer, not Caddy's timeout.
const flagServerTimeout = 8 * time.Second

// maxAnswerBody bounds the body of a browser's non-101 answer the agent
// passes on.
const maxAnswerBody = 64 << 10

type front struct {
	a   *Agent
	srv *http.Server
	ln  net.Listener

	// taken holds the sessions whose claim this agent took, each until
	// its claim leaves registry.TicketWindow: a claim is taken once.
	mu    sync.Mutex
	taken map[string]time.Time
}

// take reports whether t's claim is new, and remembers it.
func (f *front) take(t registry.Ticket, now time.Time) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.taken == nil {
		f.taken = map[string]time.Time{}
	}
	if _, ok := f.taken[t.Session]; ok {
		return false
	}
	if len(f.taken) >= 1024 {
		for id, until := range f.taken {
			if now.After(until) {
				delete(f.taken, id)
			}
		}
	}
	f.taken[t.Session] = t.Issued.Add(registry.TicketWindow)
	return true
}

func (f *front) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.Header.Get(registry.HeaderClaim) != "":
		f.session(w, r)
	case r.URL.Path == "/metrics":
		promhttp.HandlerFor(f.a.metrics.reg, promhttp.HandlerOpts{}).ServeHTTP(w, r)
	case r.URL.Path == "/ready":
		if f.a.ready() {
			fmt.Fprintln(w, "ready")
			return
		}
		http.Error(w, "not ready: no browser is registered and serving", http.StatusServiceUnavailable)
	case r.URL.Path == "/status":
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(f.a.status())
	default:
		http.Error(w, "this is a browser grid worker: connect through the grid's Caddy, which sends the Grid-Claim header", http.StatusBadRequest)
	}
}

// refuse answers a claim the agent will not take, in the form Caddy tells
// from a failure (503 with Grid-Refused), with the agent's counts, and
// gives the claim back in Redis.
func (f *front) refuse(w http.ResponseWriter, t registry.Ticket, wk *worker, reason string) {
	f.a.metrics.refusals.WithLabelValues(reason).Inc()
	h := w.Header()
	h.Set(registry.HeaderRefused, reason)
	h.Set("Content-Type", "text/plain; charset=utf-8")
	group := ""
	if wk != nil {
		active, served := wk.counts()
		h.Set("Grid-Active", strconv.Itoa(active))
		h.Set("Grid-Lifetime", strconv.Itoa(served))
		group = wk.rec.Group()
	}
	w.WriteHeader(http.StatusServiceUnavailable)
	fmt.Fprintf(w, "worker %s refused the session: %s\n", t.Worker, refusalText[reason])
	f.a.reports.giveBack(wk, group, t)
}

// launchRequest reads what the client asks of the browser, and says why
// the browser would not apply it ("": it would): Playwright's browser
// server, whose browser the worker's sessions share, applies no launch
// option, flag or exposeNetwork; its run-server drops the unsafe
// options; flags are Chromium's, those the claim carries (Caddy checked
// them against launch_args), and only those the grid passes. It returns
// the flags to apply.
func (f *front) launchRequest(r *http.Request, t registry.Ticket) ([]string, string) {
	launcher := f.a.cfg.Launcher
	if launcher != LauncherPlaywright && launcher != LauncherPlaywrightServer {
		if len(t.Args) > 0 {
			return nil, fmt.Sprintf("this worker's browser (launcher %s) takes no flags from a client", launcher)
		}
		return nil, ""
	}
	lr, err := registry.ReadLaunchRequest(r)
	switch {
	case err != nil:
		return nil, err.Error()
	case len(lr.Ignored) > 0:
		return nil, fmt.Sprintf("launch options %s are not applied by this worker's browser: leave them out", strings.Join(lr.Ignored, ", "))
	case len(lr.Args) > 0 && len(t.Args) == 0:
		return nil, "args are not allowed here: this route passes no flags (launch_args of the browser_grid handler)"
	case launcher == LauncherPlaywright && (len(lr.Options) > 0 || len(t.Args) > 0 || lr.ExposeNetwork != ""):
		what := lr.Names()
		if len(t.Args) > 0 {
			what = append(what, "args")
		}
		if lr.ExposeNetwork != "" {
			what = append(what, "exposeNetwork")
		}
		return nil, fmt.Sprintf("this worker's browser is shared by its sessions, so %s cannot apply to yours: connect to a pool of playwright-server workers", strings.Join(what, ", "))
	case len(t.Args) > 0 && f.a.cfg.BrowserType != "chromium":
		return nil, fmt.Sprintf("args are Chromium flags, and this worker's browser is %s", f.a.cfg.BrowserType)
	}
	for _, a := range t.Args {
		if err := registry.CheckArgName(registry.ArgName(a)); err != nil {
			return nil, "args: " + err.Error()
		}
	}
	return t.Args, ""
}

var refusalText = map[string]string{
	registry.RefusedFull:     "it holds as many sessions as it may at once",
	registry.RefusedSpent:    "it has served its max_lifetime of sessions",
	registry.RefusedDraining: "it is draining",
	registry.RefusedHeld:     "its last session waits until the browser it replaced has drained",
	registry.RefusedGone:     "no such browser runs behind this agent",
}

// session takes one session: the agent's checks, then the upgrade
// forwarded to the browser, then the relay until it ends.
func (f *front) session(w http.ResponseWriter, r *http.Request) {
	a := f.a
	now := time.Now()
	t, err := registry.ParseTicket(r.Header.Get(registry.HeaderClaim), a.secret)
	if err == nil {
		err = t.Fresh(now)
	}
	if err == nil && !f.take(t, now) {
		err = fmt.Errorf("%s header: this session's claim was taken already", registry.HeaderClaim)
	}
	if err != nil {
		// A claim that is no claim of Caddy's now: nothing to give back.
		a.metrics.refusals.WithLabelValues("bad_claim").Inc()
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	wk, held := a.find(t.Worker)
	if wk == nil {
		f.refuse(w, t, nil, registry.RefusedGone)
		return
	}
	if t.Group != wk.rec.Group() {
		// a claim made where this worker is not registered: Redis was
		// written by someone else; serving it would move a pool's clients
		a.metrics.refusals.WithLabelValues("bad_claim").Inc()
		http.Error(w, fmt.Sprintf("%s header: worker %s is of group %s, not %s", registry.HeaderClaim, t.Worker, wk.rec.Group(), t.Group), http.StatusBadRequest)
		return
	}
	args, msg := f.launchRequest(r, t)
	if msg != "" {
		// the client's doing, on every worker of this kind: told, not
		// retried elsewhere
		a.metrics.refusals.WithLabelValues("launch_options").Inc()
		http.Error(w, msg, http.StatusBadRequest)
		a.reports.giveBack(wk, wk.rec.Group(), t)
		return
	}
	adm := wk.admit(t, held)
	if adm.refused != "" {
		f.refuse(w, t, wk, adm.refused)
		return
	}
	begun := time.Now()
	if adm.last {
		a.retiring(wk, "it took its last session (max_lifetime)")
	}
	served := false
	defer func() {
		if !served {
			wk.unadmit(t.Session, adm.last)
			a.reports.giveBack(wk, wk.rec.Group(), t)
		}
	}()
	backend := wk.backend
	if len(args) > 0 {
		// a browser server of the worker's launcher whose browsers run
		// with these flags
		ctx, cancel := context.WithTimeout(r.Context(), flagServerTimeout)
		addr, release, err := wk.proc.FlagServer(ctx, args)
		cancel()
		if err != nil {
			a.log.Warn("starting a browser server with flags", zap.String("worker_id", wk.rec.ID), zap.Error(err))
			http.Error(w, "the worker could not start a browser with the session's flags", http.StatusBadGateway)
			return
		}
		defer release()
		backend = addr
	}
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		a.log.Warn("taking over the proxy's connection", zap.Error(err))
		return
	}
	defer func() {
		if !served {
			conn.Close()
		}
	}()
	bconn, err := net.DialTimeout("tcp", backend, 5*time.Second)
	if err != nil {
		a.log.Warn("dialing the browser", zap.String("worker_id", wk.rec.ID), zap.Error(err))
		writeStatus(conn, http.StatusBadGateway, "the worker's browser does not answer")
		return
	}
	// The browser reads the query as the agent checked it: re-encoded
	// from what Go parsed, so no byte Go skipped reaches Node's parser.
	u := *r.URL
	if q, err := url.ParseQuery(u.RawQuery); err == nil {
		u.RawQuery = q.Encode()
	}
	out := &http.Request{Method: http.MethodGet, URL: &u, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: r.Header.Clone(), Host: backend}
	out.Header.Del(registry.HeaderClaim)
	_ = bconn.SetDeadline(time.Now().Add(upgradeTimeout))
	if err := out.Write(bconn); err != nil {
		bconn.Close()
		writeStatus(conn, http.StatusBadGateway, "the worker's browser does not answer")
		return
	}
	br := bufio.NewReaderSize(bconn, relayBuffer)
	resp, err := http.ReadResponse(br, out)
	if err != nil {
		bconn.Close()
		writeStatus(conn, http.StatusBadGateway, "the worker's browser did not answer the upgrade")
		return
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		passAnswer(conn, resp)
		bconn.Close()
		return
	}
	_ = bconn.SetDeadline(time.Time{})
	resp.Header.Set(registry.HeaderSession, t.Session)
	var head bytes.Buffer
	head.WriteString("HTTP/1.1 101 Switching Protocols\r\n")
	_ = resp.Header.Write(&head)
	head.WriteString("\r\n")
	if _, err := conn.Write(head.Bytes()); err != nil {
		bconn.Close()
		return
	}
	served = true
	a.metrics.sessions.Inc()
	a.metrics.live.Inc()
	defer a.metrics.live.Dec()
	// What the proxy sent after its request is in brw's buffer.
	pending, _ := brw.Reader.Peek(brw.Reader.Buffered())
	proxyR := bufio.NewReaderSize(io.MultiReader(bytes.NewReader(bytes.Clone(pending)), conn), relayBuffer)
	rl := newRelay(conn, proxyR, bconn, br)
	wk.started(t.Session, rl)
	stop := make(chan struct{})
	go enforce(rl, t, stop)
	rl.run()
	close(stop)
	wk.ended(t.Session)
	why := "closed"
	if p := rl.why.Load(); p != nil {
		why = *p
	}
	a.metrics.ends.WithLabelValues(why).Inc()
	a.metrics.bytes.WithLabelValues("to_client").Add(float64(rl.toProxy.Load()))
	a.metrics.bytes.WithLabelValues("to_browser").Add(float64(rl.toBrowser.Load()))
	a.reports.ended(wk, registry.Ended{Session: t.Session, Duration: time.Since(begun)})
}

// enforce ends the session at its max_session, or once it was idle for
// its idle_timeout (no data frame either way), with a close frame that
// says which.
func enforce(rl *relay, t registry.Ticket, stop <-chan struct{}) {
	var deadline <-chan time.Time
	if t.MaxSession > 0 {
		tm := time.NewTimer(t.MaxSession)
		defer tm.Stop()
		deadline = tm.C
	}
	var tick <-chan time.Time
	if t.IdleTimeout > 0 {
		tk := time.NewTicker(min(time.Second, max(t.IdleTimeout/4, 10*time.Millisecond)))
		defer tk.Stop()
		tick = tk.C
	}
	for {
		select {
		case <-stop:
			return
		case <-deadline:
			rl.end(ClosePolicy, "max_session", fmt.Sprintf("the session reached the grid's max_session of %s", t.MaxSession))
			return
		case <-tick:
			if rl.idle() >= t.IdleTimeout {
				rl.end(ClosePolicy, "idle_timeout", fmt.Sprintf("the session was idle for the grid's idle_timeout of %s", t.IdleTimeout))
				return
			}
		}
	}
}

// writeStatus answers on a taken-over connection and closes it.
func writeStatus(conn net.Conn, code int, msg string) {
	body := msg + "\n"
	fmt.Fprintf(conn, "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
		code, http.StatusText(code), len(body), body)
	conn.Close()
}

// passAnswer passes the browser's refusal (a 428 for a client of another
// Playwright version, a 400 for bad launch options) on to the proxy, its
// body cut to maxAnswerBody, and closes the connection.
func passAnswer(conn net.Conn, resp *http.Response) {
	body, _ := io.ReadAll(io.LimitReader(resp.Body, maxAnswerBody))
	resp.Body.Close()
	resp.Body = io.NopCloser(bytes.NewReader(body))
	resp.ContentLength = int64(len(body))
	resp.TransferEncoding = nil
	resp.Header.Del("Transfer-Encoding")
	resp.Header.Set("Content-Length", strconv.Itoa(len(body)))
	resp.Close = true
	_ = conn.SetWriteDeadline(time.Now().Add(5 * time.Second))
	_ = resp.Write(conn)
	conn.Close()
}

// serve runs the front until ctx ends.
func (f *front) serve(ctx context.Context) {
	go func() {
		<-ctx.Done()
		_ = f.srv.Close()
	}()
	if err := f.srv.Serve(f.ln); err != nil && err != http.ErrServerClosed {
		f.a.log.Error("the agent's listener failed", zap.Error(err))
	}
}
