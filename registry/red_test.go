package registry

import (
	"context"
	"encoding/json"
	"errors"
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

// A worker marked suspect in its record only (by a version without hot
// figures: its Undo and Cancel write suspect_until into the record, during
// a rolling upgrade; or by hand) stays suspect for this version too, hot
// figures or not: a suspicion only ever grows until the worker registers
// anew, which writes both, so the later of the two is the one in force.
func TestRecordSuspicionWinsOverOlderHotFigures(t *testing.T) {
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
	if n, _ := rdb.HExists(ctx, r.Key("p", keyHot), "w").Result(); !n {
		t.Fatal("no hot figures after a claim and a release")
	}
	// an older version's undo: the record's suspect_until, not hot
	recKey := r.Key("p", keyWorkers)
	raw, err := rdb.HGet(ctx, recKey, "w").Result()
	if err != nil {
		t.Fatal(err)
	}
	var rec map[string]any
	if err := json.Unmarshal([]byte(raw), &rec); err != nil {
		t.Fatal(err)
	}
	until := time.Now().Add(time.Hour).UnixMilli()
	rec["suspect_until"] = until
	b, _ := json.Marshal(rec)
	if err := rdb.HSet(ctx, recKey, "w", string(b)).Err(); err != nil {
		t.Fatal(err)
	}
	w, err := r.Worker(ctx, "p", "w")
	if err != nil || w.SuspectUntil.UnixMilli() != until {
		t.Fatalf("Worker: suspect until %v (%v), want %d", w.SuspectUntil, err, until)
	}
	if c, err := claimP(t, r, "lease-2"); !errors.Is(err, ErrNoWorker) {
		t.Fatalf("claim of a worker suspect by its record: %+v %v; want ErrNoWorker", c, err)
	}
}
