package caddygrid

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math"
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
	// DefaultDialRetries is how many other workers a session tries after
	// a worker failed it.
	DefaultDialRetries = 2
	// DefaultStreamCloseDelay is how long live sessions of a replaced
	// config go on after a reload, without max_session.
	DefaultStreamCloseDelay = time.Hour
	// maxRetryAfter bounds the Retry-After estimate (seconds).
	maxRetryAfter = 600
)

// Handler is the browser_grid handler, the request path's front: it
// answers what is no WebSocket upgrade with 426 and a pool it does not
// serve with 400, then runs Caddy's own reverse_proxy, which it sets up
// with the grid's upstream source, policy and transport. When no worker
// takes the session it answers 428 (a Playwright version no worker
// serves), 429 (queue full, client at its client_limit), 502 (every
// worker tried failed) or 503 (none free within select_timeout, Redis
// unreachable) with one sentence a Playwright user reads in their error.
type Handler struct {
	// Pool names the pool; placeholders are expanded per request.
	// Default: the ?browser= query parameter, else the last path segment.
	Pool string `json:"pool,omitempty"`
	// Browsers lists the pools a request may name when the pool comes
	// from the request. Default: chromium, firefox, webkit (or just Pool).
	Browsers []string `json:"browsers,omitempty"`
	// PolicyRaw is the selection policy with its options. Default:
	// lifetime_first.
	PolicyRaw json.RawMessage `json:"policy,omitempty" caddy:"namespace=http.reverse_proxy.selection_policies inline_key=policy"`
	// DialRetries is how many other workers a session tries after a worker
	// failed it (an agent's refusal does not count), 0-10. Default: 2.
	DialRetries *int `json:"dial_retries,omitempty"`
	// UpgradeTimeout is how long a worker may take to answer the upgrade.
	// Default: 10s.
	UpgradeTimeout caddy.Duration `json:"upgrade_timeout,omitempty"`
	// StreamCloseDelay is how long the live sessions of a replaced config
	// go on after a reload; a second before it runs out, their agents end
	// them with a close frame that says so. Default: max_session, or 1h.
	StreamCloseDelay caddy.Duration `json:"stream_close_delay,omitempty"`
	// LaunchOptions are the Playwright launch options a client may set
	// for its session's browser (playwright-server workers apply them):
	// of channel, headless (false), proxy, slowMo; ["none"]: none.
	// Default: proxy, slowMo.
	LaunchOptions []string `json:"launch_options,omitempty"`
	// LaunchArgs are the Chromium flags a client's args may hold, by name
	// (--accept-lang allows --accept-lang=de); playwright-server workers
	// apply them.
	// Only flags of registry.PassableArgs can be listed. Default: none.
	LaunchArgs []string `json:"launch_args,omitempty"`
	// ExposeNetwork is whether a client may use Playwright's
	// exposeNetwork, which sends its browser's matching traffic back
	// through the client: "on", "off", or the patterns a client may ask
	// for, comma-separated. Default: on.
	ExposeNetwork string `json:"expose_network,omitempty"`

	spec          poolSpec
	proxy         *reverseproxy.Handler
	selectTimeout time.Duration
	logger        *zap.Logger
}

// CaddyModule returns the Caddy module information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "http.handlers.browser_grid", New: func() caddy.Module { return new(Handler) }}
}

// Provision fills the defaults and provisions the reverse_proxy it runs.
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
	if len(h.PolicyRaw) == 0 {
		h.PolicyRaw = json.RawMessage(`{"policy":"lifetime_first"}`)
	}
	var shared ClaimOptions
	if err := json.Unmarshal(h.PolicyRaw, &shared); err != nil {
		return fmt.Errorf("browser_grid: decoding the policy: %w", err)
	}
	if h.StreamCloseDelay == 0 {
		h.StreamCloseDelay = shared.MaxSession
		if h.StreamCloseDelay == 0 {
			h.StreamCloseDelay = caddy.Duration(DefaultStreamCloseDelay)
		}
	}
	h.selectTimeout = time.Duration(shared.SelectTimeout)
	if h.selectTimeout == 0 {
		h.selectTimeout = DefaultSelectTimeout
	}
	if err := h.Validate(); err != nil {
		return err
	}
	transport := &Transport{UpgradeTimeout: h.UpgradeTimeout, CloseDelay: h.StreamCloseDelay}
	var stream caddy.Duration
	if shared.MaxSession > 0 {
		// the agent closes at max_session with a close frame; this only
		// backs it up
		stream = shared.MaxSession + caddy.Duration(10*time.Second)
	}
	inner := reverseproxy.Handler{
		TransportRaw:        caddyconfig.JSONModuleObject(transport, "protocol", "browser_grid", nil),
		DynamicUpstreamsRaw: caddyconfig.JSONModuleObject(&UpstreamSource{Pool: h.Pool, Browsers: h.Browsers}, "source", "browser_grid", nil),
		LoadBalancing: &reverseproxy.LoadBalancing{
			SelectionPolicyRaw: h.PolicyRaw,
			// failures are bounded by dial_retries, refusals by
			// maxRefusals: the policy stops before this
			Retries: *h.DialRetries + maxRefusals + 1,
		},
		StreamTimeout:    stream,
		StreamCloseDelay: h.StreamCloseDelay,
	}
	raw, err := json.Marshal(inner)
	if err != nil {
		return fmt.Errorf("browser_grid: encoding the reverse_proxy config: %w", err)
	}
	mod, err := ctx.LoadModuleByID("http.handlers.reverse_proxy", raw)
	if err != nil {
		return fmt.Errorf("browser_grid: %w", err)
	}
	h.proxy = mod.(*reverseproxy.Handler)
	if p, ok := h.proxy.LoadBalancing.SelectionPolicy.(interface{ claimerOf() *claimer }); ok {
		p.claimerOf().app.addRoute(h.spec.allowed(), p.claimerOf())
	}
	return nil
}

// Validate checks the handler's own options (the policy checks its own).
func (h *Handler) Validate() error {
	if err := h.spec.validate(); err != nil {
		return fmt.Errorf("browser_grid: %w", err)
	}
	switch {
	case h.DialRetries != nil && (*h.DialRetries < 0 || *h.DialRetries > 10):
		return fmt.Errorf("browser_grid: dial_retries %d: must be 0-10", *h.DialRetries)
	case h.UpgradeTimeout < 0:
		return fmt.Errorf("browser_grid: upgrade_timeout %s: must be more than 0", time.Duration(h.UpgradeTimeout))
	case h.StreamCloseDelay < 0:
		return fmt.Errorf("browser_grid: stream_close_delay %s: must be 0 or more", time.Duration(h.StreamCloseDelay))
	}
	for _, o := range h.LaunchOptions {
		if o != "none" && !slices.Contains(registry.AppliedOptions, o) {
			return fmt.Errorf("browser_grid: launch_options %q: not an option Playwright's server applies (%s)", o, strings.Join(registry.AppliedOptions, ", "))
		}
	}
	for _, a := range h.LaunchArgs {
		if err := registry.CheckArgName(a); err != nil {
			return fmt.Errorf("browser_grid: launch_args: %w", err)
		}
	}
	return nil
}

// DefaultLaunchOptions are the launch options a client may set without
// launch_options.
var DefaultLaunchOptions = []string{"proxy", "slowMo"}

// checkLaunch refuses, with 400 and why, launch options and an
// exposeNetwork pattern this route does not allow; it returns the flags
// the session's claim carries.
func (h *Handler) checkLaunch(r *http.Request) ([]string, string) {
	lr, err := registry.ReadLaunchRequest(r)
	if err != nil {
		return nil, err.Error()
	}
	if len(lr.Ignored) > 0 {
		return nil, fmt.Sprintf("launch options %s are not applied by this grid's browsers: Playwright's server drops them in its safe mode; leave them out",
			strings.Join(lr.Ignored, ", "))
	}
	allowed := h.LaunchOptions
	if len(allowed) == 0 {
		allowed = DefaultLaunchOptions
	}
	for _, name := range lr.Names() {
		if !slices.Contains(allowed, name) {
			return nil, fmt.Sprintf("the launch option %s is not allowed here (launch_options): this grid allows %s", name, allowedList(allowed))
		}
	}
	for _, a := range lr.Args {
		if name := registry.ArgName(a); !slices.Contains(h.LaunchArgs, name) {
			return nil, fmt.Sprintf("the browser flag %s in args is not allowed here (launch_args): this grid allows %s", name, allowedList(h.LaunchArgs))
		}
	}
	if lr.ExposeNetwork == "" {
		return lr.Args, ""
	}
	switch h.ExposeNetwork {
	case "", "on":
		return lr.Args, ""
	case "off":
		return nil, "exposeNetwork is off on this grid (expose_network)"
	}
	ok := strings.Split(h.ExposeNetwork, ",")
	for _, p := range strings.Split(lr.ExposeNetwork, ",") {
		if !slices.Contains(ok, strings.TrimSpace(p)) {
			return nil, fmt.Sprintf("exposeNetwork %q is not allowed here: this grid allows %s", strings.TrimSpace(p), h.ExposeNetwork)
		}
	}
	return lr.Args, ""
}

func allowedList(names []string) string {
	if len(names) == 0 || names[0] == "none" {
		return "none"
	}
	return strings.Join(names, ", ")
}

// ServeHTTP checks the request, proxies it to a claimed worker, and
// answers itself when no worker takes it.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	if kind, base := discoveryOf(r); kind != notDiscovery {
		// The endpoint's pool must be one this route serves.
		u := *r.URL
		u.Path, u.RawPath = base, ""
		r2 := r.Clone(r.Context())
		r2.URL = &u
		if _, err := h.spec.resolve(r2); err != nil {
			return h.reject(w, r, http.StatusBadRequest, "", err.Error())
		}
		return h.discover(w, r, kind, base)
	}
	if !isWebSocket(r) {
		if r.ProtoMajor == 1 {
			// Upgrade and Connection are HTTP/1 only: in an HTTP/2 or
			// HTTP/3 answer they are malformed (RFC 9113 8.2.2), and
			// curl and browsers reset the stream instead of showing
			// the sentence.
			w.Header().Set("Upgrade", "websocket")
			w.Header().Set("Connection", "Upgrade")
		}
		return h.reject(w, r, http.StatusUpgradeRequired, "",
			"this endpoint serves browser sessions over WebSocket only: connect with a WebSocket client, e.g. Playwright's connect()")
	}
	if r.ProtoMajor == 1 && (r.ContentLength != 0 || len(r.TransferEncoding) > 0) {
		return h.reject(w, r, http.StatusBadRequest, "", "a WebSocket upgrade request must not have a body")
	}
	pool, err := h.spec.resolve(r)
	if err != nil {
		return h.reject(w, r, http.StatusBadRequest, "", err.Error())
	}
	// The check changes the headers as reverse_proxy would, on a copy:
	// what Caddy's placeholders read (client_key, the access log) keeps
	// what the client sent.
	r = r.Clone(r.Context())
	if code, msg := checkHandshake(r); code != 0 {
		if code == http.StatusUpgradeRequired {
			w.Header().Set("Sec-WebSocket-Version", "13")
		}
		return h.reject(w, r, code, "", msg)
	}
	args, msg := h.checkLaunch(r)
	if msg != "" {
		return h.reject(w, r, http.StatusBadRequest, pool, msg)
	}
	a := newAttempt(r, pool, *h.DialRetries)
	a.args = args
	proxyErr := h.proxy.ServeHTTP(w, r, next)
	a.mu.Lock()
	if a.claim != nil && !a.sent {
		// claimed, but reverse_proxy never sent it
		stale := *a.claim
		a.mu.Unlock()
		giveBack(currentBackend(), &stale, false)
		a.settle(false, false)
	} else {
		a.mu.Unlock()
	}
	o, msg := a.result()
	a.mu.Lock()
	served, passed := a.served, a.passed
	a.mu.Unlock()
	if served || passed != 0 {
		return proxyErr
	}
	retry := strconv.Itoa(max(1, int(h.selectTimeout/time.Second)))
	a.mu.Lock()
	pos := a.queuePos
	a.mu.Unlock()
	if b := currentBackend(); b != nil {
		if d, ok := b.queue(pool).retryAfter(pos); ok {
			// when the pool's queue, served at its recent rate, reaches a
			// request at this place
			retry = strconv.Itoa(min(maxRetryAfter, max(1, int(math.Ceil(d.Seconds())))))
		}
	}
	switch o {
	case outcomeQueueFull:
		w.Header().Set("Retry-After", retry)
		return h.reject(w, r, http.StatusTooManyRequests, pool, fmt.Sprintf("too many clients wait for a %s browser; retry later", pool))
	case outcomeClientLimited:
		w.Header().Set("Retry-After", strconv.Itoa(max(1, int(h.selectTimeout/time.Second))))
		return h.reject(w, r, http.StatusTooManyRequests, pool, msg)
	case outcomeTimeout:
		w.Header().Set("Retry-After", retry)
		return h.reject(w, r, http.StatusServiceUnavailable, pool, fmt.Sprintf("no %s browser became free within %s; retry later", pool, h.selectTimeout))
	case outcomeRedis:
		w.Header().Set("Retry-After", "1")
		return h.reject(w, r, http.StatusServiceUnavailable, pool, "the grid's registry is unreachable; retry later")
	case outcomeUnknownVersion:
		return h.reject(w, r, http.StatusPreconditionRequired, pool, msg)
	case outcomeFailed:
		return h.reject(w, r, http.StatusBadGateway, pool, msg)
	case outcomeMisconfigured:
		return h.reject(w, r, http.StatusServiceUnavailable, pool, msg)
	case outcomeCanceled:
		w.WriteHeader(499) // the client left; for the access log
		return nil
	}
	return proxyErr
}

// currentBackend is the running config's backend.
func currentBackend() *backend {
	if a := currentApp(); a != nil {
		return a.backend
	}
	return nil
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
//	    policy <lifetime_first|vnode|fair_share|interleaved_weighted_round_robin>
//	    browsers           <pool...>
//	    dial_retries       <0-10>
//	    upgrade_timeout    <duration>
//	    stream_close_delay <duration>
//	    launch_options     <none|channel headless proxy slowMo...>
//	    launch_args        <--flag...>
//	    expose_network     <on|off|pattern...>
//	    # and every option of the policy (see Policy.UnmarshalCaddyfile):
//	    max_concurrent <n>
//	    max_lifetime   <n>
//	    ...
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
	policy := registry.LifetimeFirst
	var opts policyBlock
	seen := map[string]bool{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		name := d.Val()
		if ok, err := opts.parse(d); err != nil {
			return err
		} else if ok {
			continue
		}
		if seen[name] {
			return d.Errf("%s already specified", name)
		}
		seen[name] = true
		switch name {
		case "policy":
			v, err := oneArg(d)
			if err != nil {
				return err
			}
			if d.NextBlock(d.Nesting()) {
				return d.Err("policy takes no block: put the policy's options (samples, window, …) in the browser_grid block itself")
			}
			if !slices.Contains(registry.Policies(), registry.Policy(v)) {
				return d.Errf("unrecognized policy '%s': use one of %v", v, registry.Policies())
			}
			policy = registry.Policy(v)
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
		case "launch_options":
			h.LaunchOptions = d.RemainingArgs()
			if len(h.LaunchOptions) == 0 {
				return d.ArgErr()
			}
			for _, o := range h.LaunchOptions {
				if o == "none" && len(h.LaunchOptions) > 1 || o != "none" && !slices.Contains(registry.AppliedOptions, o) {
					return d.Errf("invalid launch_options '%s': use none, or some of %s", o, strings.Join(registry.AppliedOptions, ", "))
				}
			}
		case "launch_args":
			h.LaunchArgs = d.RemainingArgs()
			if len(h.LaunchArgs) == 0 {
				return d.ArgErr()
			}
			for _, a := range h.LaunchArgs {
				if err := registry.CheckArgName(a); err != nil {
					return d.Errf("invalid launch_args: %v", err)
				}
			}
		case "expose_network":
			args := d.RemainingArgs()
			if len(args) == 0 {
				return d.ArgErr()
			}
			for _, a := range args {
				if (a == "on" || a == "off") && len(args) > 1 || strings.ContainsAny(a, ", ") {
					return d.Errf("invalid expose_network '%s': use on, off, or the patterns a client may ask for", a)
				}
			}
			h.ExposeNetwork = strings.Join(args, ",")
		case "upgrade_timeout", "stream_close_delay":
			dur, err := durationArg(d, name)
			if err != nil {
				return err
			}
			if name == "upgrade_timeout" {
				h.UpgradeTimeout = caddy.Duration(dur)
			} else {
				h.StreamCloseDelay = caddy.Duration(dur)
			}
		default:
			return d.Errf("unrecognized subdirective '%s'", name)
		}
	}
	mod, err := caddy.GetModule("http.reverse_proxy.selection_policies." + string(policy))
	if err != nil {
		return d.Errf("policy %s: %v", policy, err)
	}
	if err := opts.check(mod.New().(interface{ kind() policyKind }).kind()); err != nil {
		return err
	}
	h.PolicyRaw = caddyconfig.JSONModuleObject(struct {
		ClaimOptions
		PolicyOptions
	}{opts.ClaimOptions, opts.PolicyOptions}, "policy", string(policy), nil)
	return nil
}

// Interface guards.
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddy.Validator             = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
	_ caddyfile.Unmarshaler       = (*Handler)(nil)
)
