package registry

import (
	"context"
	"errors"
	"testing"
	"time"
)

// A worker crashed with its agent (nobody deregistered it) and a new one
// was started at the same port (systemd's Restart=always with a fixed
// BROWSER_PORT): the new browser's exclusive registration removes the old
// record, which would otherwise send claims to the new browser beside its
// own record's, past its cap and max_lifetime, until it went stale (an
// operator red team: 3 over-admissions, 25-36 lifetime overshoots). A
// draining record at that address stays (it takes no session), records
// registered without Exclusive are left alone, and the address map
// forgets a worker that leaves.
func TestAnExclusiveRegistrationReplacesACrashedOneAtItsAddress(t *testing.T) {
	ctx := context.Background()
	r, rdb := startRegistry(t, Options{})
	req := ClaimRequest{Pool: "p", Policy: LifetimeFirst, Limits: capLimits, LeaseTTL: time.Minute}
	at := func(id string, exclusive bool) Registration {
		reg := capReg(id, "gen-"+id, 2)
		reg.Exclusive = exclusive
		return reg
	}
	registered := func(id string) bool {
		t.Helper()
		_, err := r.Worker(ctx, "p", id)
		if err != nil && !errors.Is(err, ErrNotRegistered) {
			t.Fatal(err)
		}
		return err == nil
	}

	mustRegister(t, r, at("old", true))
	c, err := r.Claim(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	mustRegister(t, r, at("new", true))
	if registered("old") || !registered("new") {
		t.Fatalf("after the new exclusive registration: old registered %v, new %v; want false, true", registered("old"), registered("new"))
	}
	// the old one's session lease is left to its holder
	if err := r.Release(ctx, "p", c.LeaseID); err != nil {
		t.Fatal(err)
	}
	// only the new record takes sessions: capacity 2, then none
	for i := range 3 {
		c, err := r.Claim(ctx, req)
		if i < 2 && (err != nil || c.Worker.ID != "new") {
			t.Fatalf("claim %d: %v, %v", i+1, c, err)
		}
		if i == 2 && !errors.Is(err, ErrNoWorker) {
			t.Fatalf("claim 3 past the new browser's capacity: %v, want no worker", err)
		}
	}

	// a draining record at the address stays
	if err := r.SetDraining(ctx, "p", "new"); err != nil {
		t.Fatal(err)
	}
	mustRegister(t, r, at("respawned", true))
	if !registered("new") || !registered("respawned") {
		t.Errorf("a draining record was removed by the next registration at its address")
	}

	// without Exclusive, records share an address as before
	mustRegister(t, r, at("a", false))
	mustRegister(t, r, at("b", false))
	if !registered("a") || !registered("b") || !registered("respawned") {
		t.Errorf("registrations without Exclusive removed a record: a %v, b %v, respawned %v",
			registered("a"), registered("b"), registered("respawned"))
	}

	// leaving forgets the address
	for _, id := range []string{"new", "respawned", "a", "b"} {
		if err := r.Deregister(ctx, "p", id); err != nil {
			t.Fatal(err)
		}
	}
	if n := rdb.HLen(ctx, r.Key("p", keyAddrs)).Val(); n != 0 {
		t.Errorf("%d address entries left after every worker left, want 0", n)
	}
}
