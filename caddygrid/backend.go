package caddygrid

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"golang.org/x/sync/singleflight"

	"github.com/browsergrid/caddy-browser-grid/registry"
)

// backends holds one backend per Redis URL and key prefix. Every grid app
// that names the same Redis, and every live session claimed through it,
// holds a reference, so a config reload (Caddy provisions the new config
// before it stops the old one) keeps the same Redis client, the same live
// leases and the same waiters, and a session that outlives its config can
// still release its claim.
var backends = caddy.NewUsagePool()

// backendKey identifies a backend. url holds credentials: never log it.
type backendKey struct {
	url    string
	prefix string
}

// errBackendGone is what a session gets when it tries to take a reference
// on a backend that has already been destroyed.
var errBackendGone = errors.New("grid backend no longer in use")

// Timing of the work a backend does in the background.
const (
	// safetyPoll is how often the head of a queue tries again without a
	// wake-up, for the slots no event announces (a suspect worker's
	// penalty ending, a heartbeat making a worker fresh again, a lost
	// pub/sub message while Redis restarted).
	safetyPoll = time.Second
	// suspectFor is how long a worker that failed a dial or an upgrade is
	// skipped by every Caddy instance.
	suspectFor = 5 * time.Second
	// redisCallTimeout bounds a release, undo, renewal or expiry call.
	redisCallTimeout = 5 * time.Second
	// claimCallTimeout bounds one select-and-claim call, so that an
	// unreachable Redis answers 503 quickly rather than at select_timeout.
	claimCallTimeout = 2 * time.Second
	// cancelAttempts and cancelFirstBackoff bound how hard a claim whose
	// call failed is cancelled while Redis is away (the backoff doubles:
	// about 8s of waiting plus the calls' own timeouts).
	cancelAttempts     = 6
	cancelFirstBackoff = 250 * time.Millisecond
	// renewRetry is how often leases are renewed while a renewal is owed
	// (renewOwed).
	renewRetry = 200 * time.Millisecond
)

// liveLease is a lease of a live session of this process, with what a
// renewal needs to re-assert it if Redis lost it.
type liveLease struct {
	renewal registry.LeaseRenewal
	// ended: a renewal found the lease released or cancelled (by someone
	// else): it is no longer renewed, though its session still counts here
	// until it finishes.
	ended bool
	// done is when the claim call returned (floors.go).
	done time.Time
}

// backend is everything one Redis gives the grid inside this process: the
// client, the registry over it, the leases of the sessions this process
// holds, the queues of waiting requests and their wake-up subscriptions.
type backend struct {
	key      backendKey
	redacted string
	rdb      redis.UniversalClient
	reg      *registry.Registry
	holder   string
	logger   *zap.Logger

	// leaseTTL (nanoseconds) is the lease_ttl of the most recently
	// started grid app using this backend.
	leaseTTL atomic.Int64
	// rearm tells keepLeases that leaseTTL changed (capacity 1).
	rearm chan struct{}
	// renewOwed is set when a renewal or another call to Redis failed:
	// Redis may have lost what this process holds (a restart, a failover
	// to a replica that missed the last writes). Until a renewal of every
	// live lease succeeds, keepLeases renews every renewRetry and a claim
	// first re-asserts the leases (renewMu keeps that to one at a time),
	// so that no slot this process holds is granted again meanwhile.
	renewOwed atomic.Bool
	renewMu   sync.Mutex
	// epochs holds each pool's dataset epoch as last seen (under mu): a
	// claim whose epoch Redis no longer has re-asserts this process's
	// leases before it is granted a slot (registry.EpochError).
	epochs map[string]string
	// floors holds, per pool, the highest lifetime this process served a
	// session of each worker generation at (under mu; floors.go).
	floors map[string]map[floorKey]*lifeFloor
	// floorsOwed: pools whose floors a failed call could not re-assert
	// (under mu); floorAsserts makes one call of the claims that learn of
	// one loss at once, and one of those that find the floors owed.
	floorsOwed   map[string]bool
	floorAsserts singleflight.Group

	mu       sync.Mutex
	leases   map[string]map[string]*liveLease // pool → lease ID → lease held by this process
	queues   map[string]*waitQueue
	watching map[string]bool // pools with a wake-up subscription
	recent   map[string]time.Time
	// versions caches each pool's Playwright versions (versions.go).
	versions map[string]cachedVersions
	// swept is when a client-limit refusal last swept a pool's version
	// groups for expired leases (versions.go, sweepGroups).
	swept map[string]time.Time
	// omittedWarned is when this backend last warned that a pool serves
	// more than registry.MaxVersionGroups versions (under mu).
	omittedWarned map[string]time.Time
	// versionReads makes concurrent reads of one pool's versions one.
	versionReads singleflight.Group
	// lastPick is, per pool (or version group) this backend has claimed
	// in, the last claim's request and its config: for admin picks, to
	// tell the pools it serves from names a Redis writer put in the set
	// of pools (badRecord), and to store the limits again after a loss
	// (reassert).
	lastPick map[string]lastPick
	// clients holds, per client and pool (clientSlot), the claims this
	// process made for a client with a client_limit until their end has
	// reached Redis, and the requests of that client under way (see
	// waitClientEnd). An entry goes when neither is left.
	clients map[string]*clientSessions
	// reapers are the running reapers of the apps on this backend
	// (*reaper.Reaper → struct{}), kicked when a claim meets stale
	// workers (reaper.go).
	reapers sync.Map

	// ctx ends when the last reference goes (Destruct); the background
	// work started by start runs until then.
	ctx     context.Context
	cancel  context.CancelFunc
	startMu sync.Once
	wg      sync.WaitGroup
}

// loadBackend returns the backend for key, creating it (no network I/O:
// the Redis client connects lazily) when this is its first user. Every
// successful call must be matched by one backends.Delete(key).
func loadBackend(key backendKey, logger *zap.Logger) (*backend, error) {
	v, _, err := backends.LoadOrNew(key, func() (caddy.Destructor, error) {
		return newBackend(key, logger)
	})
	if err != nil {
		return nil, err
	}
	return v.(*backend), nil
}

func newBackend(key backendKey, logger *zap.Logger) (*backend, error) {
	rdb, err := registry.NewClient(key.url)
	if err != nil {
		return nil, fmt.Errorf("creating Redis client for %s: %w", registry.RedactURL(key.url), err)
	}
	host, _ := os.Hostname()
	b := &backend{
		key:      key,
		redacted: registry.RedactURL(key.url),
		rdb:      rdb,
		holder:   host + ":" + strconv.Itoa(os.Getpid()) + ":" + strconv.FormatUint(rand.Uint64()&0xffffff, 16),
		logger:   logger.With(zap.String("redis", registry.RedactURL(key.url))),
		leases:   map[string]map[string]*liveLease{},
		queues:   map[string]*waitQueue{},
		watching: map[string]bool{},
		recent:   map[string]time.Time{},
		lastPick: map[string]lastPick{},
		clients:  map[string]*clientSessions{},
	}
	b.reg = registry.New(rdb, registry.Options{Prefix: key.prefix, OnBadRecord: b.badRecord, OnStale: b.staleSeen,
		OnBatch: observeBatch})
	b.ctx, b.cancel = context.WithCancel(context.Background())
	b.leaseTTL.Store(int64(defaultLeaseTTL))
	b.rearm = make(chan struct{}, 1)
	return b, nil
}

// retain takes one more reference on the backend for a live session and
// returns the backend to use: the same one, or, when this one was already
// destroyed and a new config created another for the same Redis, that one.
func (b *backend) retain() (*backend, error) {
	v, _, err := backends.LoadOrNew(b.key, func() (caddy.Destructor, error) { return nil, errBackendGone })
	if err != nil {
		return nil, err
	}
	return v.(*backend), nil
}

// drop gives back a reference taken by loadBackend or retain.
func (b *backend) drop() {
	if _, err := backends.Delete(b.key); err != nil {
		b.logger.Error("closing grid backend", zap.Error(err))
	}
}

// Destruct closes the client when the last user is gone.
func (b *backend) Destruct() error {
	// Under mu, so that watch cannot start a goroutine after Wait began.
	b.mu.Lock()
	b.cancel()
	b.mu.Unlock()
	b.wg.Wait()
	if err := b.rdb.Close(); err != nil {
		return fmt.Errorf("closing Redis client for %s: %w", b.redacted, err)
	}
	return nil
}

// configure adopts the lease TTL and max_batch (0: the default) of the
// grid app that was started last.
// A shorter TTL re-arms the renewal timer at once: leases claimed from now
// on live only that long, so waiting out a timer set for a longer TTL
// would let them lapse before their first renewal.
func (b *backend) configure(leaseTTL time.Duration, maxBatch int) {
	b.reg.SetMaxBatch(maxBatch)
	if old := b.leaseTTL.Swap(int64(leaseTTL)); leaseTTL < time.Duration(old) {
		select {
		case b.rearm <- struct{}{}:
		default:
		}
	}
}

// start launches the lease keeper and the epoch watch once per backend (from an app's Start,
// never from Provision); it stops when the backend is destroyed. Stale
// workers a claim walks past are expired by the registry itself.
func (b *backend) start() {
	b.startMu.Do(func() {
		b.wg.Add(2)
		go b.keepLeases()
		go b.watchEpochs()
	})
}

// badRecord reports a worker record that does not parse, at most once a
// minute per worker.
//
// The metric names the pool only when the configuration serves it or
// this instance has claimed in it; others are poolOther: the reaper and
// the admin reads meet every pool in Redis, names a Redis writer may make
// up by the thousand, and each would be a series of its own. The log
// names it.
func (b *backend) badRecord(pool, id string, err error) {
	b.mu.Lock()
	_, claimed := b.lastPick[pool]
	b.mu.Unlock()
	label := pool
	if a := running.current(); !claimed && (a == nil || !a.limits.servesPool(pool)) {
		label = poolOther
	}
	badRecords.WithLabelValues(label, reasonUnparsable).Inc()
	if !b.firstReport(reasonUnparsable, pool, id) {
		return
	}
	b.logger.Warn("skipping a worker record that does not parse",
		zap.String("pool", pool), zap.String("worker_id", id), zap.Error(err))
}

// lastPick is a backend's last claim in a pool: its request, and the
// limits of the config that made it (nil: none), whose limits a loss
// stores again only while that config runs.
type lastPick struct {
	req    registry.ClaimRequest
	config *limitsClock
}

// claim runs one select-and-claim and keeps the books: the lease joins
// those this process renews, and the metrics count the decision.
func (b *backend) claim(ctx context.Context, req registry.ClaimRequest, samples int) (*registry.Claim, error) {
	if configGone(ctx) {
		return nil, errConfigGone
	}
	setClaimLimits(ctx, &req)
	policy := string(req.Policy)
	req.Holder = b.holder
	req.LeaseTTL = time.Duration(b.leaseTTL.Load())
	// The lease ID is chosen here so that a claim whose outcome is unknown
	// (its call failed or timed out, and it may have run or still run) can
	// be cancelled.
	req.LeaseID = registry.NewLeaseID()
	start := time.Now()
	cctx, cancel := context.WithTimeout(ctx, claimCallTimeout)
	if b.renewOwed.Load() {
		// Redis failed since the last renewal: put back what it may have
		// lost of this process's sessions before granting a slot.
		b.renewNow(cctx)
	}
	b.mu.Lock()
	req.Epoch = b.epochs[req.Pool]
	owed := b.floorsOwed[req.Pool]
	b.mu.Unlock()
	var err error
	if owed {
		err = b.retryFloors(cctx, req.Pool)
	}
	var c *registry.Claim
	if err == nil {
		c, err = b.reg.Claim(cctx, req)
	}
	var ee *registry.EpochError
	if errors.As(err, &ee) {
		// Redis lost the pool's data since this process last claimed (a
		// restart that came back empty between two calls, so no call
		// failed): re-assert every live lease, then claim once more.
		b.logger.Warn("Redis lost the pool's data; re-asserting this instance's live sessions before claiming",
			zap.String("pool", req.Pool))
		// not re-asserted, a claim now would count without them
		if err = b.reassert(cctx, map[string]string{req.Pool: ee.Now}); err == nil {
			req.Epoch = ee.Now
			c, err = b.reg.Claim(cctx, req)
		}
	}
	cancel()
	metrics.selectDuration.WithLabelValues(req.Pool, policy).Observe(time.Since(start).Seconds())
	var nw *registry.NoWorkerError
	switch {
	case err == nil && c.LimitsOverridden:
		b.limitsOverridden(req, c.PoolLimits)
	case errors.As(err, &nw) && nw.LimitsOverridden:
		b.limitsOverridden(req, nw.PoolLimits)
	}
	if (err == nil && c.IndexBuilding) || (errors.As(err, &nw) && nw.IndexBuilding) {
		b.indexBuilding(req)
	}
	switch {
	case err == nil:
		b.setEpoch(req.Pool, c.Epoch)
	case errors.As(err, &nw):
		b.setEpoch(req.Pool, nw.Epoch)
	}
	switch {
	case err == nil:
		metrics.selections.WithLabelValues(req.Pool, policy).Inc()
		metrics.activeSessions.WithLabelValues(req.Pool).Inc()
		observeDecision(req.Pool, policy, samples, c.Decision)
		b.mu.Lock()
		ls := b.leases[req.Pool]
		if ls == nil {
			ls = map[string]*liveLease{}
			b.leases[req.Pool] = ls
		}
		ls[c.LeaseID] = &liveLease{renewal: registry.LeaseRenewal{
			ID: c.LeaseID, Worker: c.Worker.ID, Gen: c.Gen, Claimed: start, Lifetime: c.Worker.Lifetime,
			Client: c.Client,
		}, done: time.Now()}
		if c.Client != "" {
			b.clientEntry(clientSlot(c.Pool, c.Client)).live++
		}
		b.lastPick[req.Pool] = lastPick{req: req, config: claimClock(ctx)}
		b.mu.Unlock()
		if c.Drain {
			metrics.drains.WithLabelValues(req.Pool).Inc()
			b.logger.Info("worker reached max_lifetime; shutdown command set",
				zap.String("pool", req.Pool), zap.String("worker_id", c.Worker.ID),
				zap.Int("lifetime", c.Worker.Lifetime))
		}
		return c, nil
	case errors.As(err, &nw):
		metrics.noWorker.WithLabelValues(req.Pool, policy).Inc()
		observeDecision(req.Pool, policy, samples, nw.Decision)
		b.mu.Lock()
		b.lastPick[req.Pool] = lastPick{req: req, config: claimClock(ctx)}
		b.mu.Unlock()
		return nil, err
	case errors.Is(err, registry.ErrNoWorker):
		metrics.noWorker.WithLabelValues(req.Pool, policy).Inc()
		return nil, err
	case errors.Is(err, registry.ErrClientLimit):
		// counted where the request's answer is decided (acquireWith):
		// a refusal it waits out is not one
		return nil, err
	case errors.Is(err, errReassert):
		// the claim was not sent again: nothing to cancel
		metrics.redisErrors.WithLabelValues("claim").Inc()
		return nil, err
	default:
		metrics.redisErrors.WithLabelValues("claim").Inc()
		b.renewOwed.Store(true)
		b.cancelClaim(req.Pool, req.LeaseID, err)
		return nil, err
	}
}

// cancelClaim makes sure a claim whose call failed leaves nothing once
// Redis answers: the claim may have run with its reply lost, or may still
// run (sent before Redis stalled). Cancel undoes it, or tombstones its
// lease ID so it claims nothing when it runs. It runs in the background
// with its own deadlines, retried with a doubling backoff while Redis is
// away, a bounded number of times; it holds a reference on the backend so
// the client outlives it.
func (b *backend) cancelClaim(pool, leaseID string, cause error) {
	b.retryInBackground("cancel", true, func(ctx context.Context) error {
		return b.reg.Cancel(ctx, pool, leaseID)
	}, func(attempts int, err error) {
		if err == nil {
			metrics.claimsCancelled.WithLabelValues(pool).Inc()
			b.logger.Info("cancelled a claim whose call failed; it leaves nothing",
				zap.String("pool", pool), zap.String("lease_id", leaseID), zap.NamedError("claim_error", cause))
			return
		}
		b.logger.Error("could not cancel a claim whose call failed; if it ran, its lease expires by itself",
			zap.String("pool", pool), zap.String("lease_id", leaseID), zap.Int("attempts", attempts),
			zap.Duration("lease_ttl", time.Duration(b.leaseTTL.Load())), zap.Error(err))
	})
}

// retryInBackground runs call (a Redis call safe to repeat: cancel,
// release, undo) up to cancelAttempts times with a doubling backoff from
// cancelFirstBackoff, the first at once when now, while this backend
// lives; done gets the attempts made and the last error (nil: success).
func (b *backend) retryInBackground(op string, now bool, call func(context.Context) error, done func(attempts int, err error)) {
	rb, err := b.retain()
	if err != nil {
		return
	}
	go func() {
		defer rb.drop()
		delay := cancelFirstBackoff
		for attempt := 1; ; attempt++ {
			if attempt > 1 || !now {
				t := time.NewTimer(delay)
				select {
				case <-rb.ctx.Done():
					t.Stop()
					return
				case <-t.C:
				}
				delay *= 2
			}
			ctx, cancel := context.WithTimeout(rb.ctx, redisCallTimeout)
			err := call(ctx)
			cancel()
			if err != nil {
				metrics.redisErrors.WithLabelValues(op).Inc()
			}
			if err == nil || attempt == cancelAttempts {
				done(attempt, err)
				return
			}
		}
	}()
}

// setEpoch remembers a pool's dataset epoch ("" changes nothing).
func (b *backend) setEpoch(pool, epoch string) {
	if epoch == "" {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.epochs == nil {
		b.epochs = map[string]string{}
	}
	b.epochs[pool] = epoch
}

// renewNow renews every live lease at once if a renewal is owed (another
// caller may have done it while this one waited for renewMu), and reports
// whether the leases are renewed: by this call, or by one that began after
// the caller noted a renewal owed. Not the owed flag after it: another
// caller may have set that again meanwhile, for its own reason (a
// concurrent claim that met the same loss answered 503 so, though every
// lease had just been written).
func (b *backend) renewNow(ctx context.Context) bool {
	b.renewMu.Lock()
	defer b.renewMu.Unlock()
	if !b.renewOwed.Load() {
		return true
	}
	if ctx.Err() != nil {
		return false
	}
	return b.renewAll(ctx, time.Duration(b.leaseTTL.Load()))
}

// finish ends a claim: Release when the session was served (the lifetime
// it used stays counted), Undo when it never started (active and lifetime
// given back; suspect marks the worker as failing for a few seconds).
// A failed call is tried again in the background (retryInBackground); if
// that fails too, Redis frees the slot within one lease TTL anyway, since
// this process no longer renews the lease.
func (b *backend) finish(c *registry.Claim, served, suspect bool) {
	outcome, op := "released", "release"
	if !served {
		outcome, op = "undone", "undo"
	}
	b.noteEnded(c, served)
	end := func(ctx context.Context) error {
		if served {
			return b.reg.Release(ctx, c.Pool, c.LeaseID)
		}
		var d time.Duration
		if suspect {
			d = suspectFor
		}
		return b.reg.Undo(ctx, c.Pool, c.LeaseID, d)
	}
	if err := b.settle(c, outcome, end); err != nil {
		metrics.redisErrors.WithLabelValues(op).Inc()
		b.renewOwed.Store(true)
		b.logger.Warn("could not end claim; trying again in the background",
			zap.String("op", op), zap.String("pool", c.Pool), zap.String("worker_id", c.Worker.ID), zap.Error(err))
		// Release and Undo are safe to repeat (a lease ends once; its
		// tombstone stops a late renewal from bringing it back). If every
		// attempt fails, the lease expires by itself within lease_ttl.
		b.retryInBackground(op, false, end, func(attempts int, err error) {
			if err == nil {
				b.logger.Info("ended a claim on a later attempt", zap.String("op", op),
					zap.String("pool", c.Pool), zap.Int("attempts", attempts+1))
				return
			}
			b.logger.Error("could not end claim; its lease expires by itself", zap.String("op", op),
				zap.String("pool", c.Pool), zap.Int("attempts", attempts+1),
				zap.Duration("lease_ttl", time.Duration(b.leaseTTL.Load())), zap.Error(err))
		})
		return
	}
	if ce := b.logger.Check(zapcore.DebugLevel, "claim ended"); ce != nil {
		ce.Write(zap.String("outcome", outcome), zap.String("pool", c.Pool),
			zap.String("worker_id", c.Worker.ID), zap.String("lease_id", c.LeaseID))
	}
}

// settle ends claim c in Redis with end (one try) and keeps this
// process's books of it: the lease is no longer renewed, the client's
// waiting requests learn of the end (clientEnd), and the metrics count it
// as outcome. Every path that ends a claim goes through it (finish,
// refuseRecord).
func (b *backend) settle(c *registry.Claim, outcome string, end func(context.Context) error) error {
	held := b.forget(c)
	ctx, cancel := context.WithTimeout(context.Background(), redisCallTimeout)
	err := end(ctx)
	cancel()
	if held && c.Client != "" {
		// ended in Redis (or failed to: then its lease lapses, and the
		// waiter's claim is refused again)
		b.clientEnd(c)
	}
	metrics.activeSessions.WithLabelValues(c.Pool).Dec()
	metrics.releases.WithLabelValues(c.Pool, outcome).Inc()
	return err
}

// forget takes a claim whose session is over out of the leases this
// process renews. It runs before the lease is ended in Redis: a renewal
// whose snapshot still held the lease, and which reaches Redis after the
// release, then finds the lease gone here when its answer comes back, and
// does not report the release's own tombstone as a live session's lease
// ended elsewhere (renewBatch).
// It reports whether this process held the lease.
func (b *backend) forget(c *registry.Claim) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	_, held := b.leases[c.Pool][c.LeaseID]
	delete(b.leases[c.Pool], c.LeaseID)
	return held
}

// clientSlot names a client's claims in a pool: its version groups share
// the client's count (registry: lease_client is the pool's).
func clientSlot(pool, client string) string {
	base, _ := registry.SplitGroup(pool)
	return base + "\x00" + client
}

// clientSessions is one client's claims in one pool held by this process
// (under backend.mu).
type clientSessions struct {
	live    int    // claims made, their end not yet in Redis
	pins    int    // requests under way (acquireWith): the entry stays
	waiting int    // of them, those waiting in waitClientEnd
	ends    uint64 // claims ended so far
	// ended is closed (and replaced) when one of them ends.
	ended chan struct{}
}

// clientEntry is the client's entry of slot k, made if needed (under mu).
func (b *backend) clientEntry(k string) *clientSessions {
	cs := b.clients[k]
	if cs == nil {
		cs = &clientSessions{ended: make(chan struct{})}
		b.clients[k] = cs
	}
	return cs
}

// pinClient returns the client's entry of slot k, kept until unpinClient,
// and how many of its claims have ended so far: a request reads in it
// whether one of the client's claims ended while its own claim ran.
func (b *backend) pinClient(k string) (*clientSessions, uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	cs := b.clientEntry(k)
	cs.pins++
	return cs, cs.ends
}

// clientEnds is how many of the client's claims have ended so far.
func (b *backend) clientEnds(cs *clientSessions) uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return cs.ends
}

func (b *backend) unpinClient(k string, cs *clientSessions) {
	b.mu.Lock()
	defer b.mu.Unlock()
	cs.pins--
	b.dropClient(k, cs)
}

// dropClient removes an entry nothing uses any more (under mu).
func (b *backend) dropClient(k string, cs *clientSessions) {
	if cs.live <= 0 && cs.pins == 0 && b.clients[k] == cs {
		delete(b.clients, k)
	}
}

// clientEnd notes that claim c of a client with a client_limit has ended
// in Redis (or failed to: then its lease lapses by itself), and wakes the
// requests of that client waiting for it. Every path that forgot a claim
// this process held calls it (finish, refuseRecord).
func (b *backend) clientEnd(c *registry.Claim) {
	k := clientSlot(c.Pool, c.Client)
	b.mu.Lock()
	defer b.mu.Unlock()
	cs := b.clients[k]
	if cs == nil {
		return
	}
	cs.live--
	cs.ends++
	close(cs.ended)
	cs.ended = make(chan struct{})
	b.dropClient(k, cs)
}

// clientEndGrace bounds how long a request refused at its client's limit
// waits for one of that client's sessions held here to end.
const clientEndGrace = time.Second

// waitClientEnd claims again for a request refused at its client's limit
// (err) each time one of the client's claims held by this process ends,
// for up to clientEndGrace. A client that closes a session and opens the
// next at once sees the close before Caddy has given the slot back (the
// proxy's stream ends after it, then the release's round trip): without
// the wait, that next session got 429 a few times in a hundred.
//
// cs is the client's entry, pinned before the refused claim began, when
// its ends counted ends0. A claim that ended since may have freed the
// slot: it claims again at once. Otherwise it waits only while this
// process holds one of the client's sessions, and at most ClientLimit
// requests of a client wait at once (as in the queue): a client that does
// hold its limit here gets its 429 after the grace, its further requests
// at once, and one whose sessions are all held by other instances at
// once. Each request claims again at most once per end, so a client's
// waiters cost at most ClientLimit claims per session that ends.
func (b *backend) waitClientEnd(ctx context.Context, req registry.ClaimRequest, cs *clientSessions, ends0 uint64, claim func(context.Context) (*registry.Claim, error), deadline time.Time, err error) (*registry.Claim, error) {
	end := time.Now().Add(clientEndGrace)
	if deadline.Before(end) {
		end = deadline
	}
	seen, waiting := ends0, false
	defer func() {
		if waiting {
			b.mu.Lock()
			cs.waiting--
			b.mu.Unlock()
		}
	}()
	for errors.Is(err, registry.ErrClientLimit) && time.Now().Before(end) {
		b.mu.Lock()
		if cs.ends != seen {
			// one ended since the last claim began: its slot may be free
			seen = cs.ends
			b.mu.Unlock()
			var c *registry.Claim
			c, err = claim(ctx)
			if err == nil {
				return c, nil
			}
			continue
		}
		if cs.live == 0 || (!waiting && cs.waiting >= req.ClientLimit) {
			b.mu.Unlock()
			return nil, err
		}
		if !waiting {
			waiting = true
			cs.waiting++
		}
		ended := cs.ended
		b.mu.Unlock()
		t := time.NewTimer(time.Until(end))
		select {
		case <-ended:
			t.Stop()
		case <-t.C:
			return nil, err
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		}
	}
	return nil, err
}

// liveLeases counts the leases this process holds, by pool.
func (b *backend) liveLeases() map[string]int {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make(map[string]int, len(b.leases))
	for pool, ls := range b.leases {
		out[pool] = len(ls)
	}
	return out
}

// keepLeases renews every live lease of this process every lease_ttl/3,
// one batched call per pool, so a session lives as long as its socket and
// a crashed Caddy's sessions free their slots within one lease TTL.
func (b *backend) keepLeases() {
	defer b.wg.Done()
	for {
		ttl := time.Duration(b.leaseTTL.Load())
		every := ttl / 3
		if b.renewOwed.Load() && renewRetry < every {
			every = renewRetry
		}
		t := time.NewTimer(every)
		select {
		case <-b.ctx.Done():
			t.Stop()
			return
		case <-b.rearm:
			// lease_ttl was lowered: renew now with the new TTL (the
			// leases renewed last with the old one may be due sooner
			// than the new interval), then every new TTL/3.
			t.Stop()
			ttl = time.Duration(b.leaseTTL.Load())
		case <-t.C:
		}
		b.renewMu.Lock()
		b.renewAll(b.ctx, ttl)
		b.renewMu.Unlock()
		b.pruneFloors(time.Now())
		for _, pool := range b.owedFloors() {
			b.retryFloors(b.ctx, pool)
		}
	}
}

// renewAll renews every live lease of this process to ttl from now, and
// reports whether every pool's call succeeded.
func (b *backend) renewAll(ctx context.Context, ttl time.Duration) bool {
	return b.renewBatch(ctx, ttl, b.renewals())
}

// renewals takes the snapshot of the leases to renew, by pool: those of
// the live sessions, but the ones found ended.
func (b *backend) renewals() map[string][]registry.LeaseRenewal {
	b.mu.Lock()
	defer b.mu.Unlock()
	batch := make(map[string][]registry.LeaseRenewal, len(b.leases))
	for pool, ls := range b.leases {
		for _, l := range ls {
			if !l.ended {
				batch[pool] = append(batch[pool], l.renewal)
			}
		}
	}
	return batch
}

// renewBatch renews a snapshot taken by renewals, one call per pool, and
// reports whether every call succeeded.
func (b *backend) renewBatch(ctx context.Context, ttl time.Duration, batch map[string][]registry.LeaseRenewal) bool {
	// Owed stays set if any pool's renewal fails; cleared first so that a
	// failure meanwhile (another caller's) is not lost.
	b.renewOwed.Store(false)
	ok := true
	for pool, leases := range batch {
		if len(leases) == 0 {
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, redisCallTimeout)
		res, err := b.reg.RenewLeases(cctx, pool, leases, ttl)
		cancel()
		if err != nil {
			b.renewOwed.Store(true)
			ok = false
			metrics.redisErrors.WithLabelValues("renew").Inc()
			b.logger.Error("renewing leases of live sessions", zap.String("pool", pool),
				zap.Int("leases", len(leases)), zap.Error(err))
			continue
		}
		if len(res.Recreated) > 0 {
			metrics.leasesReasserted.WithLabelValues(pool).Add(float64(len(res.Recreated)))
			b.logger.Warn("leases of live sessions were missing from Redis; written again and their workers' counts re-asserted",
				zap.String("pool", pool), zap.Strings("lease_ids", res.Recreated))
		}
		if len(res.Ended) == 0 {
			continue
		}
		// Only the leases whose sessions still run here were ended
		// elsewhere: a session that finished since the snapshot (forget)
		// met its own release's tombstone, its slot rightly free.
		var lost []string
		b.mu.Lock()
		for _, id := range res.Ended {
			if l := b.leases[pool][id]; l != nil {
				l.ended = true
				lost = append(lost, id)
			}
		}
		b.mu.Unlock()
		if len(lost) == 0 {
			continue
		}
		metrics.leasesLost.WithLabelValues(pool).Add(float64(len(lost)))
		b.logger.Warn("leases of live sessions were ended elsewhere (released or cancelled); no longer renewed",
			zap.String("pool", pool), zap.Strings("lease_ids", lost))
	}
	return ok
}

// queue returns the pool's wait queue.
func (b *backend) queue(pool string) *waitQueue {
	b.mu.Lock()
	defer b.mu.Unlock()
	q := b.queues[pool]
	if q == nil {
		q = &waitQueue{}
		b.queues[pool] = q
	}
	return q
}

// queueDepth is how many requests wait for a worker of pool here.
func (b *backend) queueDepth(pool string) int {
	b.mu.Lock()
	q := b.queues[pool]
	b.mu.Unlock()
	if q == nil {
		return 0
	}
	return q.depth()
}

// watch makes sure a wake-up subscription for pool runs: a release, undo
// or registration in the pool, by any process sharing the Redis, wakes the
// head of this pool's queue. Pools come only from configuration (a fixed
// name or the browsers list), so the subscriptions are few.
//
// Subscribing opens a connection and waits for Redis to confirm: that runs
// in the background, never on the request's goroutine, so a Redis that
// hangs cannot hold a waiting request past its select_timeout (waiters
// poll every safetyPoll until the subscription is in place).
func (b *backend) watch(pool string) {
	b.mu.Lock()
	if b.watching[pool] || b.ctx.Err() != nil {
		b.mu.Unlock()
		return
	}
	b.watching[pool] = true
	b.wg.Add(1)
	b.mu.Unlock()
	go func() {
		defer b.wg.Done()
		defer func() {
			b.mu.Lock()
			b.watching[pool] = false
			b.mu.Unlock()
		}()
		ch, err := b.reg.Wakeups(b.ctx, pool)
		if err != nil {
			if b.ctx.Err() == nil {
				metrics.redisErrors.WithLabelValues("subscribe").Inc()
				b.logger.Error("subscribing to wake-ups; waiting requests poll instead",
					zap.String("pool", pool), zap.Error(err))
			}
			return
		}
		q := b.queue(pool)
		for range ch {
			q.wakeHead()
		}
	}()
}

// outcome says how a request that got no worker ended.
type outcome int

const (
	outcomeNone           outcome = iota
	outcomeQueueFull              // 429: the queue of the pool was full
	outcomeTimeout                // 503: no worker within select_timeout
	outcomeRedis                  // 503: Redis unreachable or failing
	outcomeCanceled               // the client went away while waiting
	outcomeBadPool                // 400: the pool is not allowed
	outcomeNoSource               // 503: the policy runs without the browser_grid upstream source
	outcomeStopped                // 503: the request's config was replaced and cleaned up before it claimed
	outcomeUnknownVersion         // 428: no worker of the pool serves the client's Playwright version
	outcomeClientLimited          // 429: the client holds its client_limit of live sessions
	outcomeNotWebSocket           // no WebSocket upgrade: nothing claimed (503 in a hand-composed proxy; the directive answers 426 before)
	outcomeRefused                // the workers tried answered a 4xx, and no other worker was free to try: that 4xx
)

// acquire claims a worker for the session, waiting in the pool's queue
// (at most queueSize waiters here) until deadline when none is free.
func (b *backend) acquire(ctx context.Context, req registry.ClaimRequest, samples, queueSize int, deadline time.Time) (*registry.Claim, outcome, error) {
	return b.acquireWith(ctx, req, func(ctx context.Context) (*registry.Claim, error) {
		return b.claim(ctx, req, samples)
	}, queueSize, deadline)
}

// acquireWith is acquire with the claim to make (one group, or any group
// of a pool: see acquireRouted), waiting in the queue of req.Pool; a
// client with a client_limit has at most that many requests waiting.
func (b *backend) acquireWith(ctx context.Context, req registry.ClaimRequest, claim func(context.Context) (*registry.Claim, error), queueSize int, deadline time.Time) (*registry.Claim, outcome, error) {
	pool := req.Pool
	var slot string
	var cs *clientSessions
	var ends0 uint64
	if req.ClientLimit > 0 {
		slot = clientSlot(pool, registry.ClientHash(req.ClientKey))
		cs, ends0 = b.pinClient(slot)
		defer b.unpinClient(slot, cs)
	}
	c, err := claim(ctx)
	if errors.Is(err, registry.ErrClientLimit) && b.sweepGroups(ctx, pool) {
		// expired leases of the pool's other groups were freed: they may
		// have been the client's
		if cs != nil {
			ends0 = b.clientEnds(cs)
		}
		c, err = claim(ctx)
	}
	if errors.Is(err, registry.ErrClientLimit) {
		c, err = b.waitClientEnd(ctx, req, cs, ends0, claim, deadline, err)
	}
	if err == nil {
		return c, outcomeNone, nil
	}
	if !errors.Is(err, registry.ErrNoWorker) {
		if errors.Is(err, registry.ErrClientLimit) && ctx.Err() == nil {
			b.clientLimited(req, err)
		}
		return nil, b.claimFailed(ctx, pool, err), err
	}
	if !time.Now().Before(deadline) {
		return nil, outcomeTimeout, err
	}
	q := b.queue(pool)
	w, ok, clientFull := q.joinClient(queueSize, req.ClientKey, req.ClientLimit)
	if clientFull {
		b.clientLimited(req, errClientWaiting)
		return nil, outcomeClientLimited, errClientWaiting
	}
	if !ok {
		return nil, outcomeQueueFull, err
	}
	if len(req.Avoid) > 0 {
		q.avoid(w, req.Avoid)
	}
	metrics.queueDepth.WithLabelValues(pool).Inc()
	waitStart := time.Now()
	defer func() {
		metrics.queueDepth.WithLabelValues(pool).Dec()
		metrics.queueWait.WithLabelValues(pool).Observe(time.Since(waitStart).Seconds())
	}()
	b.watch(pool)

	timeout := time.NewTimer(time.Until(deadline))
	defer timeout.Stop()
	poll := time.NewTicker(safetyPoll)
	defer poll.Stop()
	// a pool held after a restore (NoWorkerError.Held) frees up when the
	// hold ends, which no event announces: try again then, not at the
	// next poll
	held := heldRetry(err)
	for {
		select {
		case <-w.wake:
		case <-poll.C:
			if !q.isHead(w) {
				continue
			}
		case <-held:
		case <-timeout.C:
			q.leave(w)
			return nil, outcomeTimeout, registry.ErrNoWorker
		case <-ctx.Done():
			q.leave(w)
			return nil, outcomeCanceled, ctx.Err()
		}
		c, err := claim(ctx)
		if err == nil {
			q.leave(w)
			q.wakeHead() // pass the wake-up on: another slot may be free too
			return c, outcomeNone, nil
		}
		if !errors.Is(err, registry.ErrNoWorker) {
			// (a client limit: the client's other sessions took its
			// budget meanwhile)
			q.leave(w)
			q.wakeHead()
			if errors.Is(err, registry.ErrClientLimit) && ctx.Err() == nil {
				b.clientLimited(req, err)
			}
			return nil, b.claimFailed(ctx, pool, err), err
		}
		if len(req.Avoid) > 0 {
			// the slot freed may be on a worker this retry avoids: the
			// waiters behind it may take it
			q.wakeNext(w)
		}
		held = heldRetry(err)
	}
}

// heldRetry fires when the hold err reports ends (a pool's claims are held
// a while after its data came back on another Redis server process:
// registry.RestoreHold), or never when err reports none.
func heldRetry(err error) <-chan time.Time {
	var nw *registry.NoWorkerError
	if !errors.As(err, &nw) || nw.Held <= 0 {
		return nil
	}
	return time.After(nw.Held + 10*time.Millisecond)
}

// claimFailed classifies a claim that failed for another reason than "no
// worker": the client leaving, the client's limit, the request's config
// gone (a reload that failed after it started), or Redis failing
// (redisFailure).
func (b *backend) claimFailed(ctx context.Context, pool string, err error) outcome {
	switch {
	case ctx.Err() != nil:
		return outcomeCanceled // the client left: no answer reaches it
	case errors.Is(err, registry.ErrClientLimit):
		return outcomeClientLimited
	case errors.Is(err, errConfigGone):
		return outcomeStopped
	}
	return b.redisFailure(ctx, pool, err)
}

// redisFailure classifies a claim that failed for another reason than "no
// worker", a client limit or a config gone: the client leaving, or Redis
// failing (logged).
func (b *backend) redisFailure(ctx context.Context, pool string, err error) outcome {
	if ctx.Err() != nil {
		return outcomeCanceled
	}
	b.logger.Error("Redis unreachable or failing while claiming a worker; answering 503",
		zap.String("pool", pool), zap.Error(err))
	return outcomeRedis
}

// Interface guards
var _ caddy.Destructor = (*backend)(nil)
