package caddygrid

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/browsergrid/caddy-browser-grid/registry"
	"github.com/browsergrid/caddy-browser-grid/selection"
)

func init() {
	caddy.RegisterModule(AdminAPI{})
}

// adminTimeout bounds the Redis work of one admin request.
const adminTimeout = 5 * time.Second

// AdminAPI serves the grid's routes on Caddy's admin endpoint:
//
//	GET  /grid/pools                          every pool with its totals
//	GET  /grid/pools/{pool}                   every worker of a pool
//	POST /grid/pools/{pool}/workers/{id}/drain  set a worker's shutdown command
//	GET  /grid/pools/{pool}/pick[?policy=…]   what a claim would choose now (claims nothing)
//
// Errors are caddy.APIError JSON ({"error": "…"}).
type AdminAPI struct{}

// CaddyModule returns the Caddy module information.
func (AdminAPI) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "admin.api.grid",
		New: func() caddy.Module { return new(AdminAPI) },
	}
}

// Routes returns the admin routes of the grid.
func (AdminAPI) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{{Pattern: "/grid/", Handler: caddy.AdminHandlerFunc(serveAdmin)}}
}

// PoolSummary is one pool in GET /grid/pools.
type PoolSummary struct {
	Pool string `json:"pool"`
	// Workers registered, and how many of them are available or draining
	// (status draining, or told to shut down: either takes no session).
	Workers   int `json:"workers"`
	Available int `json:"available"`
	Draining  int `json:"draining"`
	// Active is the sum of the workers' live sessions.
	Active int `json:"active"`
	// Capacity is the sum of the available workers' caps (the smaller of
	// max_concurrent and the worker's capacity); Uncapped counts
	// available workers without any cap (not in Capacity).
	Capacity int `json:"capacity"`
	Uncapped int `json:"uncapped,omitempty"`
	// Leases is the number of live leases in Redis (all Caddy instances).
	Leases int `json:"leases"`
	// QueueDepth is the number of requests waiting in this instance.
	QueueDepth int `json:"queue_depth"`
	// LocalSessions is the number of live sessions this instance holds.
	LocalSessions int `json:"local_sessions"`
	// Versions are the Playwright versions (major.minor) the pool's
	// workers serve, oldest first; none for a pool of CDP or exec workers.
	Versions []string `json:"versions,omitempty"`
}

// WorkerStatus is one worker in GET /grid/pools/{pool}.
type WorkerStatus struct {
	ID       string `json:"id"`
	Endpoint string `json:"endpoint"`
	Addr     string `json:"addr"`
	Path     string `json:"path"`
	Status   string `json:"status"`
	Active   int    `json:"active"`
	Lifetime int    `json:"lifetime"`
	// Capacity is the worker's own registered capacity (0: none).
	Capacity int `json:"capacity"`
	// HeartbeatAge is the time since the last heartbeat, e.g. "1.2s";
	// HeartbeatAgeMS the same in milliseconds.
	HeartbeatAge   string `json:"heartbeat_age"`
	HeartbeatAgeMS int64  `json:"heartbeat_age_ms"`
	SuspectUntil   string `json:"suspect_until,omitempty"`
	Command        string `json:"command,omitempty"`
	// PlaywrightVersion is the major.minor of the Playwright browser
	// server the worker runs ("" for CDP and exec workers).
	PlaywrightVersion string `json:"playwright_version,omitempty"`
}

// PoolDetail is GET /grid/pools/{pool}.
type PoolDetail struct {
	PoolSummary
	MaxConcurrent  int            `json:"max_concurrent"`
	MaxLifetime    int            `json:"max_lifetime"`
	WorkerStatuses []WorkerStatus `json:"workers"`
	BadRecords     []BadRecordOut `json:"bad_records,omitempty"`
	// Indexes are the optional indexes the pool and its version groups
	// keep (docs/redis.md, "Kept indexes").
	Indexes []IndexOut `json:"indexes,omitempty"`
}

// IndexOut is one optional index a pool keeps: its pool or version
// group, name, the policy that walks it, its state ("complete",
// "building": that policy's claims choose as lifetime_first until it is
// complete, "kept": no claim of this version settled the pool yet) and
// when a claim last walked it (RFC 3339, noted every 15 minutes at most).
type IndexOut struct {
	Pool       string `json:"pool"`
	Name       string `json:"name"`
	Policy     string `json:"policy"`
	State      string `json:"state"`
	LastWalked string `json:"last_walked,omitempty"`
}

// BadRecordOut is a worker record that does not parse.
type BadRecordOut struct {
	ID    string `json:"id"`
	Error string `json:"error"`
}

// PickResult is GET /grid/pools/{pool}/pick.
type PickResult struct {
	Pool   string `json:"pool"`
	Policy string `json:"policy"`
	// Version is the Playwright version group the pick was made in
	// (absent: the pool's workers without a version).
	Version string        `json:"version,omitempty"`
	Worker  *WorkerStatus `json:"worker"`
	// Scanned, Stale: what the decision walked past.
	Scanned int      `json:"scanned"`
	Stale   []string `json:"stale,omitempty"`
}

func apiError(code int, err error) error {
	return caddy.APIError{HTTPStatus: code, Err: err}
}

func serveAdmin(w http.ResponseWriter, r *http.Request) error {
	a := running.current()
	var b *backend
	if a != nil {
		b = a.liveBackend()
	}
	if b == nil {
		return apiError(http.StatusServiceUnavailable, errors.New("no grid app is running"))
	}
	// Hold the backend for the request: a reload may clean the app up
	// meanwhile.
	b, err := b.retain()
	if err != nil {
		return apiError(http.StatusServiceUnavailable, errors.New("no grid app is running"))
	}
	defer b.drop()
	parts := strings.Split(strings.Trim(strings.TrimPrefix(r.URL.Path, "/grid/"), "/"), "/")
	ctx, cancel := context.WithTimeout(r.Context(), adminTimeout)
	defer cancel()
	switch {
	case len(parts) == 1 && parts[0] == "pools":
		if r.Method != http.MethodGet {
			return apiError(http.StatusMethodNotAllowed, fmt.Errorf("method %s not allowed: use GET", r.Method))
		}
		return a.adminPools(ctx, b, w)
	case len(parts) >= 2 && parts[0] == "pools":
		pool := parts[1]
		if !validPoolName(pool) {
			return apiError(http.StatusBadRequest, fmt.Errorf("invalid pool name %q", pool))
		}
		switch {
		case len(parts) == 2:
			if r.Method != http.MethodGet {
				return apiError(http.StatusMethodNotAllowed, fmt.Errorf("method %s not allowed: use GET", r.Method))
			}
			return a.adminPool(ctx, b, w, pool)
		case len(parts) == 3 && parts[2] == "pick":
			if r.Method != http.MethodGet {
				return apiError(http.StatusMethodNotAllowed, fmt.Errorf("method %s not allowed: use GET", r.Method))
			}
			return a.adminPick(ctx, b, w, pool, r.URL.Query().Get("policy"), r.URL.Query().Get("version"))
		case len(parts) == 5 && parts[2] == "workers" && parts[4] == "drain":
			if r.Method != http.MethodPost {
				return apiError(http.StatusMethodNotAllowed, fmt.Errorf("method %s not allowed: use POST", r.Method))
			}
			return a.adminDrain(ctx, b, w, pool, parts[3])
		}
	}
	return apiError(http.StatusNotFound, fmt.Errorf("no grid admin route %s %s", r.Method, r.URL.Path))
}

func writeJSON(w http.ResponseWriter, v any) error {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func redisError(what string, err error) error {
	metrics.redisErrors.WithLabelValues("admin").Inc()
	return apiError(http.StatusServiceUnavailable, fmt.Errorf("%s: %w", what, err))
}

// summarize totals a pool (with its version groups: inspectPool).
func (a *App) summarize(b *backend, info registry.PoolInfo, versions, groups []string) PoolSummary {
	s := PoolSummary{Pool: info.Pool, Workers: len(info.Workers), Leases: info.Leases, Versions: versions}
	live := b.liveLeases()
	for _, g := range groups {
		s.QueueDepth += b.queueDepth(g)
		s.LocalSessions += live[g]
	}
	for _, w := range info.Workers {
		s.Active += w.Active
		switch {
		case w.Status == selection.Draining || w.Command == registry.CommandShutdown:
			// told to shut down, its agent not draining yet: it takes no
			// session either
			s.Draining++
		case w.Status == selection.Available:
			s.Available++
			snap := w.Snapshot()
			if c := info.Limits.Cap(&snap); c > 0 {
				s.Capacity += c
			} else {
				s.Uncapped++
			}
		}
	}
	return s
}

func (a *App) adminPools(ctx context.Context, b *backend, w http.ResponseWriter) error {
	pools, err := b.reg.Pools(ctx)
	if err != nil {
		return redisError("listing pools", err)
	}
	pools = basePools(pools)
	out := make([]PoolSummary, 0, len(pools))
	for _, p := range pools {
		info, versions, groups, err := inspectPool(ctx, b, p)
		if err != nil {
			return redisError(fmt.Sprintf("reading pool %q", p), err)
		}
		out = append(out, a.summarize(b, info, versions, groups))
	}
	return writeJSON(w, out)
}

func workerStatus(wi registry.WorkerInfo, now time.Time) WorkerStatus {
	age := now.Sub(wi.LastHeartbeat)
	if wi.LastHeartbeat.IsZero() || age < 0 {
		age = 0
	}
	ws := WorkerStatus{
		ID: wi.ID, Addr: wi.Addr, Path: wi.Path, Endpoint: "ws://" + wi.Addr + wi.Path,
		Status: string(wi.Status), Active: wi.Active, Lifetime: wi.Lifetime, Capacity: wi.Capacity,
		HeartbeatAge: age.Round(time.Millisecond).String(), HeartbeatAgeMS: age.Milliseconds(),
		Command: string(wi.Command), PlaywrightVersion: wi.PlaywrightVersion,
	}
	if wi.SuspectUntil.After(now) {
		ws.SuspectUntil = wi.SuspectUntil.UTC().Format(time.RFC3339Nano)
	}
	return ws
}

func (a *App) adminPool(ctx context.Context, b *backend, w http.ResponseWriter, pool string) error {
	info, versions, groups, err := inspectPool(ctx, b, pool)
	if err != nil {
		return redisError(fmt.Sprintf("reading pool %q", pool), err)
	}
	if len(info.Workers) == 0 && len(info.BadRecords) == 0 {
		pools, err := b.reg.Pools(ctx)
		if err != nil {
			return redisError("listing pools", err)
		}
		known := false
		for _, p := range basePools(pools) {
			known = known || p == pool
		}
		if !known {
			return apiError(http.StatusNotFound, fmt.Errorf("pool %q has no workers and never had any", pool))
		}
	}
	now := info.Now // Redis' clock, as the heartbeats it shows
	if now.IsZero() {
		now = time.Now()
	}
	d := PoolDetail{
		PoolSummary:    a.summarize(b, info, versions, groups),
		MaxConcurrent:  info.Limits.MaxConcurrent,
		MaxLifetime:    info.Limits.MaxLifetime,
		WorkerStatuses: make([]WorkerStatus, 0, len(info.Workers)),
	}
	for _, ix := range info.Indexes {
		out := IndexOut{Pool: ix.Pool, Name: ix.Name, Policy: string(ix.Policy), State: ix.State}
		if !ix.LastWalked.IsZero() {
			out.LastWalked = ix.LastWalked.UTC().Format(time.RFC3339)
		}
		d.Indexes = append(d.Indexes, out)
	}
	for _, wi := range info.Workers {
		d.WorkerStatuses = append(d.WorkerStatuses, workerStatus(wi, now))
	}
	for _, b := range info.BadRecords {
		d.BadRecords = append(d.BadRecords, BadRecordOut{ID: b.ID, Error: b.Err})
	}
	d.BadRecords = append(d.BadRecords, a.refusedRecords(ctx, info)...)
	return writeJSON(w, d)
}

func (a *App) adminDrain(ctx context.Context, b *backend, w http.ResponseWriter, pool, id string) error {
	err := b.reg.Drain(ctx, pool, id)
	if errors.Is(err, registry.ErrNotRegistered) {
		// the worker may be in one of the pool's version groups
		vs, verr := b.reg.Versions(ctx, pool)
		if verr != nil {
			return redisError(fmt.Sprintf("reading the versions of pool %q", pool), verr)
		}
		for v := range vs.Workers {
			if v != "" && errors.Is(err, registry.ErrNotRegistered) {
				err = b.reg.Drain(ctx, registry.GroupPool(pool, v), id)
			}
		}
	}
	if err != nil {
		if errors.Is(err, registry.ErrNotRegistered) {
			return apiError(http.StatusNotFound, fmt.Errorf("worker %q is not registered in pool %q", id, pool))
		}
		return redisError(fmt.Sprintf("draining worker %q of pool %q", id, pool), err)
	}
	a.logger.Info("worker told to drain through the admin API",
		zap.String("pool", pool), zap.String("worker_id", id))
	return writeJSON(w, map[string]string{"pool": pool, "worker_id": id, "command": string(registry.CommandShutdown)})
}

// adminPick asks the registry what a claim would choose now. With
// version, a Playwright client of that version: its version's group only.
// Without, a client that sends none: the pool's groups in the order such
// a claim tries them (registry.PoolVersions.Groups), up to the first that
// has a worker to give. In each group the request is this instance's
// last claim there (its policy and limits), or lifetime_first with the
// group's stored limits.
func (a *App) adminPick(ctx context.Context, b *backend, w http.ResponseWriter, pool, policy, version string) error {
	if policy != "" {
		if _, ok := registry.LookupPolicy(policy); !ok {
			return apiError(http.StatusBadRequest, &registry.UnknownPolicyError{Name: policy})
		}
	}
	groups := []string{pool}
	if version != "" {
		if err := registry.CheckVersion(version); err != nil {
			return apiError(http.StatusBadRequest, err)
		}
		// as a client's User-Agent is read: "01.065" is 1.65
		major, minor, _ := strings.Cut(version, ".")
		groups = []string{registry.GroupPool(pool, majorMinor(major, minor))}
	} else {
		vs, err := b.reg.Versions(ctx, pool)
		if err != nil {
			return redisError(fmt.Sprintf("reading the versions of pool %q", pool), err)
		}
		if gs := vs.Groups(pool); len(gs) > 0 {
			groups = gs
		}
	}
	out := PickResult{Pool: pool}
	for i, group := range groups {
		req, err := a.pickRequest(ctx, b, group, policy)
		if err != nil {
			return err
		}
		wi, dec, err := b.reg.Pick(ctx, req)
		out.Scanned += dec.Scanned
		out.Stale = append(out.Stale, dec.Stale...)
		if i == 0 || err == nil {
			_, out.Version = registry.SplitGroup(group)
			out.Policy = string(req.Policy)
		}
		switch {
		case err == nil:
			ws := workerStatus(wi, time.Now())
			out.Worker = &ws
			return writeJSON(w, out)
		case errors.Is(err, registry.ErrNoWorker):
		default:
			return redisError(fmt.Sprintf("picking in pool %q", group), err)
		}
	}
	return writeJSON(w, out)
}

// pickRequest is the claim request adminPick asks about in group: this
// instance's last there, or lifetime_first with the group's stored limits;
// with policy, that policy with its parameters at their defaults.
func (a *App) pickRequest(ctx context.Context, b *backend, group, policy string) (registry.ClaimRequest, error) {
	b.mu.Lock()
	last, ok := b.lastPick[group]
	b.mu.Unlock()
	req := last.req
	if !ok {
		info, err := b.reg.Inspect(ctx, group)
		if err != nil {
			return req, redisError(fmt.Sprintf("reading pool %q", group), err)
		}
		req = registry.ClaimRequest{Pool: group, Policy: registry.LifetimeFirst, Limits: info.Limits}
		req.Limits.StaleAfter = time.Duration(a.StaleThreshold)
	}
	if policy != "" && registry.Policy(policy) != req.Policy {
		// Another policy than the last claim's: its own parameters at
		// their defaults (the registry fills zero fields).
		req.Policy = registry.Policy(policy)
		req.Vnode, req.FairShare = selection.Vnode{}, selection.FairShare{}
	}
	return req, nil
}

// Interface guards
var _ caddy.AdminRouter = (*AdminAPI)(nil)
