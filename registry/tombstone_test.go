package registry

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
	"github.com/redis/go-redis/v9"
)

// An ended lease's tombstone is the lease's own entry (leases and
// lease_expiry), not an entry of another key: a claim run again after the
// release claims nothing, a renewal does not bring the lease back, a
// retried release changes nothing, and neither Inspect nor reconcile
// counts the tombstone as a lease.
func TestTombstoneIsTheLeasesOwnEntry(t *testing.T) {
	ctx := context.Background()
	r, rdb := startRegistry(t, Options{})
	mustRegister(t, r, capReg("w", "gen-1", 2))
	c, err := claimP(t, r, "lease-1")
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Release(ctx, "p", c.LeaseID); err != nil {
		t.Fatal(err)
	}
	tomb, err := rdb.HGet(ctx, r.Key("p", keyLeases), c.LeaseID).Result()
	if err != nil || !isTombstone(tomb) {
		t.Fatalf("leases[%s] after the release: %q %v; want a tombstone", c.LeaseID, tomb, err)
	}
	at, err := strconv.ParseInt(strings.TrimPrefix(tomb, tombPrefix), 10, 64)
	if err != nil {
		t.Fatalf("tombstone %q: %v", tomb, err)
	}
	if n, _ := rdb.Exists(ctx, r.Key("p", keyCancelled)).Result(); n != 0 {
		t.Fatal("the release wrote the cancelled set")
	}
	// The lease's lease_expiry entry stays where it was; the sweep that
	// meets it there (here: made due at once) moves it to the forget time.
	lexp := r.Key("p", keyLeaseExpiry)
	if exp, err := rdb.ZScore(ctx, lexp, c.LeaseID).Result(); err != nil || int64(exp) >= at {
		t.Fatalf("lease_expiry[%s] = %v %v after the release; want the lease's expiry, before %d", c.LeaseID, exp, err, at)
	}
	if err := rdb.ZAddXX(ctx, lexp, redis.Z{Score: 1, Member: c.LeaseID}).Err(); err != nil {
		t.Fatal(err)
	}
	if n, err := r.ExpireLeases(ctx, "p", 10); err != nil || n != 0 {
		t.Fatalf("sweep: %d leases freed, %v; want none (a tombstone is no lease)", n, err)
	}
	if exp, err := rdb.ZScore(ctx, lexp, c.LeaseID).Result(); err != nil || int64(exp) != at {
		t.Fatalf("lease_expiry[%s] = %v %v after the sweep; want the tombstone's forget time %d", c.LeaseID, exp, err, at)
	}

	if again, err := claimP(t, r, c.LeaseID); !errors.Is(err, ErrClaimCancelled) {
		t.Fatalf("claim replayed after its release: %+v %v; want ErrClaimCancelled", again, err)
	}
	res, err := r.RenewLeases(ctx, "p", []LeaseRenewal{renewal(c)}, time.Minute)
	if err != nil || !slices.Equal(res.Ended, []string{c.LeaseID}) || len(res.Recreated) != 0 {
		t.Fatalf("renewal after the release: %+v %v; want it ended", res, err)
	}
	if err := r.Release(ctx, "p", c.LeaseID); err != nil {
		t.Fatal(err)
	}
	if v, _ := rdb.HGet(ctx, r.Key("p", keyLeases), c.LeaseID).Result(); v != tomb {
		t.Fatalf("a retried release rewrote the tombstone: %q, was %q", v, tomb)
	}
	if a, l, _ := figures(t, r, "w"); a != 0 || l != 1 {
		t.Fatalf("after the release, its replays and retries: active %d lifetime %d; want 0 and 1", a, l)
	}
	// A lease id cancelled before its claim ran has no lease_expiry entry
	// yet: its tombstone's is written with it.
	if err := r.Cancel(ctx, "p", "never-ran"); err != nil {
		t.Fatal(err)
	}
	v, _ := rdb.HGet(ctx, r.Key("p", keyLeases), "never-ran").Result()
	if exp, err := rdb.ZScore(ctx, lexp, "never-ran").Result(); err != nil || !isTombstone(v) ||
		strconv.FormatInt(int64(exp), 10) != strings.TrimPrefix(v, tombPrefix) {
		t.Fatalf("cancel before the claim: leases %q, lease_expiry %v %v; want a tombstone scored by its forget time", v, exp, err)
	}

	// A live lease beside the tombstone: both count right.
	if _, err := claimP(t, r, "lease-2"); err != nil {
		t.Fatal(err)
	}
	if info, err := r.Inspect(ctx, "p"); err != nil || info.Leases != 1 {
		t.Fatalf("Inspect: %d leases, %v; want 1 (the tombstone is not one)", info.Leases, err)
	}
	out, err := r.Reconcile(ctx, "p")
	if err != nil || out.CountersFixed != 0 || out.OrphansRemoved != 0 || out.LeasesFreed != 0 {
		t.Fatalf("reconcile: %+v %v; want nothing to fix", out, err)
	}
	if a, _, _ := figures(t, r, "w"); a != 1 {
		t.Fatalf("active %d after reconcile, want 1", a)
	}
	if v, _ := rdb.HGet(ctx, r.Key("p", keyLeases), c.LeaseID).Result(); v != tomb {
		t.Fatalf("reconcile touched the tombstone: %q", v)
	}
}

// The lease expiry sweep forgets tombstones whose time has passed (one
// sweep for both), after which the lease id is new again.
func TestTombstoneForgottenByTheLeaseSweep(t *testing.T) {
	ctx := context.Background()
	r, rdb := startRegistry(t, Options{TombstoneTTL: time.Millisecond})
	mustRegister(t, r, capReg("w", "gen-1", 2))
	c, err := claimP(t, r, "lease-1")
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Release(ctx, "p", c.LeaseID); err != nil {
		t.Fatal(err)
	}
	// (the lease's entry, due at once, as if it had lapsed meanwhile)
	if err := rdb.ZAddXX(ctx, r.Key("p", keyLeaseExpiry), redis.Z{Score: 1, Member: c.LeaseID}).Err(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, "the tombstone forgotten", func() bool {
		n, err := r.ExpireLeases(ctx, "p", 10)
		if err != nil || n != 0 {
			t.Fatalf("expiring: %d leases freed, %v; want only the tombstone forgotten", n, err)
		}
		return rdb.HExists(ctx, r.Key("p", keyLeases), c.LeaseID).Val() == false
	})
	if n, _ := rdb.ZCard(ctx, r.Key("p", keyLeaseExpiry)).Result(); n != 0 {
		t.Fatalf("%d lease_expiry entries left after the tombstone went", n)
	}
	if again, err := claimP(t, r, c.LeaseID); err != nil || again.Worker.Lifetime != 2 {
		t.Fatalf("claim of a forgotten lease id: %+v %v; want a new claim", again, err)
	}
}

// Rolling upgrade: the cancelled set an older version wrote is read by
// nobody; the reaper's reconcile forgets its entries as they come due.
func TestReconcileForgetsTheOldCancelledSet(t *testing.T) {
	ctx := context.Background()
	r, rdb := startRegistry(t, Options{})
	key := r.Key("p", keyCancelled)
	far := float64(time.Now().Add(time.Hour).UnixMilli())
	if err := rdb.ZAdd(ctx, key, redis.Z{Score: 1, Member: "due"}, redis.Z{Score: far, Member: "young"}).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Reconcile(ctx, "p"); err != nil {
		t.Fatal(err)
	}
	if left, _ := rdb.ZRange(ctx, key, 0, -1).Result(); !slices.Equal(left, []string{"young"}) {
		t.Fatalf("cancelled after reconcile: %v; want only the entry not yet due", left)
	}
}

// A tombstone whose lease_expiry entry was lost (a partial loss) would
// never be forgotten: reconcile puts the entry back.
func TestReconcileRestoresATombstonesExpiry(t *testing.T) {
	ctx := context.Background()
	r, rdb := startRegistry(t, Options{})
	if err := r.Cancel(ctx, "p", "lost"); err != nil {
		t.Fatal(err)
	}
	lexp := r.Key("p", keyLeaseExpiry)
	want, err := rdb.ZScore(ctx, lexp, "lost").Result()
	if err != nil {
		t.Fatal(err)
	}
	rdb.ZRem(ctx, lexp, "lost")
	if _, err := r.Reconcile(ctx, "p"); err != nil {
		t.Fatal(err)
	}
	if got, err := rdb.ZScore(ctx, lexp, "lost").Result(); err != nil || got != want {
		t.Fatalf("lease_expiry[lost] after reconcile: %v %v; want %v", got, err, want)
	}
}
