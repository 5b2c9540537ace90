package registry

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// A lease whose holder stops renewing it (a Caddy cut off from Redis whose
// sessions go on) keeps its slot while the worker's agent counts as many
// connections at its browser as the worker has leases (lua/common.lua,
// "Held leases").

const heldTTL = 200 * time.Millisecond

// claimShort claims on pool "p" with a lease that lapses after heldTTL.
func claimShort(t *testing.T, r *Registry) (*Claim, error) {
	t.Helper()
	return r.Claim(context.Background(), ClaimRequest{Pool: "p", Policy: LifetimeFirst, Limits: capLimits, LeaseTTL: heldTTL})
}

// holdRecheck is how long a held lease waits before it is looked at again
// (HOLD_RECHECK_MS).
const holdRecheck = time.Second

// lapse waits past the leases' expiry (and a held lease's next look) and
// runs the expiry sweep, as a claim, a heartbeat or the reaper would; it
// returns how many it freed.
func lapse(t *testing.T, r *Registry) int {
	t.Helper()
	time.Sleep(max(heldTTL, holdRecheck) + 50*time.Millisecond)
	n, err := r.ExpireLeases(context.Background(), "p", 100)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// beat is the agent's heartbeat with its count, a moment after what the
// test did before (a count speaks only for leases older than it).
func beat(t *testing.T, r *Registry, conns int) {
	t.Helper()
	time.Sleep(5 * time.Millisecond)
	if _, err := r.HeartbeatConns(context.Background(), "p", "w", time.Minute, conns); err != nil {
		t.Fatal(err)
	}
}

func TestALapsedLeaseOfALiveSessionKeepsItsSlot(t *testing.T) {
	ctx := context.Background()
	r, rdb := startRegistry(t, Options{})
	mustRegister(t, r, capReg("w", "gen-1", 2))
	var held []*Claim
	for range 2 {
		c, err := claimShort(t, r)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	// the agent sees both sessions' connections; then their holder goes
	// quiet past the leases' expiry
	beat(t, r, 2)
	if n := lapse(t, r); n != 0 {
		t.Fatalf("the sweep freed %d lapsed leases of sessions the browser still serves, want 0", n)
	}
	if a, _, _ := figures(t, r, "w"); a != 2 {
		t.Fatalf("active %d after the leases lapsed with both connections live, want 2", a)
	}
	if c, err := claimShort(t, r); err == nil {
		t.Fatalf("a third session was admitted at capacity 2 (lease %s): the lapsed leases gave their slots away", c.LeaseID)
	} else if !errors.As(err, new(*NoWorkerError)) {
		t.Fatal(err)
	}

	// One session ended meanwhile (its release did not reach Redis): the
	// next heartbeat counts one connection, so one lapsed lease goes.
	beat(t, r, 1)
	if n := lapse(t, r); n != 1 {
		t.Fatalf("the sweep freed %d lapsed leases with one of two connections left, want 1", n)
	}
	if a, _, _ := figures(t, r, "w"); a != 1 {
		t.Fatalf("active %d, want 1", a)
	}
	if _, err := claimShort(t, r); err != nil {
		t.Fatalf("the freed slot is not claimable: %v", err)
	}

	// The holder comes back and renews the session still live, the lease
	// that was held: its renewal carries on with it, nothing re-created.
	var kept []LeaseRenewal
	for _, c := range held {
		if rdb.HExists(ctx, r.Key("p", keyLeases), c.LeaseID).Val() {
			kept = append(kept, LeaseRenewal{ID: c.LeaseID, Worker: "w", Gen: c.Gen, Lifetime: c.Worker.Lifetime})
		}
	}
	if len(kept) != 1 {
		t.Fatalf("%d of the 2 lapsed leases are still in Redis, want the 1 held", len(kept))
	}
	res, err := r.RenewLeases(ctx, "p", kept, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Recreated) != 0 || len(res.Ended) != 0 {
		t.Fatalf("renewing the held lease: re-created %v, ended %v, want neither", res.Recreated, res.Ended)
	}
	if a, _, _ := figures(t, r, "w"); a != 2 {
		t.Fatalf("active %d after the renewal, want 2", a)
	}
	// the renewal ended the hold: a later lapse is held afresh
	if v := rdb.HGet(ctx, r.Key("p", keyLeases), kept[0].ID).Val(); strings.Contains(v, "held_at") {
		t.Fatalf("the renewed lease still carries its hold: %s", v)
	}
}

// moveHold rewrites held lease lid's held_at (which it must carry) to
// to(held_at), as a Redis writer could.
func moveHold(t *testing.T, r *Registry, rdb redis.UniversalClient, lid string, to func(float64) float64) {
	t.Helper()
	ctx, key := context.Background(), r.Key("p", keyLeases)
	var l map[string]any
	if err := json.Unmarshal([]byte(rdb.HGet(ctx, key, lid).Val()), &l); err != nil {
		t.Fatal(err)
	}
	at, ok := l["held_at"].(float64)
	if !ok {
		t.Fatalf("a held lease carries no held_at: %v", l)
	}
	l["held_at"] = to(at)
	b, err := json.Marshal(l)
	if err != nil {
		t.Fatal(err)
	}
	if err := rdb.HSet(ctx, key, lid, b).Err(); err != nil {
		t.Fatal(err)
	}
}

// A lease is held for a bounded time: a Caddy host that vanished leaves
// half-open connections the browser may count for a long time.
func TestALeaseIsHeldForABoundedTime(t *testing.T) {
	r, rdb := startRegistry(t, Options{})
	mustRegister(t, r, capReg("w", "gen-1", 1))
	c, err := claimShort(t, r)
	if err != nil {
		t.Fatal(err)
	}
	beat(t, r, 1)
	if n := lapse(t, r); n != 0 {
		t.Fatalf("freed %d, want the lease held", n)
	}
	// two minutes on (HOLD_MAX_MS), with the browser still counting it
	moveHold(t, r, rdb, c.LeaseID, func(at float64) float64 { return at - 120_000 })
	beat(t, r, 1)
	if n := lapse(t, r); n != 1 {
		t.Fatalf("freed %d after two minutes held, want 1", n)
	}

	// a hold that claims to start in the future (a Redis writer's) holds
	// nothing
	c, err = claimShort(t, r)
	if err != nil {
		t.Fatal(err)
	}
	beat(t, r, 1)
	if n := lapse(t, r); n != 0 {
		t.Fatalf("freed %d, want the new lease held", n)
	}
	moveHold(t, r, rdb, c.LeaseID, func(float64) float64 { return 9007199254740991 })
	beat(t, r, 1)
	if n := lapse(t, r); n != 1 {
		t.Fatalf("freed %d under a hold from the future, want 1", n)
	}
}

// An agent that cannot count (or a version before the count) reports
// nothing, and a report that is not the latest heartbeat's holds nothing:
// the lapsed leases go as before.
func TestALapsedLeaseGoesWithoutACurrentCount(t *testing.T) {
	r, rdb := startRegistry(t, Options{})
	mustRegister(t, r, capReg("w", "gen-1", 2))
	for range 2 {
		if _, err := claimShort(t, r); err != nil {
			t.Fatal(err)
		}
	}
	beat(t, r, 2)
	beat(t, r, -1)
	if n := rdb.HLen(context.Background(), r.Key("p", keyConns)).Val(); n != 0 {
		t.Fatalf("a heartbeat that could not count left %d reports", n)
	}
	if n := lapse(t, r); n != 2 {
		t.Fatalf("the sweep freed %d of 2 lapsed leases with no count, want 2", n)
	}

	for range 2 {
		if _, err := claimShort(t, r); err != nil {
			t.Fatal(err)
		}
	}
	beat(t, r, 2)
	// a heartbeat that writes no report (a version before it) moves the
	// record's heartbeat on: the report is no longer the latest
	if _, err := r.run(context.Background(), scriptHeartbeat, "p", 0, "w", ms(time.Minute), 0, r.opts.DurationWindow, ms(r.opts.CommandTTL)).Result(); err != nil {
		t.Fatal(err)
	}
	if n := lapse(t, r); n != 2 {
		t.Fatalf("the sweep freed %d of 2 lapsed leases under an older heartbeat's count, want 2", n)
	}
}

// A count taken before a lease began cannot speak for it: a claim whose
// holder died before it dialled goes at its expiry, not a heartbeat later.
func TestACountFromBeforeTheLeaseHoldsNothing(t *testing.T) {
	r, _ := startRegistry(t, Options{})
	mustRegister(t, r, capReg("w", "gen-1", 1))
	beat(t, r, 0)
	if _, err := claimShort(t, r); err != nil {
		t.Fatal(err)
	}
	if n := lapse(t, r); n != 1 {
		t.Fatalf("freed %d, want the lease the count never saw freed", n)
	}
}

// A worker registered again (a new browser) does not inherit its
// predecessor's count.
func TestARegistrationDropsTheCount(t *testing.T) {
	r, rdb := startRegistry(t, Options{})
	mustRegister(t, r, capReg("w", "gen-1", 2))
	beat(t, r, 2)
	mustRegister(t, r, capReg("w", "gen-2", 2))
	if n := rdb.HLen(context.Background(), r.Key("p", keyConns)).Val(); n != 0 {
		t.Fatalf("%d reports left after a new registration", n)
	}
	beat(t, r, 0)
	if err := r.Deregister(context.Background(), "p", "w"); err != nil {
		t.Fatal(err)
	}
	if n := rdb.HLen(context.Background(), r.Key("p", keyConns)).Val(); n != 0 {
		t.Fatalf("%d reports left after deregistration", n)
	}
}
