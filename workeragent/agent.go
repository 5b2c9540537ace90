// Package workeragent is the worker agent that runs beside each browser
// (the worker lifecycle: register, heartbeat, drain, reap): it launches a browser server, connects
// to Redis with retries, registers the browser in the grid's registry,
// heartbeats and reads its command in the same round trip, drains on the
// shutdown command or SIGTERM, then deregisters and closes the browser.
// It exits 0 after a drain for a supervisor to restart it, or with
// Respawn starts a fresh browser under a new worker ID itself, relaunching
// a crashed browser with a backoff that doubles from 1s (the failure-handling rules).
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
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/browsergrid/caddy-browser-grid/internal/sockets"
	"github.com/browsergrid/caddy-browser-grid/registry"
	"github.com/browsergrid/caddy-browser-grid/selection"
)

// How long a single Redis call may take before the agent moves on.
const redisCallTimeout = 5 * time.Second

// stopGrace is how long a browser gets to close itself before SIGKILL.
const stopGrace = 5 * time.Second

// deregisterBudget bounds all of a deregistration's attempts together.
const deregisterBudget = 3 * time.Second

// StopMargin is how much longer than DrainTimeout a stop on SIGTERM takes
// at most, whatever Redis does (answers, refuses, or holds every call):
// deregisterBudget, then stopGrace, and room to spare (a last attempt to
// remove the record gets a second of it). A supervisor must
// give the agent more than DrainTimeout + StopMargin before its SIGKILL.
//
// The stop's phases are cut at times counted from the signal (drainEnd,
// recordsEnd, browserGrace), not from when each phase starts: a Redis
// call in flight when the signal comes (it ends by its own timeout,
// redisCallTimeout, which is shorter than the margin), a second record to
// remove (a -respawn hand-over) or a late drain cannot add their times up
// past the bound. Calls are never abandoned in flight: one that landed
// after the drain or the deregistration began would register the worker
// available again.
const StopMargin = 10 * time.Second

// Agent runs the lifecycle of one worker slot: one browser at a time.
type Agent struct {
	cfg    Config
	log    *zap.Logger
	rdb    redis.UniversalClient
	reg    *registry.Registry
	launch LaunchFunc

	abort     chan struct{}
	abortOnce sync.Once

	// handover is the record of a drained browser that --respawn is
	// replacing: it stays registered as draining, heartbeated, until the
	// next browser has registered, so the pool sees one worker retiring
	// for the whole drain-and-restart (selection's StaggerDrains holds the
	// next worker's last session back meanwhile).
	handover *handover

	// recordLost is when this browser's record was last found gone and
	// registered again (zero: never). Redis may have lost the leases with
	// it (a restart, a failover, a restore from an older snapshot), and
	// they count again only once their proxies re-assert them: within one
	// lease TTL of it, a drain takes 0 active as drained only when the
	// browser has no live connection either (drainedAfterLoss). Used by
	// the life loop only.
	recordLost time.Time

	// signalled is when Run's ctx ended (nil before): the start of a
	// stop, from which its phases' deadlines are counted. It keeps its
	// monotonic reading: a step of the wall clock moves no deadline.
	signalled atomic.Pointer[time.Time]
}

// The stop's clock: after the signal the drain ends by DrainTimeout, the
// records are removed by deregisterBudget more and the browser is closed
// by stopGrace more, whatever ran late before. Before the signal (a
// drain for the shutdown command, a crash) each phase has its full time.

// stopAt is when the signal came (zero before it).
func (a *Agent) stopAt() time.Time {
	if t := a.signalled.Load(); t != nil {
		return *t
	}
	return time.Time{}
}

// bySignal is end, or the signal's time plus after when that is sooner.
func (a *Agent) bySignal(end time.Time, after time.Duration) time.Time {
	if s := a.stopAt(); !s.IsZero() && s.Add(after).Before(end) {
		return s.Add(after)
	}
	return end
}

// drainEnd is when a drain starting at start must end.
func (a *Agent) drainEnd(start time.Time) time.Time {
	return a.bySignal(start.Add(a.cfg.DrainTimeout), a.cfg.DrainTimeout)
}

// recordsEnd is when removing a record (every attempt) must end.
func (a *Agent) recordsEnd() time.Time {
	return a.bySignal(time.Now().Add(deregisterBudget), a.cfg.DrainTimeout+deregisterBudget)
}

// browserGrace is how long the browser may take to close before SIGKILL.
func (a *Agent) browserGrace() time.Duration {
	if s := a.stopAt(); !s.IsZero() {
		return min(stopGrace, max(0, time.Until(s.Add(a.cfg.DrainTimeout+deregisterBudget+stopGrace))))
	}
	return stopGrace
}

// drainedAfterLoss says whether a drain that reads 0 active may end,
// given the record's loss (Agent.recordLost): it may once the proxies had
// one lease TTL to re-assert their sessions, or at once when the browser
// has no established connection (none could be live). The connections are
// counted in the browser process's own network namespace, and only when a
// process of the browser's holds the listening socket of its port: a
// browser run elsewhere (an exec launcher's, in another container) may
// have its port published by another program that sees none of them. It
// returns what it found, for the log: the connections, or -1 when it
// cannot count them.
func (a *Agent) drainedAfterLoss(b *Browser) (bool, int) {
	if a.recordLost.IsZero() || time.Since(a.recordLost) >= a.cfg.LeaseTTL {
		return true, 0
	}
	_, p, _ := net.SplitHostPort(dialAddr(b.Endpoint))
	port, err := strconv.Atoi(p)
	if err != nil {
		return false, -1
	}
	ps, err := sockets.ReadPort(b.Pid, port)
	if err != nil || len(ps.Listening) == 0 {
		return false, -1
	}
	if owned, err := sockets.Owned(ps.Listening, b.Groups()); err != nil || !owned {
		return false, -1
	}
	return ps.Established == 0, ps.Established
}

type handover struct {
	log  *zap.Logger
	reg  registry.Registration
	stop context.CancelFunc
}

// New checks what the agent needs before anything starts: the Redis URL
// parses, the launcher's files exist. Errors mean bad configuration.
func New(cfg Config, log *zap.Logger) (*Agent, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	for _, w := range cfg.Warnings() {
		log.Warn(w)
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
	return &Agent{
		cfg:    cfg,
		log:    log,
		rdb:    rdb,
		reg:    registry.New(rdb, registry.Options{Prefix: cfg.KeyPrefix, CommandTTL: cfg.CommandTTL}),
		launch: launch,
		abort:  make(chan struct{}),
	}, nil
}

// Abort stops a drain in progress without waiting for its sessions (a
// second SIGTERM): the agent deregisters and closes the browser at once.
func (a *Agent) Abort() { a.abortOnce.Do(func() { close(a.abort) }) }

// lifeEnd says how one browser's life ended.
type lifeEnd int

const (
	endSignal  lifeEnd = iota // ctx ended: drained (or never started), the agent exits
	endDrained                // the shutdown command: drained
	endCrashed                // the browser exited, failed its probe, or did not start
)

// Run runs browsers until ctx ends (SIGTERM: drain, then return nil) or,
// without Respawn, until the first drain (nil) or crash (an error).
func (a *Agent) Run(ctx context.Context) error {
	defer a.rdb.Close()
	if err := a.connect(ctx); err != nil {
		if ctx.Err() != nil {
			// A signal while Redis was still away: nothing was launched
			// or registered, so there is nothing to drain.
			a.log.Info("stopping before Redis answered; nothing was registered")
			return nil
		}
		return err
	}
	ran := make(chan struct{})
	defer close(ran)
	go func() {
		select {
		case <-ctx.Done():
			t := time.Now()
			a.signalled.Store(&t)
		case <-ran:
		}
	}()
	const firstBackoff = time.Second
	backoff := firstBackoff
	defer a.endHandover()
	for {
		started := time.Now()
		end, err := a.life(ctx)
		if end != endDrained {
			// No replacement follows right away: the old record must not
			// keep the pool's restart slot.
			a.endHandover()
		}
		switch end {
		case endSignal:
			return nil
		case endDrained:
			if !a.cfg.Respawn {
				a.log.Info("drained; exiting for the supervisor to restart the worker")
				return nil
			}
			if ctx.Err() != nil {
				// A signal came during the drain: no fresh browser.
				a.log.Info("drained; exiting on the signal received meanwhile")
				return nil
			}
			backoff = firstBackoff
			a.log.Info("drained; respawning a fresh browser")
			continue
		}
		// Crashed.
		if ctx.Err() != nil {
			// The signal came as the browser went down (it exited, or
			// failed its last probe, and the agent was removing its
			// record): the stop asked for is done, and a stop exits 0.
			a.log.Info("the browser went down as the signal came; exiting", zap.NamedError("browser", err))
			return nil
		}
		if !a.cfg.Respawn {
			return err
		}
		// A browser that ran longer than the cap was healthy: start over.
		if time.Since(started) > a.cfg.RespawnMaxBackoff {
			backoff = firstBackoff
		}
		a.log.Warn("browser down; relaunching after backoff", zap.Error(err), zap.Duration("backoff", backoff))
		t := time.NewTimer(backoff)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			a.log.Info("stopping while waiting to relaunch the browser")
			return nil
		}
		backoff = min(2*backoff, a.cfg.RespawnMaxBackoff)
	}
}

// connect pings Redis until it answers, up to RedisRetryAttempts tries
// with a doubling delay (the worker lifecycle: "If Redis isn't available, the worker
// retries").
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
		if ctx.Err() != nil {
			return fmt.Errorf("connecting to redis at %s: stopped: %w", registry.RedactURL(a.cfg.RedisURL), ctx.Err())
		}
		if attempt == a.cfg.RedisRetryAttempts {
			break
		}
		a.log.Warn("redis not reachable; retrying",
			zap.String("redis", registry.RedactURL(a.cfg.RedisURL)), zap.Int("attempt", attempt),
			zap.Int("attempts", a.cfg.RedisRetryAttempts), zap.Duration("retry_in", delay), zap.Error(err))
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("connecting to redis at %s: stopped: %w", registry.RedactURL(a.cfg.RedisURL), ctx.Err())
		}
		delay = min(2*delay, 5*time.Second)
	}
	return fmt.Errorf("connecting to redis at %s: no answer after %d attempts: %w",
		registry.RedactURL(a.cfg.RedisURL), a.cfg.RedisRetryAttempts, err)
}

// NewID returns a worker ID unique per launch: <prefix>-<pid>-<random>, so
// a respawned browser registers as a new worker.
func NewID(prefix string) string {
	prefix = idPrefix(prefix)
	var b [4]byte
	_, _ = rand.Read(b[:])
	return prefix + "-" + strconv.Itoa(os.Getpid()) + "-" + hex.EncodeToString(b[:])
}

// idPrefix is the start of the worker IDs made from -id-prefix: the
// hostname when it is empty.
func idPrefix(prefix string) string {
	if prefix == "" {
		prefix, _ = os.Hostname()
		if prefix == "" {
			prefix = "worker"
		}
	}
	return prefix
}

// advertised computes the host:port proxies dial for a browser endpoint.
func (a *Agent) advertised(b *Browser) string {
	host, port := b.Endpoint.Hostname(), b.Endpoint.Port()
	if port == "" {
		port = "80"
		if b.Endpoint.Scheme == "wss" {
			port = "443"
		}
	}
	if adv := a.cfg.Advertise; adv != "" {
		// checked by Validate
		if h, p, err := splitAdvertise(adv); err == nil {
			if p == "" {
				p = port
			}
			return net.JoinHostPort(h, p)
		}
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		if h, err := os.Hostname(); err == nil && h != "" {
			host = h
		}
	}
	return net.JoinHostPort(host, port)
}

// warnOutsideDialPolicy warns when Caddy's default dial policy would
// refuse the advertised address: a host name (dialed only with the grid's
// allow_worker_hostnames) or an IP outside loopback and the private
// ranges (dialed only when worker_networks names it).
func warnOutsideDialPolicy(log *zap.Logger, addr string) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return
	}
	ip := net.ParseIP(host)
	switch {
	case ip == nil:
		log.Warn("advertising a host name: Caddy dials it only with the grid option allow_worker_hostnames; advertise an IP (-advertise) otherwise",
			zap.String("addr", addr))
	case !ip.IsLoopback() && !ip.IsPrivate():
		log.Warn("advertised address is outside Caddy's default worker_networks (loopback and private ranges); Caddy dials it only when worker_networks names it",
			zap.String("addr", addr))
	}
}

// rctx is a context for one Redis call. It does not derive from Run's ctx:
// SIGTERM must not cut the calls that drain and deregister.
func rctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), redisCallTimeout)
}

// rctxBy is rctx cut short at end: a call made near a deadline (the
// drain's, the deregistration's) does not outlast it.
func rctxBy(end time.Time) (context.Context, context.CancelFunc) {
	if d := time.Now().Add(redisCallTimeout); d.Before(end) {
		end = d
	}
	return context.WithDeadline(context.Background(), end)
}

// life runs one browser from launch to exit.
func (a *Agent) life(ctx context.Context) (lifeEnd, error) {
	a.log.Info("launching browser", zap.String("launcher", a.cfg.Launcher), zap.String("browser_type", a.cfg.BrowserType))
	b, err := a.launch(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return endSignal, nil
		}
		return endCrashed, fmt.Errorf("launching the browser (%s launcher): %w", a.cfg.Launcher, err)
	}
	defer func() {
		if err := b.Stop(a.browserGrace()); err != nil {
			a.log.Error("stopping the browser", zap.Error(err))
		}
	}()

	reg := registry.Registration{
		// A Playwright browser server serves only clients of its own
		// major.minor: it registers in that version's group of the pool.
		Pool:         registry.GroupPool(a.cfg.Pool, b.PlaywrightVersion),
		ID:           NewID(a.cfg.IDPrefix),
		BrowserType:  a.cfg.BrowserType,
		Addr:         a.advertised(b),
		Path:         b.Endpoint.EscapedPath(),
		Capacity:     a.cfg.MaxConcurrent,
		Weight:       a.cfg.Weight,
		TTL:          a.cfg.KeyTTL,
		VirtualNodes: a.cfg.VirtualNodes,
		// One generation for this browser process: registering again after
		// the record was lost carries on with its live sessions' leases.
		Generation: registry.NewGeneration(),
		// Its browser is the only one at its address: the record of one
		// that crashed there before (a fixed port) goes.
		Exclusive: true,
	}
	if reg.Path == "" {
		reg.Path = "/"
	}
	if a.cfg.WorkerSecret != "" {
		reg.Secret = []byte(a.cfg.WorkerSecret)
	}
	log := a.log.With(zap.String("worker_id", reg.ID), zap.String("pool", reg.Pool))
	a.recordLost = time.Time{}
	warnOutsideDialPolicy(log, reg.Addr)
	log.Info("browser listening", zap.String("endpoint", b.Endpoint.String()), zap.String("playwright_version", b.PlaywrightVersion), zap.Int("pid", b.Pid), zap.Ints("process_groups", b.Groups()))

	// Register; keep trying while Redis is away (it answered at start).
	for attempt := 1; ; attempt++ {
		cctx, cancel := rctx()
		err := a.reg.Register(cctx, reg)
		cancel()
		if err == nil {
			break
		}
		log.Warn("registering failed; retrying", zap.Int("attempt", attempt), zap.Error(err))
		t := time.NewTimer(min(a.cfg.HeartbeatInterval, 2*time.Second))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			// A register that timed out may still have landed. The
			// drained browser's record (a -respawn hand-over) goes too,
			// at the same time: both share the stop's time for records.
			done := make(chan struct{})
			go func() {
				defer close(done)
				a.endHandover()
			}()
			a.deregister(log, reg)
			<-done
			return endSignal, nil
		case <-b.Done():
			t.Stop()
			a.deregister(log, reg)
			return endCrashed, fmt.Errorf("the browser exited before it could be registered (%v)", b.ExitError())
		}
	}
	log.Info("worker registered",
		zap.String("addr", reg.Addr), zap.String("path", reg.Path), zap.String("browser_type", reg.BrowserType),
		zap.Int("capacity", reg.Capacity), zap.Duration("key_ttl", reg.TTL), zap.Duration("heartbeat_interval", a.cfg.HeartbeatInterval))
	// The replacement is serving: the drained browser's record goes now.
	a.endHandover()

	lifeCtx, stopProbe := context.WithCancel(context.Background())
	defer stopProbe()
	probeFailed := a.startProber(lifeCtx, log, b, reg)

	tick := time.NewTicker(a.cfg.HeartbeatInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			a.drain(log, b, reg, "signal")
			a.exit(log, b, reg)
			return endSignal, nil
		case <-b.Done():
			// Deregister at once: no proxy should pick a dead browser until
			// its record's TTL runs out.
			log.Error("browser exited", zap.Int("pid", b.Pid), zap.NamedError("exit", b.ExitError()), zap.String("last_output", b.Output()))
			a.deregister(log, reg)
			return endCrashed, fmt.Errorf("the browser exited: %v", b.ExitError())
		case err := <-probeFailed:
			log.Error("browser failed its probe; restarting it", zap.Error(err))
			a.deregister(log, reg)
			// A browser that does not answer will not close itself either.
			if err := b.Stop(0); err != nil {
				log.Error("stopping the browser", zap.Error(err))
			}
			return endCrashed, fmt.Errorf("the browser stopped answering: %w", err)
		case <-tick.C:
			if ctx.Err() != nil {
				// The signal came with a tick (select picks either at
				// random): the drain goes first, not one more heartbeat,
				// which a Redis holding calls would make 5 s long, again
				// and again.
				continue
			}
			cctx, cancel := rctx()
			hb, err := a.reg.Heartbeat(cctx, reg.Pool, reg.ID, reg.TTL)
			cancel()
			if ctx.Err() != nil && errors.Is(err, registry.ErrNotRegistered) {
				// The record is gone and a signal came meanwhile: the
				// drain registers it again, as draining.
				continue
			}
			cmd := hb.Command
			if err == nil {
				// Kept to re-assert if Redis loses the record.
				reg.Lifetime = hb.Lifetime
			}
			switch {
			case errors.Is(err, registry.ErrNotRegistered):
				log.Warn("worker record gone (expired, reaped, redis restarted, or replaced by another worker registering at this address); registering again",
					zap.Int("lifetime", reg.Lifetime))
				a.recordLost = time.Now()
				cctx, cancel := rctx()
				// held a moment, so that the Caddy instances that served
				// it re-assert the sessions Redis lost before it takes new
				// ones (registry.ReassertHold)
				again := reg
				again.Hold = registry.ReassertHold
				if err := a.reg.Register(cctx, again); err != nil {
					log.Warn("registering again failed; will retry at the next heartbeat", zap.Error(err))
				} else {
					// What it asserted: Redis keeps the higher of that and
					// what it counted (the lifetime kept when the record
					// lapsed, its live leases'); the next heartbeat tells.
					log.Info("worker registered again", zap.String("addr", reg.Addr), zap.Int("lifetime", reg.Lifetime))
				}
				cancel()
			case err != nil:
				log.Warn("heartbeat failed; still serving, will retry", zap.Error(err))
			case cmd == registry.CommandShutdown:
				a.drain(log, b, reg, "shutdown command")
				if a.cfg.Respawn {
					a.retire(log, b, reg)
				} else {
					a.exit(log, b, reg)
				}
				return endDrained, nil
			case cmd != "":
				log.Warn("ignoring unknown command", zap.String("command", string(cmd)))
			}
		}
	}
}

// startProber checks the browser every heartbeat interval; the returned
// channel receives the last error once ProbeFailures probes in a row have
// failed. A success in between starts the count again.
//
// A failed probe that is not yet the last also takes the worker out of
// rotation until the next probe's answer is due (registry.Suspect, as
// Caddy does with a worker that fails a dial): its live sessions go on,
// and no new one is sent to a browser that may be hung. A success lets
// the suspicion run out.
func (a *Agent) startProber(ctx context.Context, log *zap.Logger, b *Browser, reg registry.Registration) <-chan error {
	failed := make(chan error, 1)
	if a.cfg.ProbeTimeout <= 0 {
		return failed
	}
	go func() {
		t := time.NewTicker(a.cfg.HeartbeatInterval)
		defer t.Stop()
		inRow := 0
		for {
			select {
			case <-ctx.Done():
				return
			case <-b.Done():
				return // the lifecycle loop sees the exit itself
			case <-t.C:
			}
			err := b.Probe(ctx, a.cfg.ProbeTimeout)
			if err == nil {
				if inRow > 0 {
					log.Info("browser answers its probe again", zap.Int("failed_in_a_row", inRow))
				}
				inRow = 0
				continue
			}
			if ctx.Err() != nil {
				return
			}
			select {
			case <-b.Done():
				return
			default:
			}
			inRow++
			if inRow < a.cfg.ProbeFailures {
				log.Warn("browser failed a probe; no new sessions until it answers, restarting it if it fails in a row",
					zap.Int("failed_in_a_row", inRow), zap.Int("probe_failures", a.cfg.ProbeFailures), zap.Error(err))
				cctx, cancel := rctx()
				if err := a.reg.Suspect(cctx, reg.Pool, reg.ID, reg.Generation, a.cfg.HeartbeatInterval+a.cfg.ProbeTimeout); err != nil {
					log.Warn("taking the worker out of rotation failed", zap.Error(err))
				}
				cancel()
				continue
			}
			failed <- fmt.Errorf("%d probes in a row failed, the last: %w", inRow, err)
			return
		}
	}()
	return failed
}

// drain marks the worker draining and waits until its active sessions
// reach 0, up to DrainTimeout (the worker lifecycle, "Phase 3: Drain"). It keeps
// heartbeating meanwhile so the record outlives a long drain.
func (a *Agent) drain(log *zap.Logger, b *Browser, reg registry.Registration, reason string) {
	log.Info("draining", zap.String("reason", reason), zap.Duration("drain_timeout", a.cfg.DrainTimeout))
	start := time.Now()
	// Every Redis call below ends by the drain's deadline, so a Redis
	// that holds calls cannot stretch the drain past DrainTimeout (after
	// a signal: past DrainTimeout from the signal).
	end := a.drainEnd(start)
	cctx, cancel := rctxBy(end)
	err := a.reg.SetDraining(cctx, reg.Pool, reg.ID)
	cancel()
	if errors.Is(err, registry.ErrNotRegistered) {
		a.registerDraining(log, reg, end)
	} else if err != nil {
		log.Warn("marking the worker draining failed; waiting for its sessions anyway", zap.Error(err))
	}
	deadline := time.NewTimer(time.Until(end))
	defer deadline.Stop()
	poll := time.NewTicker(min(250*time.Millisecond, a.cfg.HeartbeatInterval))
	defer poll.Stop()
	hb := time.NewTicker(a.cfg.HeartbeatInterval)
	defer hb.Stop()
	active, waitedForLeases, counted := -1, false, time.Time{}
	for {
		cctx, cancel := rctxBy(end)
		w, err := a.reg.Worker(cctx, reg.Pool, reg.ID)
		cancel()
		switch {
		case err == nil:
			if w.Status != selection.Draining {
				// A registration that landed late (it timed out here, but
				// Redis ran it after the drain began) wrote the worker
				// available again: proxies would keep sending sessions
				// the drain's end cuts.
				log.Warn("the draining worker is available again (a late registration landed); marking it draining again")
				cctx, cancel := rctxBy(end)
				if err := a.reg.SetDraining(cctx, reg.Pool, reg.ID); err != nil && !errors.Is(err, registry.ErrNotRegistered) {
					log.Warn("marking the worker draining again failed", zap.Error(err))
				}
				cancel()
			}
			if w.Active != active {
				active = w.Active
				log.Info("waiting for active sessions", zap.Int("active", active))
			}
			if active <= 0 {
				// Right after the record was lost, 0 may only mean the
				// proxies have not re-asserted their leases yet.
				// Counting reads /proc (every socket of the host's
				// namespace, every process): once a second at most.
				if time.Since(counted) < time.Second && time.Since(a.recordLost) < a.cfg.LeaseTTL {
					break
				}
				counted = time.Now()
				if ok, conns := a.drainedAfterLoss(b); ok {
					log.Info("drained", zap.Duration("took", time.Since(start)))
					return
				} else if !waitedForLeases {
					waitedForLeases = true
					log.Info("0 active, but the record was lost meanwhile and the browser has connections (-1: cannot count them): waiting up to lease-ttl for proxies to re-assert live sessions",
						zap.Int("connections", conns), zap.Duration("lease_ttl", a.cfg.LeaseTTL),
						zap.Duration("left", a.cfg.LeaseTTL-time.Since(a.recordLost)))
				}
			}
		case errors.Is(err, registry.ErrNotRegistered):
			a.registerDraining(log, reg, end)
		default:
			log.Warn("reading active sessions failed", zap.Error(err))
		}
		select {
		case <-poll.C:
		case <-hb.C:
			cctx, cancel := rctxBy(end)
			if _, err := a.reg.Heartbeat(cctx, reg.Pool, reg.ID, reg.TTL); err != nil && !errors.Is(err, registry.ErrNotRegistered) {
				log.Warn("heartbeat while draining failed", zap.Error(err))
			}
			cancel()
		case <-deadline.C:
			log.Warn("drain timeout; closing the browser with sessions still open",
				zap.Int("active", active), zap.Duration("drain_timeout", a.cfg.DrainTimeout))
			return
		case <-a.abort:
			log.Warn("drain aborted; closing the browser with sessions still open", zap.Int("active", active))
			return
		case <-b.Done():
			log.Warn("browser exited while draining", zap.NamedError("exit", b.ExitError()))
			return
		}
	}
}

// registerDraining registers a draining worker again when its record was
// lost (expired while the agent was paused, or Redis lost it): with the
// same generation its live sessions still count, so the drain waits for
// them rather than cutting them.
func (a *Agent) registerDraining(log *zap.Logger, reg registry.Registration, end time.Time) {
	log.Warn("worker record gone while draining; registering it again as draining to wait for its sessions")
	a.recordLost = time.Now()
	reg.Draining = true
	cctx, cancel := rctxBy(end)
	defer cancel()
	if err := a.reg.Register(cctx, reg); err != nil {
		log.Warn("registering the draining worker again failed; will retry", zap.Error(err))
	}
}

// exit removes the worker from Redis, then closes the browser (the worker lifecycle,
// "Phase 4: Exit").
func (a *Agent) exit(log *zap.Logger, b *Browser, reg registry.Registration) {
	a.deregister(log, reg)
	if err := b.Stop(a.browserGrace()); err != nil {
		log.Error("stopping the browser", zap.Error(err))
	} else {
		log.Info("browser closed")
	}
}

// retire closes a drained browser but keeps its record, still draining and
// heartbeated, until the next browser registers (endHandover).
func (a *Agent) retire(log *zap.Logger, b *Browser, reg registry.Registration) {
	if err := b.Stop(a.browserGrace()); err != nil {
		log.Error("stopping the browser", zap.Error(err))
	} else {
		log.Info("browser closed; its record stays draining until the new browser registers")
	}
	ctx, stop := context.WithCancel(context.Background())
	a.handover = &handover{log: log, reg: reg, stop: stop}
	go func() {
		t := time.NewTicker(a.cfg.HeartbeatInterval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			cctx, cancel := context.WithTimeout(ctx, redisCallTimeout)
			_, err := a.reg.Heartbeat(cctx, reg.Pool, reg.ID, reg.TTL)
			cancel()
			if errors.Is(err, registry.ErrNotRegistered) {
				return // reaped or Redis restarted: nothing left to hand over
			}
		}
	}()
}

// endHandover deregisters the drained browser's record, if one is waiting.
func (a *Agent) endHandover() {
	h := a.handover
	if h == nil {
		return
	}
	a.handover = nil
	// Not waiting for its heartbeat in flight (it ends alone, at its
	// timeout, and one that lands after the deregistration finds no
	// record and writes nothing).
	h.stop()
	a.deregister(h.log, h.reg)
}

func (a *Agent) deregister(log *zap.Logger, reg registry.Registration) {
	// At least one attempt of a second, even past the stop's time for
	// records: a registration that ran late (a slow Redis) must not leave
	// an available record of a browser about to be closed, and the
	// margin's spare second covers it.
	end := a.recordsEnd()
	if floor := time.Now().Add(time.Second); end.Before(floor) {
		end = floor
	}
	for attempt := 1; attempt <= 3 && time.Now().Before(end); attempt++ {
		cctx, cancel := rctxBy(end)
		err := a.reg.Deregister(cctx, reg.Pool, reg.ID)
		cancel()
		if err == nil || errors.Is(err, registry.ErrNotRegistered) {
			log.Info("worker deregistered")
			return
		}
		log.Warn("deregistering failed", zap.Int("attempt", attempt), zap.Error(err))
	}
	log.Error("could not deregister; the reaper will remove the record once it is stale")
}

// NewLogger builds the agent's zap logger on stderr in cfg's format and
// level.
func NewLogger(cfg Config) (*zap.Logger, error) {
	var zc zap.Config
	if cfg.LogFormat == "console" {
		zc = zap.NewDevelopmentConfig()
		zc.DisableStacktrace = true
	} else {
		zc = zap.NewProductionConfig()
		zc.Sampling = nil
		zc.EncoderConfig.TimeKey = "ts"
		zc.EncoderConfig.EncodeTime = zapcore.ISO8601TimeEncoder
	}
	lvl, err := zapcore.ParseLevel(cfg.LogLevel)
	if err != nil {
		return nil, fmt.Errorf("-log-level %q: %w", cfg.LogLevel, err)
	}
	zc.Level = zap.NewAtomicLevelAt(lvl)
	zc.OutputPaths = []string{"stderr"}
	zc.ErrorOutputPaths = []string{"stderr"}
	return zc.Build()
}

// RedisLogger adapts log for go-redis' internal messages (pool dial
// failures and the like), which it otherwise prints unstructured on stderr:
// redis.SetLogger(workeragent.RedisLogger(log)). They go out at debug
// level; the agent logs every failure that matters itself.
func RedisLogger(log *zap.Logger) interface {
	Printf(ctx context.Context, format string, v ...any)
} {
	return redisLogger{log.Named("redis")}
}

type redisLogger struct{ log *zap.Logger }

func (l redisLogger) Printf(_ context.Context, format string, v ...any) {
	if ce := l.log.Check(zapcore.DebugLevel, "redis client"); ce != nil {
		ce.Write(zap.String("detail", fmt.Sprintf(format, v...)))
	}
}
