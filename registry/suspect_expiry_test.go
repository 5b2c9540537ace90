package registry

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
)

// TestSuspectWithoutLeaseExpiresBackToRotation: a worker marked suspect without a
// lease comes back to every policy's walk once the suspicion passes, its
// indexes exact throughout; a draining worker marked suspect stays out of
// every index; an at-cap worker marked suspect re-enters on release and is
// still walked past until the suspicion ends.
func TestSuspectWithoutLeaseExpiresBackToRotation(t *testing.T) {
	ctx := context.Background()
	r, _ := startRegistry(t, Options{})
	for _, p := range Policies() {
		t.Run(string(p.Name), func(t *testing.T) {
			pool := "expiry-" + strings.ReplaceAll(string(p.Name), "_", "-")
			register(t, r, pool, "w1", 1)
			register(t, r, pool, "w2", 1)
			register(t, r, pool, "w3", 1)
			req := ClaimRequest{Pool: pool, Policy: p.Name}
			claimGivenBack(t, r, req) // settles the policy's index
			bad, gen := claimGivenBack(t, r, req)
			// draining worker: suspect must not bring it back
			var drain string
			for _, id := range []string{"w1", "w2", "w3"} {
				if id != bad {
					drain = id
					break
				}
			}
			raw, _ := r.rdb.HGet(ctx, r.Key(pool, keyWorkers), drain).Result()
			var wd struct{ Gen string }
			_ = json.Unmarshal([]byte(raw), &wd)
			if err := r.SetDraining(ctx, pool, drain); err != nil {
				t.Fatal(err)
			}
			if err := r.Suspect(ctx, pool, drain, wd.Gen, 100*time.Millisecond); err != nil {
				t.Fatal(err)
			}
			if err := r.Suspect(ctx, pool, bad, gen, 300*time.Millisecond); err != nil {
				t.Fatal(err)
			}
			for _, ix := range []string{"ring", "iwrr", "fair"} {
				if kept, _ := r.rdb.HExists(ctx, r.Key(pool, keyConfig), "ix:"+ix).Result(); kept {
					checkIndexExact(t, r, pool, ix)
				}
			}
			// the third worker takes the one claim
			c2, err := r.Claim(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			if c2.Worker.ID == bad || c2.Worker.ID == drain {
				t.Fatalf("claimed %s (bad %s, draining %s)", c2.Worker.ID, bad, drain)
			}
			if _, err := r.Claim(ctx, req); !errors.Is(err, ErrNoWorker) {
				t.Fatalf("claim while the only free worker is suspect: %v, want ErrNoWorker", err)
			}
			time.Sleep(400 * time.Millisecond)
			c3, err := r.Claim(ctx, req)
			if err != nil {
				t.Fatalf("claim after the suspicion passed: %v", err)
			}
			if c3.Worker.ID != bad {
				t.Fatalf("claimed %s after the suspicion passed, want %s", c3.Worker.ID, bad)
			}
			// at cap, suspect, released: re-enters, walked past while suspect
			if err := r.Suspect(ctx, pool, bad, gen, 300*time.Millisecond); err != nil {
				t.Fatal(err)
			}
			if err := r.Release(ctx, pool, c3.LeaseID); err != nil {
				t.Fatal(err)
			}
			if _, err := r.Claim(ctx, req); !errors.Is(err, ErrNoWorker) {
				t.Fatalf("claim while released worker still suspect: %v", err)
			}
			time.Sleep(400 * time.Millisecond)
			c4, err := r.Claim(ctx, req)
			if err != nil || c4.Worker.ID != bad {
				t.Fatalf("claim after: %v %v", c4, err)
			}
			if w, _ := r.Worker(ctx, pool, drain); string(w.Status) != "draining" {
				t.Errorf("draining worker now %q", w.Status)
			}
			for _, ix := range []string{"ring", "iwrr", "fair"} {
				if kept, _ := r.rdb.HExists(ctx, r.Key(pool, keyConfig), "ix:"+ix).Result(); kept {
					checkIndexExact(t, r, pool, ix)
				}
			}
			if n, _ := r.rdb.ZScore(ctx, r.Key(pool, keyIdxLifetime), drain).Result(); n != 0 {
				t.Errorf("draining worker in idx:lifetime")
			}
			if ok, _ := r.rdb.ZScore(ctx, r.Key(pool, keyIdxLifetime), drain).Result(); ok != 0 {
				t.Errorf("draining in index")
			}
			if ex, _ := r.rdb.Exists(ctx, r.Key(pool, keyIdxLifetime)).Result(); ex == 0 {
				t.Log("idx:lifetime empty")
			}
			res, err := r.Reconcile(ctx, pool)
			t.Logf("reconcile: %+v %v", res, err)
		})
	}
}
