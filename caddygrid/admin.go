package caddygrid

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/browsergrid/caddy-browser-grid/registry"
)

func init() {
	caddy.RegisterModule(AdminAPI{})
}

// adminTimeout bounds the Redis work of one admin request.
const adminTimeout = 5 * time.Second

// AdminAPI serves the grid's routes on Caddy's admin endpoint:
//
//	GET    /grid/pools                           every pool with its totals
//	GET    /grid/pools/{pool}                    a pool's workers and configured limits
//	POST   /grid/pools/{pool}/workers/{id}/drain drain a worker
//	GET    /grid/pools/{pool}/pick[?version=]    what a claim would take now (claims nothing)
//	GET    /grid/sessions[?pool=][&cursor=]      live sessions, every instance's, a page at a time
//	GET    /grid/sessions/{id}                   one session
//	DELETE /grid/sessions/{id}                   end a session
//
// Errors are caddy.APIError JSON ({"error": "…"}).
type AdminAPI struct{}

// CaddyModule returns the Caddy module information.
func (AdminAPI) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "admin.api.grid", New: func() caddy.Module { return new(AdminAPI) }}
}

// Routes returns the admin routes of the grid.
func (AdminAPI) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{{Pattern: "/grid/", Handler: caddy.AdminHandlerFunc(serveAdmin)}}
}

// PoolSummary is one pool in GET /grid/pools.
type PoolSummary struct {
	Pool string `json:"pool"`
	// Workers registered; Available take sessions; Leaving are on their
	// way out (retiring, draining, or replaced).
	Workers   int `json:"workers"`
	Available int `json:"available"`
	Leaving   int `json:"leaving"`
	// Active is the live and pending sessions Redis counts; Capacity the
	// sum of the available workers' caps (Uncapped: those without one).
	Active   int `json:"active"`
	Capacity int `json:"capacity"`
	Uncapped int `json:"uncapped,omitempty"`
	// QueueDepth is the requests waiting in the pool's queue, across
	// every instance, and OldestWaitMS how long the oldest has waited, as
	// this instance last read them (every second); LocalSessions are
	// this instance's sessions.
	QueueDepth    int   `json:"queue_depth"`
	OldestWaitMS  int64 `json:"oldest_wait_ms"`
	LocalSessions int   `json:"local_sessions"`
	// Versions are the Playwright versions its workers serve, oldest
	// first.
	Versions []string `json:"versions,omitempty"`
}

// WorkerStatus is one worker in GET /grid/pools/{pool}.
type WorkerStatus struct {
	ID string `json:"id"`
	// Version is the Playwright major.minor it serves ("": any client).
	Version  string `json:"version,omitempty"`
	Addr     string `json:"addr"`
	Path     string `json:"path"`
	Launcher string `json:"launcher,omitempty"`
	// Status: available, retiring (the claim of its last session is on
	// its way), draining, replaced (draining, its replacement serving),
	// stale (no heartbeat within stale_threshold).
	Status   string `json:"status"`
	Active   int    `json:"active"`
	Lifetime int    `json:"lifetime"`
	// Capacity is its own (0: none).
	Capacity       int    `json:"capacity"`
	HeartbeatAge   string `json:"heartbeat_age"`
	HeartbeatAgeMS int64  `json:"heartbeat_age_ms"`
	SuspectUntil   string `json:"suspect_until,omitempty"`
	// Held: its last session waits until its agent's previous browser has
	// drained.
	Held       bool      `json:"held,omitempty"`
	Video      bool      `json:"video,omitempty"`
	Registered time.Time `json:"registered"`
}

// Configured is what this instance's config brings to a pool.
type Configured struct {
	Policy         string `json:"policy"`
	MaxConcurrent  int    `json:"max_concurrent"`
	MaxLifetime    int    `json:"max_lifetime"`
	StaggerDrains  bool   `json:"stagger_drains"`
	MaxSession     string `json:"max_session,omitempty"`
	IdleTimeout    string `json:"idle_timeout,omitempty"`
	ClientLimit    int    `json:"client_limit,omitempty"`
	SelectTimeout  string `json:"select_timeout"`
	VersionRouting bool   `json:"version_routing"`
}

// PoolDetail is GET /grid/pools/{pool}.
type PoolDetail struct {
	PoolSummary
	// Configured is nil for a pool this instance's config does not name.
	Configured *Configured     `json:"configured,omitempty"`
	Workers    []WorkerStatus  `json:"workers"`
	BadRecords []BadRecordOut  `json:"bad_records,omitempty"`
	Groups     []GroupRetiring `json:"groups,omitempty"`
}

// GroupRetiring lists the workers of a version group that count as
// retiring for stagger_drains.
type GroupRetiring struct {
	Version  string   `json:"version,omitempty"`
	Retiring []string `json:"retiring"`
}

// BadRecordOut is a worker record that does not parse, or that the dial
// policy refuses.
type BadRecordOut struct {
	ID    string `json:"id"`
	Error string `json:"error"`
}

// SessionOut is one session in GET /grid/sessions.
type SessionOut struct {
	ID      string `json:"id"`
	Pool    string `json:"pool"`
	Version string `json:"version,omitempty"`
	Worker  string `json:"worker"`
	// State: pending (claimed, not yet seen by its agent), live, ending.
	State string `json:"state"`
	// Instance is the Caddy that claimed it ("": its agent reported it
	// after Redis lost its record).
	Instance string    `json:"instance,omitempty"`
	Client   string    `json:"client_hash,omitempty"`
	Label    string    `json:"label,omitempty"`
	Started  time.Time `json:"started"`
	AgeMS    int64     `json:"age_ms"`
	// IdleMS is how long no data frame has passed, as its agent last
	// reported (at most a heartbeat ago).
	IdleMS int64 `json:"idle_ms"`
}

// SessionsPage is GET /grid/sessions.
type SessionsPage struct {
	Sessions []SessionOut `json:"sessions"`
	// Next is the cursor of the next page, "" after the last.
	Next string `json:"next,omitempty"`
}

func serveAdmin(w http.ResponseWriter, r *http.Request) error {
	app := currentApp()
	if app == nil {
		return caddy.APIError{HTTPStatus: http.StatusServiceUnavailable, Err: errors.New("no grid app is running")}
	}
	ctx, cancel := context.WithTimeout(r.Context(), adminTimeout)
	defer cancel()
	parts := strings.Split(strings.Trim(strings.TrimPrefix(r.URL.Path, "/grid/"), "/"), "/")
	method := r.Method
	var out any
	var err error
	switch {
	case parts[0] == "pools" && len(parts) == 1 && method == http.MethodGet:
		out, err = app.pools(ctx)
	case parts[0] == "pools" && len(parts) == 2 && method == http.MethodGet:
		out, err = app.pool(ctx, parts[1])
	case parts[0] == "pools" && len(parts) == 3 && parts[2] == "pick" && method == http.MethodGet:
		out, err = app.pick(ctx, parts[1], r.URL.Query().Get("version"))
	case parts[0] == "pools" && len(parts) == 5 && parts[2] == "workers" && parts[4] == "drain" && method == http.MethodPost:
		out, err = app.drain(ctx, parts[1], parts[3])
	case parts[0] == "sessions" && len(parts) == 1 && method == http.MethodGet:
		out, err = app.sessionsPage(ctx, r.URL.Query().Get("pool"), r.URL.Query().Get("cursor"))
	case parts[0] == "sessions" && len(parts) == 2 && method == http.MethodGet:
		out, err = app.session(ctx, parts[1])
	case parts[0] == "sessions" && len(parts) == 2 && method == http.MethodDelete:
		out, err = app.endSession(ctx, parts[1])
	default:
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("no grid route %s %s", method, r.URL.Path)}
	}
	if err != nil {
		var ae caddy.APIError
		if errors.As(err, &ae) {
			return ae
		}
		return caddy.APIError{HTTPStatus: http.StatusServiceUnavailable, Err: err}
	}
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}

func notFound(format string, args ...any) error {
	return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf(format, args...)}
}

func badRequest(err error) error { return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: err} }

func (a *App) summary(ctx context.Context, pool string) (PoolSummary, []registry.GroupInfo, error) {
	infos, vs, err := a.backend.reg.InspectPool(ctx, pool)
	if err != nil {
		return PoolSummary{}, nil, err
	}
	depth, oldest := a.backend.queue(pool).poolState()
	s := PoolSummary{Pool: pool, Versions: vs.Versions, QueueDepth: depth, OldestWaitMS: oldest.Milliseconds(),
		LocalSessions: a.backend.sessions.count(pool)}
	conf := a.configured(pool)
	for _, gi := range infos {
		for _, w := range gi.Workers {
			s.Workers++
			s.Active += w.Active
			if workerStatus(w, gi.Now, time.Duration(a.StaleThreshold)) != "available" {
				if w.Status != "available" {
					s.Leaving++
				}
				continue
			}
			s.Available++
			mc := 0
			if conf != nil {
				mc = conf.MaxConcurrent
			}
			if c := effectiveCap(w.Record.Capacity, mc); c > 0 {
				s.Capacity += c
			} else {
				s.Uncapped++
			}
		}
	}
	return s, infos, nil
}

// effectiveCap is the smaller of a worker's capacity and max_concurrent,
// ignoring either when 0.
func effectiveCap(capacity, mc int) int {
	switch {
	case capacity > 0 && mc > 0:
		return min(capacity, mc)
	case capacity > 0:
		return capacity
	}
	return mc
}

func workerStatus(w registry.WorkerInfo, now time.Time, stale time.Duration) string {
	if stale > 0 && now.Sub(w.LastHeartbeat) > stale {
		return "stale"
	}
	return w.Status
}

// knownPools are the directory's pools and those this config names.
func (a *App) knownPools(ctx context.Context) ([]string, error) {
	pools, err := a.backend.reg.Pools(ctx)
	if err != nil {
		return nil, err
	}
	a.mu.Lock()
	for p := range a.routes {
		if !slices.Contains(pools, p) {
			pools = append(pools, p)
		}
	}
	a.mu.Unlock()
	slices.Sort(pools)
	return pools, nil
}

func (a *App) pools(ctx context.Context) ([]PoolSummary, error) {
	pools, err := a.knownPools(ctx)
	if err != nil {
		return nil, err
	}
	out := []PoolSummary{}
	for _, p := range pools {
		s, _, err := a.summary(ctx, p)
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, nil
}

// checkPoolName refuses, with 400, what is no pool's name: a version
// group's name too ("chromium@1.65"), since a pool's routes cover its
// version groups themselves.
func checkPoolName(pool string) error {
	if err := registry.CheckPool(pool); err != nil || strings.Contains(pool, "@") {
		return badRequest(fmt.Errorf("invalid pool name %q", pool))
	}
	return nil
}

func (a *App) pool(ctx context.Context, pool string) (*PoolDetail, error) {
	if err := checkPoolName(pool); err != nil {
		return nil, err
	}
	s, infos, err := a.summary(ctx, pool)
	if err != nil {
		return nil, err
	}
	d := &PoolDetail{PoolSummary: s, Configured: a.configured(pool), Workers: []WorkerStatus{}}
	if s.Workers == 0 && d.Configured == nil {
		return nil, notFound("pool %q has no workers and this configuration does not name it", pool)
	}
	for _, gi := range infos {
		_, v := registry.SplitGroup(gi.Group)
		d.Groups = append(d.Groups, GroupRetiring{Version: v, Retiring: append([]string{}, gi.Retiring...)})
		for _, b := range gi.BadRecords {
			d.BadRecords = append(d.BadRecords, BadRecordOut{ID: b.ID, Error: b.Error})
		}
		for _, w := range gi.Workers {
			d.Workers = append(d.Workers, workerOut(w, gi.Now, time.Duration(a.StaleThreshold)))
			if _, r := a.dial.check(ctx, &w.Record); r != nil {
				d.BadRecords = append(d.BadRecords, BadRecordOut{ID: w.ID, Error: r.reason + ": " + r.err.Error()})
			}
		}
	}
	return d, nil
}

func workerOut(w registry.WorkerInfo, now time.Time, stale time.Duration) WorkerStatus {
	age := now.Sub(w.LastHeartbeat)
	out := WorkerStatus{
		ID: w.ID, Version: w.Version, Addr: w.Addr, Path: w.Path, Launcher: w.Launcher,
		Status: workerStatus(w, now, stale), Active: w.Active, Lifetime: w.Lifetime, Capacity: w.Record.Capacity,
		HeartbeatAge: age.Round(time.Millisecond).String(), HeartbeatAgeMS: age.Milliseconds(),
		Held: w.Hold, Video: w.Video, Registered: time.UnixMilli(w.Registered),
	}
	if w.SuspectUntil.After(now) {
		out.SuspectUntil = w.SuspectUntil.Format(time.RFC3339Nano)
	}
	return out
}

// PickResult is GET /grid/pools/{pool}/pick.
type PickResult struct {
	Pool    string        `json:"pool"`
	Policy  string        `json:"policy"`
	Version string        `json:"version,omitempty"`
	Worker  *WorkerStatus `json:"worker"`
	Scanned int           `json:"scanned"`
	Stale   []string      `json:"stale,omitempty"`
}

func (a *App) pick(ctx context.Context, pool, version string) (*PickResult, error) {
	if err := checkPoolName(pool); err != nil {
		return nil, err
	}
	conf := a.route(pool)
	res := &PickResult{Pool: pool, Policy: string(conf.policy)}
	vs, err := a.backend.reg.Versions(ctx, pool)
	if err != nil {
		return nil, err
	}
	groups := vs.Groups(pool)
	if version != "" {
		if err := registry.CheckVersion(version); err != nil {
			return nil, badRequest(err)
		}
		groups = []string{registry.GroupPool(pool, version)}
	}
	for _, g := range groups {
		c, info, err := a.backend.reg.Pick(ctx, registry.ClaimRequest{
			Group: g, Policy: conf.policy, Options: conf.options, Limits: conf.limits.Limits,
			StaleAfter: time.Duration(a.StaleThreshold), MaxScan: DefaultMaxScan,
		})
		res.Scanned += info.Scanned
		res.Stale = append(res.Stale, info.Stale...)
		if errors.Is(err, registry.ErrNoWorker) {
			continue
		}
		if err != nil {
			return nil, err
		}
		gi, err := a.backend.reg.Inspect(ctx, g)
		if err != nil {
			return nil, err
		}
		for _, w := range gi.Workers {
			if w.ID == c.Worker.ID {
				ws := workerOut(w, gi.Now, time.Duration(a.StaleThreshold))
				res.Worker = &ws
			}
		}
		_, res.Version = registry.SplitGroup(g)
		return res, nil
	}
	return res, nil
}

func (a *App) drain(ctx context.Context, pool, id string) (map[string]string, error) {
	if err := checkPoolName(pool); err != nil {
		return nil, err
	}
	vs, err := a.backend.reg.Versions(ctx, pool)
	if err != nil {
		return nil, err
	}
	groups := append([]string{pool}, vs.Groups(pool)...)
	for _, g := range groups {
		ok, err := a.backend.reg.Drain(ctx, g, id)
		if err != nil {
			return nil, err
		}
		if ok {
			return map[string]string{"pool": pool, "worker_id": id, "status": "draining"}, nil
		}
	}
	return nil, notFound("worker %q is not registered in pool %q", id, pool)
}

func sessionOut(s registry.Session, now time.Time) SessionOut {
	return SessionOut{ID: s.ID, Pool: s.Pool, Version: s.Version, Worker: s.Worker, State: s.State, Instance: s.Instance,
		Client: s.Client, Label: s.Label, Started: s.Claimed, AgeMS: now.Sub(s.Claimed).Milliseconds(),
		IdleMS: max(0, now.Sub(s.Active).Milliseconds())}
}

// sessionsPage lists sessions a page at a time. The cursor is
// "<pool index>.<Redis cursor>" over the pools in order.
func (a *App) sessionsPage(ctx context.Context, pool, cursor string) (*SessionsPage, error) {
	pools := []string{pool}
	if pool == "" {
		var err error
		if pools, err = a.knownPools(ctx); err != nil {
			return nil, err
		}
	} else if err := registry.CheckPool(pool); err != nil {
		return nil, badRequest(err)
	}
	pi, rc := 0, uint64(0)
	if cursor != "" {
		p, c, ok := strings.Cut(cursor, ".")
		var err1, err2 error
		pi, err1 = strconv.Atoi(p)
		rc, err2 = strconv.ParseUint(c, 10, 64)
		if !ok || err1 != nil || err2 != nil || pi < 0 || pi >= len(pools) {
			return nil, badRequest(fmt.Errorf("invalid cursor %q", cursor))
		}
	}
	out := &SessionsPage{Sessions: []SessionOut{}}
	now := time.Now()
	for pi < len(pools) && len(out.Sessions) < 100 {
		ss, next, err := a.backend.reg.Sessions(ctx, pools[pi], rc, 100)
		if err != nil {
			return nil, err
		}
		for _, s := range ss {
			out.Sessions = append(out.Sessions, sessionOut(s, now))
		}
		if next == 0 {
			pi, rc = pi+1, 0
		} else {
			rc = next
		}
	}
	if pi < len(pools) {
		out.Next = strconv.Itoa(pi) + "." + strconv.FormatUint(rc, 10)
	}
	return out, nil
}

// findSession looks a session up in every pool.
func (a *App) findSession(ctx context.Context, id string) (registry.Session, error) {
	if registry.CheckID(id) != nil {
		return registry.Session{}, notFound("no session %q", id)
	}
	pools, err := a.knownPools(ctx)
	if err != nil {
		return registry.Session{}, err
	}
	for _, p := range pools {
		s, ok, err := a.backend.reg.GetSession(ctx, p, id)
		if err != nil {
			return registry.Session{}, err
		}
		if ok {
			return s, nil
		}
	}
	return registry.Session{}, notFound("no session %q", id)
}

func (a *App) session(ctx context.Context, id string) (*SessionOut, error) {
	s, err := a.findSession(ctx, id)
	if err != nil {
		return nil, err
	}
	out := sessionOut(s, time.Now())
	return &out, nil
}

// endSession ends a session wherever it runs: its agent closes it with a
// close frame, "ended by the operator".
func (a *App) endSession(ctx context.Context, id string) (map[string]string, error) {
	s, err := a.findSession(ctx, id)
	if err != nil {
		return nil, err
	}
	ok, err := a.backend.reg.EndSession(ctx, s.Pool, id, 1000, "ended by the operator")
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, notFound("no session %q", id)
	}
	return map[string]string{"session": id, "pool": s.Pool, "worker": s.Worker, "status": "ending"}, nil
}
