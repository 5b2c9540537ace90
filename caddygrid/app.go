package caddygrid

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"go.uber.org/zap"

	"github.com/browsergrid/caddy-browser-grid/registry"
)

func init() {
	caddy.RegisterModule(new(App))
	httpcaddyfile.RegisterGlobalOption("grid", parseGlobalOption)
}

// Defaults of the grid app.
const (
	// DefaultRedis is the Redis the grid uses when none is configured.
	DefaultRedis = "redis://127.0.0.1:6379/0"
	// defaultLeaseTTL is how long a session's lease lives unless renewed.
	defaultLeaseTTL = 30 * time.Second
	// DefaultStaleThreshold is the heartbeat age past which a worker is
	// neither selected nor kept (the worker lifecycle: 30s).
	DefaultStaleThreshold = 30 * time.Second
	// DefaultReaperInterval is how often each Caddy instance's reaper runs
	// (the worker lifecycle says 300s; the registry frees expired leases on every claim
	// and heartbeat, so the reaper is the backstop, not the only healer).
	DefaultReaperInterval = 60 * time.Second
	// reaperStopWait is how long Stop waits for a reaper pass under way
	// to notice it was stopped. A pass waiting on a stalled Redis goes on
	// in the background (until its call's read timeout, or the backend's
	// close when no config uses it any more) rather than hold up a
	// reload or a shutdown: the next config's reaper already runs.
	reaperStopWait = time.Second
)

// running holds the grid apps that are started and not yet stopped, for
// the admin API (whose routes are set up before the apps of a new config
// are provisioned). The admin API answers from the one started last: a
// reload starts the new config's app before it stops the old one, and a
// reload that fails stops the new app again, which leaves the old one.
var running runningApps

// runningApps is the list of started grid apps, oldest first.
type runningApps struct {
	mu   sync.Mutex
	apps []*App
}

func (r *runningApps) add(a *App) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.apps = append(r.apps, a)
}

func (r *runningApps) remove(a *App) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.apps = slices.DeleteFunc(r.apps, func(x *App) bool { return x == a })
}

// has reports whether a is started and not yet stopped.
func (r *runningApps) has(a *App) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Contains(r.apps, a)
}

// current is the grid app of the running config, or nil.
func (r *runningApps) current() *App {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.apps) == 0 {
		return nil
	}
	return r.apps[len(r.apps)-1]
}

// App is the grid app (`grid` global option). It owns the Redis client,
// shared with every other grid app naming the same Redis through a
// caddy.UsagePool so that it survives config reloads; it renews the
// leases of this instance's live sessions, runs the reaper, and serves
// the admin routes. The browser_grid handler and the grid selection
// policies load it; a config that uses them without a `grid` option gets
// the defaults.
type App struct {
	// Redis is the URL of the grid's Redis: redis://[user:password@]host:port/db,
	// rediss:// for TLS, redis+cluster://host1:port1,host2:port2 for Redis
	// Cluster, unix:///path. Placeholders such as {env.REDIS_URL} are
	// expanded when the config loads. Default: redis://127.0.0.1:6379/0.
	Redis string `json:"redis,omitempty"`
	// Prefix of every Redis key of the grid. Default: "grid".
	Prefix string `json:"prefix,omitempty"`
	// LeaseTTL is how long a live session's lease lasts unless renewed;
	// this instance renews its leases every lease_ttl/3 (a reload that
	// lowers it renews at once, then at the new interval). When a Caddy
	// instance dies, its sessions' slots free themselves after at most
	// this long. Default: 30s.
	LeaseTTL caddy.Duration `json:"lease_ttl,omitempty"`
	// StaleThreshold is the heartbeat age past which a worker is not
	// selected and the reaper removes it. Keep it above the workers'
	// heartbeat interval. Default: 30s.
	StaleThreshold caddy.Duration `json:"stale_threshold,omitempty"`
	// ReaperInterval is how often this instance's reaper removes stale
	// workers and expired leases and fixes counters. Reapers on many
	// instances take turns per pool. Default: 60s.
	ReaperInterval caddy.Duration `json:"reaper_interval,omitempty"`
	// DisableReaper turns this instance's reaper off (another process
	// runs one). Default: false.
	DisableReaper bool `json:"disable_reaper,omitempty"`
	// MaxBatch is how many claims (or releases) of one pool this instance
	// sends to Redis in one call at most, when they arrive while one of
	// the pool's is in flight (docs/redis.md, "Busy pools"); 1 sends every
	// call alone. 1 to 256. Default: 32.
	MaxBatch int `json:"max_batch,omitempty"`
	// WorkerNetworks are the networks (CIDR, or one IP) a worker's
	// address must be in for Caddy to dial it; a record outside them is
	// refused, reported and skipped. Default: DefaultWorkerNetworks
	// (loopback and the private ranges 10.0.0.0/8, 172.16.0.0/12,
	// 192.168.0.0/16, fc00::/7; not link-local).
	WorkerNetworks []string `json:"worker_networks,omitempty"`
	// AllowUnixWorkers lets a worker advertise a unix socket
	// ("unix//path"). Default: false (TCP only).
	AllowUnixWorkers bool `json:"allow_unix_workers,omitempty"`
	// AllowWorkerHostnames lets a worker advertise a host name: Caddy
	// resolves it at every claim, dials only if every address it resolves
	// to is inside WorkerNetworks, and dials that checked IP. Default:
	// false (IP literals only; no lookup on the request path).
	AllowWorkerHostnames bool `json:"allow_worker_hostnames,omitempty"`
	// WorkerSecret, when set, makes Caddy dial only records signed with
	// it (grid-worker -worker-secret): an HMAC-SHA256 over pool, ID,
	// address, path and registration. Use a placeholder such as
	// {env.GRID_WORKER_SECRET}; it is expanded when the config loads and
	// never logged. Default: none (records are not signed).
	WorkerSecret string `json:"worker_secret,omitempty"`

	// backend is nil once Cleanup ran; read it with liveBackend. key
	// names it (Redis URL and prefix), set at Provision.
	backend *backend
	key     backendKey
	logger  *zap.Logger
	// provisioned is when this config was provisioned; limits holds when
	// each set of limits its policies claim with was first configured, and
	// prevLimits the running config's at provisioning (limits.go).
	provisioned time.Time
	// predecessor is the context of the config Caddy ran when this one was
	// provisioned (nil: none), to tell a failed config (failedAfterStart).
	predecessor context.Context
	limits      limitsClock
	prevLimits  limitsTimes
	dial        *dialPolicy

	// limitsStored is closed once this config's new limits have been
	// stored as it started (storeLimits), or given up on.
	limitsStored chan struct{}

	mu         sync.Mutex
	stopReaper context.CancelFunc
	reaperDone chan struct{}
	// stopStoring ends storeLimits' work (Stop).
	stopStoring context.CancelFunc
}

// CaddyModule returns the Caddy module information.
func (*App) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "grid",
		New: func() caddy.Module { return new(App) },
	}
}

// gridApp returns the grid app of the config being provisioned, loading
// it with the defaults when the config has no `grid` option.
func gridApp(ctx caddy.Context) (*App, error) {
	v, err := ctx.App("grid")
	if err != nil {
		return nil, fmt.Errorf("loading the grid app: %w", err)
	}
	return v.(*App), nil
}

// Provision fills the defaults, expands placeholders in the Redis URL,
// and takes a reference on the backend for that Redis (creating the
// client does no network I/O; `caddy validate` runs this too).
func (a *App) Provision(ctx caddy.Context) error {
	a.logger = ctx.Logger()
	a.provisioned = time.Now()
	a.predecessor = caddy.ActiveContext().Context
	if cur := running.current(); cur != nil {
		a.prevLimits = cur.limits.snapshot(cur.prevLimits)
	}
	if a.Redis == "" {
		a.Redis = DefaultRedis
	}
	if a.Prefix == "" {
		a.Prefix = "grid"
	}
	if a.LeaseTTL == 0 {
		a.LeaseTTL = caddy.Duration(defaultLeaseTTL)
	}
	if a.StaleThreshold == 0 {
		a.StaleThreshold = caddy.Duration(DefaultStaleThreshold)
	}
	if a.ReaperInterval == 0 {
		a.ReaperInterval = caddy.Duration(DefaultReaperInterval)
	}
	if err := a.validate(); err != nil {
		return err
	}
	dial, err := a.newDialPolicy()
	if err != nil {
		return err
	}
	a.dial = dial
	url := caddy.NewReplacer().ReplaceAll(a.Redis, "")
	if strings.TrimSpace(url) == "" {
		return fmt.Errorf("grid: redis URL %q is empty after expanding placeholders", a.Redis)
	}
	a.key = backendKey{url: url, prefix: a.Prefix}
	b, err := loadBackend(a.key, a.logger)
	if err != nil {
		return fmt.Errorf("grid: %w", err)
	}
	a.backend = b
	if err := registerMetrics(ctx.GetMetricsRegistry()); err != nil {
		return fmt.Errorf("grid: registering metrics: %w", err)
	}
	return nil
}

func (a *App) validate() error {
	if err := registry.CheckPrefix(a.Prefix); err != nil {
		return fmt.Errorf("grid: prefix: %w", err)
	}
	switch {
	case a.LeaseTTL < caddy.Duration(time.Second):
		return fmt.Errorf("grid: lease_ttl %s: must be at least 1s", time.Duration(a.LeaseTTL))
	case a.StaleThreshold < 0:
		return fmt.Errorf("grid: stale_threshold %s: must be more than 0", time.Duration(a.StaleThreshold))
	case a.ReaperInterval < 0:
		return fmt.Errorf("grid: reaper_interval %s: must be more than 0", time.Duration(a.ReaperInterval))
	case a.MaxBatch < 0 || a.MaxBatch > registry.MaxBatchCap:
		return fmt.Errorf("grid: max_batch %d: must be from 1 to %d", a.MaxBatch, registry.MaxBatchCap)
	}
	return nil
}

// Start begins the background work: the lease keeper of the backend (once
// per Redis, for as long as anything uses it) and this app's reaper.
func (a *App) Start() error {
	a.backend.configure(time.Duration(a.LeaseTTL), a.MaxBatch)
	a.backend.start()
	if !a.DisableReaper {
		a.startReaper()
	}
	running.add(a)
	a.storeLimits()
	a.logger.Info("grid started",
		zap.String("redis", a.backend.redacted),
		zap.String("prefix", a.Prefix),
		zap.Duration("lease_ttl", time.Duration(a.LeaseTTL)),
		zap.Duration("stale_threshold", time.Duration(a.StaleThreshold)),
		zap.Bool("reaper", !a.DisableReaper),
		zap.Int("max_batch", a.backend.reg.MaxBatch()))
	return nil
}

// limitsStoreWait is how long Start waits for this config's new limits to
// be stored before it goes on and lets the storing end in the background:
// with Redis answering, the reload ends with them in force; with Redis
// away, it is not held up for long.
const limitsStoreWait = 500 * time.Millisecond

// storeLimits stores, in every group of each pool a policy of this config
// names, the limits the config brings that are new (first configured at
// its provisioning), as its first claim there would (registry.
// StoreLimits). Until then every claim of the pool, whichever config it
// comes from, ran under the limits stored before: requests of the
// replaced config still waiting in the shared queue, or retrying past a
// failed dial, claimed under the old limits until the new config's first
// claim (a lowered max_concurrent or max_lifetime was exceeded for up to
// the old select_timeout). Pools named by placeholders, and groups whose
// first worker registers later, get the limits from the config's first
// claim as before. A failure is logged: the config's claims store the
// limits all the same.
func (a *App) storeLimits() {
	a.limitsStored = make(chan struct{})
	reqs := a.limits.newLimits(a.prevLimits, a.provisioned)
	if len(reqs) == 0 {
		close(a.limitsStored)
		return
	}
	b, err := a.backend.retain()
	if err != nil {
		close(a.limitsStored)
		return
	}
	// Stop ends the storing unless a successor on the same Redis and
	// prefix takes it over; a failed config's ends at once (gone).
	stopped, stop := context.WithCancel(b.ctx)
	a.mu.Lock()
	a.stopStoring = stop
	a.mu.Unlock()
	go func() {
		defer close(a.limitsStored)
		defer b.drop()
		defer stop()
		for _, req := range reqs {
			if stopped.Err() != nil || a.limits.gone.Load() {
				return
			}
			ctx, cancel := context.WithTimeout(stopped, claimCallTimeout)
			groups, err := b.limitGroups(ctx, req.Pool)
			cancel()
			for _, g := range groups {
				if err != nil || stopped.Err() != nil || a.limits.gone.Load() {
					break
				}
				r := req
				r.Pool = g
				ctx, cancel := context.WithTimeout(stopped, claimCallTimeout)
				_, _, err = b.reg.StoreLimits(ctx, r)
				cancel()
			}
			if err != nil && stopped.Err() == nil {
				metrics.redisErrors.WithLabelValues("store_limits").Inc()
				a.logger.Warn("could not store this config's new limits as it started; they apply from its first claim in the pool, and until then requests of the config it replaced claim under the old ones",
					zap.String("pool", req.Pool), zap.Error(err))
			}
		}
	}()
	select {
	case <-a.limitsStored:
	case <-time.After(limitsStoreWait):
	}
}

// Stop ends this app's reaper. Live sessions are not touched: their
// leases stay with the backend, which the next config's app (or the
// sessions themselves) keep alive.
func (a *App) Stop() error {
	running.remove(a)
	// When the app that goes is not the one a reload replaced but the new
	// one (the reload failed after starting it), the running app's
	// lease_ttl applies again.
	cur := running.current()
	if cur != nil {
		if b := cur.liveBackend(); b != nil {
			b.configure(time.Duration(cur.LeaseTTL), cur.MaxBatch)
		}
	}
	// The limits this config is storing (storeLimits) are its successor's
	// to store when the successor claims through the same Redis and
	// prefix: it took their times over, so it stores none of the limits it
	// keeps, and they must still reach Redis. Otherwise (a failed config,
	// another Redis, Caddy stopping) the storing ends here.
	handedOn := a.successor() != nil
	a.mu.Lock()
	stop, done := a.stopReaper, a.reaperDone
	a.stopReaper, a.reaperDone = nil, nil
	if a.stopStoring != nil && !handedOn {
		a.stopStoring()
	}
	a.mu.Unlock()
	if stop != nil {
		stop()
		select {
		case <-done:
		case <-time.After(reaperStopWait):
			a.logger.Warn("stopped this config's reaper, but its pass under way is still waiting on Redis; it ends in the background",
				zap.String("redis", registry.RedactURL(a.key.url)), zap.Duration("waited", reaperStopWait))
		}
	}
	return nil
}

// Cleanup gives back the app's reference on the backend. Requests of the
// replaced config may still be running (Caddy does not wait for them):
// they see no backend from then on (see liveBackend).
func (a *App) Cleanup() error {
	// A config that fails after its apps started may be cleaned up
	// without Stop: Caddy does so when the config's loader
	// (admin.config.load) fails. Stop it here, as Caddy's http app does
	// its servers, so that its reaper ends and the running config's
	// lease_ttl and max_batch apply again.
	if running.has(a) {
		_ = a.Stop()
	}
	a.mu.Lock()
	b := a.backend
	a.backend = nil
	a.mu.Unlock()
	var own *backend
	if b != nil {
		// a reference of handLimitsBack's own: the Redis this config
		// stored its limits in, whichever the running config names
		own, _ = b.retain()
		b.drop()
	}
	a.handLimitsBack(own)
	return nil
}

// handLimitsBack: when a is a config that failed after it started
// (failedAfterStart) and stored limits of its own for some pools (as it
// started, or at claims), those carry its newer configuration time and
// would stay in force over the running config's and over any older
// configuration, on every instance sharing a's Redis. They are dropped
// (registry.ForgetLimits, in the background, through own, a's backend,
// in each version group of the pools), and when the running config claims
// through the same Redis and prefix its claims for these pools replace
// what carries a's time too (limitsClock.handBack), should they come
// first. Called once the backend is gone (Cleanup), so that no claim of
// a's comes after: a request of a that claims has recorded its limits
// (configTime) before it took the backend, and once a is cleaned up it
// gets none (requestBackend), while a retry keeps the pool of its first
// try. own (nil: none) is dropped once the work is done.
func (a *App) handLimitsBack(own *backend) {
	if own != nil {
		defer own.drop()
	}
	cur := running.current()
	if !a.failedAfterStart(cur) {
		return
	}
	// before the pools are read: a claim of a's from here on is not made
	// (its queued and retried requests are answered 503), so none stores
	// a's limits again after they are dropped below
	a.limits.gone.Store(true)
	pools := a.limits.ownPools()
	if len(pools) == 0 {
		return
	}
	if cur != nil && cur.key == a.key {
		cur.limits.handBack(pools, a.provisioned)
	}
	a.logger.Warn("a config that failed after it started stored limits of its own; dropping what it stored, so that the limits of the configurations still running take over again from their next claim",
		zap.Strings("pools", pools), zap.Time("failed_config_provisioned", a.provisioned))
	if own == nil {
		return
	}
	stored := a.limitsStored
	for _, pool := range pools {
		forget := func(ctx context.Context) error {
			groups, err := own.limitGroups(ctx, pool)
			if err != nil {
				return err
			}
			if !slices.Contains(groups, pool) {
				groups = append(groups, pool)
			}
			for _, g := range groups {
				if _, err := own.reg.ForgetLimits(ctx, g, a.provisioned); err != nil {
					return err
				}
			}
			return nil
		}
		failed := func(attempts int, err error) {
			if err != nil {
				a.logger.Error("could not drop the limits a failed config stored; the running config's claims still replace them, other instances' older configurations run under them until a newer one claims",
					zap.String("pool", pool), zap.Int("attempts", attempts), zap.Error(err))
			}
		}
		own.retryInBackground("forget_limits", true, func(ctx context.Context) error {
			if stored != nil {
				// what a stores as it starts is dropped after it is stored
				select {
				case <-stored:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			return forget(ctx)
		}, func(attempts int, err error) {
			if err != nil {
				failed(attempts, err)
				return
			}
			// Once more when every claim call of a's that was on its way
			// to Redis as Caddy went back has landed or given up (each
			// gives up after claimCallTimeout): such a call stores a's
			// limits with a's time again after the first drop.
			own.retryInBackground("forget_limits", true, func(ctx context.Context) error {
				t := time.NewTimer(forgetAgainAfter)
				defer t.Stop()
				select {
				case <-t.C:
				case <-ctx.Done():
					return ctx.Err()
				}
				return forget(ctx)
			}, failed)
		})
	}
}

// forgetAgainAfter is how long after dropping a failed config's limits
// they are dropped once more (handLimitsBack): past the longest a claim
// call of that config already under way can take.
const forgetAgainAfter = claimCallTimeout + 250*time.Millisecond

// failedAfterStart reports whether a, being cleaned up, is a config that
// failed after it started, Caddy going back to the one that ran before
// it, rather than one a newer config replaced or Caddy stopping. With a
// grid app running (cur), a failed when cur is the older. With none, the
// config Caddy runs has no grid app: a failed when that is the config
// that was running when a was provisioned (a reload replacing a by a
// config without a grid app makes that one the running config instead).
func (a *App) failedAfterStart(cur *App) bool {
	if cur != nil {
		return cur != a && cur.provisioned.Before(a.provisioned)
	}
	// Caddy's contexts hold a *cancelCtx (or nothing before the first
	// config): comparable.
	return !caddy.Exiting() && caddy.ActiveContext().Context == a.predecessor
}

// successor is the grid app of the running config when it replaced a: it
// names the same Redis and prefix and was provisioned after a. nil
// otherwise (a runs, failed, or was replaced by a config on another
// Redis or without a grid app).
func (a *App) successor() *App {
	cur := running.current()
	if cur == nil || cur == a || cur.key != a.key || !cur.provisioned.After(a.provisioned) {
		return nil
	}
	return cur
}

// liveBackend is the app's backend, or nil once Cleanup ran.
func (a *App) liveBackend() *backend {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.backend
}

// requestBackend is the backend a request of this app's config claims
// through: its own, or, once Cleanup ran, the running config's when that
// names the same Redis and prefix. Caddy does not wait for a replaced
// config's requests, so one still on its way to the grid handler (behind
// an auth check, say) when a reload ends is served, not refused. Only a
// config the running one replaced (provisioned before it) falls back: a
// config whose reload failed is newer than the running one, and its
// request would bring its limits with its newer configuration time, which
// would win in Redis over the config Caddy went back to. nil when neither
// is there (the running config names another Redis, or is older).
func (a *App) requestBackend() *backend {
	if b := a.liveBackend(); b != nil {
		return b
	}
	if cur := running.current(); cur != nil && cur != a && cur.key == a.key &&
		cur.provisioned.After(a.provisioned) {
		return cur.liveBackend()
	}
	return nil
}

// Registry is the registry over the app's Redis (for the admin API and
// the 'caddy grid' command).
func (a *App) Registry() *registry.Registry { return a.backend.reg }

// parseGlobalOption sets up the grid app from the `grid` global option.
// Syntax:
//
//	grid {
//	    redis           <url>
//	    prefix          <prefix>
//	    lease_ttl       <duration>
//	    stale_threshold <duration>
//	    reaper_interval <duration>|off
//	    max_batch       <1-256>
//	    worker_networks <cidr...>
//	    allow_unix_workers
//	    allow_worker_hostnames
//	    worker_secret   <secret>
//	}
func parseGlobalOption(d *caddyfile.Dispenser, existing any) (any, error) {
	if existing != nil {
		return nil, d.Err("grid option already specified")
	}
	a := new(App)
	if err := a.UnmarshalCaddyfile(d); err != nil {
		return nil, err
	}
	return httpcaddyfile.App{Name: "grid", Value: caddyconfig.JSON(a, nil)}, nil
}

// UnmarshalCaddyfile sets up the app from Caddyfile tokens (the body of
// the `grid` global option).
func (a *App) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // consume option name
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
		if ok, err := a.unmarshalDialOption(d, name); ok {
			if err != nil {
				return err
			}
			continue
		}
		if !d.NextArg() {
			return d.ArgErr()
		}
		val := d.Val()
		if d.NextArg() {
			return d.ArgErr()
		}
		switch name {
		case "redis":
			if !strings.Contains(val, "{") && !strings.Contains(val, "://") {
				return d.Errf("invalid redis '%s': want a URL such as redis://host:6379/0", registry.RedactURL(val))
			}
			a.Redis = val
		case "prefix":
			if err := registry.CheckPrefix(val); err != nil {
				return d.Errf("invalid prefix '%s': %v", val, err)
			}
			a.Prefix = val
		case "max_batch":
			n, err := strconv.Atoi(val)
			if err != nil || n < 1 || n > registry.MaxBatchCap {
				return d.Errf("invalid max_batch '%s': want a whole number from 1 to %d", val, registry.MaxBatchCap)
			}
			a.MaxBatch = n
		case "lease_ttl", "stale_threshold", "reaper_interval":
			if name == "reaper_interval" && val == "off" {
				a.DisableReaper = true
				continue
			}
			dur, err := positiveDuration(d, name, val)
			if err != nil {
				return err
			}
			if name == "lease_ttl" && dur < time.Second {
				return d.Errf("invalid lease_ttl '%s': must be at least 1s", val)
			}
			switch name {
			case "lease_ttl":
				a.LeaseTTL = caddy.Duration(dur)
			case "stale_threshold":
				a.StaleThreshold = caddy.Duration(dur)
			default:
				a.ReaperInterval = caddy.Duration(dur)
			}
		default:
			return d.Errf("unrecognized grid option '%s'", name)
		}
	}
	return nil
}

// Interface guards
var (
	_ caddy.App             = (*App)(nil)
	_ caddy.Provisioner     = (*App)(nil)
	_ caddy.CleanerUpper    = (*App)(nil)
	_ caddyfile.Unmarshaler = (*App)(nil)
)
