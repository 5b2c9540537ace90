package registry

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/selection"
)

// Red-team tests of the batch memo (common.lua, MEMO): what an attacker
// with Redis write access or an operator changing limits under load can
// make a batch's calls see that the same calls sent alone would not.

// TestMemoRedRecordExtraFields: a record written by hand (or by an
// attacker) with fields named after the figures a script keeps on a
// worker it loaded (fs_len, fs_sum, fs_win, durations, fs_counted) is
// read as the record, not as those figures: each call of a batch that
// reads it again (its decoded fields kept and copied) gets what the same
// call alone gets, and neither takes the record's word for the
// fair-share estimate (the pool's default, 30 s, for a worker with no
// sessions, not the 5000 s the record claims).
func TestMemoRedRecordExtraFields(t *testing.T) {
	r, rdb := startRegistry(t, Options{})
	ctx := context.Background()
	const n = 5
	req := ClaimRequest{Policy: FairShare, Holder: "t"}
	// run makes n claims of pool's one worker, whose record carries the
	// extra fields, alone or in one batch, and returns how far each
	// claim moved the worker's predicted end (the estimate it charged).
	run := func(pool string, batched bool) []time.Duration {
		register(t, r, pool, "solo", 0)
		key := r.Key(pool, keyWorkers)
		rec, err := rdb.HGet(ctx, key, "solo").Result()
		if err != nil {
			t.Fatal(err)
		}
		rec = strings.TrimSuffix(rec, "}") + `,"fs_len":1,"fs_sum":5000000,"fs_win":20,"durations":[5000000],"fs_counted":true}`
		if err := rdb.HSet(ctx, key, "solo", rec).Err(); err != nil {
			t.Fatal(err)
		}
		// no hot figures (a version before them, or Redis lost them):
		// the next claim counts the durations list
		if err := rdb.HDel(ctx, r.Key(pool, keyHot), "solo").Err(); err != nil {
			t.Fatal(err)
		}
		claims := claimEach(t, r, pool, req, n, batched)
		var moved []time.Duration
		for i := 1; i < n; i++ {
			moved = append(moved, claims[i].Worker.PredictedEnd.Sub(claims[i-1].Worker.PredictedEnd))
		}
		for _, c := range claims {
			if err := r.Release(ctx, pool, c.LeaseID); err != nil {
				t.Fatal(err)
			}
		}
		noDrift(t, r, rdb, pool)
		return moved
	}
	alone, batched := run("memo-extra-alone", false), run("memo-extra-batched", true)
	if !reflect.DeepEqual(alone, batched) {
		t.Errorf("each batched claim moved the predicted end by %v, the same claims alone by %v", batched, alone)
	}
	for i, d := range alone {
		if d != 30*time.Second {
			t.Errorf("claim %d alone moved the predicted end by %v, want the default estimate 30s "+
				"(the record's own fields taken as the worker's figures)", i+1, d)
		}
	}
}

// memoOutcome is what one claim got, for comparing a batch with the same
// claims alone.
type memoOutcome struct {
	Worker            string
	Err               string
	Limits            PoolLimits
	Overridden, Build bool
	Drain             bool
}

func memoOutcomeOf(c *Claim, err error) memoOutcome {
	if err != nil {
		return memoOutcome{Err: err.Error()}
	}
	return memoOutcome{Worker: c.Worker.ID, Limits: c.PoolLimits, Overridden: c.LimitsOverridden,
		Build: c.IndexBuilding, Drain: c.Drain}
}

// memoDigits stands for the times (ms) in config hash values.
var memoDigits = regexp.MustCompile(`\d{12,}`)

// memoConfig is pool's config hash without its epoch (random per pool),
// times written as T.
func memoConfig(t *testing.T, r *Registry, pool string) map[string]string {
	t.Helper()
	cfg, err := r.rdb.HGetAll(context.Background(), r.Key(pool, keyConfig)).Result()
	if err != nil {
		t.Fatal(err)
	}
	delete(cfg, "epoch")
	for k, v := range cfg {
		cfg[k] = memoDigits.ReplaceAllString(v, "T")
	}
	return cfg
}

// TestMemoRedMixedPoliciesAsAlone: claims of one pool under different
// policies and limits (routes that share the pool's claim queue) in one
// batch, on a fresh pool of 600 workers (the kept indexes settle, then
// ring and fair_share build in several steps, each writing the config
// hash) and on the same pool again once settled: every claim gets the
// worker, limits and building state the same claim got alone, in the
// same order, on a twin pool, and the config hashes end alike.
func TestMemoRedMixedPoliciesAsAlone(t *testing.T) {
	r, _ := startRegistry(t, Options{})
	ctx := context.Background()
	const workers, n = 600, 48
	base := time.Now().Add(-time.Hour)
	policies := []Policy{Vnode, FairShare, LifetimeFirst, InterleavedWeightedRoundRobin, FairShare, Vnode,
		InterleavedWeightedRoundRobin, LifetimeFirst}
	rng := rand.New(rand.NewPCG(7, 7))
	reqs := make([]ClaimRequest, n)
	for i := range reqs {
		p := policies[i%len(policies)]
		lim := selection.Limits{MaxConcurrent: []int{0, 2, 3, 1}[rng.IntN(4)], MaxLifetime: []int{0, 50, 3}[rng.IntN(3)],
			StaggerDrains: rng.IntN(2) == 0}
		reqs[i] = ClaimRequest{Policy: p, Holder: "t", Limits: lim,
			ConfigTime: base.Add(time.Duration(rng.IntN(20)) * time.Minute),
			// estimates of minutes (no session ends, so every one is the
			// default): no predicted end passes while the test runs, the
			// batch (sent at once) and the calls alone (one after the
			// other) see the same busy workers
			FairShare: selection.FairShare{Window: []int{0, 5, 20}[rng.IntN(3)], Median: rng.IntN(2) == 0,
				Default: time.Duration(10+rng.IntN(50)) * time.Minute},
		}
	}
	// rands gives claim i of a round the same draws in either pool
	rands := func(round, i int) selection.Rand { return rand.New(rand.NewPCG(uint64(round), uint64(i))) }
	type result struct {
		claims [][]memoOutcome
		config []map[string]string
	}
	run := func(pool string, batched bool) result {
		for i := range workers {
			redRegister(t, r, pool, fmt.Sprintf("w%03d", i), 3, 1+i%5)
		}
		var res result
		for round := range 2 {
			out, epochs := make([]memoOutcome, n), make([]string, n)
			claim := func(i int) {
				req := reqs[i]
				req.Pool, req.Rand = pool, rands(round, i)
				c, err := r.Claim(ctx, req)
				out[i] = memoOutcomeOf(c, err)
				if err == nil {
					epochs[i] = c.Epoch
				}
			}
			if batched {
				batchOf{pool: pool, n: n, inOrder: true}.calls(t, r, scriptClaim, claim)
			} else {
				for i := range n {
					claim(i)
				}
			}
			// the first claim of the fresh pool stored the epoch: every
			// later one (the batch's next calls too) reports it
			stored, err := r.rdb.HGet(ctx, r.Key(pool, keyConfig), "epoch").Result()
			if err != nil {
				t.Fatal(err)
			}
			for i, e := range epochs {
				if e != "" && e != stored {
					t.Errorf("%s round %d claim %d: epoch %q, the pool's is %q", pool, round, i, e, stored)
				}
			}
			res.claims = append(res.claims, out)
			res.config = append(res.config, memoConfig(t, r, pool))
			if m, e, l, notes := redAudit(t, r, pool); m+e+l > 0 {
				t.Errorf("%s round %d: %d missing, %d extra, %d leaked: %v", pool, round, m, e, l, notes)
			}
		}
		return res
	}
	// the pool itself, and a version group (its own indexes, its kept
	// index states in the pool's config hash under its own field names)
	for _, group := range []string{"", "g@1.65"} {
		alone, batched := run("memo-mix-alone"+group, false), run("memo-mix-batched"+group, true)
		for round := range alone.claims {
			for i := range n {
				if a, b := alone.claims[round][i], batched.claims[round][i]; a != b {
					t.Errorf("%q round %d claim %d (%s): batched %+v, alone %+v", group, round, i, reqs[i].Policy, b, a)
				}
			}
			if !reflect.DeepEqual(alone.config[round], batched.config[round]) {
				t.Errorf("%q round %d: config hash batched %v, alone %v", group, round, batched.config[round], alone.config[round])
			}
		}
		builds := 0
		for _, o := range alone.claims[0] {
			if o.Build {
				builds++
			}
		}
		t.Logf("%q round 0: %d of %d claims walked while an index was built; config %v", group, builds, n, alone.config[1])
	}
}

// TestMemoRedLoadWithChangingLimits: goroutines claim and release in one
// pool under every policy, each claim bringing its own limits (a
// configuration of its own time: the newest in force flips as they go),
// while MaxBatch changes, workers heartbeat and a hand edit adds unknown
// fields to a worker's record. No claim finds its worker past the cap in
// force after it (Redis' own count, in the claim's reply), no count
// sampled between calls is past a worker's capacity, and every slot and
// lease is free at the end.
func TestMemoRedLoadWithChangingLimits(t *testing.T) {
	var largest largestBatch
	r, rdb := startRegistry(t, Options{OnBatch: largest.observe})
	ctx := context.Background()
	const pool, workers, capacity, goroutines, rounds = "memo-load", 8, 3, 24, 80
	for i := range workers {
		redRegister(t, r, pool, fmt.Sprint("w", i), capacity, 1+i%3)
	}
	base := time.Now().Add(-time.Hour)
	var mu sync.Mutex
	var calls, granted, refused int
	var failed, over []string
	note := func(f func()) { mu.Lock(); f(); mu.Unlock() }
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			for range rounds {
				req := ClaimRequest{Pool: pool, Policy: redPolicies[rng.IntN(len(redPolicies))], Holder: fmt.Sprint("g", g),
					Limits:     selection.Limits{MaxConcurrent: rng.IntN(capacity + 1), StaggerDrains: rng.IntN(2) == 0},
					ConfigTime: base.Add(time.Duration(rng.IntN(50)) * time.Second),
					FairShare: selection.FairShare{Window: rng.IntN(10), Median: rng.IntN(2) == 0,
						Default: time.Duration(1+rng.IntN(30)) * time.Second}}
				c, err := r.Claim(ctx, req)
				note(func() { calls++ })
				if errors.Is(err, ErrNoWorker) {
					note(func() { refused++ })
					continue
				}
				if err != nil {
					note(func() { failed = append(failed, "claim: "+err.Error()) })
					continue
				}
				note(func() {
					granted++
					if c.Worker.Active > effCap(capacity, c.PoolLimits.MaxConcurrent) {
						over = append(over, fmt.Sprintf("%s active %d under max_concurrent %d",
							c.Worker.ID, c.Worker.Active, c.PoolLimits.MaxConcurrent))
					}
				})
				err = r.Release(ctx, pool, c.LeaseID)
				note(func() {
					calls++
					if err != nil {
						failed = append(failed, "release: "+err.Error())
					}
				})
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()

	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	hung := time.After(2 * time.Minute)
	rng := rand.New(rand.NewPCG(99, 99))
	samples, edits := 0, 0
	for running := true; running; {
		select {
		case <-done:
			running = false
		case <-hung:
			t.Fatalf("claims and releases still running two minutes after they started")
		case <-tick.C:
			r.SetMaxBatch([]int{1, 2, 0, 5, 256}[rng.IntN(5)])
			id := fmt.Sprint("w", rng.IntN(workers))
			switch rng.IntN(3) {
			case 0:
				if _, err := r.Heartbeat(ctx, pool, id, 100*time.Hour); err != nil {
					t.Errorf("heartbeat %s: %v", id, err)
				}
			case 1:
				// an unknown field and the names of counted figures
				key := r.Key(pool, keyWorkers)
				if rec, err := rdb.HGet(ctx, key, id).Result(); err == nil && !strings.Contains(rec, `"zz"`) {
					rec = strings.TrimSuffix(rec, "}") + `,"zz":[1,{"a":2}],"fs_len":0,"fs_sum":0,"fs_win":0}`
					if err := rdb.HSet(ctx, key, id, rec).Err(); err != nil {
						t.Fatal(err)
					}
					edits++
				}
			}
			active, err := rdb.HGetAll(ctx, r.Key(pool, keyActive)).Result()
			if err != nil {
				t.Fatal(err)
			}
			for id, v := range active {
				if n, _ := strconv.Atoi(v); n > capacity {
					note(func() { over = append(over, fmt.Sprintf("sampled %s active %d", id, n)) })
				}
			}
			samples++
		}
	}
	t.Logf("%d calls: %d claims granted, %d refused, %d failed, %d over-admitted; %d samples, %d record edits, largest call %d",
		calls, granted, refused, len(failed), len(over), samples, edits, largest.take())
	if len(failed) > 0 {
		t.Errorf("%d calls failed, first: %s", len(failed), failed[0])
	}
	if len(over) > 0 {
		t.Errorf("over-admitted: %v", over)
	}
	if granted == 0 {
		t.Error("no claim was granted")
	}
	lifetime := 0
	for _, c := range counts(t, r, pool) {
		lifetime += c[1]
	}
	if lifetime != granted {
		t.Errorf("lifetimes add up to %d, want the %d claims granted", lifetime, granted)
	}
	noDrift(t, r, rdb, pool)
	if m, e, l, notes := redAudit(t, r, pool); m+e+l > 0 {
		t.Errorf("indexes: %d missing, %d extra, %d leaked: %v", m, e, l, notes)
	}
}

// TestMemoRedNotKeptAcrossCalls: what a batch kept of the config hash is
// gone once its FCALL returns. After a batch of claims read the hash, an
// operator writes newer limits into it by hand; the next call, alone or
// in a batch, runs under them.
func TestMemoRedNotKeptAcrossCalls(t *testing.T) {
	r, rdb := startRegistry(t, Options{})
	ctx := context.Background()
	const pool, n = "memo-across", 4
	req := ClaimRequest{Pool: pool, Policy: LifetimeFirst, Holder: "t", ConfigTime: time.Now().Add(-time.Hour),
		Limits: selection.Limits{MaxConcurrent: 3, MaxLifetime: 1000}}
	for i := range 16 {
		register(t, r, pool, fmt.Sprint("w", i), 0)
	}
	var all []*Claim
	claimed := func(what string, cs []*Claim, errs []error, mc int) {
		t.Helper()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("%s claim %d: %v", what, i, err)
			}
			if got := cs[i].PoolLimits.MaxConcurrent; got != mc {
				t.Errorf("%s claim %d ran under max_concurrent %d, want %d", what, i, got, mc)
			}
		}
		all = append(all, cs...)
	}
	cs, errs := batchOf{pool: pool, n: n}.claims(t, r, req)
	claimed("first batch", cs, errs, 3)

	edit := func(mc int) {
		t.Helper()
		err := rdb.HSet(ctx, r.Key(pool, keyConfig), "max_concurrent", mc,
			"set_at", time.Now().Add(time.Hour).UnixMilli()).Err()
		if err != nil {
			t.Fatal(err)
		}
	}
	edit(2)
	c, err := r.Claim(ctx, req)
	claimed("lone", []*Claim{c}, []error{err}, 2)

	cs, errs = batchOf{pool: pool, n: n}.claims(t, r, req)
	claimed("second batch", cs, errs, 2)
	edit(1)
	cs, errs = batchOf{pool: pool, n: 1}.claims(t, r, req)
	claimed("batch of one", cs, errs, 1)
	cs, errs = batchOf{pool: pool, n: 2}.claims(t, r, req)
	claimed("third batch", cs, errs, 1)
	for _, c := range all {
		if err := r.Release(ctx, pool, c.LeaseID); err != nil {
			t.Fatal(err)
		}
	}
	noDrift(t, r, rdb, pool)
}

// TestMemoRedRecordCountCutsNoList: a record carrying "fs_len":0 (a hand
// edit) does not make a release take the worker's durations list for
// empty: the list keeps its entries and gains the session's.
func TestMemoRedRecordCountCutsNoList(t *testing.T) {
	r, rdb := startRegistry(t, Options{})
	ctx := context.Background()
	const pool = "memo-cut"
	now := time.Now()
	put(t, r, pool, selection.Worker{ID: "solo", Status: selection.Available, LastHeartbeat: now,
		Durations: []time.Duration{time.Second, 2 * time.Second, 3 * time.Second}}, 0, time.Time{})
	key := r.Key(pool, keyWorkers)
	rec, err := rdb.HGet(ctx, key, "solo").Result()
	if err != nil {
		t.Fatal(err)
	}
	rec = strings.TrimSuffix(rec, "}") + `,"fs_len":0,"fs_sum":0,"fs_win":20}`
	if err := rdb.HSet(ctx, key, "solo", rec).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.HDel(ctx, r.Key(pool, keyHot), "solo").Err(); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		c, err := r.Claim(ctx, ClaimRequest{Pool: pool, Policy: FairShare, Holder: "t"})
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Release(ctx, pool, c.LeaseID); err != nil {
			t.Fatal(err)
		}
		info, err := r.Inspect(ctx, pool)
		if err != nil || len(info.Workers) != 1 {
			t.Fatalf("inspect: %v (%d workers)", err, len(info.Workers))
		}
		if got, want := len(info.Workers[0].Durations), 4+i; got != want {
			t.Errorf("after session %d: %d durations, want %d (the list cut by the record's fs_len)", i+1, got, want)
		}
	}
	noDrift(t, r, rdb, pool)
}
