package registry

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// A tombstone whose forget time has more digits than a count may hold
// (a hand edit, or an attacker with write access to Redis) must not stay
// due for ever: string.format('%d') of a number past 2^63 is no number,
// and a tombstone re-filed at such a score is due again at every sweep,
// so that enough of them fill every sweep (the claims' and reconcile's,
// whose 'leases' stage then never reports "no more") and no expired lease
// is freed again.
func TestTombstoneHostileForgetTimeIsForgotten(t *testing.T) {
	ctx := context.Background()
	r, rdb := startRegistry(t, Options{})
	leases, lexp := r.Key("p", keyLeases), r.Key("p", keyLeaseExpiry)
	for i := 0; i < reconcileLeases+5; i++ {
		lid := "hostile-" + strconv.Itoa(i)
		if err := rdb.HSet(ctx, leases, lid, tombPrefix+"99999999999999999999").Err(); err != nil {
			t.Fatal(err)
		}
		if err := rdb.ZAdd(ctx, lexp, redis.Z{Score: 1, Member: lid}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if _, err := r.Reconcile(rctx, "p"); err != nil {
		t.Fatalf("reconcile over hostile tombstones: %v", err)
	}
	due, err := rdb.ZCount(ctx, lexp, "-inf", strconv.FormatInt(time.Now().UnixMilli(), 10)).Result()
	if err != nil || due != 0 {
		t.Fatalf("%d lease_expiry entries still due after reconcile (%v); want none", due, err)
	}
}
