package registry

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/browsergrid/caddy-browser-grid/selection"
)

// fcalls is how many FCALLs the server has run (INFO commandstats).
func fcalls(t *testing.T, rdb redis.UniversalClient) int {
	t.Helper()
	return commandCalls(t, rdb, "fcall")
}

// commandCalls is how many times Redis ran cmd (INFO commandstats; a
// script's nested commands count too).
func commandCalls(t *testing.T, rdb redis.UniversalClient, cmd string) int {
	t.Helper()
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+cmd+":calls="); ok {
			n, err := strconv.Atoi(rest[:strings.IndexByte(rest, ',')])
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	return 0
}

// largestBatch records the most calls one call to Redis carried
// (Options.OnBatch).
type largestBatch struct {
	mu sync.Mutex
	n  int
}

func (l *largestBatch) observe(_, _ string, n int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.n = max(l.n, n)
}

// take returns the most seen since the last take.
func (l *largestBatch) take() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := l.n
	l.n = 0
	return n
}

// claimLoad is what a claim-and-release load saw (read once it is done).
type claimLoad struct {
	calls, granted int
	// over: claims that reported their worker above max_concurrent after
	// themselves (Redis' own count); failed: calls that failed.
	over, failed []string
}

// startClaimLoad has goroutines each claim and release in pool rounds
// times, under max_concurrent capacity (a refusal, ErrNoWorker, counts
// as a call, not a failure); done closes when all have finished.
func startClaimLoad(r *Registry, pool string, capacity, goroutines, rounds int) (<-chan struct{}, *claimLoad) {
	ctx := context.Background()
	var mu sync.Mutex
	load := &claimLoad{}
	note := func(f func()) { mu.Lock(); f(); mu.Unlock() }
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range rounds {
				c, err := r.Claim(ctx, ClaimRequest{Pool: pool, Policy: LifetimeFirst, Holder: fmt.Sprint("g", g),
					Limits: selection.Limits{MaxConcurrent: capacity}})
				note(func() { load.calls++ })
				if err != nil {
					if !errors.Is(err, ErrNoWorker) {
						note(func() { load.failed = append(load.failed, err.Error()) })
					}
					continue
				}
				note(func() {
					load.granted++
					if c.Worker.Active > capacity {
						load.over = append(load.over, fmt.Sprintf("%s (active %d)", c.Worker.ID, c.Worker.Active))
					}
				})
				err = r.Release(ctx, pool, c.LeaseID)
				note(func() {
					load.calls++
					if err != nil {
						load.failed = append(load.failed, err.Error())
					}
				})
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	return done, load
}

// loadEnded fails the test unless a claim-and-release load on pool ended
// clean: no call failed, no claim over-admitted, some claim was granted,
// every count and owner entry is 0 and the lifetimes add up to the claims
// granted.
func loadEnded(t *testing.T, r *Registry, rdb redis.UniversalClient, pool string, load *claimLoad) {
	t.Helper()
	if len(load.failed) > 0 {
		t.Fatalf("%d calls failed, first: %s", len(load.failed), load.failed[0])
	}
	if len(load.over) > 0 {
		t.Fatalf("over-admitted: %v", load.over)
	}
	if load.granted == 0 {
		t.Fatal("no claim was granted")
	}
	lifetime := 0
	for id, c := range counts(t, r, pool) {
		if c[0] != 0 {
			t.Errorf("worker %s: active %d after every release, want 0", id, c[0])
		}
		lifetime += c[1]
	}
	if lifetime != load.granted {
		t.Errorf("lifetimes add up to %d, want the %d claims granted", lifetime, load.granted)
	}
	if n, err := rdb.ZCard(context.Background(), r.Key(pool, "lease_owner")).Result(); err != nil || n != 0 {
		t.Errorf("lease owner entries left: %d (%v)", n, err)
	}
}

// TestBatchedClaimsAndReleases: 32 goroutines claim and release in one
// pool of 16 slots. Batched, the pool's claims and releases share calls
// (fewer FCALLs than calls), no slot is held twice, and every slot and
// lease is free at the end; with MaxBatch 1 every call is its own FCALL.
func TestBatchedClaimsAndReleases(t *testing.T) {
	for _, maxBatch := range []int{0, 1} {
		t.Run(fmt.Sprint("max_batch_", maxBatch), func(t *testing.T) {
			// what OnBatch is told, by script: calls carried, FCALLs, largest
			var bmu sync.Mutex
			carried, sends, largest := map[string]int{}, map[string]int{}, map[string]int{}
			onBatch := func(p, script string, n int) {
				bmu.Lock()
				defer bmu.Unlock()
				if p != "batch" {
					t.Errorf("OnBatch told of pool %q", p)
				}
				carried[script] += n
				sends[script]++
				largest[script] = max(largest[script], n)
			}
			r, rdb := startRegistry(t, Options{MaxBatch: maxBatch, OnBatch: onBatch})
			const pool, workers, capacity, goroutines, rounds = "batch", 4, 4, 32, 40
			for i := range workers {
				register(t, r, pool, fmt.Sprint("w", i), capacity)
			}
			before := fcalls(t, rdb)
			done, load := startClaimLoad(r, pool, capacity, goroutines, rounds)
			<-done
			calls, granted := load.calls, load.granted
			sent := fcalls(t, rdb) - before
			t.Logf("MaxBatch %d: %d claims and releases (%d granted) in %d FCALLs; OnBatch: %v calls in %v sends, largest %v",
				maxBatch, calls, granted, sent, carried, sends, largest)
			loadEnded(t, r, rdb, pool, load)
			switch {
			case maxBatch == 1 && sent < calls:
				t.Errorf("MaxBatch 1: %d FCALLs for %d calls, want one each at least", sent, calls)
			case maxBatch != 1 && sent >= calls:
				t.Errorf("batched: %d FCALLs for %d calls, want fewer", sent, calls)
			}
			// OnBatch saw every release and every FCALL of the two scripts
			bmu.Lock()
			defer bmu.Unlock()
			if carried["lease"] != granted {
				t.Errorf("OnBatch: %d lease ends carried, want the %d releases", carried["lease"], granted)
			}
			if sends["claim"]+sends["lease"] != sent {
				t.Errorf("OnBatch: told of %d sends, the server ran %d FCALLs", sends["claim"]+sends["lease"], sent)
			}
			if big := max(largest["claim"], largest["lease"]); (maxBatch == 1) != (big == 1) {
				t.Errorf("MaxBatch %d: the largest call carried %d", maxBatch, big)
			}
		})
	}
}

// TestBatchErrorIsOwn: one call of a batch that fails fails alone; the
// calls before and after it in the same FCALL run and get their replies.
func TestBatchErrorIsOwn(t *testing.T) {
	r, _ := startRegistry(t, Options{})
	ctx := context.Background()
	const pool = "batch-err"
	register(t, r, pool, "a", 2)
	register(t, r, pool, "b", 2)
	var leases []string
	for range 2 {
		c, err := r.Claim(ctx, ClaimRequest{Pool: pool, Policy: LifetimeFirst, Holder: "t"})
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, c.LeaseID)
	}
	job := func(op, lid string) *batchJob {
		return &batchJob{ctx: ctx, done: make(chan struct{}),
			args: []any{op, r.opts.DurationWindow, lid, 0, ms(r.opts.TombstoneTTL)}}
	}
	jobs := []*batchJob{job("release", leases[0]), job("no-such-op", "x"), job("release", leases[1])}
	r.sendBatch(scriptLease, pool, jobs)
	for i, want := range []any{int64(1), nil, int64(1)} {
		j := jobs[i]
		if want == nil {
			if j.err == nil || !strings.Contains(j.err.Error(), "unknown lease op no-such-op") {
				t.Errorf("batched call %d: error %v, want unknown lease op", i, j.err)
			}
			continue
		}
		if j.err != nil || j.res != want {
			t.Errorf("batched call %d: %v, %v; want %v", i, j.res, j.err, want)
		}
	}
	for id, c := range counts(t, r, pool) {
		if c[0] != 0 {
			t.Errorf("worker %s: active %d, want 0: both releases ran", id, c[0])
		}
	}
}

// TestBatchMalformed: a batch whose argument counts do not add up is
// refused whole, naming the call.
func TestBatchMalformed(t *testing.T) {
	r, _ := startRegistry(t, Options{})
	ctx := context.Background()
	const pool = "batch-bad"
	register(t, r, pool, "a", 1)
	err := r.run(ctx, scriptLease.manyFn(), pool, 0, 5, "release").Err()
	if err == nil || !strings.Contains(err.Error(), "batched call 1: bad argument count 5") {
		t.Fatalf("malformed batch: %v, want bad argument count", err)
	}
}

// TestBatchWaiterGivesUp: a call waiting for one in flight whose caller
// gives up leaves the queue at once and never runs.
func TestBatchWaiterGivesUp(t *testing.T) {
	r, _ := startRegistry(t, Options{})
	ctx := context.Background()
	const pool = "batch-wait"
	register(t, r, pool, "a", 1)
	c, err := r.Claim(ctx, ClaimRequest{Pool: pool, Policy: LifetimeFirst, Holder: "t"})
	if err != nil {
		t.Fatal(err)
	}
	q := holdQueue(r, scriptLease, pool)
	wctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	err = r.Release(wctx, pool, c.LeaseID)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("release waiting past its deadline: %v, want context.DeadlineExceeded", err)
	}
	q.mu.Lock()
	left := len(q.waiting)
	q.busy = false
	q.mu.Unlock()
	if left != 0 {
		t.Fatalf("%d calls left waiting after their callers gave up", left)
	}
	if got := counts(t, r, pool)["a"]; got[0] != 1 {
		t.Fatalf("worker a: active %d, want 1: the release that gave up must not have run", got[0])
	}
	if err := r.Release(ctx, pool, c.LeaseID); err != nil {
		t.Fatal(err)
	}
	if got := counts(t, r, pool)["a"]; got[0] != 0 {
		t.Fatalf("worker a: active %d after the release, want 0", got[0])
	}
}

// TestBatchGivenUpNotSent: a waiting call whose caller gave up is not
// sent, whichever takes the queue's lock first, the caller (it leaves
// the queue) or the next batch (it skips the call).
func TestBatchGivenUpNotSent(t *testing.T) {
	r, _ := startRegistry(t, Options{})
	ctx := context.Background()
	const pool = "batch-gaveup"
	register(t, r, pool, "a", 1)
	for round := range 30 {
		c, err := r.Claim(ctx, ClaimRequest{Pool: pool, Policy: LifetimeFirst, Holder: "t"})
		if err != nil {
			t.Fatal(err)
		}
		q := holdQueue(r, scriptLease, pool)
		wctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- r.Release(wctx, pool, c.LeaseID) }()
		waitQueued(t, q, 1)
		// the caller gives up while the queue's lock is held, then the
		// caller and the next batch race for it
		q.mu.Lock()
		cancel()
		go r.nextBatch(q, scriptLease, pool)
		q.mu.Unlock()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("round %d: release given up: %v, want context.Canceled", round, err)
		}
		waitIdle(t, q)
		if got := counts(t, r, pool)["a"]; got[0] != 1 {
			t.Fatalf("round %d: worker a: active %d, want 1: a release given up before it was sent ran", round, got[0])
		}
		if err := r.Release(ctx, pool, c.LeaseID); err != nil {
			t.Fatal(err)
		}
	}
}

// TestSetMaxBatch: SetMaxBatch changes how calls go from then on, taken
// as the option is (0: the default; above the cap: the cap); at 1 every
// call goes alone, under the same concurrency that batched them before.
func TestSetMaxBatch(t *testing.T) {
	var largest largestBatch
	r, rdb := startRegistry(t, Options{OnBatch: largest.observe})
	const capacity = 8
	for round, tc := range []struct{ set, want int }{{1, 1}, {0, DefaultMaxBatch}, {1000, MaxBatchCap}, {1, 1}} {
		// a pool per round, so that each load's end is judged on its own
		pool := fmt.Sprint("batch-set-", round)
		for i := range 4 {
			register(t, r, pool, fmt.Sprint("w", i), capacity)
		}
		r.SetMaxBatch(tc.set)
		if got := r.MaxBatch(); got != tc.want {
			t.Fatalf("SetMaxBatch(%d): MaxBatch %d, want %d", tc.set, got, tc.want)
		}
		largest.take()
		done, load := startClaimLoad(r, pool, capacity, 32, 20)
		<-done
		loadEnded(t, r, rdb, pool, load)
		if big := largest.take(); (tc.want == 1) != (big == 1) {
			t.Errorf("MaxBatch %d: the largest call carried %d", tc.want, big)
		}
	}
}

// TestSetMaxBatchUnderLoad: a reload changes MaxBatch while a pool's
// claims and releases are waiting and in flight (between 1, which makes
// new calls skip the queue, and values that batch them). No call hangs
// or fails, no slot is held twice, and every slot and lease is free at
// the end: the calls that waited go out in the batches the new value
// makes.
func TestSetMaxBatchUnderLoad(t *testing.T) {
	var largest largestBatch
	r, rdb := startRegistry(t, Options{OnBatch: largest.observe})
	const pool, workers, capacity, goroutines, rounds = "batch-reload", 4, 4, 32, 60
	for i := range workers {
		register(t, r, pool, fmt.Sprint("w", i), capacity)
	}
	done, load := startClaimLoad(r, pool, capacity, goroutines, rounds)
	// the reloads: each value in turn, every 200µs (a pace, not a wait)
	tick := time.NewTicker(200 * time.Microsecond)
	defer tick.Stop()
	hung := time.After(time.Minute)
	sets := 0
	for values := []int{1, 2, 0, 1, 256, 1, 3}; ; sets++ {
		select {
		case <-done:
		case <-hung:
			t.Fatalf("claims and releases still running a minute after they started (%d MaxBatch changes)", sets)
		case <-tick.C:
			r.SetMaxBatch(values[sets%len(values)])
			continue
		}
		break
	}
	t.Logf("%d claims granted while MaxBatch changed %d times; largest call carried %d", load.granted, sets, largest.take())
	loadEnded(t, r, rdb, pool, load)
}
