// Package workeragent is the worker agent, grid-worker, that runs beside
// each browser and fronts it: every session's connection passes through
// it on its way to the browser, so it knows for certain what its browser
// holds and has served. It launches the browser, registers it, holds the
// limits each claim carries, reports its sessions to Redis, drains it and
// starts the next one (docs/design.md).
//
// cmd/grid-worker is its thin main.
package workeragent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/browsergrid/caddy-browser-grid/registry"
)

// How long a single Redis call may take.
const redisCallTimeout = 5 * time.Second

// stopGrace is how long a browser gets to close itself before SIGKILL.
const stopGrace = 5 * time.Second

// StopMargin is how much longer than DrainTimeout a stop on SIGTERM takes
// at most: the records' removal and the browsers' close. A supervisor
// must give the agent more than DrainTimeout + StopMargin before SIGKILL.
const StopMargin = 10 * time.Second

// Agent runs the browsers of one worker slot: one serving, and while its
// replacement starts serving, the one it replaces draining. Never more.
type Agent struct {
	cfg     Config
	log     *zap.Logger
	rdb     redis.UniversalClient
	reg     *registry.Registry
	launch  LaunchFunc
	secret  []byte
	metrics *agentMetrics
	reports *reports
	// logLimit spaces out the warnings of failing Redis calls.
	logLimit rateLimit
	front    *front
	addr     string // what proxies dial

	// events carries what the Run loop acts on; only it changes current
	// and old.
	events chan event
	abort  chan struct{}
	once   sync.Once

	mu      sync.Mutex
	current *worker // serving
	old     *worker // draining, replaced by current
	// joining is the browser being registered: its record is claimable
	// in Redis before Register returns, so a claim may reach it first.
	joining *worker
	// departed are the records of browsers this agent closed lately: a
	// Redis brought back from an older snapshot brings them back too,
	// with nothing behind them (forgetDeparted).
	departed []departure
	// chans is signalled when the set of workers, and so of command
	// channels, changes.
	chans chan struct{}
}

type eventKind int

const (
	evRetire  eventKind = iota // a worker takes no more sessions
	evCrash                    // its browser exited or stopped answering
	evDrained                  // a retiring worker holds no session, or its drain timed out
	evStarted                  // a browser launched (or failed to)
	evLaunch                   // time to launch one
)

type event struct {
	kind eventKind
	wk   *worker
	b    *Browser // evStarted
	err  error
	why  string
}

// New checks what the agent needs before anything starts: the Redis URL
// parses, the launcher's files exist.
func New(cfg Config, log *zap.Logger) (*Agent, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	rdb, err := registry.NewClient(cfg.RedisURL)
	if err != nil {
		return nil, fmt.Errorf("-redis %s: %w", registry.RedactURL(cfg.RedisURL), err)
	}
	launch, err := NewLauncher(cfg, log)
	if err != nil {
		rdb.Close()
		return nil, err
	}
	a := &Agent{
		cfg: cfg, log: log, rdb: rdb, launch: launch,
		reg:     registry.New(rdb, registry.Options{Prefix: cfg.KeyPrefix}),
		metrics: newAgentMetrics(),
		events:  make(chan event, 16), abort: make(chan struct{}), chans: make(chan struct{}, 1),
		logLimit: rateLimit{period: 10 * time.Second},
	}
	if cfg.WorkerSecret != "" {
		a.secret = []byte(cfg.WorkerSecret)
	}
	a.reports = newReports(a)
	return a, nil
}

// Abort ends a drain at once (a second SIGTERM): the sessions left are
// closed.
func (a *Agent) Abort() { a.once.Do(func() { close(a.abort) }) }

// Addr is the address proxies dial, once Run listens.
func (a *Agent) Addr() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.addr
}

func (a *Agent) post(ev event) {
	select {
	case a.events <- ev:
	default:
		go func() { a.events <- ev }()
	}
}

// find returns the worker of a ticket, and whether it is the serving one
// while a replaced one still drains (held: it may not take its last
// session).
func (a *Agent) find(id string) (wk *worker, held bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	switch {
	case a.current != nil && a.current.rec.ID == id:
		return a.current, a.old != nil
	case a.old != nil && a.old.rec.ID == id:
		return a.old, false
	case a.joining != nil && a.joining.rec.ID == id:
		return a.joining, a.current != nil && a.current.isRetiring()
	}
	return nil, false
}

// workers lists the agent's workers with whether each is held.
func (a *Agent) workers() []*worker {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []*worker
	for _, w := range []*worker{a.current, a.old} {
		if w != nil {
			out = append(out, w)
		}
	}
	return out
}

func (a *Agent) held(wk *worker) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return wk == a.current && a.old != nil
}

// retiring tells the Run loop that wk takes no more sessions.
func (a *Agent) retiring(wk *worker, why string) { a.post(event{kind: evRetire, wk: wk, why: why}) }

func (a *Agent) ready() bool {
	a.mu.Lock()
	cur := a.current
	a.mu.Unlock()
	return cur != nil && !cur.isRetiring()
}

// Run runs browsers until ctx ends (SIGTERM: drain, then return nil) or,
// without Respawn, until the first browser has drained (nil) or crashed
// (an error).
func (a *Agent) Run(ctx context.Context) error {
	defer a.rdb.Close()
	if err := a.connect(ctx); err != nil {
		if ctx.Err() != nil {
			a.log.Info("stopping before Redis answered; nothing was registered")
			return nil
		}
		return err
	}
	if err := a.listen(); err != nil {
		return err
	}
	bg, stopBG := context.WithCancel(context.Background())
	defer stopBG()
	go a.front.serve(bg)
	go a.reports.run(bg)
	go a.subscribe(bg)

	const firstBackoff = time.Second
	backoff := firstBackoff
	launching := false
	var launches sync.WaitGroup
	launch := func() {
		launching = true
		launches.Go(func() {
			a.log.Info("launching a browser", zap.String("launcher", a.cfg.Launcher), zap.String("browser_type", a.cfg.BrowserType))
			b, err := a.launch(ctx)
			if err == nil && ctx.Err() != nil {
				// the agent stops: this browser will not serve
				_ = b.Stop(stopGrace)
				return
			}
			a.post(event{kind: evStarted, err: err, b: b})
		})
	}
	launch()
	for {
		select {
		case <-ctx.Done():
			launches.Wait()
			for len(a.events) > 0 {
				if ev := <-a.events; ev.kind == evStarted && ev.b != nil {
					_ = ev.b.Stop(stopGrace)
				}
			}
			return a.shutdown()
		case ev := <-a.events:
			switch ev.kind {
			case evLaunch:
				if !launching {
					launch()
				}
			case evStarted:
				launching = false
				if ev.err != nil {
					if ctx.Err() != nil {
						continue
					}
					if !a.cfg.Respawn && a.current == nil && a.old == nil {
						return fmt.Errorf("launching the browser (%s launcher): %w", a.cfg.Launcher, ev.err)
					}
					a.log.Warn("launching the browser failed; trying again after backoff", zap.Error(ev.err), zap.Duration("backoff", backoff))
					time.AfterFunc(backoff, func() { a.post(event{kind: evLaunch}) })
					backoff = min(2*backoff, a.cfg.RespawnMaxBackoff)
					continue
				}
				if err := a.install(ev.b); err != nil {
					a.log.Warn("registering the browser failed; trying again after backoff", zap.Error(err), zap.Duration("backoff", backoff))
					_ = ev.b.Stop(stopGrace)
					time.AfterFunc(backoff, func() { a.post(event{kind: evLaunch}) })
					backoff = min(2*backoff, a.cfg.RespawnMaxBackoff)
					continue
				}
				backoff = firstBackoff
			case evRetire:
				a.mu.Lock()
				cur := a.current
				a.mu.Unlock()
				if ev.wk != cur || cur == nil {
					continue
				}
				a.log.Info("the browser retires", zap.String("worker_id", cur.rec.ID), zap.String("why", ev.why))
				cur.retire(registry.Draining)
				a.reports.beat()
				if !a.cfg.Respawn {
					go a.watchDrain(cur)
					continue
				}
				if a.old == nil && !launching {
					launch()
				}
			case evDrained:
				if done := a.drained(ev.wk); done {
					return nil
				}
				a.mu.Lock()
				cur := a.current
				a.mu.Unlock()
				if a.cfg.Respawn && cur != nil && cur.isRetiring() && !launching {
					launch()
				}
			case evCrash:
				if a.gone(ev.wk, ev.err) {
					if ctx.Err() != nil {
						return a.shutdown()
					}
					if !a.cfg.Respawn {
						return fmt.Errorf("the browser went down: %w", ev.err)
					}
					a.log.Warn("browser down; relaunching after backoff", zap.Error(ev.err), zap.Duration("backoff", backoff))
					time.AfterFunc(backoff, func() { a.post(event{kind: evLaunch}) })
					backoff = min(2*backoff, a.cfg.RespawnMaxBackoff)
				}
			}
		}
	}
}

// install registers a launched browser as the serving worker; the one it
// replaces, when the serving one retires, goes on draining.
func (a *Agent) install(b *Browser) error {
	backend := dialAddr(b.Endpoint)
	path := b.Endpoint.EscapedPath()
	if path == "" {
		path = "/"
	}
	rec := registry.NewRecord(registry.Record{
		ID: NewID(a.cfg.IDPrefix), Pool: a.cfg.Pool, Version: b.PlaywrightVersion, Browser: a.cfg.BrowserType,
		Addr: a.addr, Path: path, Capacity: a.cfg.MaxConcurrent, Weight: a.cfg.Weight, Launcher: a.cfg.Launcher, Video: b.Video,
	}, a.cfg.VirtualNodes, a.secret)
	wk := newWorker(rec, b, backend)
	a.mu.Lock()
	prev := a.current
	replaces := ""
	if prev != nil && prev.isRetiring() {
		replaces = prev.rec.ID
	}
	a.joining = wk
	a.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), redisCallTimeout)
	defer cancel()
	err := a.reg.Register(ctx, rec, wk.state(replaces != ""), replaces)
	a.mu.Lock()
	a.joining = nil
	if err != nil {
		a.mu.Unlock()
		return err
	}
	if replaces != "" {
		prev.retire(registry.Replaced)
		a.old = prev
	}
	a.current = wk
	a.mu.Unlock()
	a.signalChans()
	a.metrics.browsers.Set(float64(len(a.workers())))
	a.log.Info("browser registered", zap.String("worker_id", rec.ID), zap.String("pool", rec.Group()),
		zap.String("addr", rec.Addr), zap.String("browser", backend), zap.String("replaces", replaces))
	go a.watch(wk)
	if replaces != "" {
		go a.watchDrain(prev)
	}
	a.reports.beat()
	return nil
}

// watch posts evCrash when the browser exits or fails ProbeFailures
// probes in a row, and retires it when its temporary files pass DiskMax.
func (a *Agent) watch(wk *worker) {
	failures := 0
	tick := time.NewTicker(a.cfg.HeartbeatInterval)
	defer tick.Stop()
	for {
		select {
		case <-wk.removed:
			return
		case <-wk.proc.Done():
			a.post(event{kind: evCrash, wk: wk, err: fmt.Errorf("the browser process exited: %v; its last output:\n%s", wk.proc.ExitError(), wk.proc.Output())})
			return
		case <-tick.C:
			if d := wk.proc.Dir; d != "" && a.cfg.DiskMax > 0 && !wk.isRetiring() {
				if n := diskUse(d); n > a.cfg.DiskMax {
					a.retiring(wk, fmt.Sprintf("its temporary files (videos, traces, downloads) take %d MB, past -disk-max", n>>20))
				}
			}
			if a.cfg.ProbeTimeout <= 0 {
				continue
			}
			if err := wk.proc.Probe(context.Background(), a.cfg.ProbeTimeout); err != nil {
				failures++
				a.log.Warn("the browser did not answer its probe", zap.String("worker_id", wk.rec.ID), zap.Int("failures", failures), zap.Error(err))
				if failures >= a.cfg.ProbeFailures {
					a.post(event{kind: evCrash, wk: wk, err: fmt.Errorf("the browser failed %d probes in a row: %w", failures, err)})
					return
				}
			} else {
				failures = 0
			}
		}
	}
}

// watchDrain posts evDrained once a retiring worker holds no session, or
// its drain timed out, or Abort was called.
func (a *Agent) watchDrain(wk *worker) {
	t := time.NewTimer(a.cfg.DrainTimeout)
	defer t.Stop()
	select {
	case <-wk.drained:
	case <-t.C:
	case <-a.abort:
	}
	a.post(event{kind: evDrained, wk: wk})
}

// drained closes a retiring worker that drained: its sessions left (a
// drain past its timeout) end with a close frame, its record goes, its
// browser stops. It reports whether the agent is done (no Respawn).
func (a *Agent) drained(wk *worker) bool {
	if n := wk.endSessions(func(*session) bool { return true }, CloseGoingAway, "drain_timeout",
		"the browser is restarting and the session outlasted the worker's drain timeout"); n > 0 {
		a.log.Warn("drain timed out; closing the sessions left", zap.String("worker_id", wk.rec.ID), zap.Int("sessions", n))
	}
	a.remove(wk)
	a.mu.Lock()
	last := a.current == nil && a.old == nil
	a.mu.Unlock()
	return !a.cfg.Respawn && last
}

// gone removes a worker whose browser crashed; it reports whether it was
// the serving one.
func (a *Agent) gone(wk *worker, err error) bool {
	a.mu.Lock()
	serving, known := wk == a.current, wk == a.current || wk == a.old
	a.mu.Unlock()
	if !known {
		return false // removed already
	}
	a.log.Error("the browser is down; removing its record", zap.String("worker_id", wk.rec.ID), zap.Error(err))
	wk.endSessions(func(*session) bool { return true }, CloseGoingAway, "crash", "the worker's browser went down")
	a.remove(wk)
	return serving
}

// remove deregisters a worker, stops its browser and forgets it.
func (a *Agent) remove(wk *worker) {
	wk.removedOnce.Do(func() { close(wk.removed) })
	a.mu.Lock()
	switch wk {
	case a.current:
		a.current = nil
	case a.old:
		a.old = nil
	}
	a.mu.Unlock()
	a.signalChans()
	a.reports.flush() // its ends first: the record's removal drops what is left
	ctx, cancel := context.WithTimeout(context.Background(), redisCallTimeout)
	if err := a.reg.Deregister(ctx, wk.rec.Group(), wk.rec.ID); err != nil {
		a.log.Warn("removing the record; the reaper will", zap.String("worker_id", wk.rec.ID), zap.Error(err))
	}
	cancel()
	if err := wk.proc.Stop(stopGrace); err != nil {
		a.log.Error("stopping the browser", zap.String("worker_id", wk.rec.ID), zap.Error(err))
	}
	a.metrics.browsers.Set(float64(len(a.workers())))
	a.mu.Lock()
	a.departed = append(a.departed, departure{group: wk.rec.Group(), id: wk.rec.ID, at: time.Now()})
	if len(a.departed) > maxDeparted {
		a.departed = a.departed[len(a.departed)-maxDeparted:]
	}
	a.mu.Unlock()
	a.log.Info("browser closed and deregistered", zap.String("worker_id", wk.rec.ID))
	a.reports.beat() // the replacement's hold ends
}

// departure is a browser the agent closed and deregistered.
type departure struct {
	group, id string
	at        time.Time
}

// maxDeparted and departedFor bound what forgetDeparted removes again:
// the records an older snapshot of Redis can bring back.
const (
	maxDeparted = 16
	departedFor = 5 * time.Minute
)

// forgetDeparted removes again the records of the browsers this agent
// closed lately, when its Redis connection comes back: a Redis restored
// from a snapshot older than their departure holds them, with sessions
// no browser serves, until they turn stale.
func (a *Agent) forgetDeparted() {
	a.mu.Lock()
	var ds []departure
	for _, d := range a.departed {
		if time.Since(d.at) < departedFor {
			ds = append(ds, d)
		}
	}
	a.departed = ds
	a.mu.Unlock()
	for _, d := range ds {
		// a Redis still loading its snapshot answers LOADING for a moment
		for try := 0; try < 10; try++ {
			ctx, cancel := context.WithTimeout(context.Background(), redisCallTimeout)
			err := a.reg.Deregister(ctx, d.group, d.id)
			cancel()
			if err == nil {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
}

// shutdown drains every browser (SIGTERM) up to DrainTimeout, closes the
// sessions left, and removes the records.
func (a *Agent) shutdown() error {
	ws := a.workers()
	for _, wk := range ws {
		wk.retire(registry.Draining)
	}
	a.log.Info("draining on the signal", zap.Int("browsers", len(ws)), zap.Duration("drain_timeout", a.cfg.DrainTimeout))
	a.reports.flush()
	a.reports.heartbeatAll()
	t := time.NewTimer(a.cfg.DrainTimeout)
	defer t.Stop()
	for _, wk := range ws {
		select {
		case <-wk.drained:
		case <-t.C:
		case <-a.abort:
		}
	}
	for _, wk := range ws {
		wk.endSessions(func(*session) bool { return true }, CloseGoingAway, "shutdown", "the worker is shutting down")
		a.remove(wk)
	}
	return nil
}

// connect pings Redis until it answers, up to RedisRetryAttempts tries
// with a doubling delay.
func (a *Agent) connect(ctx context.Context) error {
	delay := a.cfg.RedisRetryDelay
	var err error
	for attempt := 1; attempt <= a.cfg.RedisRetryAttempts; attempt++ {
		cctx, cancel := context.WithTimeout(ctx, redisCallTimeout)
		err = a.rdb.Ping(cctx).Err()
		cancel()
		if err == nil {
			a.log.Info("connected to redis", zap.String("redis", registry.RedactURL(a.cfg.RedisURL)), zap.Int("attempt", attempt))
			return nil
		}
		if ctx.Err() != nil || attempt == a.cfg.RedisRetryAttempts {
			break
		}
		a.log.Warn("redis not reachable; retrying", zap.String("redis", registry.RedactURL(a.cfg.RedisURL)),
			zap.Int("attempt", attempt), zap.Duration("retry_in", delay), zap.Error(err))
		select {
		case <-time.After(delay):
		case <-ctx.Done():
		}
		delay = min(2*delay, 5*time.Second)
	}
	return fmt.Errorf("connecting to redis at %s: no answer after %d attempts: %w",
		registry.RedactURL(a.cfg.RedisURL), a.cfg.RedisRetryAttempts, err)
}

// listen opens the agent's listener and works out the address proxies
// dial.
func (a *Agent) listen() error {
	ln, err := listenFront(net.JoinHostPort(a.cfg.Host, strconv.Itoa(a.cfg.Port)), a.cfg.ProxyTimeout)
	if err != nil {
		return fmt.Errorf("listening for proxies on %s:%d: %w", a.cfg.Host, a.cfg.Port, err)
	}
	a.front = &front{a: a, ln: ln, srv: &http.Server{ReadHeaderTimeout: 10 * time.Second, ErrorLog: nil}}
	a.front.srv.Handler = a.front
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	host := a.cfg.Host
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		if h, err := os.Hostname(); err == nil && h != "" {
			host = h
		}
	}
	if adv := a.cfg.Advertise; adv != "" {
		if h, p, err := splitAdvertise(adv); err == nil {
			host = h
			if p != "" {
				port = p
			}
		}
	}
	a.mu.Lock()
	a.addr = net.JoinHostPort(host, port)
	a.mu.Unlock()
	warnOutsideDialPolicy(a.log, a.addr)
	a.log.Info("listening for proxies", zap.String("listen", ln.Addr().String()), zap.String("advertise", a.addr))
	return nil
}

// NewID returns a worker ID unique per browser: <prefix>-<pid>-<random>.
func NewID(prefix string) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return idPrefix(prefix) + "-" + strconv.Itoa(os.Getpid()) + "-" + hex.EncodeToString(b[:])
}

// idPrefix is the start of worker IDs: the hostname when prefix is empty.
func idPrefix(prefix string) string {
	if prefix == "" {
		prefix, _ = os.Hostname()
		if prefix == "" {
			prefix = "worker"
		}
	}
	return prefix
}

// warnOutsideDialPolicy warns when Caddy's default dial policy would
// refuse the advertised address.
func warnOutsideDialPolicy(log *zap.Logger, addr string) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return
	}
	switch ip := net.ParseIP(host); {
	case ip == nil:
		log.Warn("advertising a host name: Caddy dials it only with the grid option allow_worker_hostnames; advertise an IP (-advertise) otherwise", zap.String("addr", addr))
	case !ip.IsLoopback() && !ip.IsPrivate():
		log.Warn("advertised address is outside Caddy's default worker_networks (loopback and private ranges); Caddy dials it only when worker_networks names it", zap.String("addr", addr))
	}
}

// BrowserStatus is one browser as /status shows it.
type BrowserStatus struct {
	ID       string   `json:"id"`
	Pool     string   `json:"pool"`
	Backend  string   `json:"backend"`
	Status   string   `json:"status"`
	Active   int      `json:"active"`
	Lifetime int      `json:"lifetime"`
	Sessions []string `json:"sessions"`
}

// AgentStatus is what /status answers.
type AgentStatus struct {
	Addr     string          `json:"addr"`
	Browsers []BrowserStatus `json:"browsers"`
}

func (a *Agent) status() AgentStatus {
	out := AgentStatus{Addr: a.Addr(), Browsers: []BrowserStatus{}}
	for _, wk := range a.workers() {
		st := wk.state(false)
		out.Browsers = append(out.Browsers, BrowserStatus{ID: wk.rec.ID, Pool: wk.rec.Group(), Backend: wk.backend,
			Status: statusWords[st.Status], Active: len(st.Sessions), Lifetime: st.Lifetime, Sessions: sessionIDs(st.Sessions)})
	}
	return out
}

var statusWords = map[registry.Status]string{registry.Serving: "serving", registry.Draining: "draining", registry.Replaced: "replaced"}

// errNoRedis marks a report that could not reach Redis.
var errNoRedis = errors.New("redis unreachable")

func sessionIDs(ss []registry.LiveSession) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = s.ID
	}
	return out
}
