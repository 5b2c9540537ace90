package registry

import (
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
	"github.com/browsergrid/caddy-browser-grid/selection"
)

// Pick writes nothing: an expired lease it walks past stays for a claim
// or the reaper to free, its limits are not stored, and a fair-share
// worker whose predicted end passed is walked as idle without being moved.
// It runs read-only: the claim script run that way fails as soon as it
// would write.
func TestPickWritesNothing(t *testing.T) {
	ctx := context.Background()
	r, rdb := startRegistry(t, Options{NoStaleExpiry: true})
	now := time.UnixMilli(1_700_000_000_000)
	lim := selection.Limits{MaxConcurrent: 2}
	for _, id := range []string{"a", "b"} {
		put(t, r, "p", selection.Worker{ID: id, Status: selection.Available, LastHeartbeat: now}, 0, time.Time{})
	}
	c, err := r.Claim(ctx, ClaimRequest{Pool: "p", Policy: LifetimeFirst, Limits: lim, LeaseTTL: time.Second, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	dump := func() string {
		var b strings.Builder
		keys, _ := rdb.Keys(ctx, "*").Result()
		for _, k := range sorted(keys) {
			v, _ := rdb.Dump(ctx, k).Result()
			b.WriteString(k + "=" + strconv.Quote(v) + "\n")
		}
		return b.String()
	}
	before := dump()
	later := now.Add(time.Minute) // the lease has expired
	for _, p := range Policies() {
		req := ClaimRequest{Pool: "p", Policy: p.Name, Limits: selection.Limits{MaxConcurrent: 3, MaxLifetime: 9}, Now: later}
		if _, _, err := r.Pick(ctx, req); err != nil {
			t.Fatalf("%s: Pick: %v", p.Name, err)
		}
	}
	if _, err := r.Inspect(ctx, "p"); err != nil {
		t.Fatal(err)
	}
	if after := dump(); after != before {
		t.Fatalf("Pick or Inspect wrote:\nbefore\n%s\nafter\n%s", before, after)
	}
	// The same script, asked to claim (it would free the expired lease and
	// write the new limits) under FCALL_RO, is refused by Redis.
	args, err := newArgv(claimArgsLayout).set("policy", string(LifetimeFirst)).set("dry", 0).set("limits_only", 0).
		set("max_concurrent", 3).set("max_lifetime", 9).set("stale_after_ms", 0).set("max_scan", 64).set("fallback_max_scan", 64).
		set("stagger", 0).set("drain_hold_ms", 0).set("fs_window", 20).set("fs_median", 0).set("fs_default_ms", 30000).
		set("lease_id", "ro-test").set("lease_ttl_ms", 1000).set("holder", "t").set("command_ttl_ms", 1000).
		set("durations_kept", 20).set("lease_sweep", 64).set("config_time_ms", 0).set("config_supersedes_ms", 0).set("epoch_seen", "").
		set("epoch_new", "e").set("client", "").set("client_limit", 0).set("avoid", "").set("restore_hold_ms", 0).list()
	if err != nil {
		t.Fatal(err)
	}
	err = r.runRO(ctx, scriptClaim, "p", toMS(later), args...).Err()
	if err == nil || !strings.Contains(err.Error(), "Write commands are not allowed from read-only scripts") {
		t.Fatalf("a claim run read-only: %v, want Redis to refuse its first write", err)
	}
	if n, _ := rdb.HLen(ctx, r.Key("p", keyLeases)).Result(); n != 1 {
		t.Fatalf("%d leases after the refused claim, want %s's 1", n, c.LeaseID)
	}
}

// Pick, Inspect and Worker work against a read-only replica, where any
// write fails.
func TestReadsOnAReplica(t *testing.T) {
	ctx := context.Background()
	r, _ := startRegistry(t, Options{NoStaleExpiry: true})
	register(t, r, "p", "w1", 2)
	register(t, r, "p", "w2", 2)
	// A lease that will have expired when the replica is read: a claim
	// would free it (a write).
	if _, err := r.Claim(ctx, ClaimRequest{Pool: "p", Policy: LifetimeFirst, LeaseTTL: time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	ro, rc := startReplica(t, r)
	testenv.Eventually(t, 30*time.Second, "the replica to hold the pool", func() bool {
		n, _ := rc.HLen(ctx, ro.Key("p", keyWorkers)).Result()
		return n == 2
	})
	if err := rc.Set(ctx, "x", "1", 0).Err(); err == nil || !strings.Contains(err.Error(), "READONLY") {
		t.Fatalf("a write on the replica: %v, want READONLY", err)
	}
	later := time.Now().Add(time.Minute)
	for _, p := range Policies() {
		w, _, err := ro.Pick(ctx, ClaimRequest{Pool: "p", Policy: p.Name, Limits: selection.Limits{MaxConcurrent: 1}, Now: later})
		if err != nil && !errors.Is(err, ErrNoWorker) {
			t.Fatalf("%s: Pick on a replica: %v", p.Name, err)
		}
		if err == nil && w.ID == "" {
			t.Fatalf("%s: Pick on a replica chose no id", p.Name)
		}
	}
	info, err := ro.Inspect(ctx, "p")
	if err != nil || len(info.Workers) != 2 {
		t.Fatalf("Inspect on a replica: %d workers, %v", len(info.Workers), err)
	}
	if _, err := ro.Worker(ctx, "p", "w1"); err != nil {
		t.Fatalf("Worker on a replica: %v", err)
	}
}

// A fair-share Pick, which may not move busy workers whose predicted end
// has passed to the idle index, walks them as idle all the same: some
// seconds after the pool was written, Pick decides as the selection
// package does at that time, and as the Claim that follows it (which
// moves them) does.
func TestFairSharePickSeesDueWorkersAsIdle(t *testing.T) {
	ctx := context.Background()
	r, _ := startRegistry(t, Options{NoStaleExpiry: true})
	rng := rand.New(rand.NewPCG(3, 9))
	now := time.UnixMilli(1_700_000_000_000)
	due := 0
	for i := range 300 {
		st := randomState(rng, now)
		st.limits.StaleAfter = 0 // the later time must not make workers stale
		st.write(t, r, "fs", now)
		later := now.Add(time.Duration(rng.IntN(9000)) * time.Millisecond)
		for _, w := range st.ws {
			if w.PredictedEnd.After(now) && !w.PredictedEnd.After(later) {
				due++
			}
		}
		want := st.expected(FairShare, later, 0)
		_, got, err := r.Pick(ctx, st.request("fs", FairShare, later, 0))
		if err != nil && !errors.Is(err, ErrNoWorker) {
			t.Fatalf("state %d: Pick: %v", i, err)
		}
		if !sameDecision(got, want) {
			t.Fatalf("state %d at +%s:\n pick      %+v\n selection %+v\n%s", i, later.Sub(now), got, want, describe(st, now))
		}
		c, err := r.Claim(ctx, st.request("fs", FairShare, later, 0))
		if want.OK && (err != nil || c.Worker.ID != want.ID) {
			t.Fatalf("state %d: claim %+v %v, pick chose %s", i, c, err, want.ID)
		}
	}
	if due == 0 {
		t.Fatal("no state had a busy worker due at the later time: the test does not cover it")
	}
	t.Logf("%d workers due between the write and the pick", due)
}
