package registry

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// TestOperatorDrainTakesNoNewSession: an operator's Drain (the admin API's
// drain) takes the worker out of selection at once, for every policy of
// the table, not at its agent's next heartbeat (10 s by default). It stays
// out while the command is live: through the release of a session it
// held, a heartbeat (the agent hearing the command), and the reaper's
// reconcile, which must find nothing to fix. A command that lapses unheard
// (its agent never heartbeated within CommandTTL) gives the worker back to
// claims at its next heartbeat, as the command is gone.
func TestOperatorDrainTakesNoNewSession(t *testing.T) {
	ctx := context.Background()
	const ttl = 1500 * time.Millisecond
	r, _ := startRegistry(t, Options{CommandTTL: ttl})
	ids := []string{"w1", "w2", "w3"}
	for _, p := range Policies() {
		t.Run(string(p.Name), func(t *testing.T) {
			pool := "opdrain-" + strings.ReplaceAll(string(p.Name), "_", "-")
			for _, id := range ids {
				register(t, r, pool, id, 4)
			}
			req := func(avoid ...string) ClaimRequest {
				return ClaimRequest{Pool: pool, Policy: p.Name, Avoid: avoid}
			}
			// the worker this policy takes first, with a session on it
			held, err := r.Claim(ctx, req())
			if err != nil {
				t.Fatalf("claim: %v", err)
			}
			x := held.Worker.ID
			others := without(ids, x)
			if err := r.Drain(ctx, pool, x); err != nil {
				t.Fatal(err)
			}
			// only x may be taken: nothing may be
			noneFor := func(when string) {
				t.Helper()
				c, err := r.Claim(ctx, req(others...))
				var nw *NoWorkerError
				if !errors.As(err, &nw) {
					t.Fatalf("%s: a claim that could only take drained %s: %+v, %v; want a NoWorkerError", when, x, c, err)
				}
			}
			noneFor("right after the drain")
			// the other workers still serve
			c, err := r.Claim(ctx, req())
			if err != nil || c.Worker.ID == x {
				t.Fatalf("claim after draining %s: %+v, %v; want another worker", x, c, err)
			}
			if err := r.Release(ctx, pool, c.LeaseID); err != nil {
				t.Fatal(err)
			}
			// a release of its own session reindexes it: it stays out
			if err := r.Release(ctx, pool, held.LeaseID); err != nil {
				t.Fatal(err)
			}
			noneFor("after its session was released")
			res, err := r.Reconcile(ctx, pool)
			if err != nil {
				t.Fatal(err)
			}
			if res.CountersFixed != 0 || res.OrphansRemoved != 0 {
				t.Errorf("reconcile of a drained worker fixed %d and removed %d, want nothing", res.CountersFixed, res.OrphansRemoved)
			}
			noneFor("after the reaper's reconcile")
			hb, err := r.Heartbeat(ctx, pool, x, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			if hb.Command != CommandShutdown {
				t.Errorf("heartbeat of drained %s: command %q, want shutdown", x, hb.Command)
			}
			noneFor("after its heartbeat")
			// unheard: the agent acts on no command that lapsed, so neither
			// do claims
			time.Sleep(ttl + 200*time.Millisecond)
			if hb, err = r.Heartbeat(ctx, pool, x, time.Minute); err != nil || hb.Command != "" {
				t.Fatalf("heartbeat once the command lapsed: %+v, %v; want no command", hb, err)
			}
			c, err = r.Claim(ctx, req(others...))
			if err != nil || c.Worker.ID != x {
				t.Fatalf("claim of %s once its command lapsed: %+v, %v", x, c, err)
			}
			if err := r.Release(ctx, pool, c.LeaseID); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// inLifetimeIndex reports whether id is in the pool's idx:lifetime.
func inLifetimeIndex(t *testing.T, r *Registry, pool, id string) bool {
	t.Helper()
	_, err := r.rdb.ZScore(context.Background(), r.Key(pool, keyIdxLifetime), id).Result()
	return err == nil
}

// An operator drains a worker whose agent then stalls past the stale
// threshold: the stale expiry keeps the command, and the agent's comeback
// (the same generation registering again) must not put the worker back in
// rotation before it hears it, through claims, releases or a reconcile.
func TestOperatorDrainSurvivesALapsedRecord(t *testing.T) {
	ctx := context.Background()
	r, _ := startRegistry(t, Options{})
	mustRegister(t, r, capReg("w", "gen-1", 4))
	held, err := claimP(t, r, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Drain(ctx, "p", "w"); err != nil {
		t.Fatal(err)
	}
	expireStale(t, r, "w")
	mustRegister(t, r, capReg("w", "gen-1", 4)) // the agent's comeback
	if _, _, cmd := figures(t, r, "w"); cmd != CommandShutdown {
		t.Fatalf("comeback: command %q, want the operator's shutdown kept", cmd)
	}
	for _, when := range []string{"after its comeback", "after its session's release", "after a reconcile"} {
		switch when {
		case "after its session's release":
			if err := r.Release(ctx, "p", held.LeaseID); err != nil {
				t.Fatal(err)
			}
		case "after a reconcile":
			if _, err := r.Reconcile(ctx, "p"); err != nil {
				t.Fatal(err)
			}
		}
		if c, err := claimP(t, r, ""); !errors.Is(err, ErrNoWorker) {
			t.Fatalf("%s: a claim took the drained worker: %+v, %v", when, c, err)
		}
		if inLifetimeIndex(t, r, "p", "w") {
			t.Errorf("%s: the drained worker is in idx:lifetime", when)
		}
	}
}

// A commanded worker missing from the retiring set (the set lost, a hand
// written command): the reaper's repair makes it a member and keeps it
// out of the indexes; it does not put it in them on the way.
func TestReconcileRepairKeepsACommandedWorkerOut(t *testing.T) {
	ctx := context.Background()
	for _, p := range Policies() {
		t.Run(string(p.Name), func(t *testing.T) {
			r, _ := startRegistry(t, Options{})
			mustRegister(t, r, capReg("w", "gen-1", 4))
			req := ClaimRequest{Pool: "p", Policy: p.Name, Limits: capLimits, LeaseTTL: time.Minute}
			c, err := r.Claim(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			if err := r.Release(ctx, "p", c.LeaseID); err != nil {
				t.Fatal(err)
			}
			if err := r.Drain(ctx, "p", "w"); err != nil {
				t.Fatal(err)
			}
			r.rdb.SRem(ctx, r.Key("p", keyRetiring), "w")
			// the workers stage alone: the scans after it would hide a
			// worker it indexed
			if _, err := r.run(ctx, scriptReconcile, "p", 0, "workers", "0", 16).Slice(); err != nil {
				t.Fatal(err)
			}
			if inLifetimeIndex(t, r, "p", "w") {
				t.Error("the reaper's repair put the commanded worker in idx:lifetime")
			}
			if got := retiringSet(t, r, "p"); len(got) != 1 || got[0] != "w" {
				t.Errorf("retiring set %v after the repair, want [w]", got)
			}
			if c, err := r.Claim(ctx, req); err == nil {
				t.Errorf("a claim took the commanded worker after the repair: %+v", c)
			}
			// a heartbeat (the agent hears it) keeps it out too
			if _, err := r.Heartbeat(ctx, "p", "w", time.Minute); err != nil {
				t.Fatal(err)
			}
			if inLifetimeIndex(t, r, "p", "w") {
				t.Error("the heartbeat put the commanded worker in idx:lifetime")
			}
		})
	}
}

// Only a shutdown command holds a worker out: another name (a hand edit,
// a newer version's command) is one the agent ignores, so it must not
// keep the worker from serving until its expiry.
func TestOnlyAShutdownCommandHoldsAWorkerOut(t *testing.T) {
	ctx := context.Background()
	r, _ := startRegistry(t, Options{})
	mustRegister(t, r, capReg("w", "gen-1", 4))
	if err := r.Drain(ctx, "p", "w"); err != nil {
		t.Fatal(err)
	}
	r.rdb.HSet(ctx, r.Key("p", keyCommands), "w", "restart|99999999999999")
	hb, err := r.Heartbeat(ctx, "p", "w", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	c, err := claimP(t, r, "")
	if err != nil {
		t.Fatalf("a worker whose agent was told %q (which it ignores) takes no session: %v", hb.Command, err)
	}
	if err := r.Release(ctx, "p", c.LeaseID); err != nil {
		t.Fatal(err)
	}
}

// The undo of a claim that brought its worker to max_lifetime withdraws
// the shutdown command that claim set, not an operator's drain made since.
func TestUndoKeepsALaterOperatorDrain(t *testing.T) {
	ctx := context.Background()
	r, _ := startRegistry(t, Options{})
	reg := capReg("w", "gen-1", 4)
	reg.Lifetime = capLimits.MaxLifetime - 1
	mustRegister(t, r, reg)
	for _, operator := range []bool{false, true} {
		c, err := claimP(t, r, "")
		if err != nil || !c.Drain {
			t.Fatalf("the worker's last session: %+v, %v", c, err)
		}
		if operator {
			time.Sleep(2 * time.Millisecond) // a later expiry than the claim's
			if err := r.Drain(ctx, "p", "w"); err != nil {
				t.Fatal(err)
			}
		}
		if err := r.Undo(ctx, "p", c.LeaseID, 0); err != nil {
			t.Fatal(err)
		}
		_, _, cmd := figures(t, r, "w")
		if operator && cmd != CommandShutdown {
			t.Errorf("the undo withdrew the operator's drain: command %q", cmd)
		}
		if !operator && cmd != "" {
			t.Errorf("the undo kept the command its claim set: %q", cmd)
		}
	}
	if c, err := claimP(t, r, ""); err == nil {
		t.Errorf("a claim took the worker its operator drained: %+v", c)
	}
}
