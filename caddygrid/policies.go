package caddygrid

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"go.uber.org/zap"

	"github.com/browsergrid/caddy-browser-grid/registry"
	"github.com/browsergrid/caddy-browser-grid/selection"
)

// Policy names, as in lb_policy and the browser_grid policy option: rows
// of the registry's table (TestEveryTablePolicyIsAModule checks each has
// its module, in its policy_<name>.go).
const (
	policyLifetimeFirst = "lifetime_first"
	policyVnode         = "vnode"
	policyFairShare     = "fair_share"
)

// Defaults of the options every grid policy shares.
const (
	// DefaultSelectTimeout is how long a request waits for a free worker
	// (the lifetime-first rule's WORKER_SELECT_TIMEOUT).
	DefaultSelectTimeout = 5 * time.Second
	// DefaultQueueSize bounds the requests waiting per pool and instance.
	DefaultQueueSize = 100
	// maxScanLimit bounds max_scan for every policy (the vnode design's range).
	maxScanLimit = selection.MaxVnodeMaxScan
)

// ClaimOptions are the settings every grid selection policy shares. In the
// browser_grid directive they are options of the directive itself; in a
// hand-composed reverse_proxy they go in the lb_policy block.
type ClaimOptions struct {
	// MaxConcurrent caps the live sessions of one worker; a worker's own
	// registered capacity applies too (the smaller wins). 0: no cap beyond
	// the worker's own. Default: 0.
	MaxConcurrent int `json:"max_concurrent,omitempty"`
	// MaxLifetime is the number of sessions after which a worker is told
	// to drain and restart; the claim that reaches it sets the worker's
	// shutdown command. 0: workers never restart. Default: 0.
	MaxLifetime int `json:"max_lifetime,omitempty"`
	// MaxScan bounds how many unusable workers (stale heartbeat, suspect)
	// one decision walks past before it reports none, 0-256. 0: the
	// policy's default (vnode 16, lifetime_first and fair_share 64).
	MaxScan int `json:"max_scan,omitempty"`
	// SelectTimeout is how long a request waits in the pool's queue for a
	// free worker before it gets 503 with Retry-After. Default: 5s.
	SelectTimeout caddy.Duration `json:"select_timeout,omitempty"`
	// QueueSize is how many requests may wait per pool in this Caddy
	// instance; the next one gets 429 with Retry-After at once.
	// Default: 100.
	QueueSize int `json:"queue_size,omitempty"`
	// StaggerDrains keeps restarts one at a time: while a worker of the
	// pool is retiring (draining, or at max_lifetime awaiting its
	// command), no claim brings another worker to max_lifetime; that
	// worker's last session goes elsewhere or waits. Needs max_lifetime.
	// Default: on for lifetime_first, off for vnode and fair_share.
	StaggerDrains *bool `json:"stagger_drains,omitempty"`
	// ClientLimit is the most live sessions one client (ClientKey) may
	// hold in a pool, across every Caddy instance sharing the Redis; the
	// next request of that client gets 429 with Retry-After at once (503
	// in a hand-composed reverse_proxy), without waiting or claiming. A
	// session counts until its lease ends (released, or expired after a
	// crash). 0: no limit. Default: 0.
	ClientLimit int `json:"client_limit,omitempty"`
	// ClientKey names the client, a placeholder expanded per request,
	// e.g. "{http.auth.user.id}" or "{http.request.header.X-Client}".
	// Only its SHA-256 reaches Redis. A request whose key expands to ""
	// counts as its IP address. A key without a placeholder is refused
	// (every client would share one budget). Used with ClientLimit only.
	// Default: "{http.vars.client_ip}" (the client's IP address, an IPv6
	// client's /64; see DefaultClientKey).
	ClientKey string `json:"client_key,omitempty"`
	// VersionRouting sends a Playwright client (its User-Agent names its
	// version) only to workers of its major.minor, and refuses with 428 a
	// version no worker of the pool serves; clients without a version go
	// to any worker. Off: every client goes to any worker. Default: on.
	VersionRouting *bool `json:"version_routing,omitempty"`
}

// DefaultClientKey is the client key of client_limit: the client's IP
// address as Caddy determines it ({client_ip} in a Caddyfile): the
// connection's, or, from a proxy listed in the server's trusted_proxies,
// the one its forwarding header names.
const DefaultClientKey = "{http.vars.client_ip}"

// routing resolves VersionRouting with its default (on).
func (o ClaimOptions) routing() bool { return o.VersionRouting == nil || *o.VersionRouting }

// stagger resolves StaggerDrains with the policy's default.
func (o ClaimOptions) stagger(def bool) bool {
	if o.StaggerDrains != nil {
		return *o.StaggerDrains
	}
	return def
}

func (o *ClaimOptions) setDefaults() {
	if o.SelectTimeout == 0 {
		o.SelectTimeout = caddy.Duration(DefaultSelectTimeout)
	}
	if o.QueueSize == 0 {
		o.QueueSize = DefaultQueueSize
	}
	if o.ClientLimit > 0 && o.ClientKey == "" {
		o.ClientKey = DefaultClientKey
	}
}

func (o ClaimOptions) validate() error {
	switch {
	case o.MaxConcurrent < 0:
		return fmt.Errorf("max_concurrent %d: must be 0 (no cap) or more", o.MaxConcurrent)
	case o.MaxLifetime < 0:
		return fmt.Errorf("max_lifetime %d: must be 0 (no limit) or more", o.MaxLifetime)
	case o.MaxScan < 0 || o.MaxScan > maxScanLimit:
		return fmt.Errorf("max_scan %d: must be 0-%d", o.MaxScan, maxScanLimit)
	case o.SelectTimeout < 0:
		return fmt.Errorf("select_timeout %s: must be more than 0", time.Duration(o.SelectTimeout))
	case o.QueueSize < 0:
		return fmt.Errorf("queue_size %d: must be 1 or more", o.QueueSize)
	case o.ClientLimit < 0:
		return fmt.Errorf("client_limit %d: must be 1 or more", o.ClientLimit)
	case o.ClientKey != "" && o.ClientLimit == 0:
		return fmt.Errorf("client_key %q: needs client_limit", o.ClientKey)
	}
	if o.ClientKey != "" {
		if err := checkClientKeyPlaceholder(o.ClientKey); err != nil {
			return fmt.Errorf("client_key %q: %w", o.ClientKey, err)
		}
	}
	return nil
}

// checkClientKeyPlaceholder refuses a client_key without a placeholder:
// such a key is the same for every request, so all clients would share
// one budget of client_limit sessions (typically a header name written
// without its placeholder, X-User for {http.request.header.X-User}).
func checkClientKeyPlaceholder(key string) error {
	open := strings.Index(key, "{")
	if open < 0 || !strings.Contains(key[open:], "}") {
		return errors.New("no placeholder: every client would share one budget; name the client with a placeholder, e.g. {http.auth.user.id} or {http.request.header.X-User}")
	}
	return nil
}

// merge fills o's unset options from defaults (the browser_grid
// directive's own options).
func (o *ClaimOptions) merge(from ClaimOptions) {
	if o.MaxConcurrent == 0 {
		o.MaxConcurrent = from.MaxConcurrent
	}
	if o.MaxLifetime == 0 {
		o.MaxLifetime = from.MaxLifetime
	}
	if o.MaxScan == 0 {
		o.MaxScan = from.MaxScan
	}
	if o.SelectTimeout == 0 {
		o.SelectTimeout = from.SelectTimeout
	}
	if o.QueueSize == 0 {
		o.QueueSize = from.QueueSize
	}
	if o.StaggerDrains == nil {
		o.StaggerDrains = from.StaggerDrains
	}
	if o.ClientLimit == 0 {
		o.ClientLimit = from.ClientLimit
	}
	if o.ClientKey == "" {
		o.ClientKey = from.ClientKey
	}
	if o.VersionRouting == nil {
		o.VersionRouting = from.VersionRouting
	}
}

// unmarshalClaimOption parses one shared option at the dispenser's cursor.
// It reports false when the option is not a shared one.
func unmarshalClaimOption(d *caddyfile.Dispenser, o *ClaimOptions, seen map[string]bool) (bool, error) {
	name := d.Val()
	switch name {
	case "max_concurrent", "max_lifetime", "max_scan", "queue_size", "select_timeout", "stagger_drains",
		"client_limit", "client_key", "version_routing":
	default:
		return false, nil
	}
	if seen[name] {
		return true, d.Errf("%s already specified", name)
	}
	seen[name] = true
	if name == "stagger_drains" || name == "version_routing" {
		on := true
		if d.NextArg() {
			switch d.Val() {
			case "on":
			case "off":
				on = false
			default:
				return true, d.Errf("invalid %s '%s': use on or off", name, d.Val())
			}
			if d.NextArg() {
				return true, d.ArgErr()
			}
		}
		if name == "stagger_drains" {
			o.StaggerDrains = &on
		} else {
			o.VersionRouting = &on
		}
		return true, nil
	}
	if !d.NextArg() {
		return true, d.ArgErr()
	}
	val := d.Val()
	if d.NextArg() {
		return true, d.ArgErr()
	}
	if name == "client_key" {
		if strings.TrimSpace(val) == "" {
			return true, d.Err("invalid client_key '': must name the client, e.g. {http.auth.user.id}")
		}
		if err := checkClientKeyPlaceholder(val); err != nil {
			return true, d.Errf("invalid client_key '%s': %v", val, err)
		}
		o.ClientKey = val
		return true, nil
	}
	if name == "select_timeout" {
		dur, err := positiveDuration(d, name, val)
		if err != nil {
			return true, err
		}
		o.SelectTimeout = caddy.Duration(dur)
		return true, nil
	}
	n, err := strconv.Atoi(val)
	if err != nil {
		return true, d.Errf("invalid %s '%s': %v", name, val, err)
	}
	switch name {
	case "max_concurrent":
		if n < 0 {
			return true, d.Errf("invalid max_concurrent '%s': must be 0 (no cap) or more", val)
		}
		o.MaxConcurrent = n
	case "max_lifetime":
		if n < 0 {
			return true, d.Errf("invalid max_lifetime '%s': must be 0 (no limit) or more", val)
		}
		o.MaxLifetime = n
	case "max_scan":
		if n < 1 || n > maxScanLimit {
			return true, d.Errf("invalid max_scan '%s': must be 1-%d", val, maxScanLimit)
		}
		o.MaxScan = n
	case "queue_size":
		if n < 1 {
			return true, d.Errf("invalid queue_size '%s': must be 1 or more", val)
		}
		o.QueueSize = n
	case "client_limit":
		if n < 1 {
			return true, d.Errf("invalid client_limit '%s': must be a whole number, 1 or more", val)
		}
		o.ClientLimit = n
	}
	return true, nil
}

// intArg parses the one integer argument of an option within [lo, hi].
// positiveDuration parses the value val of option name as a duration
// greater than 0, with an adapt-time error naming both otherwise.
func positiveDuration(d *caddyfile.Dispenser, name, val string) (time.Duration, error) {
	dur, err := caddy.ParseDuration(val)
	if err != nil {
		return 0, d.Errf("invalid %s '%s': %v", name, val, err)
	}
	if dur <= 0 {
		return 0, d.Errf("invalid %s '%s': must be more than 0", name, val)
	}
	return dur, nil
}

func intArg(d *caddyfile.Dispenser, name string, lo, hi int) (int, error) {
	if !d.NextArg() {
		return 0, d.ArgErr()
	}
	val := d.Val()
	if d.NextArg() {
		return 0, d.ArgErr()
	}
	n, err := strconv.Atoi(val)
	if err != nil {
		return 0, d.Errf("invalid %s '%s': %v", name, val, err)
	}
	if n < lo || n > hi {
		return 0, d.Errf("invalid %s '%s': must be %d-%d", name, val, lo, hi)
	}
	return n, nil
}

// newGridPolicy returns a new module of the grid policy name: a row of the
// registry's policy table, found as Caddy finds any selection policy, by
// its module ID http.reverse_proxy.selection_policies.<name>.
func newGridPolicy(name string) (gridPolicy, error) {
	if _, ok := registry.LookupPolicy(name); !ok {
		return nil, &registry.UnknownPolicyError{Name: name}
	}
	mi, err := caddy.GetModule("http.reverse_proxy.selection_policies." + name)
	if err != nil {
		return nil, fmt.Errorf("policy %q has no Caddy module: %w", name, err)
	}
	policy, ok := mi.New().(gridPolicy)
	if !ok {
		return nil, fmt.Errorf("policy %q's module is not a grid policy", name)
	}
	return policy, nil
}

// gridPolicy is what every grid selection policy module is.
type gridPolicy interface {
	reverseproxy.Selector
	caddy.Module
	claimOptions() *ClaimOptions
	// unmarshalOwn parses the policy's own options (not the shared ones):
	// the block of the browser_grid directive's policy option.
	unmarshalOwn(d *caddyfile.Dispenser, shared bool) error
}

// policyCore is the runtime every grid policy shares: the grid app, the
// logger, and the Select that claims through Redis.
type policyCore struct {
	name     string
	app      *App
	logger   *zap.Logger
	warnOnce sync.Once
	// xffWarn: the warning that the server's client_ip can be forged
	// (forgeableClientIP) was logged.
	xffWarn sync.Once
}

// provision finds the grid app and records in it the limits this policy
// claims with (opts, and req's policy and fair-share options), so that a
// reload hands on only the times of limits the config still brings
// (limitsClock.configures).
func (c *policyCore) provision(ctx caddy.Context, name string, opts ClaimOptions, req registry.ClaimRequest) error {
	c.name = name
	c.logger = ctx.Logger()
	app, err := gridApp(ctx)
	if err != nil {
		return err
	}
	c.app = app
	c.fillLimits(&req, opts)
	app.limits.configures(req, policyPools(ctx))
	return nil
}

// policyPools returns the pools the reverse_proxy a policy is provisioned
// in may claim for (its browser_grid upstream source's pool, or the
// browsers a request may name), nil when not known. The limits a config
// records are per pool: two pools with the same limits do not keep each
// other's times (limitsClock.snapshot).
func policyPools(ctx caddy.Context) []string {
	mods := ctx.Modules()
	if len(mods) < 2 {
		return nil
	}
	h, ok := mods[len(mods)-2].(*reverseproxy.Handler)
	if !ok {
		return nil
	}
	var src *UpstreamSource
	if u, ok := h.DynamicUpstreams.(*UpstreamSource); ok {
		src = u
	} else if len(h.DynamicUpstreamsRaw) > 0 {
		var raw struct {
			Source string `json:"source"`
			UpstreamSource
		}
		if json.Unmarshal(h.DynamicUpstreamsRaw, &raw) != nil || raw.Source != "browser_grid" {
			return nil
		}
		src = &raw.UpstreamSource
	}
	if src == nil {
		return nil
	}
	return poolSpec{pool: src.Pool, browsers: src.Browsers}.allowed()
}

// setLimits fills the limits a claim of the policy name brings from its
// options (limitsKey names them).
func setLimits(req *registry.ClaimRequest, name string, opts ClaimOptions) {
	req.Limits.MaxConcurrent = opts.MaxConcurrent
	req.Limits.MaxLifetime = opts.MaxLifetime
	spec, _ := registry.LookupPolicy(name)
	req.Limits.StaggerDrains = opts.stagger(spec.StaggerByDefault) && opts.MaxLifetime > 0
}

// fillLimits sets the limits a claim of the policy brings (its options,
// and the app's stale_threshold) in req.
func (c *policyCore) fillLimits(req *registry.ClaimRequest, opts ClaimOptions) {
	setLimits(req, c.name, opts)
	req.Limits.StaleAfter = time.Duration(c.app.StaleThreshold)
	if req.Limits.MaxScan == 0 {
		req.Limits.MaxScan = opts.MaxScan
	}
	req.Vnode.Limits = req.Limits
	req.FairShare.Limits = req.Limits
	// A worker draining its last sessions holds the others' last sessions
	// back (stagger_drains) for at most half the time a request waits, so
	// a long session on it does not keep the pool from serving.
	wait := time.Duration(opts.SelectTimeout)
	if wait <= 0 {
		wait = DefaultSelectTimeout
	}
	req.DrainHold = wait / 2
}

// claimLimits sets the limits req claims with and their configuration
// time. A request of a config that a reload replaced (still waiting in the
// queue, or retrying, once the new config started) claims with the
// running config's limits for its pool, and their time, when that config
// has one set of them there: they are the operator's limits now. The new
// config stores them as it starts (App.storeLimits), but a pool may have
// none stored when such a request claims (Redis lost its data, or the
// store failed): its claim would then store the replaced limits, and the
// requests of the replaced config would claim under them until the new
// config claimed there. With several sets there, or when one of the two
// configs claims with fair_share and the other does not, the request's
// own apply.
func (c *policyCore) claimLimits(req *registry.ClaimRequest) {
	app := c.app
	if s := app.successor(); s != nil {
		// Only when both claim with fair-share options or neither does:
		// the claim then brings exactly the running config's limits, and
		// never this config's fair-share options with the running
		// config's time, nor a set of limits the running config does not
		// configure into its clock.
		if t, ok := s.limits.onlyLimits(req.Pool); ok && (t.Policy == registry.FairShare) == (req.Policy == registry.FairShare) {
			req.Limits.MaxConcurrent = t.Limits.MaxConcurrent
			req.Limits.MaxLifetime = t.Limits.MaxLifetime
			req.Limits.StaggerDrains = t.Limits.StaggerDrains
			req.FairShare.Window, req.FairShare.Median, req.FairShare.Default = t.FairShare.Window, t.FairShare.Median, t.FairShare.Default
			req.Vnode.Limits = req.Limits
			req.FairShare.Limits = req.Limits
			app = s
		}
	}
	req.ConfigTime, req.Supersedes = app.limits.configTime(limitsKey(*req), req.Pool, app.prevLimits, app.provisioned)
}

// selectWorker is Select for every grid policy: it gives back the claim
// of a failed previous attempt, claims a worker of the request's pool in
// one atomic Redis call (waiting in the pool's queue when none is free),
// points the upstream request at it, and returns the one upstream of the
// browser_grid source. nil means no worker; the session says why.
func (c *policyCore) selectWorker(upstreams reverseproxy.UpstreamPool, r *http.Request, w http.ResponseWriter,
	opts ClaimOptions, req registry.ClaimRequest, samples int,
) *reverseproxy.Upstream {
	s := sessionFrom(r)
	if s != nil {
		if o, _ := s.getOutcome(); o == outcomeBadPool {
			return nil
		}
	}
	if s == nil || len(upstreams) == 0 {
		c.warnOnce.Do(func() {
			c.logger.Error("the " + c.name + " policy works only with the browser_grid upstream source ('dynamic browser_grid <pool>'); answering 503")
		})
		if s != nil {
			s.setOutcome(outcomeNoSource, 0)
		}
		return nil
	}
	if failed, b := s.takeFailed(); failed != nil {
		// Select runs again: the previous attempt failed to dial or was
		// refused the upgrade. Give its claim back (lifetime too) and,
		// when the failure was the worker's, mark it suspect so that no
		// instance picks it right away. reverse_proxy retries a dial
		// that the client's leaving cancelled too: that blames nobody,
		// and there is nobody left to try another worker for.
		clientGone := r.Context().Err() != nil
		status := s.upstreamStatus()
		suspect := blames(status, clientGone)
		if clientGone {
			b.finish(failed, false, suspect)
			s.setOutcome(outcomeCanceled, 0)
			return nil
		}
		metrics.dialRetries.WithLabelValues(failed.Pool).Inc()
		if clientRefused(status) {
			// The client's doing if every worker answers alike, the
			// worker's if another accepts: held, and its worker avoided,
			// until the session ends (session.held). Logged once a minute
			// per worker and status: clients can send such requests at will.
			s.hold(failed, status)
			if b.firstReport("upgrade_held", failed.Pool, failed.Worker.ID+" "+strconv.Itoa(status)) {
				c.logger.Warn("worker refused the upgrade with a 4xx; trying another worker, and blaming this one if another accepts",
					zap.String("pool", failed.Pool), zap.String("worker_id", failed.Worker.ID),
					zap.String("addr", failed.Worker.Addr), zap.Int("status", status))
			}
		} else {
			b.upgradeRefused(failed, status, suspect)
			c.logger.Warn("worker failed; claim given back, trying another",
				zap.String("pool", failed.Pool), zap.String("worker_id", failed.Worker.ID),
				zap.String("addr", failed.Worker.Addr), zap.Int("status", status),
				zap.Bool("suspect", suspect))
			b.finish(failed, false, suspect)
		}
	}
	if o, _ := s.getOutcome(); o != outcomeNone {
		return nil // an earlier attempt already gave up (timeout, queue full)
	}
	if code, _ := checkHandshake(r); !isWebSocket(r) || code != 0 {
		// A hand-composed reverse_proxy (the directive answers 426 first)
		// would proxy a plain HTTP request, which a browser server answers
		// with 200 (Playwright's "Running"), or a malformed handshake,
		// which Chromium's DevTools server answers with 500 or a close:
		// answers that blame the worker for the client's request (the
		// directive answers 400 or 426 first). Nothing to claim a browser
		// for.
		s.setOutcome(outcomeNotWebSocket, 0)
		return nil
	}
	s.mu.Lock()
	pool := s.pool
	if s.start.IsZero() {
		s.start = time.Now()
		s.deadline = s.start.Add(time.Duration(opts.SelectTimeout))
	}
	deadline := s.deadline
	s.mu.Unlock()
	if pool == "" {
		s.setOutcome(outcomeBadPool, 0)
		return nil
	}
	req.Pool = pool
	c.fillLimits(&req, opts)
	// The limits are set again at each claim the request makes (backend.
	// claim): a reload may replace this config while it waits.
	own := req
	limitsNow := func(r *registry.ClaimRequest) {
		group := r.Pool
		r.Pool, r.Limits, r.Vnode, r.FairShare = own.Pool, own.Limits, own.Vnode, own.FairShare
		c.claimLimits(r)
		r.Pool = group
	}
	limitsNow(&req)
	if opts.ClientLimit > 0 {
		req.ClientKey, req.ClientLimit = clientKey(r, opts.ClientKey), opts.ClientLimit
		if opts.ClientKey == DefaultClientKey && forgeableClientIP(r) {
			c.xffWarn.Do(func() {
				c.logger.Warn("client_limit names clients by {http.vars.client_ip}, which this server takes from the left-most X-Forwarded-For entry of a trusted proxy: " +
					"a client writes that entry itself and gets a new budget per address it makes up; set trusted_proxies_strict on the server (logged once)")
			})
		}
	}
	// A retry uses the backend the session holds a reference on: the
	// config that made this policy may have been replaced and cleaned up
	// meanwhile (Caddy does not wait for its requests), which leaves its
	// app without one; a first try then takes the running config's
	// (requestBackend).
	b := s.heldBackend()
	if b == nil {
		b = c.app.requestBackend()
	}
	// The claim holds a reference of its own on the backend until the
	// session has adopted it (or given it back): a reload may clean up the
	// config the backend came from while the claim is in flight, and the
	// last reference going would close the Redis client under it, leaving
	// a lease nobody can end before lease_ttl. A first claim's session
	// keeps that reference (adopt).
	if b != nil {
		var err error
		if b, err = b.retain(); err != nil {
			b = nil
		}
	}
	if b == nil {
		s.setOutcome(outcomeStopped, time.Second)
		w.Header().Set("Retry-After", retryAfterSeconds(time.Second))
		return nil
	}
	kept := false
	defer func() {
		if !kept {
			b.drop()
		}
	}()
	// A retry after a 4xx tries the workers not tried yet. When none is
	// free it waits for one only if the pool has others (busy, suspect,
	// draining) than those it avoids: when the avoided ones are all there
	// is, waiting would only keep the client from the answer they gave,
	// most likely its own doing.
	avoid, refused := s.avoided()
	held := s.heldCount()
	if refused != 0 && req.ClientLimit > 0 {
		// The held claims are this session's own attempts, live leases
		// of its client in Redis: they must not count as the client's
		// other sessions, or a client_limit 1 would answer 429 to every
		// retry past a refusing worker.
		req.ClientLimit += held
	}
	if len(avoid) > registry.MaxAvoid {
		avoid = avoid[len(avoid)-registry.MaxAvoid:]
	}
	wait := deadline
	if refused != 0 {
		req.Avoid, deadline = avoid, time.Now()
	}
	route := &versionRoute{on: opts.routing(), client: clientVersion(r)}
	ctx := withConfig(r.Context(), &c.app.limits, limitsNow)
	claim, o, err := c.claimAllowed(ctx, b, req, route, samples, opts.QueueSize, deadline)
	if claim == nil && o == outcomeTimeout && refused != 0 {
		var nw *registry.NoWorkerError
		if errors.As(err, &nw) && nw.Registered > len(avoid) && time.Now().Before(wait) {
			// others may free up: wait in the queue as any claim does,
			// without keeping the slots of the workers that refused
			if n := s.giveBackHeld(); n > 0 && req.ClientLimit > 0 {
				req.ClientLimit -= n
			}
			claim, o, err = c.claimAllowed(ctx, b, req, route, samples, opts.QueueSize, wait)
		}
		if claim == nil && o == outcomeTimeout {
			// no other worker to try: the client gets the answer it got
			s.setOutcome(outcomeRefused, 0)
			return nil
		}
	}
	if o == outcomeUnknownVersion {
		s.refuse(route.refusal)
	}
	if claim == nil {
		retry := time.Duration(opts.SelectTimeout)
		if o == outcomeRedis || o == outcomeStopped {
			retry = time.Second
		}
		s.setOutcome(o, retry)
		if o == outcomeClientLimited {
			s.setLimited(err)
		}
		if o == outcomeQueueFull || o == outcomeTimeout || o == outcomeRedis || o == outcomeClientLimited || o == outcomeStopped {
			w.Header().Set("Retry-After", retryAfterSeconds(retry))
		}
		return nil
	}
	var adopted bool
	if adopted, kept = s.adopt(b, claim); !adopted {
		return nil
	}
	pointAt(r, claim)
	return upstreams[0]
}

// unmarshalPolicyBlock walks a policy's block. With shared (the policy
// parsed as lb_policy) the options every grid policy has are parsed into
// o; without (inside browser_grid, which parses those itself) only the
// ones alsoShared names are. Every other option goes to own, once: a
// repeated option is an error.
func unmarshalPolicyBlock(d *caddyfile.Dispenser, o *ClaimOptions, shared bool, alsoShared func(name string) bool, own func(name string) error) error {
	seen := map[string]bool{}
	keyAt := checkClientKey(d)
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		name := d.Val()
		if shared {
			keyAt.see(d)
		}
		if shared || (alsoShared != nil && alsoShared(name)) {
			if ok, err := unmarshalClaimOption(d, o, seen); ok {
				if err != nil {
					return err
				}
				continue
			}
		}
		if seen[name] {
			return d.Errf("%s already specified", name)
		}
		seen[name] = true
		if err := own(name); err != nil {
			return err
		}
	}
	return keyAt.check(*o)
}
