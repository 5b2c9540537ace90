package caddygrid

import (
	"bytes"
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
)

func init() {
	caddy.RegisterModule(UIHandler{})
	httpcaddyfile.RegisterHandlerDirective("browser_grid_ui", parseUICaddyfile)
	// With the other handlers that answer themselves (respond,
	// reverse_proxy, file_server): after the authentication directives
	// (basic_auth, forward_auth) and request rewrites, which Caddy orders
	// earlier, so that they guard the page when they share its route.
	// (The order must name a standard directive, so not browser_grid.)
	httpcaddyfile.RegisterDirectiveOrder("browser_grid_ui", httpcaddyfile.Before, "respond")
}

// Defaults and bounds of the browser_grid_ui handler.
const (
	// DefaultUIInterval is how often the page's sampler reads every pool.
	DefaultUIInterval = 2 * time.Second
	// minUIInterval keeps the sampler from becoming a load on Redis.
	minUIInterval = 500 * time.Millisecond
	// uiWindow is how far back the page's charts go.
	uiWindow = 15 * time.Minute
	// DefaultUIMaxWorkers is how many workers per pool get a lifetime
	// history.
	DefaultUIMaxWorkers = 200
	// uiMaxPools is how many pools get a history.
	uiMaxPools = 32
	// uiMaxRows is how many workers of a pool the staircase lists (the
	// oldest first: the next to retire); the rest are counted. Each row
	// is about 220 bytes of data.json that every open page fetches every
	// interval.
	uiMaxRows = 500
)

//go:embed ui
var uiFiles embed.FS

// UIHandler is the browser_grid_ui HTTP handler: a live page of the grid,
// for operators. Per pool it shows the staircase (every worker's lifetime
// toward max_lifetime, its live sessions toward its cap, status,
// Playwright version when the worker reports one, heartbeat age), each
// worker's lifetime over the last 15 minutes (the sawtooth: a restart is
// a drop), the queue depth, sessions started per second and drains.
//
// It answers GET and HEAD on the path it is given:
//
//	/           the page
//	/data.json  what the page draws (it polls it)
//	/app.js, /style.css
//
// and 404 for any other path, so put it under handle_path (which strips
// the route's prefix) on a route of its own, behind basic_auth or
// forward_auth: the page shows worker addresses and the grid's load.
//
// A sampler, one per Caddy process however many configs use the handler,
// reads every pool from Redis every interval, as the admin API does
// (GET /grid/pools/{pool}), and keeps 15 minutes of samples in memory;
// requests are answered from memory and never reach Redis. Sessions per
// second are derived from the workers' lifetimes, which Redis counts for
// the whole grid, so they are the whole pool's across Caddy instances, as
// is the queue.
type UIHandler struct {
	// Interval is how often the sampler reads every pool, and how often
	// the page refreshes. Default: 2s; at least 500ms.
	Interval caddy.Duration `json:"interval,omitempty"`
	// MaxWorkers is how many workers per pool get a lifetime history
	// (the sawtooth), which bounds the memory: each tracked worker keeps
	// at most 15 minutes of samples (451 at the default interval, 16
	// bytes each: about 1.5 MB per pool at the default). Workers
	// past it still appear in the staircase and count in the pool's
	// figures. Default: 200.
	MaxWorkers int `json:"max_workers,omitempty"`

	sampler    *uiSampler
	samplerKey string
}

// CaddyModule returns the Caddy module information.
func (UIHandler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.browser_grid_ui",
		New: func() caddy.Module { return new(UIHandler) },
	}
}

// uiSamplers holds the running samplers, keyed by their settings: a
// reload that keeps them keeps the sampler and its history.
var uiSamplers = caddy.NewUsagePool()

// Provision fills in the defaults and takes the sampler (started here
// when it is the first user; its first read of Redis happens in its own
// goroutine, and finds nothing before the grid app is started).
func (h *UIHandler) Provision(ctx caddy.Context) error {
	if h.Interval == 0 {
		h.Interval = caddy.Duration(DefaultUIInterval)
	}
	if h.MaxWorkers == 0 {
		h.MaxWorkers = DefaultUIMaxWorkers
	}
	// Checked before the sampler starts (Caddy validates after
	// provisioning): a ticker needs a positive interval.
	if err := h.Validate(); err != nil {
		return err
	}
	key := fmt.Sprintf("browser_grid_ui/%s/%d", time.Duration(h.Interval), h.MaxWorkers)
	logger := ctx.Logger()
	v, _, err := uiSamplers.LoadOrNew(key, func() (caddy.Destructor, error) {
		return startUISampler(time.Duration(h.Interval), h.MaxWorkers, logger), nil
	})
	if err != nil {
		return fmt.Errorf("starting the grid page's sampler: %w", err)
	}
	h.sampler, h.samplerKey = v.(*uiSampler), key
	return nil
}

// Validate checks the settings.
func (h *UIHandler) Validate() error {
	if h.Interval != 0 && time.Duration(h.Interval) < minUIInterval {
		return fmt.Errorf("browser_grid_ui interval %s is below the minimum %s", time.Duration(h.Interval), minUIInterval)
	}
	if h.MaxWorkers < 0 {
		return fmt.Errorf("browser_grid_ui max_workers %d is negative", h.MaxWorkers)
	}
	return nil
}

// Cleanup gives back the sampler; the last user stops it.
func (h *UIHandler) Cleanup() error {
	if h.sampler == nil {
		return nil
	}
	_, err := uiSamplers.Delete(h.samplerKey)
	return err
}

// uiAssets are the embedded files the handler serves, by path.
var uiAssets = map[string]string{
	"/":          "ui/index.html",
	"/app.js":    "ui/app.js",
	"/style.css": "ui/style.css",
}

// ServeHTTP serves the page, its assets and its data; it never calls next.
func (h *UIHandler) ServeHTTP(w http.ResponseWriter, r *http.Request, _ caddyhttp.Handler) error {
	path := r.URL.Path
	if path == "" {
		path = "/"
	}
	name, asset := uiAssets[path]
	if !asset && path != "/data.json" {
		return caddyhttp.Error(http.StatusNotFound, fmt.Errorf("browser_grid_ui has no %q: it serves /, /data.json, /app.js and /style.css (under handle_path, which strips the route's prefix)", path))
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		return caddyhttp.Error(http.StatusMethodNotAllowed, fmt.Errorf("method %s not allowed on the grid page: use GET", r.Method))
	}
	hdr := w.Header()
	hdr.Set("X-Content-Type-Options", "nosniff")
	hdr.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
	hdr.Set("Referrer-Policy", "no-referrer")
	if !asset {
		hdr.Set("Cache-Control", "no-store")
		hdr.Set("Content-Type", "application/json")
		body := h.sampler.current()
		hdr.Set("Content-Length", strconv.Itoa(len(body)))
		if r.Method == http.MethodHead {
			return nil
		}
		_, err := w.Write(body)
		return err
	}
	b, err := fs.ReadFile(uiFiles, name)
	if err != nil {
		return caddyhttp.Error(http.StatusInternalServerError, fmt.Errorf("reading embedded %s: %w", name, err))
	}
	hdr.Set("Cache-Control", "no-cache")
	http.ServeContent(w, r, name, time.Time{}, bytes.NewReader(b))
	return nil
}

// uiWorker is one row of the staircase: the admin API's worker status and
// its effective cap.
type uiWorker struct {
	WorkerStatus
	// Cap is the smaller of max_concurrent and the worker's capacity; 0
	// is none.
	Cap int `json:"cap"`
}

// uiPool is one pool on the page.
type uiPool struct {
	PoolSummary
	MaxConcurrent int        `json:"max_concurrent"`
	MaxLifetime   int        `json:"max_lifetime"`
	Workers       []uiWorker `json:"workers"`
	// BadRecords counts the worker records skipped (the admin API lists
	// them).
	BadRecords int `json:"bad_records,omitempty"`
	// WorkersHidden counts the workers past uiMaxRows.
	WorkersHidden int `json:"workers_hidden,omitempty"`
	// Sessions are the pool's live sessions, the oldest first, at most
	// uiMaxRows; SessionsHidden counts the rest.
	Sessions       []SessionOut `json:"sessions"`
	SessionsHidden int          `json:"sessions_hidden,omitempty"`
	poolHistoryOut
}

// uiData is /data.json.
type uiData struct {
	// SampledAt is when the last sample was taken (Unix milliseconds; 0:
	// none yet); IntervalMS and WindowMS the sampling interval and the
	// history's length.
	SampledAt  int64 `json:"sampled_at"`
	IntervalMS int64 `json:"interval_ms"`
	WindowMS   int64 `json:"window_ms"`
	// Error says why the last sample failed. Pools are then the last
	// sample that succeeded, taken at PoolsSampledAt (0: none yet).
	Error          string   `json:"error,omitempty"`
	PoolsSampledAt int64    `json:"pools_sampled_at,omitempty"`
	Pools          []uiPool `json:"pools"`
	// UntrackedPools counts pools past the page's limit.
	UntrackedPools int `json:"untracked_pools,omitempty"`
}

// uiSampler reads every pool every interval and keeps the page's data.
type uiSampler struct {
	interval   time.Duration
	maxWorkers int
	logger     *zap.Logger
	cancel     context.CancelFunc
	done       chan struct{}

	mu   sync.Mutex
	hist *gridHistory
	data []byte
	// last is the output of the last sample that succeeded.
	last *uiData
}

func startUISampler(interval time.Duration, maxWorkers int, logger *zap.Logger) *uiSampler {
	points := int(uiWindow/interval) + 1
	s := &uiSampler{
		interval: interval, maxWorkers: maxWorkers, logger: logger, done: make(chan struct{}),
		hist: newGridHistory(historyLimits{Window: uiWindow, MaxPoints: points, MaxWorkers: maxWorkers, MaxPools: uiMaxPools}),
	}
	s.data, _ = json.Marshal(uiData{IntervalMS: interval.Milliseconds(), WindowMS: uiWindow.Milliseconds(), Pools: []uiPool{}})
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	go s.run(ctx)
	return s
}

// Destruct stops the sampler.
func (s *uiSampler) Destruct() error {
	s.cancel()
	<-s.done
	return nil
}

func (s *uiSampler) current() []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.data
}

func (s *uiSampler) run(ctx context.Context) {
	defer close(s.done)
	t := time.NewTicker(s.interval)
	defer t.Stop()
	failing := false
	for {
		err := s.sample(ctx)
		// No grid app: between a config's provisioning and its grid app's
		// start, and in 'caddy validate'; the page says so.
		bad := err != nil && !errors.Is(err, errNoGridApp) && ctx.Err() == nil
		switch {
		case bad && !failing:
			s.logger.Warn("grid page could not sample the pools", zap.Error(err))
		case !bad && failing:
			s.logger.Info("grid page samples the pools again")
		}
		failing = bad
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

var errNoGridApp = errors.New("no grid app is running")

// sample reads every pool once, as the admin API does, records it and
// renders the page's data.
func (s *uiSampler) sample(ctx context.Context) error {
	now := time.Now()
	pools, obs, untracked, err := readPools(ctx, s.interval)
	s.mu.Lock()
	defer s.mu.Unlock()
	out := uiData{SampledAt: now.UnixMilli(), IntervalMS: s.interval.Milliseconds(), WindowMS: uiWindow.Milliseconds(), Pools: []uiPool{}}
	if err != nil {
		out.Error = err.Error()
		if s.last != nil {
			out.Pools, out.UntrackedPools, out.PoolsSampledAt = s.last.Pools, s.last.UntrackedPools, s.last.SampledAt
		}
	} else {
		s.hist.add(now, obs)
		for i := range pools {
			pools[i].poolHistoryOut = s.hist.series(pools[i].Pool)
			out.Pools = append(out.Pools, pools[i])
		}
		out.UntrackedPools = untracked + len(s.hist.untrackedPools)
		last := out
		s.last = &last
	}
	b, merr := json.Marshal(out)
	if merr != nil {
		return fmt.Errorf("encoding the grid page's data: %w", merr)
	}
	s.data = b
	return err
}

// readPools reads every pool through the running grid app, as the admin
// API does, bounded by the sampling interval.
func readPools(ctx context.Context, interval time.Duration) ([]uiPool, []poolObservation, int, error) {
	a := currentApp()
	if a == nil {
		return nil, nil, 0, errNoGridApp
	}
	ctx, cancel := context.WithTimeout(ctx, max(interval, adminTimeout))
	defer cancel()
	names, err := a.knownPools(ctx)
	if err != nil {
		return nil, nil, 0, fmt.Errorf("listing pools: %w", err)
	}
	// The pools this config names first: made-up names that sort first
	// must not push a served pool off the page.
	sort.SliceStable(names, func(i, j int) bool { return a.configured(names[i]) != nil && a.configured(names[j]) == nil })
	untracked := 0
	if len(names) > uiMaxPools {
		untracked = len(names) - uiMaxPools
		names = names[:uiMaxPools]
	}
	var pools []uiPool
	var obs []poolObservation
	for _, name := range names {
		d, err := a.pool(ctx, name)
		if err != nil {
			continue // gone since it was listed
		}
		p := uiPool{PoolSummary: d.PoolSummary, BadRecords: len(d.BadRecords), Workers: make([]uiWorker, 0, len(d.Workers))}
		if d.Configured != nil {
			p.MaxConcurrent, p.MaxLifetime = d.Configured.MaxConcurrent, d.Configured.MaxLifetime
		}
		o := poolObservation{Pool: name, QueueDepth: p.QueueDepth, Active: p.Active, Capacity: p.Capacity, Leaving: p.Leaving}
		for _, w := range d.Workers {
			p.Workers = append(p.Workers, uiWorker{WorkerStatus: w, Cap: effectiveCap(w.Capacity, p.MaxConcurrent)})
			o.Workers = append(o.Workers, workerObservation{ID: w.ID, Lifetime: w.Lifetime, Registered: w.Registered})
		}
		// The staircase: the highest lifetime first.
		sort.SliceStable(p.Workers, func(i, j int) bool {
			if p.Workers[i].Lifetime != p.Workers[j].Lifetime {
				return p.Workers[i].Lifetime > p.Workers[j].Lifetime
			}
			return p.Workers[i].ID < p.Workers[j].ID
		})
		if n := len(p.Workers) - uiMaxRows; n > 0 {
			p.WorkersHidden = n
			p.Workers = p.Workers[:uiMaxRows]
		}
		if page, err := a.sessionsPage(ctx, name, ""); err == nil {
			p.Sessions = page.Sessions
			sort.Slice(p.Sessions, func(i, j int) bool { return p.Sessions[i].Started.Before(p.Sessions[j].Started) })
			if n := len(p.Sessions) - uiMaxRows; n > 0 {
				p.SessionsHidden = n
				p.Sessions = p.Sessions[:uiMaxRows]
			}
		}
		pools = append(pools, p)
		obs = append(obs, o)
	}
	return pools, obs, untracked, nil
}

func parseUICaddyfile(helper httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	h := new(UIHandler)
	err := h.UnmarshalCaddyfile(helper.Dispenser)
	return h, err
}

// UnmarshalCaddyfile sets up the handler from Caddyfile tokens. Syntax:
//
//	browser_grid_ui {
//	    interval    <duration>
//	    max_workers <n>
//	}
func (h *UIHandler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // consume directive name
	if d.NextArg() {
		return d.ArgErr()
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		switch d.Val() {
		case "interval":
			if h.Interval != 0 {
				return d.Errf("interval already specified")
			}
			if !d.NextArg() {
				return d.ArgErr()
			}
			v, err := caddy.ParseDuration(d.Val())
			if err != nil || v <= 0 {
				if err == nil {
					err = errors.New("must be positive")
				}
				return d.Errf("invalid interval '%s': %v", d.Val(), err)
			}
			h.Interval = caddy.Duration(v)
		case "max_workers":
			if h.MaxWorkers != 0 {
				return d.Errf("max_workers already specified")
			}
			if !d.NextArg() {
				return d.ArgErr()
			}
			n, err := strconv.Atoi(d.Val())
			if err != nil || n < 1 {
				if err == nil {
					err = errors.New("must be at least 1")
				}
				return d.Errf("invalid max_workers '%s': %v", d.Val(), err)
			}
			h.MaxWorkers = n
		default:
			return d.Errf("unrecognized subdirective '%s'", d.Val())
		}
		if d.NextArg() {
			return d.ArgErr()
		}
	}
	return nil
}

// Interface guards
var (
	_ caddy.Provisioner           = (*UIHandler)(nil)
	_ caddy.Validator             = (*UIHandler)(nil)
	_ caddy.CleanerUpper          = (*UIHandler)(nil)
	_ caddyhttp.MiddlewareHandler = (*UIHandler)(nil)
	_ caddyfile.Unmarshaler       = (*UIHandler)(nil)
	_ caddy.Destructor            = (*uiSampler)(nil)
)
