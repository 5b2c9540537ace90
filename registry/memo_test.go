package registry

import (
	"context"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/selection"
)

// warmPool registers n workers of capacity 1 in pool and runs one claim
// and its release, so that the pool's config hash holds everything a
// first claim stores (epoch, limits, kept indexes): later claims like req
// write nothing to it.
func warmPool(t *testing.T, r *Registry, pool string, n int, req ClaimRequest) {
	t.Helper()
	for i := range n {
		register(t, r, pool, "w"+string(rune('a'+i)), 1)
	}
	req.Pool = pool
	c, err := r.Claim(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Release(context.Background(), pool, c.LeaseID); err != nil {
		t.Fatal(err)
	}
}

// TestBatchReadsConfigOnce: the calls of one batch read the pool's config
// hash once between them, claims and releases alike (the config is the
// only HMGET either makes), and each still runs under the stored limits.
func TestBatchReadsConfigOnce(t *testing.T) {
	r, rdb := startRegistry(t, Options{})
	const pool, n = "memo-once", 8
	req := ClaimRequest{Policy: LifetimeFirst, Holder: "t", Limits: selection.Limits{MaxConcurrent: 1, MaxLifetime: 1000}}
	warmPool(t, r, pool, n, req)

	var before int
	take := func() { before = commandCalls(t, rdb, "hmget") }
	claims, errs := batchOf{pool: pool, n: n, beforeSend: take}.claims(t, r, req)
	if got := commandCalls(t, rdb, "hmget") - before; got != 1 {
		t.Errorf("a batch of %d claims read the config hash %d times, want once", n, got)
	}
	workers := map[string]bool{}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("claim %d: %v", i, err)
		}
		if c := claims[i]; c.PoolLimits.MaxLifetime != 1000 || c.PoolLimits.MaxConcurrent != 1 {
			t.Errorf("claim %d ran under %+v, want the stored limits", i, c.PoolLimits)
		}
		workers[claims[i].Worker.ID] = true
	}
	if len(workers) != n {
		t.Errorf("%d claims of capacity-1 workers went to %d workers", n, len(workers))
	}

	b := batchOf{pool: pool, beforeSend: take}
	for i, err := range b.releases(t, r, claims) {
		if err != nil {
			t.Fatalf("release %d: %v", i, err)
		}
	}
	if got := commandCalls(t, rdb, "hmget") - before; got != 1 {
		t.Errorf("a batch of %d releases read the config hash %d times, want once", n, got)
	}
	noDrift(t, r, rdb, pool)
}

// TestBatchMemoSeesItsWrites: a call of a batch that writes the config
// hash is seen by the next call of the same batch. The first claim brings
// a newer configuration (max_lifetime 5), the second an older one (10),
// both newer than what is stored: the newest wins, as it does when the
// two go alone, whatever order they run in.
func TestBatchMemoSeesItsWrites(t *testing.T) {
	r, rdb := startRegistry(t, Options{})
	ctx := context.Background()
	const pool = "memo-writes"
	now := time.Now()
	old := ClaimRequest{Policy: LifetimeFirst, Holder: "t", ConfigTime: now.Add(-time.Hour),
		Limits: selection.Limits{MaxLifetime: 100}}
	warmPool(t, r, pool, 4, old)

	reqs := []ClaimRequest{
		{Pool: pool, Policy: LifetimeFirst, Holder: "t", ConfigTime: now, Limits: selection.Limits{MaxLifetime: 5}},
		{Pool: pool, Policy: LifetimeFirst, Holder: "t", ConfigTime: now.Add(-time.Minute), Limits: selection.Limits{MaxLifetime: 10}},
	}
	claims := make([]*Claim, len(reqs))
	batchOf{pool: pool, n: len(reqs), inOrder: true}.calls(t, r, scriptClaim, func(i int) {
		c, err := r.Claim(ctx, reqs[i])
		if err != nil {
			t.Errorf("claim %d: %v", i, err)
		}
		claims[i] = c
	})
	if t.Failed() {
		return
	}
	if c := claims[1]; c.PoolLimits.MaxLifetime != 5 || !c.LimitsOverridden {
		t.Errorf("the older configuration's claim ran under max_lifetime %d (overridden %v), want 5 (true): "+
			"it did not see the newer one its batch stored", c.PoolLimits.MaxLifetime, c.LimitsOverridden)
	}
	got, err := rdb.HGet(ctx, r.Key(pool, keyConfig), "max_lifetime").Result()
	if err != nil || got != "5" {
		t.Errorf("stored max_lifetime %q (%v), want 5: the older configuration replaced the newer", got, err)
	}
}

// cfgCall matches a script's command on the config hash.
var cfgCall = regexp.MustCompile(`redis\.p?call\('(\w+)', K_CFG\b`)

// TestConfigWritesDropTheMemo: every command on the config hash in the
// library is a read, except the two in cfg_set and cfg_del, which drop
// the batch memo's copy (common.lua, MEMO). A write elsewhere would leave
// a batch's later calls reading what the hash no longer holds.
func TestConfigWritesDropTheMemo(t *testing.T) {
	reads := map[string]bool{"HGET": true, "HMGET": true, "HGETALL": true, "HEXISTS": true}
	writes := 0
	for _, m := range cfgCall.FindAllStringSubmatchIndex(registryLib.source, -1) {
		cmd := strings.ToUpper(registryLib.source[m[2]:m[3]])
		if reads[cmd] {
			continue
		}
		writes++
		// the line before the write must be the memo's drop
		start := strings.LastIndex(registryLib.source[:m[0]], "\n")
		prev := strings.LastIndex(registryLib.source[:start], "\n")
		if strings.TrimSpace(registryLib.source[prev+1:start]) != "if MEMO then MEMO.cfg = nil end" {
			line := strings.Count(registryLib.source[:m[0]], "\n") + 1
			t.Errorf("library line %d: %s on the config hash outside cfg_set / cfg_del", line, cmd)
		}
	}
	if writes != 2 {
		t.Errorf("%d writes to the config hash in the library, want 2 (cfg_set, cfg_del)", writes)
	}
}

// eachCall makes call(0) … call(n-1) of f in pool, in that order: in one
// batch, or each alone after the one before.
func eachCall(t *testing.T, r *Registry, f function, pool string, n int, batched bool, call func(i int)) {
	t.Helper()
	if batched {
		batchOf{pool: pool, n: n, inOrder: true}.calls(t, r, f, call)
		return
	}
	for i := range n {
		call(i)
	}
}

// claimEach makes n claims like req in pool (eachCall) and returns them;
// it ends the test when one failed.
func claimEach(t *testing.T, r *Registry, pool string, req ClaimRequest, n int, batched bool) []*Claim {
	t.Helper()
	req.Pool = pool
	claims := make([]*Claim, n)
	eachCall(t, r, scriptClaim, pool, n, batched, func(i int) {
		c, err := r.Claim(context.Background(), req)
		if err != nil {
			t.Errorf("%s claim %d: %v", pool, i, err)
		}
		claims[i] = c
	})
	if t.Failed() {
		t.FailNow()
	}
	return claims
}

// TestBatchSameWorkerAsAlone: the claims and releases of one batch that
// read the same worker (its record decoded once for the batch) each see
// the figures the calls before them wrote, as the same calls sent alone
// do: the counts after each claim, the durations list after each release,
// the predicted end moving on with each fair-share claim.
func TestBatchSameWorkerAsAlone(t *testing.T) {
	r, rdb := startRegistry(t, Options{})
	ctx := context.Background()
	const n = 6
	req := ClaimRequest{Policy: FairShare, Holder: "t", Limits: selection.Limits{MaxLifetime: 1000}}
	type step struct {
		active, lifetime, durations int
		ahead                       bool // the predicted end moved later than the previous claim's
	}
	// run makes n claims of pool's one worker, then ends them, alone or
	// each phase in one batch, and returns what each call left.
	run := func(pool string, batched bool) []step {
		register(t, r, pool, "solo", 0)
		claims := claimEach(t, r, pool, req, n, batched)
		var out []step
		for i, c := range claims {
			ahead := i == 0 || c.Worker.PredictedEnd.After(claims[i-1].Worker.PredictedEnd)
			out = append(out, step{c.Worker.Active, c.Worker.Lifetime, len(c.Worker.Durations), ahead})
		}
		eachCall(t, r, scriptLease, pool, n, batched, func(i int) {
			if err := r.Release(ctx, pool, claims[i].LeaseID); err != nil {
				t.Errorf("%s release %d: %v", pool, i, err)
			}
		})
		info, err := r.Inspect(ctx, pool)
		if err != nil || len(info.Workers) != 1 {
			t.Fatalf("%s: inspect: %v (%d workers)", pool, err, len(info.Workers))
		}
		w := info.Workers[0]
		out = append(out, step{w.Active, w.Lifetime, len(w.Durations), true})
		noDrift(t, r, rdb, pool)
		return out
	}
	alone, batched := run("memo-alone", false), run("memo-batched", true)
	if !reflect.DeepEqual(alone, batched) {
		t.Errorf("batched calls left %+v, the same calls alone %+v", batched, alone)
	}
	if last := alone[n]; last.active != 0 || last.lifetime != n || last.durations != n {
		t.Errorf("after %d sessions: %+v, want active 0, lifetime and durations %d", n, last, n)
	}
}
