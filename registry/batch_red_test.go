package registry

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
	"github.com/browsergrid/caddy-browser-grid/selection"
	"github.com/redis/go-redis/v9"
)

// Red-team tests of group commit (batch.go): cancellations at every
// point, whole-batch failures, a flushed or restarted Redis, maxmemory,
// Cluster, replies matched to their callers, huge batches.

// holdQueue marks f's queue for pool busy, as if a call were in flight,
// so that the calls made next wait and go together (releaseQueue).
func holdQueue(r *Registry, f function, pool string) *callQueue {
	q := r.batch.queue(f, pool)
	q.mu.Lock()
	q.busy = true
	q.mu.Unlock()
	return q
}

// waitQueued polls until n calls wait in q.
func waitQueued(t testing.TB, q *callQueue, n int) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, fmt.Sprint(n, " calls queued"), func() bool {
		q.mu.Lock()
		defer q.mu.Unlock()
		return len(q.waiting) == n
	})
}

// waitIdle polls until q has nothing in flight and nothing waiting.
func waitIdle(t *testing.T, q *callQueue) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, "the queue idle", func() bool {
		q.mu.Lock()
		defer q.mu.Unlock()
		return !q.busy && len(q.waiting) == 0
	})
}

// batchOf is n calls into one pool's queue, made so that they go to
// Redis together, as one batch.
type batchOf struct {
	pool string
	n    int
	// inOrder starts call i only once call i-1 waits, so that the batch
	// holds the calls in the order of i.
	inOrder bool
	// beforeSend, if set, runs once all n calls wait, just before the
	// batch is sent (to kill Redis, flush its functions, read a counter).
	beforeSend func()
}

// calls holds f's queue for b.pool busy, makes the n calls (call(i),
// each in its own goroutine), waits until all n wait in the queue, sends
// them as one batch (nextBatch) and returns the queue once every call has
// returned.
func (b batchOf) calls(t testing.TB, r *Registry, f function, call func(i int)) *callQueue {
	t.Helper()
	q := holdQueue(r, f, b.pool)
	var wg sync.WaitGroup
	for i := range b.n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			call(i)
		}()
		if b.inOrder {
			waitQueued(t, q, i+1)
		}
	}
	waitQueued(t, q, b.n)
	if b.beforeSend != nil {
		b.beforeSend()
	}
	r.nextBatch(q, f, b.pool)
	wg.Wait()
	return q
}

// claims makes b.n claims like req (in b.pool) in one batch, and
// returns each one's claim and error.
func (b batchOf) claims(t testing.TB, r *Registry, req ClaimRequest) ([]*Claim, []error) {
	t.Helper()
	req.Pool = b.pool
	claims, errs := make([]*Claim, b.n), make([]error, b.n)
	b.calls(t, r, scriptClaim, func(i int) {
		claims[i], errs[i] = r.Claim(context.Background(), req)
	})
	return claims, errs
}

// releases releases the leases of claims (in b.pool) in one batch, and
// returns each release's error.
func (b batchOf) releases(t testing.TB, r *Registry, claims []*Claim) []error {
	t.Helper()
	b.n = len(claims)
	errs := make([]error, b.n)
	b.calls(t, r, scriptLease, func(i int) {
		errs[i] = r.Release(context.Background(), b.pool, claims[i].LeaseID)
	})
	return errs
}

// inOneBatch makes n calls into f's queue for pool in one batch (see
// batchOf.calls) and returns the queue once all have returned.
func inOneBatch(t *testing.T, r *Registry, f function, pool string, n int, call func(i int)) *callQueue {
	t.Helper()
	return batchOf{pool: pool, n: n}.calls(t, r, f, call)
}

// noDrift fails the test when pool's counts are apart from its leases or
// a worker still counts a session.
func noDrift(t *testing.T, r *Registry, rdb redis.UniversalClient, pool string) {
	t.Helper()
	ctx := context.Background()
	if bad, err := activeDrift(ctx, r, rdb, pool); err != nil || len(bad) > 0 {
		t.Fatalf("counts apart from the leases: %v %v", bad, err)
	}
	for id, c := range counts(t, r, pool) {
		if c[0] != 0 {
			t.Errorf("worker %s: active %d after every session ended, want 0", id, c[0])
		}
	}
	if n, err := rdb.ZCard(ctx, r.Key(pool, keyLeaseOwner)).Result(); err != nil || n != 0 {
		t.Errorf("lease owner entries left: %d (%v)", n, err)
	}
}

// settled waits until pool's claim and lease queues are idle and every
// slot is free (calls given up in flight may still be running), then
// checks for drift (noDrift).
func settled(t *testing.T, r *Registry, rdb redis.UniversalClient, pool string) {
	t.Helper()
	waitIdle(t, r.batch.queue(scriptClaim, pool))
	waitIdle(t, r.batch.queue(scriptLease, pool))
	testenv.Eventually(t, 30*time.Second, "every slot free", func() bool {
		for _, c := range counts(t, r, pool) {
			if c[0] != 0 {
				return false
			}
		}
		return true
	})
	noDrift(t, r, rdb, pool)
}

// redEcho replies what its ARGV asks for, so that a lone call and the
// same call batched can be compared reply for reply.
var redEcho = newLibrary([]libScript{{name: "redecho", batch: true, body: `
local op, v = ARGV[4], ARGV[5]
if op == 'nil' then return nil end
if op == 'false' then return false end
if op == 'true' then return true end
if op == 'int' then return tonumber(v) end
if op == 'str' then return v end
if op == 'arr' then return { 1, v, false, 3 } end
if op == 'err' then return redis.error_reply('REDERR ' .. v) end
if op == 'raise' then error('raised ' .. v) end
if op == 'callerr' then return redis.call('INCRBY', K_CFG, 'x') end
return redis.error_reply('unknown op ' .. tostring(op))
`}}).function("redecho")

// TestBatchRedRepliesAsAlone: every kind of reply a script may give
// reaches its caller batched as it does from a lone call: the same value,
// the same error (redis.Nil for a script that returns nothing).
func TestBatchRedRepliesAsAlone(t *testing.T) {
	r, rdb := startRegistry(t, Options{})
	ctx := context.Background()
	const pool = "red-echo"
	ops := [][2]string{{"nil", ""}, {"false", ""}, {"true", ""}, {"int", "7"}, {"str", "s"}, {"arr", "a"},
		{"err", "e"}, {"raise", "r"}, {"callerr", ""}, {"int", "8"}}
	type reply struct {
		res any
		err error
	}
	alone := make([]reply, len(ops))
	for i, op := range ops {
		alone[i].res, alone[i].err = r.run(ctx, redEcho, pool, 0, op[0], op[1]).Result()
	}
	batched := make([]reply, len(ops))
	q := batchOf{pool: pool, n: len(ops), inOrder: true}.calls(t, r, redEcho, func(i int) {
		batched[i].res, batched[i].err = r.runBatched(ctx, redEcho, pool, ops[i][0], ops[i][1])
	})
	waitIdle(t, q)
	stats, err := rdb.Info(ctx, "errorstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(stats, "\n") {
		if code, ok := strings.CutPrefix(strings.TrimSpace(l), "errorstat_"); ok && !strings.HasPrefix(code, "ERR:") && !strings.HasPrefix(code, "REDERR:") {
			t.Errorf("INFO errorstats counts an error code of a script's line: %s", code)
		}
	}
	for i, op := range ops {
		a, b := alone[i], batched[i]
		switch {
		case !reflect.DeepEqual(a.res, b.res):
			t.Errorf("%s: batched reply %#v, alone %#v", op[0], b.res, a.res)
		case (a.err == nil) != (b.err == nil):
			t.Errorf("%s: batched error %v, alone %v", op[0], b.err, a.err)
		case errors.Is(a.err, redis.Nil) != errors.Is(b.err, redis.Nil):
			t.Errorf("%s: batched error %v, alone %v (redis.Nil)", op[0], b.err, a.err)
		case a.err != nil:
			var ra, rb redis.Error
			if errors.As(a.err, &ra) != errors.As(b.err, &rb) {
				t.Errorf("%s: batched error %#v, alone %#v (a Redis error reply)", op[0], b.err, a.err)
			}
			// the error code (the reply's first word) is what clients and
			// INFO errorstats go by
			ca, _, _ := strings.Cut(a.err.Error(), " ")
			cb, _, _ := strings.Cut(b.err.Error(), " ")
			if ca != cb {
				t.Errorf("%s: batched error code %q (%q), alone %q (%q)", op[0], cb, b.err, ca, a.err)
			}
		}
	}
}

// TestBatchRedCancelStorm: many callers claim and end sessions with
// deadlines that expire at every point (before sending, while waiting for
// a call in flight, in flight), cancelling every claim whose outcome they
// do not know as the gateway does. Nothing is over-admitted, no slot or
// lease is left once every cancel ran, and the queues end idle.
func TestBatchRedCancelStorm(t *testing.T) {
	r, rdb := startRegistry(t, Options{})
	const pool, workers, capacity, goroutines, rounds = "red-storm", 4, 3, 64, 100
	for i := range workers {
		register(t, r, pool, fmt.Sprint("w", i), capacity)
	}
	bg := context.Background()
	timeouts := []time.Duration{0, time.Microsecond, 20 * time.Microsecond, 100 * time.Microsecond,
		300 * time.Microsecond, time.Millisecond, 3 * time.Millisecond, -1}
	var mu sync.Mutex
	var claims, granted, cancelled, gaveUpWaiting, noWorker, endErrs int
	var over, failed []string
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 7))
			withTimeout := func() (context.Context, context.CancelFunc) {
				d := timeouts[rng.IntN(len(timeouts))]
				switch {
				case d < 0:
					return context.WithCancel(bg)
				case rng.IntN(2) == 0:
					// the caller goes away (a client hangs up) after d
					ctx, cancel := context.WithCancel(bg)
					time.AfterFunc(d, cancel)
					return ctx, cancel
				}
				return context.WithTimeout(bg, d)
			}
			for range rounds {
				lease := NewLeaseID()
				ctx, cancel := withTimeout()
				c, err := r.Claim(ctx, ClaimRequest{Pool: pool, Policy: LifetimeFirst, Holder: fmt.Sprint("g", g),
					LeaseID: lease, Limits: selection.Limits{MaxConcurrent: capacity}})
				cancel()
				mu.Lock()
				claims++
				switch {
				case err == nil:
					granted++
					if c.Worker.Active > capacity {
						over = append(over, fmt.Sprintf("%s active %d", c.Worker.ID, c.Worker.Active))
					}
				case errors.Is(err, ErrNoWorker):
					noWorker++
				default:
					cancelled++
					if strings.Contains(err.Error(), "waiting for a call in flight") {
						gaveUpWaiting++
					}
				}
				mu.Unlock()
				if err != nil && !errors.Is(err, ErrNoWorker) {
					// outcome unknown: cancel it, retried until it runs
					if err := r.Cancel(bg, pool, lease); err != nil {
						mu.Lock()
						failed = append(failed, "cancel: "+err.Error())
						mu.Unlock()
					}
					continue
				}
				if err != nil {
					continue
				}
				ctx, cancel = withTimeout()
				end := r.Release
				if rng.IntN(3) == 0 {
					end = r.Cancel
				}
				err = end(ctx, pool, lease)
				cancel()
				if err != nil {
					mu.Lock()
					endErrs++
					mu.Unlock()
					if err := end(bg, pool, lease); err != nil {
						mu.Lock()
						failed = append(failed, "end: "+err.Error())
						mu.Unlock()
					}
				}
			}
		}()
	}
	wg.Wait()
	t.Logf("%d claims: %d granted, %d no worker, %d failed and cancelled (%d gave up waiting); %d ends timed out and were retried",
		claims, granted, noWorker, cancelled, gaveUpWaiting, endErrs)
	if len(failed) > 0 {
		t.Fatalf("%d calls without a deadline failed, first: %s", len(failed), failed[0])
	}
	if len(over) > 0 {
		t.Fatalf("over-admitted: %v", over)
	}
	settled(t, r, rdb, pool)
	if _, err := r.Claim(bg, ClaimRequest{Pool: pool, Policy: LifetimeFirst, Holder: "after"}); err != nil {
		t.Fatalf("a claim after the storm: %v", err)
	}
}

// TestBatchRedRestartMidBatch: Redis dies with a batch in flight and
// comes back empty (no library). The batch fails for each of its callers
// and the queue is free again: the next batch loads the library, with its
// _many functions, and runs.
func TestBatchRedRestartMidBatch(t *testing.T) {
	srv := testenv.StartRedis(t)
	r, rdb := registryAt(t, srv.URL(), Options{})
	ctx := context.Background()
	const pool = "red-restart"
	register(t, r, pool, "a", 8)
	const n = 6
	errs := make([]error, n)
	q := batchOf{pool: pool, n: n, beforeSend: srv.Kill}.calls(t, r, scriptClaim, func(i int) {
		cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		_, errs[i] = r.Claim(cctx, ClaimRequest{Pool: pool, Policy: LifetimeFirst, Holder: "t"})
	})
	for i, err := range errs {
		if err == nil {
			t.Errorf("claim %d succeeded against a dead Redis", i)
		}
	}
	waitIdle(t, q)
	srv.Restart()
	register(t, r, pool, "a", 8)
	var before int
	leases, errs := batchOf{pool: pool, n: n, beforeSend: func() { before = fcalls(t, rdb) }}.
		claims(t, r, ClaimRequest{Policy: LifetimeFirst, Holder: "t"})
	for i, err := range errs {
		if err != nil {
			t.Fatalf("claim %d after the restart: %v", i, err)
		}
	}
	if sent := fcalls(t, rdb) - before; sent > 2 {
		t.Errorf("%d FCALLs for one batch after the restart, want it sent as one (and its retry)", sent)
	}
	waitIdle(t, q)
	seen := map[string]bool{}
	for _, c := range leases {
		if seen[c.LeaseID] {
			t.Fatalf("lease %s given to two callers", c.LeaseID)
		}
		seen[c.LeaseID] = true
		if err := r.Release(ctx, pool, c.LeaseID); err != nil {
			t.Fatal(err)
		}
	}
	noDrift(t, r, rdb, pool)
}

// TestBatchRedFunctionFlush: FUNCTION FLUSH between calls; the next
// batches (claims and lease ends) load the library again and run.
func TestBatchRedFunctionFlush(t *testing.T) {
	r, rdb := startRegistry(t, Options{})
	ctx := context.Background()
	const pool, n = "red-flush", 5
	register(t, r, pool, "a", n)
	flushed := batchOf{pool: pool, n: n, beforeSend: func() {
		if err := rdb.FunctionFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
	}}
	claims, errs := flushed.claims(t, r, ClaimRequest{Policy: LifetimeFirst, Holder: "t"})
	for i, err := range errs {
		if err != nil {
			t.Fatalf("batched claim %d after FUNCTION FLUSH: %v", i, err)
		}
	}
	for i, err := range flushed.releases(t, r, claims) {
		if err != nil {
			t.Fatalf("batched release %d after FUNCTION FLUSH: %v", i, err)
		}
	}
	waitIdle(t, r.batch.queue(scriptLease, pool))
	noDrift(t, r, rdb, pool)
}

// TestBatchRedReleasesAboveMaxmemory: lease ends batched together still
// run above maxmemory (lease_many is allow-oom like lease); claims batched
// together get Redis' OOM error each.
func TestBatchRedReleasesAboveMaxmemory(t *testing.T) {
	ctx := context.Background()
	srv := testenv.StartRedis(t, "--maxmemory-policy", "noeviction")
	r, rdb := registryAt(t, srv.URL(), Options{})
	const pool, n = "red-oom", 6
	register(t, r, pool, "a", n)
	var leases []string
	for range n {
		c, err := r.Claim(ctx, ClaimRequest{Pool: pool, Policy: LifetimeFirst, LeaseTTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, c.LeaseID)
	}
	big := make([]byte, 64<<10)
	for i := range 48 {
		if err := srv.Client().Set(ctx, fmt.Sprintf("other-app-%d", i), big, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	overMaxmemory(t, srv.Client())
	_, errs := batchOf{pool: pool, n: 3}.claims(t, r, ClaimRequest{Policy: LifetimeFirst, LeaseTTL: time.Minute})
	for i, err := range errs {
		if err == nil || !errorsContain(err, "OOM") {
			t.Errorf("batched claim %d above maxmemory: %v, want Redis' OOM error", i, err)
		}
	}
	errs = make([]error, n)
	q := inOneBatch(t, r, scriptLease, pool, n, func(i int) {
		if i%2 == 0 {
			errs[i] = r.Release(ctx, pool, leases[i])
		} else {
			errs[i] = r.Undo(ctx, pool, leases[i], 0)
		}
	})
	for i, err := range errs {
		if err != nil {
			t.Errorf("batched lease end %d above maxmemory: %v", i, err)
		}
	}
	waitIdle(t, q)
	noDrift(t, r, rdb, pool)
}

func errorsContain(err error, s string) bool { return err != nil && strings.Contains(err.Error(), s) }

// TestBatchRedOwnLeases: claims with their own lease ids in one batch
// each get their own lease (the reply of their own call), and a lease id
// sent twice in one batch claims once: both callers get the same lease,
// one slot.
func TestBatchRedOwnLeases(t *testing.T) {
	r, rdb := startRegistry(t, Options{})
	ctx := context.Background()
	const pool, n = "red-own", 12
	for i := range 4 {
		register(t, r, pool, fmt.Sprint("w", i), 8)
	}
	ids := make([]string, n)
	for i := range ids {
		ids[i] = NewLeaseID()
	}
	ids[n-1] = ids[3] // the same lease twice in the batch
	claims := make([]*Claim, n)
	errs := make([]error, n)
	q := batchOf{pool: pool, n: n, inOrder: true}.calls(t, r, scriptClaim, func(i int) {
		claims[i], errs[i] = r.Claim(ctx, ClaimRequest{Pool: pool, Policy: LifetimeFirst, Holder: fmt.Sprint("h", i), LeaseID: ids[i]})
	})
	waitIdle(t, q)
	for i, err := range errs {
		if err != nil {
			t.Fatalf("claim %d: %v", i, err)
		}
		if claims[i].LeaseID != ids[i] {
			t.Fatalf("claim %d got lease %s, want its own %s", i, claims[i].LeaseID, ids[i])
		}
	}
	for i := range n {
		raw, err := rdb.HGet(ctx, r.Key(pool, keyLeases), ids[i]).Result()
		if err != nil {
			t.Fatalf("lease %s of claim %d: %v", ids[i], i, err)
		}
		if !strings.Contains(raw, `"`+claims[i].Worker.ID+`"`) {
			t.Errorf("lease %s of claim %d is %s, but the caller was told worker %s", ids[i], i, raw, claims[i].Worker.ID)
		}
	}
	if claims[3].Worker.ID != claims[n-1].Worker.ID {
		t.Errorf("the same lease id twice: workers %s and %s", claims[3].Worker.ID, claims[n-1].Worker.ID)
	}
	total := 0
	for _, c := range counts(t, r, pool) {
		total += c[0]
	}
	if total != n-1 {
		t.Errorf("%d slots held for %d distinct leases", total, n-1)
	}
	if bad, err := activeDrift(ctx, r, rdb, pool); err != nil || len(bad) > 0 {
		t.Fatalf("counts apart from the leases: %v %v", bad, err)
	}
	for i := range n - 1 {
		if err := r.Release(ctx, pool, ids[i]); err != nil {
			t.Fatal(err)
		}
	}
	noDrift(t, r, rdb, pool)
}

// TestBatchRedHugeBatch: MaxBatch 1000 is capped: 1000 claims waiting
// go in calls of MaxBatchCap, and all are served, as are their releases.
func TestBatchRedHugeBatch(t *testing.T) {
	r, rdb := startRegistry(t, Options{MaxBatch: 1000})
	const pool, n = "red-huge", 1000
	for i := range 10 {
		register(t, r, pool, fmt.Sprint("w", i), 100)
	}
	var before int
	var start time.Time
	claims, errs := batchOf{pool: pool, n: n, beforeSend: func() { before, start = fcalls(t, rdb), time.Now() }}.
		claims(t, r, ClaimRequest{Policy: LifetimeFirst, Holder: "t"})
	t.Logf("a batch of %d claims answered in %s", n, time.Since(start))
	for i, err := range errs {
		if err != nil {
			t.Fatalf("claim %d of a batch of %d: %v", i, n, err)
		}
	}
	// MaxBatch 1000 is taken as MaxBatchCap: ceil(1000/256) calls
	if sent, want := fcalls(t, rdb)-before, (n+MaxBatchCap-1)/MaxBatchCap; sent != want {
		t.Errorf("%d FCALLs for %d claims waiting with MaxBatch 1000, want %d (MaxBatchCap %d)", sent, n, want, MaxBatchCap)
	}
	for i, err := range (batchOf{pool: pool}).releases(t, r, claims) {
		if err != nil {
			t.Fatalf("release %d of a batch of %d: %v", i, n, err)
		}
	}
	waitIdle(t, r.batch.queue(scriptLease, pool))
	noDrift(t, r, rdb, pool)
}

// TestBatchRedCluster: batched claims and releases on a three-node
// Cluster: _many loads on the pool's node and runs there.
func TestBatchRedCluster(t *testing.T) {
	cl := testenv.StartCluster(t)
	r, rdb := registryAt(t, cl.URL(), Options{})
	for _, pool := range []string{"chromium", "firefox", "webkit", "p1"} {
		register(t, r, pool, "a", 8)
		b := batchOf{pool: pool, n: 5}
		claims, errs := b.claims(t, r, ClaimRequest{Policy: LifetimeFirst, Holder: "t"})
		for i, err := range errs {
			if err != nil {
				t.Fatalf("pool %s: batched claim %d: %v", pool, i, err)
			}
		}
		for i, err := range b.releases(t, r, claims) {
			if err != nil {
				t.Fatalf("pool %s: batched release %d: %v", pool, i, err)
			}
		}
		waitIdle(t, r.batch.queue(scriptLease, pool))
		noDrift(t, r, rdb, pool)
	}
}

// TestBatchRedStallMidBatch: Redis stops answering for a second while
// claims and releases keep coming, every caller with a short deadline.
// The queues do not stay busy, no slot is left once the callers cancel
// what they do not know, and claims work again afterwards.
func TestBatchRedStallMidBatch(t *testing.T) {
	srv := testenv.StartRedis(t)
	r, rdb := registryAt(t, srv.URL(), Options{})
	bg := context.Background()
	const pool, goroutines = "red-stall", 24
	for i := range 3 {
		register(t, r, pool, fmt.Sprint("w", i), 4)
	}
	stop := make(chan struct{})
	var mu sync.Mutex
	var claims, granted, failed int
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				lease := NewLeaseID()
				ctx, cancel := context.WithTimeout(bg, 150*time.Millisecond)
				_, err := r.Claim(ctx, ClaimRequest{Pool: pool, Policy: LifetimeFirst, Holder: fmt.Sprint("g", g), LeaseID: lease})
				cancel()
				mu.Lock()
				claims++
				if err == nil {
					granted++
				} else if !errors.Is(err, ErrNoWorker) {
					failed++
				}
				mu.Unlock()
				if errors.Is(err, ErrNoWorker) {
					continue
				}
				end := r.Release
				if err != nil {
					end = r.Cancel
				}
				// the gateway retries in the background until it runs
				testenv.Eventually(t, 30*time.Second, "a lease end to run", func() bool {
					ctx, cancel := context.WithTimeout(bg, 500*time.Millisecond)
					defer cancel()
					return end(ctx, pool, lease) == nil
				})
			}
		}()
	}
	testenv.Eventually(t, 30*time.Second, "claims granted before the stall", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return granted > 50
	})
	srv.Stall(time.Second)
	testenv.Eventually(t, 30*time.Second, "claims granted after the stall", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return granted > 200 && failed > 0
	})
	close(stop)
	wg.Wait()
	t.Logf("%d claims: %d granted, %d failed and cancelled", claims, granted, failed)
	settled(t, r, rdb, pool)
}

// TestBatchRedOnReplica: lease ends batched on a read-only replica fail,
// each with the replica's refusal, and leave the queue free.
func TestBatchRedOnReplica(t *testing.T) {
	r, _ := startRegistry(t, Options{})
	ctx := context.Background()
	const pool = "red-replica"
	register(t, r, pool, "a", 4)
	c, err := r.Claim(ctx, ClaimRequest{Pool: pool, Policy: LifetimeFirst, Holder: "t"})
	if err != nil {
		t.Fatal(err)
	}
	ro, rc := startReplica(t, r)
	testenv.Eventually(t, 30*time.Second, "the replica in sync", func() bool {
		n, err := rc.HLen(ctx, r.Key(pool, keyLeases)).Result()
		return err == nil && n == 1
	})
	errs := make([]error, 3)
	q := inOneBatch(t, ro, scriptLease, pool, len(errs), func(i int) {
		cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		errs[i] = ro.Release(cctx, pool, c.LeaseID)
	})
	for i, err := range errs {
		if err == nil || !strings.Contains(err.Error(), "READONLY") {
			t.Errorf("batched release %d on a replica: %v, want READONLY", i, err)
		}
	}
	waitIdle(t, q)
	if err := r.Release(ctx, pool, c.LeaseID); err != nil {
		t.Fatal(err)
	}
}

// TestBatchRedSweepRetry: a pool full of expired leases; claims batched
// together are refused without sweeping, retried with a sweep (decide),
// and granted, each its own slot.
func TestBatchRedSweepRetry(t *testing.T) {
	r, rdb := startRegistry(t, Options{LeaseSweep: 10})
	ctx := context.Background()
	const pool, n = "red-sweep", 4
	register(t, r, pool, "a", n)
	for range n {
		c, err := r.Claim(ctx, ClaimRequest{Pool: pool, Policy: LifetimeFirst, Holder: "gone", LeaseTTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		// its holder stopped renewing: its expiry has passed
		if err := rdb.ZAddXX(ctx, r.Key(pool, keyLeaseExpiry), redis.Z{Score: 1, Member: c.LeaseID}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	claims, errs := batchOf{pool: pool, n: n}.claims(t, r, ClaimRequest{Policy: LifetimeFirst, Holder: "new", LeaseTTL: time.Minute})
	waitIdle(t, r.batch.queue(scriptClaim, pool))
	seen := map[string]bool{}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("claim %d in a pool of expired leases: %v", i, err)
		}
		if seen[claims[i].LeaseID] {
			t.Fatalf("lease %s given twice", claims[i].LeaseID)
		}
		seen[claims[i].LeaseID] = true
	}
	if got := counts(t, r, pool)["a"]; got[0] != n {
		t.Fatalf("worker a: active %d, want %d (the new claims only)", got[0], n)
	}
	if bad, err := activeDrift(ctx, r, rdb, pool); err != nil || len(bad) > 0 {
		t.Fatalf("counts apart from the leases: %v %v", bad, err)
	}
	for _, c := range claims {
		if err := r.Release(ctx, pool, c.LeaseID); err != nil {
			t.Fatal(err)
		}
	}
	noDrift(t, r, rdb, pool)
}

// TestBatchRedMaxBatchSplits: MaxBatch 2 and 5 calls waiting: they go
// as 2, 2 and 1 (the last alone), every one answered, the queue idle.
func TestBatchRedMaxBatchSplits(t *testing.T) {
	r, rdb := startRegistry(t, Options{MaxBatch: 2})
	ctx := context.Background()
	const pool, n = "red-split", 5
	register(t, r, pool, "a", n)
	var before int
	claims, errs := batchOf{pool: pool, n: n, beforeSend: func() { before = fcalls(t, rdb) }}.
		claims(t, r, ClaimRequest{Policy: LifetimeFirst, Holder: "t"})
	waitIdle(t, r.batch.queue(scriptClaim, pool))
	if sent := fcalls(t, rdb) - before; sent != 3 {
		t.Errorf("%d FCALLs for 5 calls at MaxBatch 2, want 3", sent)
	}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("claim %d: %v", i, err)
		}
		if err := r.Release(ctx, pool, claims[i].LeaseID); err != nil {
			t.Fatal(err)
		}
	}
	noDrift(t, r, rdb, pool)
}

// TestBatchRedSameEndTwice: one lease released, undone and cancelled in
// the same batch (a retry racing its first try): it frees one slot, once.
func TestBatchRedSameEndTwice(t *testing.T) {
	r, rdb := startRegistry(t, Options{})
	ctx := context.Background()
	const pool = "red-twice"
	register(t, r, pool, "a", 4)
	var cs []*Claim
	for range 2 {
		c, err := r.Claim(ctx, ClaimRequest{Pool: pool, Policy: LifetimeFirst, Holder: "t"})
		if err != nil {
			t.Fatal(err)
		}
		cs = append(cs, c)
	}
	ends := []func(context.Context, string, string) error{r.Release, r.Release,
		func(ctx context.Context, pool, id string) error { return r.Undo(ctx, pool, id, time.Minute) }, r.Cancel}
	errs := make([]error, len(ends))
	q := batchOf{pool: pool, n: len(ends), inOrder: true}.calls(t, r, scriptLease, func(i int) {
		errs[i] = ends[i](ctx, pool, cs[0].LeaseID)
	})
	waitIdle(t, q)
	for i, err := range errs {
		if err != nil {
			t.Fatalf("end %d: %v", i, err)
		}
	}
	got := counts(t, r, pool)["a"]
	if got != [2]int{1, 2} {
		t.Fatalf("worker a: active, lifetime %v after one of its two leases ended (four times), want [1 2]", got)
	}
	if bad, err := activeDrift(ctx, r, rdb, pool); err != nil || len(bad) > 0 {
		t.Fatalf("counts apart from the leases: %v %v", bad, err)
	}
	if err := r.Release(ctx, pool, cs[1].LeaseID); err != nil {
		t.Fatal(err)
	}
	noDrift(t, r, rdb, pool)
}

// TestBatchRedClientLimit: one client's claims batched together are held
// to its budget call by call, as back to back: exactly ClientLimit
// granted, the rest refused with ErrClientLimit.
func TestBatchRedClientLimit(t *testing.T) {
	r, rdb := startRegistry(t, Options{})
	ctx := context.Background()
	const pool, n, limit = "red-client", 8, 3
	register(t, r, pool, "a", n)
	register(t, r, pool, "b", n)
	claims, errs := batchOf{pool: pool, n: n}.claims(t, r, ClaimRequest{Policy: LifetimeFirst, Holder: "t",
		ClientKey: "10.0.0.1", ClientLimit: limit})
	waitIdle(t, r.batch.queue(scriptClaim, pool))
	granted := 0
	for i, err := range errs {
		switch {
		case err == nil:
			granted++
		case !errors.Is(err, ErrClientLimit):
			t.Fatalf("claim %d: %v, want a grant or ErrClientLimit", i, err)
		}
	}
	if granted != limit {
		t.Fatalf("%d claims granted to one client with a limit of %d", granted, limit)
	}
	for _, c := range claims {
		if c != nil {
			if err := r.Release(ctx, pool, c.LeaseID); err != nil {
				t.Fatal(err)
			}
		}
	}
	noDrift(t, r, rdb, pool)
}
