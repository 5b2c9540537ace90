package registry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
	"github.com/redis/go-redis/v9"
)

// Findings of the review of the merged reliability work, each a test that
// failed before its fix.

// The claims' background expiry and the reaper use ExpireStale: an
// operator's drain of a paused worker survives it, as it survives Expire.
func TestExpireStaleKeepsAPendingDrain(t *testing.T) {
	ctx := context.Background()
	r, _ := startRegistry(t, Options{})
	mustRegister(t, r, capReg("w", "gen-1", 2))
	if _, err := claimP(t, r, ""); err != nil {
		t.Fatal(err)
	}
	if err := r.Drain(ctx, "p", "w"); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, "stale expiry", func() bool {
		got, err := r.ExpireStale(ctx, "p", []string{"w"}, time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		return len(got) == 1
	})
	mustRegister(t, r, capReg("w", "gen-1", 2))
	if _, _, cmd := figures(t, r, "w"); cmd != CommandShutdown {
		t.Errorf("operator's drain lost by ExpireStale: command %q, want shutdown", cmd)
	}
}

// The reaper's count stage sets a worker's active count from lease_owner,
// not from the leases its Go side listed earlier: a renewal that re-created
// a lapsed lease in between must not make a full worker look free.
func TestCountStageRacingARenewalKeepsTheWorkerFull(t *testing.T) {
	ctx := context.Background()
	r, rdb := startRegistry(t, Options{})
	mustRegister(t, r, capReg("w", "gen-1", 2))
	c1, err := claimP(t, r, "")
	if err != nil {
		t.Fatal(err)
	}
	c2, err := claimP(t, r, "")
	if err != nil {
		t.Fatal(err)
	}
	// c2's holder could not reach Redis for lease_ttl: the lease lapses.
	rdb.ZAdd(ctx, r.Key("p", keyLeaseExpiry), redis.Z{Score: 1, Member: c2.LeaseID})
	if n, err := r.ExpireLeases(ctx, "p", 10); err != nil || n != 1 {
		t.Fatalf("expiring the lapsed lease: %d %v", n, err)
	}
	// The reaper's workers stage reads the worker, then lists the leases
	// (c1 only) ...
	res, err := r.run(ctx, scriptReconcile, "p", 0, "workers", "0", 100).Slice()
	if err != nil {
		t.Fatal(err)
	}
	rows := res[3].([]any)
	gen, life := rows[1].(string), rows[2].(int64)
	// ... meanwhile the holder is back and renews both ...
	if _, err := r.RenewLeases(ctx, "p", []LeaseRenewal{
		{ID: c1.LeaseID, Worker: "w", Gen: c1.Gen, Claimed: time.Now(), Lifetime: c1.Worker.Lifetime},
		{ID: c2.LeaseID, Worker: "w", Gen: c2.Gen, Claimed: time.Now(), Lifetime: c2.Worker.Lifetime},
	}, time.Minute); err != nil {
		t.Fatal(err)
	}
	// ... and the count stage runs with what the reaper listed.
	if _, err := r.run(ctx, scriptReconcile, "p", 0, "count", "w", gen, life, 1, c1.LeaseID).Slice(); err != nil {
		t.Fatal(err)
	}
	if a, _, _ := figures(t, r, "w"); a != 2 {
		t.Errorf("active %d after the count stage with 2 live leases, want 2", a)
	}
	if c3, err := claimP(t, r, ""); !errors.Is(err, ErrNoWorker) {
		t.Errorf("a third claim on capacity 2 with 2 live leases: %v (%+v)", err, c3)
	}
}

// A record whose generation or ID could not be renewed (a Redis writer's)
// is a bad record, never selected; and one lease that cannot be renewed
// does not stop the renewal of the others.
func TestUnrenewableRecordsAndLeases(t *testing.T) {
	ctx := context.Background()
	var bad []string
	r, rdb := startRegistry(t, Options{OnBadRecord: func(pool, id string, err error) { bad = append(bad, id) }})
	mustRegister(t, r, capReg("a-poison", "gen-1", 2))
	mustRegister(t, r, capReg("honest", "gen-1", 2))
	key := r.Key("p", keyWorkers)
	for _, gen := range []string{"", "two words", strings.Repeat("g", 201)} {
		raw, err := rdb.HGet(ctx, key, "a-poison").Result()
		if err != nil {
			t.Fatal(err)
		}
		var rec map[string]any
		if err := json.Unmarshal([]byte(raw), &rec); err != nil {
			t.Fatal(err)
		}
		rec["gen"] = gen
		b, _ := json.Marshal(rec)
		rdb.HSet(ctx, key, "a-poison", b)
		c, err := claimP(t, r, "")
		if err != nil {
			t.Fatal(err)
		}
		if c.Worker.ID != "honest" {
			t.Fatalf("gen %q: claimed %s, want the honest worker", gen, c.Worker.ID)
		}
		if err := r.Release(ctx, "p", c.LeaseID); err != nil {
			t.Fatal(err)
		}
	}
	if !slices.Contains(bad, "a-poison") {
		t.Errorf("the record with a bad generation was not reported: %v", bad)
	}

	c, err := claimP(t, r, "")
	if err != nil {
		t.Fatal(err)
	}
	res, err := r.RenewLeases(ctx, "p", []LeaseRenewal{
		{ID: "forged", Worker: "a-poison", Gen: "", Claimed: time.Now()},
		{ID: c.LeaseID, Worker: c.Worker.ID, Gen: c.Gen, Claimed: time.Now(), Lifetime: c.Worker.Lifetime},
	}, time.Hour)
	if err != nil {
		t.Fatalf("one unrenewable lease failed the batch: %v", err)
	}
	if !slices.Equal(res.Ended, []string{"forged"}) {
		t.Errorf("ended %v, want the unrenewable lease only", res.Ended)
	}
	exp, err := rdb.ZScore(ctx, r.Key("p", keyLeaseExpiry), c.LeaseID).Result()
	if err != nil || time.UnixMilli(int64(exp)).Before(time.Now().Add(50*time.Minute)) {
		t.Errorf("the good lease was not renewed: expiry %v %v", exp, err)
	}
}

// A renewal of many leases (after a failover it may re-create them all)
// is sent in bounded calls, not one script that holds Redis.
func TestRenewalIsChunked(t *testing.T) {
	ctx := context.Background()
	r, rdb := startRegistry(t, Options{})
	for i := range 10 {
		mustRegister(t, r, capReg(fmt.Sprintf("w%02d", i), "g", 0))
	}
	const n = 1000
	ls := make([]LeaseRenewal, 0, n)
	for range n {
		c, err := r.Claim(ctx, ClaimRequest{Pool: "p", Policy: LifetimeFirst, LeaseTTL: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, LeaseRenewal{ID: c.LeaseID, Worker: c.Worker.ID, Gen: c.Gen, Claimed: time.Now(), Lifetime: c.Worker.Lifetime})
	}
	calls := func() int {
		info, err := rdb.Info(ctx, "commandstats").Result()
		if err != nil {
			t.Fatal(err)
		}
		total := 0
		for _, line := range strings.Split(info, "\n") {
			for _, name := range []string{"cmdstat_fcall:calls="} {
				if v, ok := strings.CutPrefix(strings.TrimSpace(line), name); ok {
					c, _ := strconv.Atoi(strings.SplitN(v, ",", 2)[0])
					total += c
				}
			}
		}
		return total
	}
	// All lost (a failover to a replica that missed them): re-created.
	rdb.Del(ctx, r.Key("p", keyLeases), r.Key("p", keyLeaseExpiry), r.Key("p", keyLeaseOwner))
	before := calls()
	res, err := r.RenewLeases(ctx, "p", ls, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Recreated) != n {
		t.Fatalf("re-created %d of %d leases", len(res.Recreated), n)
	}
	if got, want := calls()-before, n/renewChunk; got < want {
		t.Errorf("%d leases renewed in %d script calls, want at least %d (chunks of %d)", n, got, want, renewChunk)
	}
}

// A Redis that lost the pool's data between two claims (restarted empty
// with no call failing meanwhile) grants a claimer nothing until it has
// seen the new epoch: its live leases may be gone, and re-asserting them
// first is what keeps their worker from being over-admitted.
func TestClaimAfterDataLossAsksForReassertion(t *testing.T) {
	ctx := context.Background()
	r, rdb := startRegistry(t, Options{})
	mustRegister(t, r, capReg("w", "gen-1", 1))
	c, err := claimP(t, r, "")
	if err != nil || c.Epoch == "" {
		t.Fatalf("first claim: %v, epoch %q", err, c.Epoch)
	}
	if err := rdb.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	mustRegister(t, r, capReg("w", "gen-1", 1)) // the agent comes back first
	req := ClaimRequest{Pool: "p", Policy: LifetimeFirst, Limits: capLimits, LeaseTTL: time.Minute, Epoch: c.Epoch}
	_, err = r.Claim(ctx, req)
	var ee *EpochError
	if !errors.As(err, &ee) || ee.Now == "" || ee.Now == c.Epoch {
		t.Fatalf("claim with the lost epoch: %v, want an EpochError with a new epoch", err)
	}
	if a, l, _ := figures(t, r, "w"); a != 0 || l != 0 {
		t.Fatalf("the refused claim counted: active %d lifetime %d", a, l)
	}
	// Re-asserted, the worker is full again and the next claim finds nothing.
	if _, err := r.RenewLeases(ctx, "p", []LeaseRenewal{{ID: c.LeaseID, Worker: "w", Gen: c.Gen, Claimed: time.Now(), Lifetime: c.Worker.Lifetime}}, time.Minute); err != nil {
		t.Fatal(err)
	}
	req.Epoch = ee.Now
	if _, err := r.Claim(ctx, req); !errors.Is(err, ErrNoWorker) {
		t.Fatalf("claim after re-assertion on a full worker: %v, want ErrNoWorker", err)
	}
}
