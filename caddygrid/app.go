// Package caddygrid holds the Caddy modules of Browser Grid: the grid app,
// the browser_grid handler, the selection policies, the upstream source
// and transport, the admin API, the metrics, the grid page, the Caddyfile
// directive and global option, and the 'caddy grid' subcommand.
//
// One claim reads top to bottom in four files: handler.go (the front
// checks and the answers), policy.go (Select), claim.go (the claimer:
// version routing, the queue, the registry call) and transport.go (the
// upgrade exchange with the agent).
package caddygrid

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"go.uber.org/zap"

	"github.com/browsergrid/caddy-browser-grid/reaper"
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
	// DefaultStaleThreshold is the heartbeat age past which a worker is
	// skipped and removed (the worker lifecycle: 30s).
	DefaultStaleThreshold = 30 * time.Second
	// DefaultReaperInterval is how often each instance removes stale
	// workers.
	DefaultReaperInterval = 60 * time.Second
)

// running lists the grid apps started and not stopped, oldest first, for
// the admin API and the grid page (their routes are set up before a new
// config's apps): they answer from the one started last.
var running struct {
	mu   sync.Mutex
	apps []*App
}

func currentApp() *App {
	running.mu.Lock()
	defer running.mu.Unlock()
	if len(running.apps) == 0 {
		return nil
	}
	return running.apps[len(running.apps)-1]
}

// App is the grid app (the `grid` global option): the Redis the grid
// shares with every other Caddy instance, the dial policy, and this
// instance's reaper. The browser_grid handler, the policies and the
// transport load it; a config without a `grid` option gets the defaults.
type App struct {
	// Redis is the grid's Redis: redis://[user:password@]host:port/db,
	// rediss:// (TLS), redis+cluster://h1:p1,h2:p2,
	// redis+sentinel://master@h1:p1,h2:p2/db, unix:///path. Placeholders
	// such as {env.REDIS_URL} are expanded when the config loads.
	// Default: redis://127.0.0.1:6379/0.
	Redis string `json:"redis,omitempty"`
	// Prefix starts every Redis key of the grid; it must match the
	// agents'. Default: "grid".
	Prefix string `json:"prefix,omitempty"`
	// StaleThreshold is the heartbeat age past which a worker is not
	// selected and the reaper removes it. Keep it above the agents'
	// heartbeat interval. Default: 30s.
	StaleThreshold caddy.Duration `json:"stale_threshold,omitempty"`
	// ReaperInterval is how often this instance removes stale workers.
	// Default: 60s.
	ReaperInterval caddy.Duration `json:"reaper_interval,omitempty"`
	// DisableReaper turns this instance's reaper off. Default: false.
	DisableReaper bool `json:"disable_reaper,omitempty"`
	// WorkerNetworks are the networks (CIDR, or one IP) a worker's
	// address must be in for Caddy to dial it. Default:
	// DefaultWorkerNetworks (loopback and the private ranges).
	WorkerNetworks []string `json:"worker_networks,omitempty"`
	// AllowWorkerHostnames lets a worker advertise a host name: Caddy
	// resolves it at each claim and dials it only if every address is
	// inside WorkerNetworks. Default: false (IP literals only).
	AllowWorkerHostnames bool `json:"allow_worker_hostnames,omitempty"`
	// WorkerSecret, when set, makes Caddy dial only worker records signed
	// with it and sign every claim it sends an agent (grid-worker
	// -worker-secret). Use a placeholder such as {env.GRID_WORKER_SECRET};
	// never logged. Default: none.
	WorkerSecret string `json:"worker_secret,omitempty"`

	backend *backend
	dial    *dialPolicy
	logger  *zap.Logger

	mu         sync.Mutex
	stopReaper func()
	// routes are what this config's browser_grid handlers bring to each
	// pool they name, for views.
	routes map[string]*claimer
}

// addRoute records the policy and limits a handler claims with in pools.
func (a *App) addRoute(pools []string, c *claimer) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.routes == nil {
		a.routes = map[string]*claimer{}
	}
	for _, p := range pools {
		if _, ok := a.routes[p]; !ok {
			a.routes[p] = c
		}
	}
}

// route is the claimer this config uses for pool; lifetime_first without
// limits when none names it.
func (a *App) route(pool string) *claimer {
	a.mu.Lock()
	defer a.mu.Unlock()
	if c, ok := a.routes[pool]; ok {
		return c
	}
	return &claimer{app: a, policy: registry.LifetimeFirst}
}

// configured is what this config brings to pool, nil when it names none.
func (a *App) configured(pool string) *Configured {
	a.mu.Lock()
	c, ok := a.routes[pool]
	a.mu.Unlock()
	if !ok {
		return nil
	}
	out := &Configured{
		Policy: string(c.policy), MaxConcurrent: c.limits.MaxConcurrent, MaxLifetime: c.limits.MaxLifetime,
		StaggerDrains: c.limits.StaggerDrains, ClientLimit: c.claim.ClientLimit,
		SelectTimeout: time.Duration(c.claim.SelectTimeout).String(), VersionRouting: c.claim.routing(),
	}
	if c.limits.MaxSession > 0 {
		out.MaxSession = c.limits.MaxSession.String()
	}
	if c.limits.IdleTimeout > 0 {
		out.IdleTimeout = c.limits.IdleTimeout.String()
	}
	return out
}

// CaddyModule returns the Caddy module information.
func (*App) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "grid", New: func() caddy.Module { return new(App) }}
}

// gridApp returns the grid app of the config being provisioned.
func gridApp(ctx caddy.Context) (*App, error) {
	v, err := ctx.App("grid")
	if err != nil {
		return nil, fmt.Errorf("loading the grid app: %w", err)
	}
	return v.(*App), nil
}

// Provision fills the defaults and takes a reference on the backend of
// its Redis (no network I/O: `caddy validate` runs this too).
func (a *App) Provision(ctx caddy.Context) error {
	a.logger = ctx.Logger()
	if a.Redis == "" {
		a.Redis = DefaultRedis
	}
	if a.Prefix == "" {
		a.Prefix = registry.DefaultPrefix
	}
	if a.StaleThreshold == 0 {
		a.StaleThreshold = caddy.Duration(DefaultStaleThreshold)
	}
	if a.ReaperInterval == 0 {
		a.ReaperInterval = caddy.Duration(DefaultReaperInterval)
	}
	if err := a.Validate(); err != nil {
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
	b, err := loadBackend(backendKey{url: url, prefix: a.Prefix}, a.logger)
	if err != nil {
		return fmt.Errorf("grid: %w", err)
	}
	a.backend = b
	return registerMetrics(ctx.GetMetricsRegistry())
}

// Validate checks the options.
func (a *App) Validate() error {
	if err := registry.CheckPrefix(a.Prefix); err != nil {
		return fmt.Errorf("grid: prefix: %w", err)
	}
	switch {
	case a.StaleThreshold < 0:
		return fmt.Errorf("grid: stale_threshold %s: must be more than 0", time.Duration(a.StaleThreshold))
	case a.ReaperInterval < 0:
		return fmt.Errorf("grid: reaper_interval %s: must be more than 0", time.Duration(a.ReaperInterval))
	}
	_, err := parseWorkerNetworks(a.WorkerNetworks)
	return err
}

// Start begins this instance's reaper.
func (a *App) Start() error {
	a.backend.start()
	if !a.DisableReaper {
		a.mu.Lock()
		a.stopReaper = reaper.Start(a.backend.reg, reaper.Options{
			Interval: time.Duration(a.ReaperInterval), StaleAfter: time.Duration(a.StaleThreshold),
			Kick: a.backend.kicks, Log: a.logger.Named("reaper"),
		})
		a.mu.Unlock()
	}
	running.mu.Lock()
	running.apps = append(running.apps, a)
	running.mu.Unlock()
	a.logger.Info("grid started", zap.String("redis", a.backend.redacted), zap.String("prefix", a.Prefix),
		zap.String("instance", a.backend.instance), zap.Duration("stale_threshold", time.Duration(a.StaleThreshold)),
		zap.Bool("reaper", !a.DisableReaper))
	return nil
}

// Stop ends the reaper. When Caddy exits, this instance's live sessions
// are ended by their agents with a close frame that says so; on a reload
// they go on (reverse_proxy's stream_close_delay).
func (a *App) Stop() error {
	running.mu.Lock()
	running.apps = slices.DeleteFunc(running.apps, func(x *App) bool { return x == a })
	running.mu.Unlock()
	a.mu.Lock()
	stop := a.stopReaper
	a.stopReaper = nil
	a.mu.Unlock()
	if stop != nil {
		stop()
	}
	if caddy.Exiting() {
		a.backend.sessions.endAll(a.backend, "Caddy is shutting down")
	}
	return nil
}

// Cleanup gives back the reference on the backend.
func (a *App) Cleanup() error {
	if a.backend != nil {
		a.backend.release()
	}
	return nil
}

// parseGlobalOption parses the `grid` global option. Syntax:
//
//	grid {
//	    redis                  <url>
//	    prefix                 <prefix>
//	    stale_threshold        <duration>
//	    reaper_interval        <duration>
//	    disable_reaper
//	    worker_networks        <cidr...>
//	    allow_worker_hostnames
//	    worker_secret          <secret>
//	}
func parseGlobalOption(d *caddyfile.Dispenser, _ any) (any, error) {
	a := new(App)
	if err := a.UnmarshalCaddyfile(d); err != nil {
		return nil, err
	}
	return httpcaddyfile.App{Name: "grid", Value: caddyconfig.JSON(a, nil)}, nil
}

// UnmarshalCaddyfile sets up the app from the `grid` global option.
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
		switch name {
		case "redis", "prefix", "worker_secret":
			if !d.NextArg() {
				return d.ArgErr()
			}
			v := d.Val()
			if d.NextArg() {
				return d.ArgErr()
			}
			switch name {
			case "redis":
				// A placeholder is read when the config loads, and
				// checked then.
				if !strings.Contains(v, "{") {
					if err := registry.CheckURL(v); err != nil {
						return d.Errf("invalid redis '%s': %v", registry.RedactURL(v), err)
					}
				}
				a.Redis = v
			case "prefix":
				if err := registry.CheckPrefix(v); err != nil {
					return d.Errf("invalid prefix '%s': %v", v, err)
				}
				a.Prefix = v
			default:
				if v == "" {
					return d.Err("invalid worker_secret: empty")
				}
				a.WorkerSecret = v
			}
		case "stale_threshold", "reaper_interval":
			dur, err := durationArg(d, name)
			if err != nil {
				return err
			}
			if name == "stale_threshold" {
				a.StaleThreshold = caddy.Duration(dur)
			} else {
				a.ReaperInterval = caddy.Duration(dur)
			}
		case "disable_reaper", "allow_worker_hostnames":
			if d.NextArg() {
				return d.ArgErr()
			}
			if name == "disable_reaper" {
				a.DisableReaper = true
			} else {
				a.AllowWorkerHostnames = true
			}
		case "worker_networks":
			args := d.RemainingArgs()
			if len(args) == 0 {
				return d.ArgErr()
			}
			for _, s := range args {
				if _, err := parseWorkerNetwork(s); err != nil {
					return d.Errf("invalid worker_networks '%s': %v", s, err)
				}
			}
			a.WorkerNetworks = args
		default:
			return d.Errf("unrecognized grid option '%s'", name)
		}
	}
	return nil
}

// Interface guards.
var (
	_ caddy.App             = (*App)(nil)
	_ caddy.Provisioner     = (*App)(nil)
	_ caddy.Validator       = (*App)(nil)
	_ caddy.CleanerUpper    = (*App)(nil)
	_ caddyfile.Unmarshaler = (*App)(nil)
)
