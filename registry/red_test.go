package registry

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
	"github.com/browsergrid/caddy-browser-grid/selection"
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

// Releases racing renewals, claim replays, undos and sweeps of the same
// lease ids: whatever the order, every lease ends as its tombstone (no
// renewal or replay brings one back), the active counts match lease_owner
// and no lease_client entry is left.
func TestReleaseRacingRenewalReplayAndSweep(t *testing.T) {
	ctx := context.Background()
	r, rdb := startRegistry(t, Options{})
	const workers, rounds = 4, 60
	for i := range workers {
		mustRegister(t, r, capReg("w"+strconv.Itoa(i), "gen-1", 1000))
	}
	resurrected, replayed := 0, 0
	for round := range rounds {
		var claims []*Claim
		for i := range 8 {
			c, err := r.Claim(ctx, ClaimRequest{Pool: "p", Policy: LifetimeFirst, Limits: selection.Limits{MaxLifetime: 100000, StaleAfter: time.Minute},
				LeaseTTL: time.Minute, LeaseID: "r" + strconv.Itoa(round) + "-" + strconv.Itoa(i), ClientKey: "c" + strconv.Itoa(i%3)})
			if err != nil {
				t.Fatal(err)
			}
			claims = append(claims, c)
		}
		var wg sync.WaitGroup
		errs := make(chan error, 100)
		for i, c := range claims {
			wg.Add(4)
			go func() {
				defer wg.Done()
				if i%2 == 0 {
					errs <- r.Release(ctx, "p", c.LeaseID)
				} else {
					errs <- r.Undo(ctx, "p", c.LeaseID, time.Millisecond)
				}
			}()
			go func() {
				defer wg.Done()
				_, err := r.RenewLeases(ctx, "p", []LeaseRenewal{rn(c)}, time.Minute)
				errs <- err
			}()
			go func() {
				defer wg.Done()
				_, err := r.Claim(ctx, ClaimRequest{Pool: "p", Policy: LifetimeFirst, Limits: selection.Limits{MaxLifetime: 100000, StaleAfter: time.Minute},
					LeaseTTL: time.Minute, LeaseID: c.LeaseID, ClientKey: "c" + strconv.Itoa(i%3)})
				if err != nil && !errors.Is(err, ErrClaimCancelled) {
					errs <- err
				}
			}()
			go func() {
				defer wg.Done()
				_, err := r.ExpireLeases(ctx, "p", 100)
				errs <- err
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		for _, c := range claims {
			v, err := rdb.HGet(ctx, r.Key("p", keyLeases), c.LeaseID).Result()
			if err != nil || !isTombstone(v) {
				resurrected++
				t.Errorf("lease %s after its release raced: %q %v; want its tombstone", c.LeaseID, v, err)
			}
			// a renewal after the race: still ended
			res, err := r.RenewLeases(ctx, "p", []LeaseRenewal{rn(c)}, time.Minute)
			if err != nil || len(res.Recreated) != 0 {
				resurrected++
				t.Errorf("renewal of %s after its release: %+v %v", c.LeaseID, res, err)
			}
			if _, err := claimP(t, r, c.LeaseID); !errors.Is(err, ErrClaimCancelled) {
				replayed++
				t.Errorf("claim replay of %s after its release: %v", c.LeaseID, err)
			}
		}
	}
	drift, err := activeDrift(ctx, r, rdb, "p")
	if err != nil || len(drift) != 0 {
		t.Fatalf("active counts after the races: %v %v", drift, err)
	}
	if n, _ := rdb.ZCard(ctx, r.Key("p", keyLeaseOwner)).Result(); n != 0 {
		t.Fatalf("%d lease_owner entries left", n)
	}
	if n, _ := rdb.ZCard(ctx, r.Key("p", keyLeaseClient)).Result(); n != 0 {
		t.Fatalf("%d lease_client entries left", n)
	}
	info, err := r.Inspect(ctx, "p")
	if err != nil || info.Leases != 0 {
		t.Fatalf("Inspect: %d leases, %v; want 0", info.Leases, err)
	}
	t.Logf("%d leases raced (release or undo, renewal, replay, sweep): %d resurrected, %d replayed", rounds*8, resurrected, replayed)
}

// rn is c's renewal, with its client.
func rn(c *Claim) LeaseRenewal {
	l := renewal(c)
	l.Client = c.Client
	return l
}

// A compiled reply is one value per field whatever the field's value: in
// a positional constructor a call in the last field would spread all its
// results (a longer reply, or a shorter one for none), where the named
// reply{} took one. The compiled reply must read like the named one.
func TestCompiledReplyTakesOneValuePerField(t *testing.T) {
	ctx := context.Background()
	_, rdb := startRegistry(t, Options{})
	body := `local function two() return 'x', 'y' end
local function none() end
local v = none()
if v == nil then v = 'n' end
return reply { a = v, b = two() }
`
	for _, script := range []string{
		contractLua("t.lua", nil, []string{"a", "b"}) + body,
		contractLua("t.lua", nil, []string{"a", "b"}) + contractBody("t.lua", nil, []string{"a", "b"}, body),
	} {
		res, err := rdb.Eval(ctx, script, nil).Slice()
		if err != nil || len(res) != 2 || res[1] != "x" {
			t.Errorf("reply %v %v, want [n x]\n%s", res, err, script)
		}
	}
}

// Hostile or garbage hot values (an attacker or an operator with write
// access to Redis) never make a claim, a release or a read fail: the
// worker is claimed and released, its figures stay whole numbers, and the
// durations list stays the stored one plus the new entry.
func TestHostileHotFigures(t *testing.T) {
	ctx := context.Background()
	r, rdb := startRegistry(t, Options{})
	mustRegister(t, r, capReg("w", "gen-1", 1000))
	hot, dur := r.Key("p", keyHot), r.Key("p", keyDurations)
	fs := func(i int) ClaimRequest {
		return ClaimRequest{Pool: "p", Policy: FairShare, Limits: capLimits, LeaseTTL: time.Minute,
			FairShare: selection.FairShare{Window: 3, Median: i%2 == 1, Default: time.Second}}
	}
	for i, v := range []string{
		"0 0 3 999999999999999 999999999999999 1,2,3", "0 0 0 0 999999999999999 1,2,3", "0 0 3 0 5 1,2,3",
		"999999999999999 0 3 3 6 1,2,3", "0 0 999999999999999 3 6 1,2,3", "0 0 3 3 6 1,2,3x", "0 0 3 3 6 1,2,3 ",
		"0 0 3 3 6 ", "1 2 3 4 5 6 7 8 9", "99999999999999999999 0", "0 0 3 1 2", strings.Repeat("9 ", 5000),
	} {
		rdb.HSet(ctx, dur, "w", "1,2,3")
		rdb.HSet(ctx, hot, "w", v)
		c, err := r.Claim(ctx, fs(i))
		if err != nil {
			// a hostile predicted end may hold the worker back; never an error other than no worker
			if !errors.Is(err, ErrNoWorker) {
				t.Fatalf("hot %q: claim: %v", v, err)
			}
			continue
		}
		if err := r.Release(ctx, "p", c.LeaseID); err != nil {
			t.Fatalf("hot %q: release: %v", v, err)
		}
		if _, err := r.Worker(ctx, "p", "w"); err != nil {
			t.Fatalf("hot %q: Worker: %v", v, err)
		}
		if d, _ := rdb.HGet(ctx, dur, "w").Result(); !strings.HasPrefix(d, "1,2,3,") && !strings.HasPrefix(d, "2,3,") {
			t.Errorf("hot %q: durations after a release %q, want 1,2,3 and the new one", v, d)
		}
	}
}

// A lease id used again once its tombstone is due (forgotten or not yet
// swept) claims afresh, once: the counts follow, and its release leaves a
// tombstone again.
func TestLeaseIDReusedAfterItsTombstone(t *testing.T) {
	ctx := context.Background()
	r, rdb := startRegistry(t, Options{TombstoneTTL: 20 * time.Millisecond})
	mustRegister(t, r, capReg("w", "gen-1", 5))
	for i := range 3 {
		c, err := claimP(t, r, "again")
		if err != nil {
			t.Fatalf("claim %d of a reused id: %v", i, err)
		}
		if a, _, _ := figures(t, r, "w"); a != 1 {
			t.Fatalf("claim %d: active %d, want 1", i, a)
		}
		if err := r.Release(ctx, "p", c.LeaseID); err != nil {
			t.Fatal(err)
		}
		if _, err := claimP(t, r, "again"); !errors.Is(err, ErrClaimCancelled) {
			t.Fatalf("claim right after the release: %v, want ErrClaimCancelled", err)
		}
		testenv.Eventually(t, 5*time.Second, "the tombstone due", func() bool {
			v, _ := rdb.HGet(ctx, r.Key("p", keyLeases), "again").Result()
			at, err := strconv.ParseInt(strings.TrimPrefix(v, tombPrefix), 10, 64)
			return err == nil && time.Now().UnixMilli() > at
		})
		if i == 1 {
			// forgotten by a sweep this time, rather than overwritten
			if _, err := r.ExpireLeases(ctx, "p", 10); err != nil {
				t.Fatal(err)
			}
		}
	}
	if a, l, _ := figures(t, r, "w"); a != 0 || l != 3 {
		t.Fatalf("active %d lifetime %d, want 0 and 3", a, l)
	}
	drift, err := activeDrift(ctx, r, rdb, "p")
	if err != nil || len(drift) != 0 {
		t.Fatalf("drift: %v %v", drift, err)
	}
}
