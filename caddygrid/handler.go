package caddygrid

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/headers"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/browsergrid/caddy-browser-grid/registry"
)

func init() {
	caddy.RegisterModule(Handler{})
	httpcaddyfile.RegisterHandlerDirective("browser_grid", parseCaddyfile)
	httpcaddyfile.RegisterDirectiveOrder("browser_grid", httpcaddyfile.Before, "reverse_proxy")
}

// Defaults of the browser_grid handler.
const (
	// DefaultDialRetries is how many other workers a session tries after a
	// dial or upgrade failure.
	DefaultDialRetries = 2
	// DefaultUpgradeTimeout is how long a worker may take to answer the
	// WebSocket upgrade.
	DefaultUpgradeTimeout = 10 * time.Second
	// DefaultStreamCloseDelay is how long live sessions of a replaced
	// config keep running after a reload, when max_session is not set.
	DefaultStreamCloseDelay = time.Hour
	// dialTimeout bounds the TCP connect to a worker.
	dialTimeout = 3 * time.Second
	// retryMatchExpr makes every answer to the upgrade but 101 and 428 a
	// retryable response for reverse_proxy, so the session moves to
	// another worker instead of failing; dial errors are always retried,
	// and a transport error (no status at all, e.g. no answer within
	// upgrade_timeout) matches the first clause. One refused on the
	// worker's side (5xx; 404: the worker does not serve that path; an
	// answer below 400 but 101: no WebSocket server there) blames the
	// worker at once (workerRefused). Another 4xx may be the client's
	// doing (the handler refuses malformed handshakes before, but a
	// browser may refuse an Origin, a token, launch options) or the
	// worker's (a broken or hostile server refusing every client): the
	// worker is avoided, and blamed only when another accepts the same
	// request (session.held). 428 (a Playwright client whose version the
	// server does not speak) goes back to the client at once: its body
	// says which version to use.
	retryMatchExpr = "type({http.reverse_proxy.status_code}) != int || ({http.reverse_proxy.status_code} != 101 && {http.reverse_proxy.status_code} != 428)"
)

// Handler is the browser_grid HTTP handler: the one-line form of the grid.
// It answers what is not a WebSocket upgrade with 426 and an unknown pool
// with 400, then runs Caddy's own reverse_proxy, which it configures
// itself: the browser_grid upstream source, the chosen grid policy (one
// atomic select-and-claim in Redis), dial_retries retries that also cover
// a refused upgrade, the worker's own Host, max_session as the stream
// timeout, and a stream_close_delay so a config reload does not cut live
// sessions. When no worker was claimed it answers 429 (queue full, or the
// client holds its client_limit of live sessions) or 503
// (none free within select_timeout, or Redis unreachable) with
// Retry-After. The claim is released when the socket closes.
type Handler struct {
	// Pool names the pool of workers; placeholders are expanded per
	// request, e.g. "{http.request.uri.query.browser}". Default: the
	// ?browser= query parameter, else the last path segment
	// (wss://host/playwright/chromium → chromium).
	Pool string `json:"pool,omitempty"`
	// Browsers lists the pools a request may name when the pool comes
	// from the request; another name gets 400. Default: chromium, firefox,
	// webkit (or just Pool when it is a fixed name).
	Browsers []string `json:"browsers,omitempty"`
	// PolicyRaw is the grid selection policy, with its own options: a
	// policy of the registry's table (lifetime_first, vnode, fair_share,
	// interleaved_weighted_round_robin; docs/policies.md). Default:
	// lifetime_first.
	PolicyRaw json.RawMessage `json:"policy,omitempty" caddy:"namespace=http.reverse_proxy.selection_policies inline_key=policy"`

	// ClaimOptions (max_concurrent, max_lifetime, select_timeout,
	// queue_size, stagger_drains) apply to the policy unless its own
	// block sets them.
	ClaimOptions

	// MaxSession is the longest a session may live; the socket is closed
	// then. 0: no limit. Default: 0.
	MaxSession caddy.Duration `json:"max_session,omitempty"`
	// DialRetries is how many other workers a session tries after the
	// chosen one could not be dialed or refused the upgrade; each failed
	// claim is given back (lifetime too) and the worker is skipped for
	// 5s. Default: 2.
	DialRetries *int `json:"dial_retries,omitempty"`
	// UpgradeTimeout is how long a worker may take to answer the
	// WebSocket upgrade before the attempt counts as failed. Default: 10s.
	UpgradeTimeout caddy.Duration `json:"upgrade_timeout,omitempty"`
	// StreamCloseDelay is how long the live sessions of a replaced config
	// keep running after a reload before they are closed (each one's
	// claim is released then, exactly once). Default: max_session, or 1h
	// when max_session is 0.
	StreamCloseDelay caddy.Duration `json:"stream_close_delay,omitempty"`

	spec          poolSpec
	policyName    string
	selectTimeout time.Duration
	proxy         *reverseproxy.Handler
	logger        *zap.Logger
}

// CaddyModule returns the Caddy module information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.browser_grid",
		New: func() caddy.Module { return new(Handler) },
	}
}

// Provision fills the defaults and provisions the inner reverse_proxy.
func (h *Handler) Provision(ctx caddy.Context) error {
	h.logger = ctx.Logger()
	h.spec = poolSpec{pool: h.Pool, browsers: h.Browsers}
	if h.DialRetries == nil {
		n := DefaultDialRetries
		h.DialRetries = &n
	}
	if h.UpgradeTimeout == 0 {
		h.UpgradeTimeout = caddy.Duration(DefaultUpgradeTimeout)
	}
	if h.StreamCloseDelay == 0 {
		h.StreamCloseDelay = h.MaxSession
		if h.StreamCloseDelay == 0 {
			h.StreamCloseDelay = caddy.Duration(DefaultStreamCloseDelay)
		}
	}
	if err := h.Validate(); err != nil {
		return err
	}
	policy, err := h.loadPolicy()
	if err != nil {
		return err
	}
	h.selectTimeout = time.Duration(policy.claimOptions().SelectTimeout)
	if h.selectTimeout == 0 {
		h.selectTimeout = DefaultSelectTimeout
	}

	upstreams := &UpstreamSource{Pool: h.Pool, Browsers: h.Browsers}
	transport := &reverseproxy.HTTPTransport{
		DialTimeout:           caddy.Duration(dialTimeout),
		ResponseHeaderTimeout: h.UpgradeTimeout,
	}
	inner := reverseproxy.Handler{
		TransportRaw:        caddyconfig.JSONModuleObject(transport, "protocol", "http", nil),
		DynamicUpstreamsRaw: caddyconfig.JSONModuleObject(upstreams, "source", "browser_grid", nil),
		LoadBalancing: &reverseproxy.LoadBalancing{
			SelectionPolicyRaw: caddyconfig.JSONModuleObject(policy, "policy", h.policyName, nil),
			Retries:            *h.DialRetries,
			RetryMatchRaw: caddyhttp.RawMatcherSets{
				caddy.ModuleMap{"expression": caddyconfig.JSON(retryMatchExpr, nil)},
			},
		},
		// Browsers' debugging endpoints accept only an IP or localhost
		// as Host (DNS rebinding protection), so send the worker's own.
		Headers: &headers.Handler{Request: &headers.HeaderOps{
			Set: http.Header{"Host": []string{"{http.reverse_proxy.upstream.hostport}"}},
		}},
		StreamTimeout:    h.MaxSession,
		StreamCloseDelay: h.StreamCloseDelay,
	}
	raw, err := json.Marshal(inner)
	if err != nil {
		return fmt.Errorf("browser_grid: encoding the reverse_proxy config: %w", err)
	}
	mod, err := ctx.LoadModuleByID("http.handlers.reverse_proxy", raw)
	if err != nil {
		return fmt.Errorf("browser_grid: loading reverse_proxy: %w", err)
	}
	h.proxy = mod.(*reverseproxy.Handler)
	return nil
}

// loadPolicy decodes the configured policy (lifetime_first by default)
// and gives it the handler's shared options it does not set itself.
func (h *Handler) loadPolicy() (gridPolicy, error) {
	name := policyLifetimeFirst
	var fields map[string]json.RawMessage
	if len(h.PolicyRaw) > 0 {
		if err := json.Unmarshal(h.PolicyRaw, &fields); err != nil {
			return nil, fmt.Errorf("browser_grid: decoding policy: %w", err)
		}
		if v, ok := fields["policy"]; ok {
			if err := json.Unmarshal(v, &name); err != nil {
				return nil, fmt.Errorf("browser_grid: decoding policy name: %w", err)
			}
			delete(fields, "policy")
		}
	}
	policy, err := newGridPolicy(name)
	if err != nil {
		return nil, fmt.Errorf("browser_grid: %w", err)
	}
	if len(fields) > 0 {
		rest, _ := json.Marshal(fields)
		dec := json.NewDecoder(bytes.NewReader(rest))
		dec.DisallowUnknownFields()
		if err := dec.Decode(policy); err != nil {
			return nil, fmt.Errorf("browser_grid: policy %s: %w", name, err)
		}
	}
	policy.claimOptions().merge(h.ClaimOptions)
	h.policyName = name
	return policy, nil
}

// Validate checks the handler's own options (the policy checks its own
// when the inner reverse_proxy provisions it).
func (h *Handler) Validate() error {
	if err := h.spec.validate(); err != nil {
		return fmt.Errorf("browser_grid: %w", err)
	}
	if err := h.ClaimOptions.validate(); err != nil {
		return fmt.Errorf("browser_grid: %w", err)
	}
	switch {
	case h.DialRetries != nil && (*h.DialRetries < 0 || *h.DialRetries > 10):
		return fmt.Errorf("browser_grid: dial_retries %d: must be 0-10", *h.DialRetries)
	case h.MaxSession < 0:
		return fmt.Errorf("browser_grid: max_session %s: must be 0 (no limit) or more", time.Duration(h.MaxSession))
	case h.UpgradeTimeout < 0:
		return fmt.Errorf("browser_grid: upgrade_timeout %s: must be more than 0", time.Duration(h.UpgradeTimeout))
	case h.StreamCloseDelay < 0:
		return fmt.Errorf("browser_grid: stream_close_delay %s: must be 0 or more", time.Duration(h.StreamCloseDelay))
	}
	return nil
}

// ServeHTTP checks the request, proxies it to a claimed worker, and
// releases the claim when the socket closes.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	if !isWebSocket(r) {
		w.Header().Set("Upgrade", "websocket")
		w.Header().Set("Connection", "Upgrade")
		return h.reject(w, r, http.StatusUpgradeRequired, "",
			"this endpoint serves browser sessions over WebSocket only: connect with a WebSocket client, e.g. Playwright's connect()")
	}
	if r.ProtoMajor == 1 && (r.ContentLength != 0 || len(r.TransferEncoding) > 0) {
		// A WebSocket handshake has no body (RFC 6455 4.1). One that
		// comes with a body the client may never finish would fail the
		// upgrade on the client's side: refuse it before claiming.
		return h.reject(w, r, http.StatusBadRequest, "",
			"a WebSocket upgrade request must not have a body")
	}
	pool, err := h.spec.resolve(r)
	if err != nil {
		return h.reject(w, r, http.StatusBadRequest, "", err.Error())
	}
	// The check changes the headers as reverse_proxy would (so that what
	// is checked is what is sent), on a copy: the request Caddy's
	// placeholders read (client_key, the access log) keeps what the client
	// sent, a header it named in Connection included. Else a client naming
	// the header client_key is built from (one forward_auth set) was
	// counted by its address instead: a budget per address.
	r = r.Clone(r.Context())
	if code, msg := checkHandshake(r); code != 0 {
		if code == http.StatusUpgradeRequired {
			w.Header().Set("Sec-WebSocket-Version", "13")
		}
		return h.reject(w, r, code, "", msg)
	}
	s := newSession(r, pool)
	uw := &upgradeWriter{ResponseWriterWrapper: &caddyhttp.ResponseWriterWrapper{ResponseWriter: w}, s: s}
	proxyErr := h.proxy.ServeHTTP(uw, r, next)
	// The socket is closed (or the session never started): end the claim
	// now. A cancelled request context means the client went away.
	s.finish(r.Context().Err() != nil)

	o, retry := s.getOutcome()
	switch o {
	case outcomeQueueFull:
		w.Header().Set("Retry-After", retryAfterSeconds(retry))
		return h.reject(w, r, http.StatusTooManyRequests, pool,
			fmt.Sprintf("too many clients waiting for a %s browser; retry later", pool))
	case outcomeTimeout:
		w.Header().Set("Retry-After", retryAfterSeconds(retry))
		return h.reject(w, r, http.StatusServiceUnavailable, pool,
			fmt.Sprintf("no %s browser became free within %s; retry later", pool, h.selectTimeout))
	case outcomeRedis:
		w.Header().Set("Retry-After", retryAfterSeconds(retry))
		return h.reject(w, r, http.StatusServiceUnavailable, pool,
			"the grid's registry is unreachable; retry later")
	case outcomeStopped:
		w.Header().Set("Retry-After", retryAfterSeconds(retry))
		return h.reject(w, r, http.StatusServiceUnavailable, pool,
			"the grid's configuration was replaced while this request waited; retry")
	case outcomeClientLimited:
		w.Header().Set("Retry-After", retryAfterSeconds(retry))
		return h.reject(w, r, http.StatusTooManyRequests, pool, s.limitedMessage())
	case outcomeNoSource:
		return h.reject(w, r, http.StatusServiceUnavailable, pool, "the grid is misconfigured")
	case outcomeUnknownVersion:
		return h.reject(w, r, http.StatusPreconditionRequired, pool, s.refusalMessage())
	case outcomeRefused:
		status := s.refusedStatus()
		if status == 0 {
			status = http.StatusBadRequest
		}
		return h.reject(w, r, status, pool,
			fmt.Sprintf("the %s browsers tried refused this WebSocket upgrade with %d; check the request", pool, status))
	case outcomeCanceled:
		// The client left while waiting; 499 for the access log, as
		// reverse_proxy records a client that went away.
		w.WriteHeader(499)
		return nil
	}
	var he caddyhttp.HandlerError
	if !uw.once && errors.As(proxyErr, &he) && he.StatusCode < 400 {
		// Every worker tried answered with another status than 101
		// below 400 (something else than a browser serves that address,
		// each blamed): no handshake, and not the client's doing. Caddy
		// would answer that status with an empty body (a 200 the client
		// cannot tell from success).
		return h.reject(w, r, http.StatusBadGateway, pool,
			fmt.Sprintf("the %s browsers tried did not answer the WebSocket upgrade; retry later", pool))
	}
	return proxyErr
}

// reject answers the request itself with a one-line plain-text reason.
func (h *Handler) reject(w http.ResponseWriter, r *http.Request, code int, pool, msg string) error {
	metrics.rejections.WithLabelValues(pool, strconv.Itoa(code)).Inc()
	if c := h.logger.Check(zapcore.DebugLevel, "request rejected"); c != nil {
		c.Write(zap.Int("status", code), zap.String("pool", pool), zap.String("reason", msg),
			zap.String("remote_addr", r.RemoteAddr))
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	_, _ = w.Write([]byte(msg + "\n")) // a client that is gone needs no answer
	return nil
}

// isWebSocket reports whether r opens a WebSocket: an HTTP/1.1 Upgrade,
// or an HTTP/2 or HTTP/3 extended CONNECT (RFC 8441, RFC 9220).
func isWebSocket(r *http.Request) bool {
	if r.Method == http.MethodConnect {
		return (r.ProtoMajor == 2 && r.Header.Get(":protocol") == "websocket") ||
			(r.ProtoMajor == 3 && r.Proto == "websocket")
	}
	return r.Method == http.MethodGet &&
		headerHasToken(r.Header, "Connection", "upgrade") &&
		headerHasToken(r.Header, "Upgrade", "websocket")
}

// checkHandshake checks what of a WebSocket handshake the worker will
// read, and returns the status (400, or 426 for a version other than 13)
// and reason when it is malformed, 0 when it is fine. A browser's
// DevTools server answers 500 to a handshake without Sec-WebSocket-Key or
// Version 13, closes the connection on a Sec-WebSocket-Extensions header
// it cannot parse, and answers a plain GET (200) when the Upgrade it is
// sent is not websocket: each would blame the worker for the client's
// handshake, so such a request is refused before any worker is claimed.
//
// For HTTP/1 it first does what reverse_proxy would do to the headers,
// so that what is checked is what is sent: the headers Connection names
// are dropped (hop-by-hop, a Sec-WebSocket-Key too), and Connection and
// Upgrade become one "Upgrade" and one "websocket" (reverse_proxy
// forwards only the first of several Upgrade values).
//
// Names are matched in any case: reverse_proxy stores the Sec-WebSocket
// headers in RFC 6455's casing, not Go's canonical one, before a retry
// runs Select again.
func checkHandshake(r *http.Request) (int, string) {
	if r.ProtoMajor == 1 {
		for _, v := range headerValues(r.Header, "Connection") {
			for _, name := range strings.Split(v, ",") {
				if name = strings.TrimSpace(name); name != "" && !strings.EqualFold(name, "upgrade") {
					deleteHeader(r.Header, name)
				}
			}
		}
		deleteHeader(r.Header, "Connection")
		deleteHeader(r.Header, "Upgrade")
		r.Header["Connection"] = []string{"Upgrade"}
		r.Header["Upgrade"] = []string{"websocket"}
		keys := headerValues(r.Header, "Sec-WebSocket-Key")
		if len(keys) != 1 {
			return http.StatusBadRequest, "a WebSocket handshake needs one Sec-WebSocket-Key header"
		}
		if k, err := base64.StdEncoding.DecodeString(strings.TrimSpace(keys[0])); err != nil || len(k) != 16 {
			return http.StatusBadRequest, "Sec-WebSocket-Key must be 16 bytes in base64"
		}
	}
	if v := headerValues(r.Header, "Sec-WebSocket-Version"); len(v) != 1 || strings.TrimSpace(v[0]) != "13" {
		return http.StatusUpgradeRequired, "a WebSocket handshake needs one Sec-WebSocket-Version: 13 header"
	}
	for _, v := range headerValues(r.Header, "Sec-WebSocket-Extensions") {
		if !validExtensions(v) {
			return http.StatusBadRequest, "Sec-WebSocket-Extensions does not parse (RFC 6455 9.1)"
		}
	}
	return 0, ""
}

// headerValues returns the values of the header name, whatever the case
// of its key in h.
func headerValues(h http.Header, name string) []string {
	var out []string
	for k, v := range h {
		if strings.EqualFold(k, name) {
			out = append(out, v...)
		}
	}
	return out
}

// deleteHeader deletes the header name, whatever the case of its key in h.
func deleteHeader(h http.Header, name string) {
	for k := range h {
		if strings.EqualFold(k, name) {
			delete(h, k)
		}
	}
}

// validExtensions reports whether v is an extension list of RFC 6455
// 9.1: one or more "token *(; token [= token | quoted-string])",
// separated by commas, where a quoted value unquoted is a token too.
func validExtensions(v string) bool {
	for _, ext := range strings.Split(v, ",") {
		params := strings.Split(ext, ";")
		if !isToken(strings.Trim(params[0], " \t")) {
			return false
		}
		for _, p := range params[1:] {
			name, val, hasVal := strings.Cut(p, "=")
			if !isToken(strings.Trim(name, " \t")) {
				return false
			}
			if !hasVal {
				continue
			}
			val = strings.Trim(val, " \t")
			if len(val) >= 2 && val[0] == '"' && val[len(val)-1] == '"' {
				var b strings.Builder
				for i := 1; i < len(val)-1; i++ {
					switch c := val[i]; {
					case c == '\\' && i+1 < len(val)-1:
						i++
						b.WriteByte(val[i])
					case c == '\\' || c == '"':
						return false
					default:
						b.WriteByte(c)
					}
				}
				val = b.String()
			}
			if !isToken(val) {
				return false
			}
		}
	}
	return true
}

// isToken reports whether s is an HTTP token (RFC 9110 5.6.2).
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// headerHasToken reports whether a comma-separated header holds token
// (case-insensitively).
func headerHasToken(h http.Header, name, token string) bool {
	for _, v := range h.Values(name) {
		for _, t := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}

// parseCaddyfile sets up the handler from the browser_grid directive.
func parseCaddyfile(helper httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	h := new(Handler)
	err := h.UnmarshalCaddyfile(helper.Dispenser)
	return h, err
}

// UnmarshalCaddyfile sets up the handler from Caddyfile tokens. Syntax:
//
//	browser_grid [<pool>] {
//	    policy lifetime_first
//	    policy vnode {
//	        virtual_nodes <1-64>
//	        samples       <1-8>
//	        max_scan      <1-256>
//	        slot_jitter   <0-64>
//	    }
//	    policy fair_share {
//	        window           <1-1000>
//	        median
//	        default_estimate <duration>
//	    }
//	    policy interleaved_weighted_round_robin
//	    browsers           <pool...>
//	    max_concurrent     <n>
//	    max_lifetime       <n>
//	    select_timeout     <duration>
//	    queue_size         <n>
//	    stagger_drains     [on|off]
//	    client_limit       <n>
//	    client_key         <placeholder>
//	    version_routing    [on|off]
//	    max_session        <duration>
//	    dial_retries       <0-10>
//	    upgrade_timeout    <duration>
//	    stream_close_delay <duration>
//	}
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // consume directive name
	if d.NextArg() {
		h.Pool = d.Val()
		if d.NextArg() {
			return d.ArgErr()
		}
		if !strings.Contains(h.Pool, "{") && !validPoolName(h.Pool) {
			return d.Errf("invalid pool name '%s': use 1-%d letters, digits, '-', '_' or '.'", h.Pool, maxPoolName)
		}
	}
	seen := map[string]bool{}
	keyAt := checkClientKey(d)
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		name := d.Val()
		if name == "max_scan" {
			return d.Err("max_scan is an option of the vnode policy: policy vnode { max_scan <n> }")
		}
		keyAt.see(d)
		if ok, err := unmarshalClaimOption(d, &h.ClaimOptions, seen); ok {
			if err != nil {
				return err
			}
			continue
		}
		if seen[name] {
			return d.Errf("%s already specified", name)
		}
		seen[name] = true
		switch name {
		case "policy":
			if !d.NextArg() {
				return d.ArgErr()
			}
			pname := d.Val()
			policy, err := newGridPolicy(pname)
			if err != nil {
				return d.Errf("unrecognized policy '%s': use %s", pname, registry.PolicyNames())
			}
			if d.NextArg() {
				return d.ArgErr()
			}
			if err := policy.unmarshalOwn(d, false); err != nil {
				return err
			}
			h.PolicyRaw = caddyconfig.JSONModuleObject(policy, "policy", pname, nil)
		case "browsers":
			h.Browsers = d.RemainingArgs()
			if len(h.Browsers) == 0 {
				return d.ArgErr()
			}
			for _, b := range h.Browsers {
				if !validPoolName(b) {
					return d.Errf("invalid browsers pool name '%s': use 1-%d letters, digits, '-', '_' or '.'", b, maxPoolName)
				}
			}
			if h.Pool != "" && !strings.Contains(h.Pool, "{") && !slices.Contains(h.Browsers, h.Pool) {
				return d.Errf("pool '%s' is not in browsers %v", h.Pool, h.Browsers)
			}
		case "dial_retries":
			n, err := intArg(d, name, 0, 10)
			if err != nil {
				return err
			}
			h.DialRetries = &n
		case "max_session", "upgrade_timeout", "stream_close_delay":
			if !d.NextArg() {
				return d.ArgErr()
			}
			val := d.Val()
			if d.NextArg() {
				return d.ArgErr()
			}
			dur, err := positiveDuration(d, name, val)
			if err != nil {
				return err
			}
			switch name {
			case "max_session":
				h.MaxSession = caddy.Duration(dur)
			case "upgrade_timeout":
				h.UpgradeTimeout = caddy.Duration(dur)
			default:
				h.StreamCloseDelay = caddy.Duration(dur)
			}
		default:
			return d.Errf("unrecognized subdirective '%s'", name)
		}
	}
	return keyAt.check(h.ClaimOptions)
}

// Interface guards
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddy.Validator             = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
	_ caddyfile.Unmarshaler       = (*Handler)(nil)
)
