package registry

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Claims free expired leases in 1 of claimSweepEvery calls; a refusal
// from one that did not (no worker, or the client at its limit) runs again
// with the sweep. So every claim of a run, whichever call of the cycle it
// is, is granted when only expired leases fill the worker or the client's
// budget.
func TestUnsweptRefusalRunsAgainWithTheSweep(t *testing.T) {
	ctx := context.Background()
	r, rdb := startRegistry(t, Options{})
	mustRegister(t, r, capReg("w", "g1", 1))
	req := ClaimRequest{Pool: "p", Policy: LifetimeFirst, LeaseTTL: time.Minute}
	for i := range 2 * claimSweepEvery {
		c, err := r.Claim(ctx, req)
		if err != nil {
			t.Fatalf("claim %d, its worker and its client full only of an expired lease: %v", i, err)
		}
		// Its holder stops renewing: the lease's expiry passes.
		if err := rdb.ZAddXX(ctx, r.Key("p", keyLeaseExpiry), redis.Z{Score: 1, Member: c.LeaseID}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	// The client's budget alone: a second worker has room.
	mustRegister(t, r, capReg("v", "g1", 4))
	req.ClientKey, req.ClientLimit = "alice", 1
	for i := range 2 * claimSweepEvery {
		c, err := r.Claim(ctx, req)
		if err != nil {
			t.Fatalf("claim %d, its client at its limit only through an expired lease: %v", i, err)
		}
		if err := rdb.ZAddXX(ctx, r.Key("p", keyLeaseExpiry), redis.Z{Score: 1, Member: c.LeaseID}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if bad, err := activeDrift(ctx, r, rdb, "p"); err != nil || len(bad) > 0 {
		t.Fatalf("counts apart from the leases: %v %v", bad, err)
	}
}
