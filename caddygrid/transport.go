package caddygrid

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"go.uber.org/zap"

	"github.com/browsergrid/caddy-browser-grid/registry"
)

// The upgrade exchange, last part of the request path: the transport sends
// the claim to the worker's agent on the upgrade request and reads the
// answer. 101: the agent serves the session, and ends it in Redis when it
// closes. A refusal (503 with Grid-Refused) blames nothing; a failure
// (no answer, a 5xx, a 404, no WebSocket server) makes the worker suspect.
// Either way the claim is given back and reverse_proxy retries.

func init() {
	caddy.RegisterModule(new(Transport))
}

// Transport is reverse_proxy's transport for the grid
// (`transport browser_grid`): Caddy's HTTP transport, plus the claim.
type Transport struct {
	// DialTimeout bounds the TCP connect to an agent. Default: 3s.
	DialTimeout caddy.Duration `json:"dial_timeout,omitempty"`
	// UpgradeTimeout bounds the wait for the agent's answer to the
	// upgrade. Default: 10s.
	UpgradeTimeout caddy.Duration `json:"upgrade_timeout,omitempty"`
	// CloseDelay, when set, is reverse_proxy's stream_close_delay: after
	// a reload, the sessions of the replaced config still open a second
	// before it runs out are ended by their agents with a close frame
	// that says why. Default: 0 (Caddy closes them itself).
	CloseDelay caddy.Duration `json:"close_delay,omitempty"`

	inner  *reverseproxy.HTTPTransport
	app    *App
	logger *zap.Logger
}

// Defaults of the transport.
const (
	DefaultDialTimeout    = 3 * time.Second
	DefaultUpgradeTimeout = 10 * time.Second
)

// CaddyModule returns the Caddy module information.
func (*Transport) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.reverse_proxy.transport.browser_grid",
		New: func() caddy.Module { return new(Transport) },
	}
}

// Provision sets up the HTTP transport under it.
func (t *Transport) Provision(ctx caddy.Context) error {
	t.logger = ctx.Logger()
	if t.DialTimeout == 0 {
		t.DialTimeout = caddy.Duration(DefaultDialTimeout)
	}
	if t.UpgradeTimeout == 0 {
		t.UpgradeTimeout = caddy.Duration(DefaultUpgradeTimeout)
	}
	app, err := gridApp(ctx)
	if err != nil {
		return err
	}
	t.app = app
	t.inner = &reverseproxy.HTTPTransport{DialTimeout: t.DialTimeout, ResponseHeaderTimeout: t.UpgradeTimeout}
	return t.inner.Provision(ctx)
}

// RoundTrip sends the request's claim to its worker's agent.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	a := attemptOf(req)
	var claim *registry.Claim
	if a != nil {
		claim = a.take()
	}
	// A client's own Grid-* headers never reach the agent.
	for k := range req.Header {
		if strings.HasPrefix(strings.ToLower(k), "grid-") {
			delete(req.Header, k)
		}
	}
	if claim == nil {
		return nil, errors.New("browser_grid transport: no claim for this request (the grid policy and upstream source are needed)")
	}
	b := t.app.backend
	ticket := registry.Ticket{
		Session: claim.Session, Group: claim.Group, Worker: claim.Worker.ID, Client: a.client, Limits: a.limits().Limits,
		MaxSession: a.limits().MaxSession, IdleTimeout: a.limits().IdleTimeout, Args: a.args,
	}.Signed(t.app.dial.secret)
	req.Header.Set(registry.HeaderClaim, ticket.String())
	// The worker's WebSocket path, and the client's query unless that
	// path has one of its own.
	path, query, hasQuery := strings.Cut(claim.Worker.Path, "?")
	req.URL.Path, req.URL.RawPath = path, ""
	if hasQuery {
		req.URL.RawQuery = query
	}
	resp, err := t.inner.RoundTrip(req)
	pool := claim.Worker.Pool
	switch {
	case err != nil && req.Context().Err() != nil:
		// the client left: nothing to blame
		giveBack(b, claim, false)
		a.settle(false, false)
		a.fail(outcomeCanceled, "")
		return nil, err
	case err != nil:
		t.failed(b, a, claim, err.Error())
		return nil, reverseproxy.NewDialError(err)
	case resp.StatusCode == http.StatusSwitchingProtocols:
		started := time.Now()
		b.sessions.add(claim.Session, liveSession{pool: pool, group: claim.Group, worker: claim.Worker.ID, started: started, owner: t})
		a.connected()
		// the session's ID joins these lines to the access log's, which
		// holds it as the Grid-Session response header
		t.logger.Info("session started", zap.String("session", claim.Session), zap.String("pool", claim.Group),
			zap.String("worker_id", claim.Worker.ID), zap.String("label", a.label))
		end := func() {
			b.sessions.remove(claim.Session)
			t.logger.Info("session ended", zap.String("session", claim.Session), zap.String("pool", claim.Group),
				zap.String("worker_id", claim.Worker.ID), zap.Duration("duration", time.Since(started)))
		}
		if rwc, ok := resp.Body.(io.ReadWriteCloser); ok {
			resp.Body = &sessionBody{ReadWriteCloser: rwc, end: end}
		}
		resp.Header.Set(registry.HeaderSession, claim.Session)
		return resp, nil
	case resp.Header.Get(registry.HeaderRefused) != "":
		reason := resp.Header.Get(registry.HeaderRefused)
		resp.Body.Close()
		metrics.refusals.WithLabelValues(pool, refusalLabel(reason)).Inc()
		if reason == registry.RefusedGone {
			// the agent runs no such browser: the claim is Caddy's to
			// give back
			giveBack(b, claim, false)
		}
		// otherwise the agent gave the claim back itself
		a.settle(false, true)
		return nil, reverseproxy.NewDialError(fmt.Errorf("worker %s refused the session: %s", claim.Worker.ID, reason))
	case resp.StatusCode >= 500 || resp.StatusCode == http.StatusNotFound || resp.StatusCode < 400:
		resp.Body.Close()
		t.failed(b, a, claim, "answered the upgrade with "+resp.Status)
		return nil, reverseproxy.NewDialError(fmt.Errorf("worker %s answered the upgrade with %s", claim.Worker.ID, resp.Status))
	default:
		// The browser refused the client's request (428 for another
		// Playwright version, 400 for bad launch options): the client
		// gets the answer as it is; the agent gave the claim back.
		a.settle(false, false)
		a.passedStatus(resp.StatusCode)
		return resp, nil
	}
}

// failed gives back a claim its worker failed, the worker suspect.
func (t *Transport) failed(b *backend, a *attempt, claim *registry.Claim, why string) {
	metrics.dialFailures.WithLabelValues(claim.Worker.Pool).Inc()
	if b.firstReport("failed", claim.Group+" "+claim.Worker.ID) {
		t.logger.Warn("a worker failed the upgrade; it is skipped for a while and the session tried elsewhere",
			zap.String("pool", claim.Group), zap.String("worker_id", claim.Worker.ID), zap.String("addr", claim.Worker.Addr), zap.String("error", why))
	}
	giveBack(b, claim, true)
	a.settle(true, false)
}

// refusalLabel bounds the reason label to the agent's reasons.
func refusalLabel(r string) string {
	switch r {
	case registry.RefusedFull, registry.RefusedSpent, registry.RefusedDraining, registry.RefusedHeld, registry.RefusedGone:
		return r
	}
	return "other"
}

// sessionBody is the connection to the agent of a live session: when
// reverse_proxy closes it, the session is over for this instance.
type sessionBody struct {
	io.ReadWriteCloser
	once sync.Once
	end  func()
}

func (s *sessionBody) Close() error {
	s.once.Do(s.end)
	return s.ReadWriteCloser.Close()
}

// Cleanup runs when the config is replaced: with a CloseDelay, its
// sessions still open a second before reverse_proxy would cut them are
// ended by their agents with a close frame that says why.
func (t *Transport) Cleanup() error {
	if t.CloseDelay <= 0 || t.app == nil || t.app.backend == nil {
		return nil
	}
	b := t.app.backend
	b.retain()
	d := max(time.Duration(t.CloseDelay)-time.Second, 0)
	time.AfterFunc(d, func() {
		defer b.release()
		b.sessions.end(b, func(s liveSession) bool { return s.owner == t },
			"the grid's configuration was reloaded and this session outlasted its stream_close_delay")
	})
	return nil
}

// UnmarshalCaddyfile sets up the transport. Syntax:
//
//	transport browser_grid {
//	    dial_timeout    <duration>
//	    upgrade_timeout <duration>
//	    close_delay     <duration>
//	}
func (t *Transport) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // consume transport name
	if d.NextArg() {
		return d.ArgErr()
	}
	seen := map[string]bool{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		name := d.Val()
		if seen[name] {
			return d.Errf("%s already specified", name)
		}
		seen[name] = true
		dur, err := durationArg(d, name)
		if err != nil {
			return err
		}
		switch name {
		case "dial_timeout":
			t.DialTimeout = caddy.Duration(dur)
		case "upgrade_timeout":
			t.UpgradeTimeout = caddy.Duration(dur)
		case "close_delay":
			t.CloseDelay = caddy.Duration(dur)
		default:
			return d.Errf("unrecognized browser_grid transport option '%s'", name)
		}
	}
	return nil
}

// Interface guards.
var (
	_ caddy.Provisioner     = (*Transport)(nil)
	_ caddy.CleanerUpper    = (*Transport)(nil)
	_ http.RoundTripper     = (*Transport)(nil)
	_ caddyfile.Unmarshaler = (*Transport)(nil)
)
