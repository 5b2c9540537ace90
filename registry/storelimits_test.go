package registry

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/selection"
)

// StoreLimits puts a newer configuration's limits in force before it
// claims: a claim of the older configuration that comes first (Caddy: a
// request of the replaced config still waiting in the queue) runs under
// them. It claims nothing, and an older configuration's StoreLimits
// changes nothing.
func TestStoreLimitsAppliesBeforeTheFirstClaim(t *testing.T) {
	r, rdb := startRegistry(t, Options{})
	ctx := context.Background()
	const pool = "stored"
	register(t, r, pool, "w1", 0)
	old := time.Now().Add(-time.Hour)
	oldReq := ClaimRequest{Pool: pool, Policy: LifetimeFirst, ConfigTime: old,
		Limits: selection.Limits{MaxConcurrent: 3, StaleAfter: 30 * time.Second}}
	first, err := r.Claim(ctx, oldReq)
	if err != nil {
		t.Fatal(err)
	}

	newReq := oldReq
	newReq.Limits.MaxConcurrent = 1
	newReq.ConfigTime = time.Now()
	claims := scriptCalls(t, rdb, "fcall")
	in, overridden, err := r.StoreLimits(ctx, newReq)
	if err != nil {
		t.Fatal(err)
	}
	if overridden || in.MaxConcurrent != 1 {
		t.Fatalf("StoreLimits of the newer configuration: in force %+v, overridden %v; want max_concurrent 1, not overridden", in, overridden)
	}
	if n := scriptCalls(t, rdb, "fcall") - claims; n != 1 {
		t.Errorf("StoreLimits made %d script calls, want 1", n)
	}
	if got := counts(t, r, pool)["w1"]; got != [2]int{1, 1} {
		t.Fatalf("StoreLimits changed the worker's counts: active, lifetime %v; want [1 1]", got)
	}
	info, err := r.Inspect(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if info.Leases != 1 {
		t.Fatalf("%d leases after StoreLimits, want the first claim's 1", info.Leases)
	}

	// The older configuration's next claim runs under max_concurrent 1:
	// the worker, holding one session, is full.
	_, err = r.Claim(ctx, oldReq)
	var nw *NoWorkerError
	if !errors.As(err, &nw) {
		t.Fatalf("the older configuration's claim after StoreLimits: %v; want no worker (max_concurrent 1 in force, 1 session held)", err)
	}
	if !nw.LimitsOverridden || nw.PoolLimits.MaxConcurrent != 1 {
		t.Fatalf("the older configuration's claim ran under %+v (overridden %v); want the stored max_concurrent 1", nw.PoolLimits, nw.LimitsOverridden)
	}

	// An older configuration's StoreLimits stores nothing.
	in, overridden, err = r.StoreLimits(ctx, oldReq)
	if err != nil {
		t.Fatal(err)
	}
	if !overridden || in.MaxConcurrent != 1 {
		t.Fatalf("StoreLimits of the older configuration: in force %+v, overridden %v; want the newer max_concurrent 1, overridden", in, overridden)
	}
	if err := r.Release(ctx, pool, first.LeaseID); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Claim(ctx, oldReq); err != nil {
		t.Fatalf("a claim once the worker is free: %v", err)
	}
}

// A bad request is refused before Redis, with the pool named.
func TestStoreLimitsRefusesABadRequest(t *testing.T) {
	r, _ := startRegistry(t, Options{})
	_, _, err := r.StoreLimits(context.Background(), ClaimRequest{Pool: "p", Policy: "no_such_policy"})
	if err == nil {
		t.Fatal("StoreLimits with an unknown policy: no error")
	}
	t.Log(err)
}
