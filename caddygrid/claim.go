package caddygrid

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base32"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/browsergrid/caddy-browser-grid/registry"
)

// The claim, second half of the request path: Select asks the claimer for
// a worker; the claimer routes the client to its Playwright version's
// group, claims in one atomic Redis call, waits in the pool's queue while
// none is free, and checks the record against the dial policy. The
// attempt is one request's state across reverse_proxy's retries.

const (
	// claimCallTimeout bounds one claim call to Redis.
	claimCallTimeout = 2 * time.Second
	// suspectFor is how long every instance skips a worker that failed a
	// dial or an upgrade.
	suspectFor = 5 * time.Second
	// maxRefusals bounds the agents' refusals one request is retried
	// past (they do not use up dial_retries).
	maxRefusals = 8
	// pollEvery is how often a waiting request claims again without a
	// wake-up (one lost with a Redis connection).
	pollEvery = time.Second
)

// outcome is why a request got no worker.
type outcome int

const (
	outcomeNone outcome = iota
	outcomeBadPool
	outcomeQueueFull
	outcomeTimeout
	outcomeRedis
	outcomeClientLimited
	outcomeUnknownVersion
	outcomeCanceled
	outcomeFailed // every worker tried failed (dial_retries used up)
	outcomeMisconfigured
)

// varAttempt is the caddyhttp variable holding the request's attempt.
const varAttempt = "browser_grid.attempt"

// varDial is the caddyhttp variable the upstream's dial address reads:
// the claimed worker's.
const varDial = "browser_grid.dial"

// attempt is one request's way to a worker: the claims made for it, what
// became of each, and why it was answered as it was.
type attempt struct {
	pool    string // the pool, without a version
	version string // the client's Playwright major.minor ("" none)
	client  string // the client key's hash ("" without client_limit)
	label   string
	args    []string // the Chromium flags checked against launch_args
	start   time.Time
	// dialRetries is how many failed workers the request moves past.
	dialRetries int

	mu    sync.Mutex
	claim *registry.Claim // the current claim, until the transport sends it
	lim   Limits          // the current claim's limits
	sent  bool
	// backend holds the claim's reference on the backend until the agent
	// has it or it is given back.
	backend  *backend
	avoid    []string
	failures int
	refusals int
	served   bool // the agent serves the session
	passed   int  // a status of the browser's the client gets as it is
	outcome  outcome
	message  string // the answer's text, for some outcomes
	// queuePos is the request's last place in the pool's queue (-1: it
	// had none), for Retry-After.
	queuePos int
}

// attemptOf returns the request's attempt, nil when there is none.
func attemptOf(r *http.Request) *attempt {
	a, _ := caddyhttp.GetVar(r.Context(), varAttempt).(*attempt)
	return a
}

// newAttempt makes r's attempt for pool, or returns the one it has.
func newAttempt(r *http.Request, pool string, dialRetries int) *attempt {
	if a := attemptOf(r); a != nil {
		return a
	}
	a := &attempt{pool: pool, version: clientVersion(r), label: sessionLabel(r), start: time.Now(), dialRetries: dialRetries, queuePos: -1}
	caddyhttp.SetVar(r.Context(), varAttempt, a)
	return a
}

func (a *attempt) fail(o outcome, msg string) {
	a.mu.Lock()
	if a.outcome == outcomeNone {
		a.outcome, a.message = o, msg
	}
	a.mu.Unlock()
}

func (a *attempt) result() (outcome, string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.outcome, a.message
}

// take hands the current claim to the transport, once.
func (a *attempt) take() *registry.Claim {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.claim == nil || a.sent {
		return nil
	}
	a.sent = true
	return a.claim
}

// settle ends the current claim's part in the request: the agent has it
// (connected), or it was given back; failed and refused workers are
// avoided from then on.
func (a *attempt) settle(failed, refused bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.claim == nil {
		return
	}
	if failed || refused {
		a.avoid = append(a.avoid, a.claim.Worker.ID)
	}
	if failed {
		a.failures++
	}
	if refused {
		a.refusals++
	}
	a.claim = nil
	if a.backend != nil {
		a.backend.release()
		a.backend = nil
	}
}

// limits are the current claim's limits.
func (a *attempt) limits() Limits {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.lim
}

// connected records that the agent serves the session.
func (a *attempt) connected() {
	a.settle(false, false)
	a.mu.Lock()
	a.served = true
	a.mu.Unlock()
}

// passedStatus records a browser's answer the client gets as it is.
func (a *attempt) passedStatus(code int) {
	a.mu.Lock()
	a.passed = code
	a.mu.Unlock()
}

// newSessionID is a session's ID: 128 random bits, in 26 lowercase
// base32 characters.
func newSessionID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(b[:]))
}

// HeaderLabel is the request header a client labels its session with
// (its test's name): shown wherever the session's ID is.
const HeaderLabel = "Grid-Label"

// sessionLabel is the client's label, cut to 64 printable characters.
func sessionLabel(r *http.Request) string {
	l := strings.Map(func(c rune) rune {
		if c < 0x20 || c == 0x7f {
			return -1
		}
		return c
	}, r.Header.Get(HeaderLabel))
	if len(l) > 64 {
		l = strings.ToValidUTF8(l[:64], "")
	}
	return strings.TrimSpace(l)
}

// clientHash names a client in Redis by its key's SHA-256, never the key.
func clientHash(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:12])
}

// claimer claims workers for one policy's requests.
type claimer struct {
	app     *App
	policy  registry.Policy
	options registry.PolicyOptions
	claim   ClaimOptions
	limits  Limits
	logger  *zap.Logger
}

// next gives up the request's previous claim when the transport never
// sent it, and claims the next worker: nil when there is none to try
// (the attempt says why).
func (c *claimer) next(r *http.Request, a *attempt) *registry.Claim {
	b := c.app.backend
	a.mu.Lock()
	if a.claim != nil && !a.sent {
		stale := *a.claim
		a.mu.Unlock()
		c.giveBack(a, &stale, false)
		a.settle(false, false)
		a.mu.Lock()
	}
	switch {
	case a.outcome != outcomeNone:
		a.mu.Unlock()
		return nil
	case a.failures > a.dialRetries:
		a.mu.Unlock()
		a.fail(outcomeFailed, failedMessage(a.pool))
		return nil
	case a.refusals > maxRefusals:
		a.mu.Unlock()
		a.fail(outcomeTimeout, "")
		return nil
	}
	avoid := slices.Clone(a.avoid)
	a.mu.Unlock()

	if c.claim.ClientLimit > 0 && a.client == "" {
		a.client = clientHash(clientKey(r, c.claim.ClientKey))
	}
	b.retain()
	claim, o, msg := c.wait(r.Context(), b, a, avoid)
	if claim == nil {
		b.release()
		a.fail(o, msg)
		return nil
	}
	a.mu.Lock()
	a.claim, a.lim, a.sent, a.backend = claim, c.limits, false, b
	a.mu.Unlock()
	caddyhttp.SetVar(r.Context(), varDial, claim.Worker.Addr)
	return claim
}

// wait claims a worker, waiting in the pool's queue while none is free,
// until select_timeout from the request's start. A waiter holds a place
// in this instance's queue, which orders its wake-ups, and in the pool's
// queue in Redis, which orders the waiters of every instance: a claim
// that finds an older waiter could take its worker waits its turn.
func (c *claimer) wait(ctx context.Context, b *backend, a *attempt, avoid []string) (*registry.Claim, outcome, string) {
	b.watch(a.pool)
	q := b.queue(a.pool)
	deadline := a.start.Add(time.Duration(c.claim.SelectTimeout))
	var w *waiter
	served := false
	defer func() {
		if w == nil {
			return
		}
		if pos := q.position(w); pos >= 0 {
			a.mu.Lock()
			a.queuePos = pos
			a.mu.Unlock()
		}
		if c.claim.shared() && !served {
			// also when the join's answer was lost: it may have landed
			b.leaveQueue(a.pool, w.id)
		}
		q.leave(w)
		metrics.queueDepth.WithLabelValues(a.pool).Dec()
		metrics.queueWait.WithLabelValues(a.pool).Observe(time.Since(a.start).Seconds())
	}()
	if q.depth() > 0 {
		// others of this instance wait already: first in, first served
		var ok bool
		if w, ok = c.join(q, a); !ok {
			return nil, outcomeQueueFull, ""
		}
	}
	woken := false // by a wake-up meant for it (wakeHead, wakeNext), not the timer
	for {
		// The groups are read again each round: a version's first worker
		// may register while the request waits.
		groups, o, msg := c.route(ctx, b, a)
		if o != outcomeNone {
			return nil, o, msg
		}
		if w != nil {
			q.setKey(w, groups, avoid)
			if o := c.enqueue(ctx, b, q, w, a); o != outcomeNone {
				return nil, o, ""
			}
		}
		behind := false
		if w == nil || woken || q.isHead(w) {
			id := registry.NotQueued
			switch {
			case !c.claim.shared():
				id = registry.OwnQueue
			case w != nil:
				id = w.id
			}
			claim, o, msg, workers, yielded := c.claimIn(ctx, b, a, groups, avoid, id)
			if claim != nil {
				served = true
				q.wakeHead() // more slots may be free: the next waiter looks
				return claim, outcomeNone, ""
			}
			if o != outcomeNone {
				return nil, o, msg
			}
			if everyWorkerFailed(a, workers) {
				return nil, outcomeFailed, failedMessage(a.pool)
			}
			if w != nil && !yielded {
				q.wakeNext(w)
			}
			behind = yielded
		}
		if w == nil {
			var ok bool
			if w, ok = c.join(q, a); !ok {
				return nil, outcomeQueueFull, ""
			}
			q.setKey(w, groups, avoid)
			if o := c.enqueue(ctx, b, q, w, a); o != outcomeNone {
				return nil, o, ""
			}
		}
		left := time.Until(deadline)
		if left <= 0 {
			return nil, outcomeTimeout, ""
		}
		every := pollEvery
		if behind {
			// an older waiter holds the worker found; should it not take
			// it up, its grant passes
			every = registry.QueueGrant + 20*time.Millisecond
		}
		t := time.NewTimer(min(left, every))
		woken = false
		select {
		case <-w.wake:
			woken = true
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, outcomeCanceled, ""
		}
		t.Stop()
	}
}

// enqueue gives w its place in the pool's queue when it has none (it has
// not joined yet, or its instance lost it: cut off from Redis longer than
// registry.QueueKeepFor). A full queue is outcomeQueueFull.
func (c *claimer) enqueue(ctx context.Context, b *backend, q *waitQueue, w *waiter, a *attempt) outcome {
	if !c.claim.shared() || q.position(w) >= 0 {
		return outcomeNone
	}
	ws := q.registryWaiter(w)
	cctx, cancel := context.WithTimeout(ctx, claimCallTimeout)
	pos, ok, err := b.reg.QueueJoin(cctx, a.pool, ws, c.claim.QueueSize)
	cancel()
	switch {
	case err != nil && ctx.Err() != nil:
		return outcomeCanceled
	case err != nil:
		metrics.redisErrors.WithLabelValues("queue").Inc()
		return outcomeRedis
	case !ok:
		a.mu.Lock()
		a.queuePos = pos // the depth: it would have been last
		a.mu.Unlock()
		return outcomeQueueFull
	}
	q.setPosition(w, pos)
	return outcomeNone
}

// failedMessage is the 502's sentence.
func failedMessage(pool string) string {
	return fmt.Sprintf("the %s browsers tried failed the WebSocket upgrade; retry later", pool)
}

// everyWorkerFailed reports whether the request failed on as many
// workers as its groups hold (each failure is another worker: a failed
// one is avoided). Then there is nothing to wait for: the client gets
// 502 now, not 503 after select_timeout, though dial_retries is not used
// up.
func everyWorkerFailed(a *attempt, workers int) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.failures > 0 && a.failures >= workers
}

func (c *claimer) join(q *waitQueue, a *attempt) (*waiter, bool) {
	w, ok, _ := q.joinClient(c.claim.QueueSize, a.client, c.claim.ClientLimit)
	if ok {
		metrics.queueDepth.WithLabelValues(a.pool).Inc()
	}
	return w, ok
}

// claimIn tries each group once; nil and outcomeNone: none is free now,
// of the workers the groups hold (as the claims counted them).
func (c *claimer) claimIn(ctx context.Context, b *backend, a *attempt, groups, avoid []string, waiter string) (claimed *registry.Claim, o outcome, msg string, workers int, behind bool) {
	refused := 0
	for _, g := range groups {
		for {
			req := registry.ClaimRequest{
				Group: g, Policy: c.policy, Options: c.options, Limits: c.limits.Limits,
				Session: newSessionID(), Client: a.client, ClientLimit: c.claim.ClientLimit,
				Instance: b.instance, Label: a.label, Avoid: avoid,
				StaleAfter: time.Duration(c.app.StaleThreshold), MaxScan: c.claim.MaxScan, Waiter: waiter,
			}
			cctx, cancel := context.WithTimeout(ctx, claimCallTimeout)
			start := time.Now()
			claim, info, err := b.reg.Claim(cctx, req)
			cancel()
			metrics.selectDuration.WithLabelValues(a.pool, string(c.policy)).Observe(time.Since(start).Seconds())
			if len(info.Stale) > 0 {
				b.kick(g)
			}
			switch {
			case err == nil:
			case errors.Is(err, registry.ErrNoWorker):
			case errors.Is(err, registry.ErrBehind):
				behind = true
			case errors.Is(err, registry.ErrClientLimit):
				return nil, outcomeClientLimited, fmt.Sprintf("client limit reached: this client holds its client_limit of %d live sessions in pool %s; retry when one has ended", c.claim.ClientLimit, a.pool), 0, false
			case ctx.Err() != nil:
				return nil, outcomeCanceled, "", 0, false
			case errors.Is(err, registry.ErrSchema):
				if b.firstReport("schema", g) {
					c.logger.Error("the pool's registry was written by another schema; upgrade the older side", zap.String("pool", g), zap.Error(err))
				}
				return nil, outcomeMisconfigured, "the grid's registry was written by another release of the grid; the operator must upgrade the older side", 0, false
			default:
				metrics.redisErrors.WithLabelValues("claim").Inc()
				if b.firstReport("claim", g) {
					c.logger.Error("claiming a worker", zap.String("pool", g), zap.Error(err))
				}
				if strings.Contains(err.Error(), "record") {
					break // a record that did not decode: given back, try again
				}
				return nil, outcomeRedis, "", 0, false
			}
			if err != nil {
				workers += info.Workers // the group's, as the claim counted them
				break
			}
			if addr, r := c.app.dial.check(ctx, &claim.Worker); r != nil {
				c.refuseRecord(b, &claim, r)
				if refused++; refused >= maxRefusedRecords {
					return nil, outcomeTimeout, "", 0, false
				}
				avoid = append(avoid, claim.Worker.ID)
				continue
			} else {
				claim.Worker.Addr = addr
			}
			metrics.selections.WithLabelValues(a.pool, string(c.policy)).Inc()
			v := claim.Worker.Version
			if v == "" {
				v = versionNone
			}
			metrics.versions.WithLabelValues(a.pool, v).Inc()
			if claim.Last {
				metrics.retirements.WithLabelValues(a.pool).Inc()
			}
			return &claim, outcomeNone, "", 0, false
		}
	}
	return nil, outcomeNone, "", workers, behind
}

// refuseRecord reports a record the dial policy refuses and gives its
// claim back, the worker skipped by every instance for suspectFor.
func (c *claimer) refuseRecord(b *backend, claim *registry.Claim, r *refusal) {
	badRecords.WithLabelValues(claim.Worker.Pool, r.reason).Inc()
	if b.firstReport("refused", claim.Group+" "+claim.Worker.ID) {
		c.logger.Warn("refusing to dial a worker record outside the dial policy; trying another worker",
			zap.String("pool", claim.Group), zap.String("worker_id", claim.Worker.ID), zap.String("reason", r.reason), zap.Error(r.err))
	}
	ctx, cancel := context.WithTimeout(context.Background(), claimCallTimeout)
	defer cancel()
	if _, err := b.reg.GiveBack(ctx, claim.Group, claim.Worker.ID, true, suspectFor, claim.Session); err != nil {
		metrics.redisErrors.WithLabelValues("give_back").Inc()
	}
}

// giveBack gives a claim back that never reached its agent; failed: the
// worker failed it, and every instance skips it for suspectFor.
func (c *claimer) giveBack(a *attempt, claim *registry.Claim, failed bool) {
	giveBack(c.app.backend, claim, failed)
}

func giveBack(b *backend, claim *registry.Claim, failed bool) {
	ctx, cancel := context.WithTimeout(context.Background(), claimCallTimeout)
	defer cancel()
	if _, err := b.reg.GiveBack(ctx, claim.Group, claim.Worker.ID, failed, suspectFor, claim.Session); err != nil {
		metrics.redisErrors.WithLabelValues("give_back").Inc()
		if b.firstReport("give_back", claim.Group) {
			b.logger.Warn("could not give back a claim; the worker's agent ends it at its next heartbeat",
				zap.String("pool", claim.Group), zap.String("worker_id", claim.Worker.ID), zap.Error(err))
		}
	}
}

// route is the groups a request may claim in: its Playwright version's,
// or for a client that names none (or with version_routing off) every
// group of the pool, its workers without a version first. A version no
// worker serves gets 428 at once.
func (c *claimer) route(ctx context.Context, b *backend, a *attempt) ([]string, outcome, string) {
	vs, err := b.poolVersions(ctx, a.pool)
	if err != nil {
		metrics.redisErrors.WithLabelValues("versions").Inc()
		return nil, outcomeRedis, ""
	}
	if !c.claim.routing() || a.version == "" || len(vs.Versions) == 0 {
		return vs.Groups(a.pool), outcomeNone, ""
	}
	if vs.Has(a.version) {
		return []string{registry.GroupPool(a.pool, a.version)}, outcomeNone, ""
	}
	metrics.versions.WithLabelValues(a.pool, versionUnregistered).Inc()
	return nil, outcomeUnknownVersion, fmt.Sprintf("no %s browser of this grid serves Playwright %s: its workers serve Playwright %s; connect with a playwright-core of one of these versions",
		a.pool, a.version, strings.Join(vs.Versions, ", "))
}
