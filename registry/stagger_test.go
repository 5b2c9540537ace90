package registry

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
	"github.com/browsergrid/caddy-browser-grid/selection"
)

// staggerLimits: a lifetime of 3 sessions, so the third is a worker's last.
var staggerLimits = selection.Limits{MaxLifetime: 3, StaleAfter: 10 * time.Second, StaggerDrains: true}

// driveToLimit claims (and releases) in a pool of workers a and b until
// one of them reaches the lifetime limit, then gives the other every
// session short of its last. It returns the retiring worker, the other one,
// and the claim that set the shutdown command (its session still open).
func driveToLimit(t *testing.T, r *Registry, req ClaimRequest) (retiring, other string, last *Claim) {
	t.Helper()
	ctx := context.Background()
	for i := 0; last == nil; i++ {
		if i == 2*staggerLimits.MaxLifetime {
			t.Fatal("no claim reached the lifetime limit")
		}
		c, err := r.Claim(ctx, req)
		if err != nil {
			t.Fatalf("claim %d: %v", i, err)
		}
		if c.Drain {
			last = c
			break
		}
		if err := r.Release(ctx, req.Pool, c.LeaseID); err != nil {
			t.Fatal(err)
		}
	}
	retiring = last.Worker.ID
	other = map[string]string{"a": "b", "b": "a"}[retiring]
	for {
		w, err := r.Worker(ctx, req.Pool, other)
		if err != nil {
			t.Fatal(err)
		}
		if w.Lifetime == staggerLimits.MaxLifetime-1 {
			return retiring, other, last
		}
		c, err := r.Claim(ctx, req)
		if err != nil || c.Worker.ID != other || c.Drain {
			t.Fatalf("a session short of %s's last: claim %+v, %v", other, c, err)
		}
		if err := r.Release(ctx, req.Pool, c.LeaseID); err != nil {
			t.Fatal(err)
		}
	}
}

// refused asserts that the pool grants nothing now, because of a retiring
// worker, and that Pick agrees.
func refused(t *testing.T, r *Registry, req ClaimRequest, why string) {
	t.Helper()
	ctx := context.Background()
	c, err := r.Claim(ctx, req)
	var nw *NoWorkerError
	if !errors.As(err, &nw) || !nw.Retiring {
		t.Fatalf("%s: claim %+v, %v; want ErrNoWorker with a retiring worker", why, c, err)
	}
	if _, _, err := r.Pick(ctx, req); !errors.Is(err, ErrNoWorker) {
		t.Fatalf("%s: Pick %v, want ErrNoWorker", why, err)
	}
}

// granted asserts that the next claim gives other its last session.
func granted(t *testing.T, r *Registry, req ClaimRequest, other, why string) *Claim {
	t.Helper()
	c, err := r.Claim(context.Background(), req)
	if err != nil || c.Worker.ID != other || !c.Drain {
		t.Fatalf("%s: claim %+v, %v; want %s's last session", why, c, err, other)
	}
	return c
}

func retiringSet(t *testing.T, r *Registry, pool string) []string {
	t.Helper()
	info, err := r.Inspect(context.Background(), pool)
	if err != nil {
		t.Fatal(err)
	}
	return info.Retiring
}

// With StaggerDrains a worker's last session waits while the other worker
// of the pool is retiring, however it came to retire, and is granted as
// soon as the retiring one is gone (or was never really going).
func TestStaggerDrainsHoldsBackTheLastSession(t *testing.T) {
	ctx := context.Background()
	r, _ := startRegistry(t, Options{})
	// How the first worker leaves the pool, or stops retiring, after it
	// has held the other's last session back.
	cases := []struct {
		name string
		// retire makes a retiring (already at the limit); nil: the claim
		// that brought it there is all.
		retire func(pool, a string) error
		// leave ends a's retirement.
		leave func(pool, a string, last *Claim) error
	}{
		{
			name:  "at the limit awaiting its command, then deregistered",
			leave: func(pool, a string, _ *Claim) error { return r.Deregister(ctx, pool, a) },
		},
		{
			name:   "draining, then deregistered",
			retire: func(pool, a string) error { return r.SetDraining(ctx, pool, a) },
			leave:  func(pool, a string, _ *Claim) error { return r.Deregister(ctx, pool, a) },
		},
		{
			name:  "at the limit, then expired by the reaper",
			leave: func(pool, a string, _ *Claim) error { _, err := r.Expire(ctx, pool, a, 0); return err },
		},
		{
			// The dial failed: the lifetime and the command are given back,
			// and the worker is suspect, so b is the only usable one.
			name: "at the limit, then the claim that brought it there is undone",
			leave: func(pool, a string, last *Claim) error {
				return r.Undo(ctx, pool, last.LeaseID, time.Minute)
			},
		},
	}
	for _, policy := range []Policy{LifetimeFirst, Vnode, FairShare} {
		for _, tc := range cases {
			t.Run(string(policy)+"/"+tc.name, func(t *testing.T) {
				pool := "stagger-" + string(policy)
				if err := r.rdb.Del(ctx, r.poolKeys(pool)...).Err(); err != nil {
					t.Fatal(err)
				}
				register(t, r, pool, "a", 0)
				register(t, r, pool, "b", 0)
				req := ClaimRequest{Pool: pool, Policy: policy, Limits: staggerLimits}
				a, b, last := driveToLimit(t, r, req)
				if tc.retire != nil {
					if err := tc.retire(pool, a); err != nil {
						t.Fatal(err)
					}
				}
				if got := retiringSet(t, r, pool); !slices.Equal(got, []string{a}) {
					t.Fatalf("retiring set %v, want [%s]", got, a)
				}
				refused(t, r, req, b+"'s last session while "+a+" retires")
				if err := tc.leave(pool, a, last); err != nil {
					t.Fatal(err)
				}
				if slices.Contains(retiringSet(t, r, pool), a) {
					t.Fatalf("%s still in the retiring set after it left", a)
				}
				granted(t, r, req, b, a+" gone")
				if got := retiringSet(t, r, pool); !slices.Equal(got, []string{b}) {
					t.Fatalf("retiring set %v after %s's last session, want [%s]", got, b, b)
				}
			})
		}
	}

	// The worker agent's handover: the drained worker's record stays
	// draining until its replacement registers, and is deregistered after.
	// Meanwhile the replacement takes sessions but not its last one either.
	t.Run("handover to a replacement", func(t *testing.T) {
		pool := "handover"
		register(t, r, pool, "a", 0)
		register(t, r, pool, "b", 0)
		req := ClaimRequest{Pool: pool, Policy: LifetimeFirst, Limits: staggerLimits}
		a, b, _ := driveToLimit(t, r, req)
		if err := r.SetDraining(ctx, pool, a); err != nil {
			t.Fatal(err)
		}
		register(t, r, pool, "c", 0)
		for i := 0; i < staggerLimits.MaxLifetime-1; i++ {
			c, err := r.Claim(ctx, req)
			if err != nil || c.Worker.ID != "c" || c.Drain {
				t.Fatalf("claim %d on the replacement: %+v, %v", i, c, err)
			}
		}
		refused(t, r, req, "b's and c's last sessions while "+a+" drains")
		if err := r.Deregister(ctx, pool, a); err != nil {
			t.Fatal(err)
		}
		c, err := r.Claim(ctx, req)
		if err != nil || !c.Drain || (c.Worker.ID != b && c.Worker.ID != "c") {
			t.Fatalf("after %s left: %+v, %v; want the last session of %s or c", a, c, err, b)
		}
		refused(t, r, req, "the other last session while "+c.Worker.ID+" retires")
	})

	// The same pool without StaggerDrains grants the last session at once:
	// the rule above is what refused it.
	t.Run("without StaggerDrains", func(t *testing.T) {
		pool := "no-stagger"
		register(t, r, pool, "a", 0)
		register(t, r, pool, "b", 0)
		req := ClaimRequest{Pool: pool, Policy: LifetimeFirst, Limits: staggerLimits}
		_, b, _ := driveToLimit(t, r, req)
		req.Limits.StaggerDrains = false
		// A caller's Retiring is ignored: Redis says whether one retires.
		req.Limits.Retiring = true
		granted(t, r, req, b, "StaggerDrains off")
	})

	// An operator's Drain counts: the worker's agent drains at its next
	// heartbeat, and until then it takes no new session either.
	t.Run("an operator's drain", func(t *testing.T) {
		pool := "operator"
		register(t, r, pool, "a", 0)
		register(t, r, pool, "b", 0)
		req := ClaimRequest{Pool: pool, Policy: LifetimeFirst, Limits: staggerLimits}
		a, b, _ := driveToLimit(t, r, req)
		// Bring a back below the limit as a fresh registration, then drain it.
		register(t, r, pool, a, 0)
		if err := r.Drain(ctx, pool, a); err != nil {
			t.Fatal(err)
		}
		if got := retiringSet(t, r, pool); !slices.Equal(got, []string{a}) {
			t.Fatalf("retiring set %v after Drain, want [%s]", got, a)
		}
		// a takes no session although it is below its limit (drained),
		// and b's last waits.
		refused(t, r, req, a+" drained by an operator")
		if err := r.Deregister(ctx, pool, a); err != nil {
			t.Fatal(err)
		}
		granted(t, r, req, b, a+" deregistered")
	})
}

// A retiring worker whose heartbeat stopped is dead: it holds nothing
// back, and the claim that walks past it hands it to the background expiry.
func TestStaggerDrainsIgnoresDeadRetiringWorkers(t *testing.T) {
	ctx := context.Background()
	for _, status := range []selection.Status{selection.Available, selection.Draining} {
		t.Run(string(status), func(t *testing.T) {
			r, _ := startRegistry(t, Options{})
			pool := "dead"
			now := time.Now()
			// a: at the limit (or draining) and fresh at first; b one session
			// short of its last.
			a := selection.Worker{ID: "a", Status: status, Lifetime: 3, LastHeartbeat: now}
			b := selection.Worker{ID: "b", Status: selection.Available, Lifetime: 2, LastHeartbeat: now}
			put(t, r, pool, a, 0, time.Time{})
			put(t, r, pool, b, 0, time.Time{})
			for _, policy := range []Policy{LifetimeFirst, Vnode, FairShare} {
				refused(t, r, ClaimRequest{Pool: pool, Policy: policy, Limits: staggerLimits}, "a fresh "+string(status))
			}
			// a's heartbeat stops: its last one is older than StaleAfter.
			a.LastHeartbeat = now.Add(-time.Minute)
			put(t, r, pool, a, 0, time.Time{})
			for _, policy := range []Policy{LifetimeFirst, Vnode, FairShare} {
				if _, _, err := r.Pick(ctx, ClaimRequest{Pool: pool, Policy: policy, Limits: staggerLimits}); err != nil {
					t.Fatalf("%s Pick with a dead retiring worker: %v", policy, err)
				}
			}
			granted(t, r, ClaimRequest{Pool: pool, Policy: LifetimeFirst, Limits: staggerLimits}, "b", "a dead")
			testenv.Eventually(t, 5*time.Second, "the dead retiring worker expired", func() bool {
				_, err := r.Worker(ctx, pool, "a")
				return errors.Is(err, ErrNotRegistered)
			})
			if got := retiringSet(t, r, pool); !slices.Equal(got, []string{"b"}) {
				t.Fatalf("retiring set %v, want [b]", got)
			}
		})
	}
}

// Reconcile rebuilds the retiring set from the records: a lost member is
// put back (and holds last sessions back again), a member of no record is
// removed.
func TestReconcileRebuildsTheRetiringSet(t *testing.T) {
	ctx := context.Background()
	r, _ := startRegistry(t, Options{})
	pool := "rec"
	register(t, r, pool, "a", 0)
	register(t, r, pool, "b", 0)
	req := ClaimRequest{Pool: pool, Policy: LifetimeFirst, Limits: staggerLimits}
	a, b, _ := driveToLimit(t, r, req)
	key := r.Key(pool, keyRetiring)
	if err := r.rdb.Del(ctx, key).Err(); err != nil {
		t.Fatal(err)
	}
	if err := r.rdb.SAdd(ctx, key, "ghost").Err(); err != nil {
		t.Fatal(err)
	}
	res, err := r.Reconcile(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if got := retiringSet(t, r, pool); !slices.Equal(got, []string{a}) {
		t.Fatalf("retiring set after Reconcile %v, want [%s]", got, a)
	}
	if res.CountersFixed != 1 || res.OrphansRemoved != 1 {
		t.Fatalf("Reconcile %+v: want 1 fixed (%s put back) and 1 orphan (ghost)", res, a)
	}
	refused(t, r, req, b+"'s last session after the rebuild")
	info, err := r.Inspect(ctx, pool)
	if err != nil || !info.Limits.StaggerDrains {
		t.Fatalf("Inspect limits %+v, %v: want StaggerDrains stored", info.Limits, err)
	}
}

// A worker draining its last sessions holds the others' last sessions
// back for DrainHold, counted from the first claim that saw it so, and
// then no longer: the next worker takes its last session and its
// heartbeat is told to drain, the first one still draining. Without the
// bound (DrainHold 0), a long session on the draining worker held every
// last session back until it ended: in steady state, with one long
// session and max_lifetime 20, the pool went 22 s of 40 without opening a
// session (an operator red team). A worker with no session left is
// restarting and holds them back whatever DrainHold.
func TestStaggerDrainsHoldForALongDrainEnds(t *testing.T) {
	ctx := context.Background()
	r, _ := startRegistry(t, Options{})
	const hold = 2 * time.Second
	for _, policy := range []Policy{LifetimeFirst, Vnode, FairShare} {
		t.Run(string(policy), func(t *testing.T) {
			pool := "long-drain-" + string(policy)
			register(t, r, pool, "a", 0)
			register(t, r, pool, "b", 0)
			req := ClaimRequest{Pool: pool, Policy: policy, Limits: staggerLimits, DrainHold: hold}
			a, b, last := driveToLimit(t, r, req) // a's last session stays open
			if err := r.SetDraining(ctx, pool, a); err != nil {
				t.Fatal(err)
			}
			t0 := time.Now()
			at := func(d time.Duration) ClaimRequest { q := req; q.Now = t0.Add(d); return q }
			// A time the clock has not reached (a failover to a server whose
			// clock is behind) is not kept: the hold starts now.
			if err := r.rdb.HSet(ctx, r.Key(pool, keyConfig), "drain_seen:"+a, t0.Add(time.Hour).UnixMilli()).Err(); err != nil {
				t.Fatal(err)
			}
			refused(t, r, at(0), b+"'s last session as "+a+" starts draining its session")
			refused(t, r, at(hold-time.Millisecond), b+"'s last session just inside the hold")
			unbound := at(4 * hold)
			unbound.DrainHold = 0
			refused(t, r, unbound, b+"'s last session with no hold bound")
			c := granted(t, r, at(hold), b, a+" still draining its session after the hold")
			hb, err := r.Heartbeat(ctx, pool, b, time.Minute)
			if err != nil || hb.Command != CommandShutdown {
				t.Fatalf("%s's heartbeat at its limit while %s drains a session: %+v, %v; want the shutdown command", b, a, hb, err)
			}
			if got := retiringSet(t, r, pool); !slices.Equal(got, []string{"a", "b"}) {
				t.Fatalf("retiring set %v, want [a b]", got)
			}
			// b drains its last session as well, past the hold too: two
			// long drains both count, so a third worker's last session
			// waits (at most two drain at once).
			if err := r.SetDraining(ctx, pool, b); err != nil {
				t.Fatal(err)
			}
			register(t, r, pool, "c", 0)
			for i := 0; i < staggerLimits.MaxLifetime-1; i++ {
				cc, err := r.Claim(ctx, at(hold))
				if err != nil || cc.Worker.ID != "c" || cc.Drain {
					t.Fatalf("claim %d on c: %+v, %v", i, cc, err)
				}
			}
			refused(t, r, at(2*hold), "c's last session while "+a+" and "+b+" both drain a session past the hold")
			refused(t, r, at(4*hold), "c's last session while "+a+" and "+b+" both drain a session past the hold")
			// b's session ends: it is restarting now, and holds c's last
			// session back whatever the hold.
			if err := r.Release(ctx, pool, c.LeaseID); err != nil {
				t.Fatal(err)
			}
			refused(t, r, at(4*hold), "c's last session while "+b+" restarts")
			if err := r.Release(ctx, pool, last.LeaseID); err != nil {
				t.Fatal(err)
			}
			if err := r.Deregister(ctx, pool, b); err != nil {
				t.Fatal(err)
			}
			// a's session ended too: a restarts, and holds c back again.
			refused(t, r, at(4*hold), "c's last session while "+a+" restarts")
			if err := r.Deregister(ctx, pool, a); err != nil {
				t.Fatal(err)
			}
			granted(t, r, at(4*hold), "c", "a and b gone")
			if n, err := r.rdb.HLen(ctx, r.Key(pool, keyConfig)).Result(); err != nil {
				t.Fatal(err)
			} else if fields, _ := r.rdb.HKeys(ctx, r.Key(pool, keyConfig)).Result(); slices.ContainsFunc(fields, func(f string) bool { return len(f) > 11 && f[:11] == "drain_seen:" }) {
				t.Fatalf("the config hash keeps a gone worker's drain_seen field (%d fields: %v)", n, fields)
			}
		})
	}
}

// The hold is timed from when a claim first sees the worker retiring with
// a session left, not from when its agent marks it draining: the agent
// hears of its limit only at its next heartbeat, 10 s by default, and
// until then the others' last sessions waited with no bound, past the
// half of select_timeout the hold promises (an operator red team: no
// session for 4.1 s, and 503s, after a comeback spent with a long
// session).
func TestStaggerDrainsHoldStartsBeforeTheAgentHears(t *testing.T) {
	ctx := context.Background()
	r, _ := startRegistry(t, Options{})
	const hold = 2 * time.Second
	for _, policy := range []Policy{LifetimeFirst, Vnode, FairShare} {
		t.Run(string(policy), func(t *testing.T) {
			pool := "hears-" + string(policy)
			register(t, r, pool, "a", 0)
			register(t, r, pool, "b", 0)
			req := ClaimRequest{Pool: pool, Policy: policy, Limits: staggerLimits, DrainHold: hold}
			a, b, _ := driveToLimit(t, r, req) // a's last session stays open
			if w, err := r.Worker(ctx, pool, a); err != nil || w.Status != selection.Available || w.Active != 1 {
				t.Fatalf("%s before its agent heard: %+v, %v; want available with its session", a, w, err)
			}
			// The first claim to see a so (this one, or one that brought b
			// to its last session) started the hold.
			refused(t, r, req, b+"'s last session as "+a+" retires with a session left")
			seen, err := r.rdb.HGet(ctx, r.Key(pool, keyConfig), "drain_seen:"+a).Int64()
			if err != nil {
				t.Fatalf("no hold started for %s retiring with a session left: %v", a, err)
			}
			t0 := time.UnixMilli(seen)
			at := func(d time.Duration) ClaimRequest { q := req; q.Now = t0.Add(d); return q }
			refused(t, r, at(0), b+"'s last session as "+a+" retires with a session left")
			refused(t, r, at(hold-time.Millisecond), b+"'s last session just inside the hold")
			granted(t, r, at(hold), b, a+" still retiring with its session after the hold, its agent not told yet")
		})
	}
}

// A worker that stops retiring (a lowered limit raised again, its
// heartbeat takes it out of the retiring set) loses its hold's start: when
// it later reaches the raised limit with a session open, the others' last
// sessions wait a hold timed afresh, not one spent long ago (a red team:
// the next worker's last session was granted at once, two draining
// together).
func TestStaggerDrainsHoldAfterARaisedLimitStartsAfresh(t *testing.T) {
	ctx := context.Background()
	r, _ := startRegistry(t, Options{})
	const hold = 2 * time.Second
	pool := "raised"
	register(t, r, pool, "a", 0)
	register(t, r, pool, "b", 0)
	high := selection.Limits{MaxLifetime: 10, StaleAfter: 10 * time.Second, StaggerDrains: true}
	reqHigh := ClaimRequest{Pool: pool, Policy: LifetimeFirst, Limits: high, DrainHold: hold}
	on := func(req ClaimRequest, id, other string) *Claim {
		t.Helper()
		req.Avoid = []string{other}
		c, err := r.Claim(ctx, req)
		if err != nil || c.Worker.ID != id {
			t.Fatalf("claim on %s: %+v, %v", id, c, err)
		}
		return c
	}
	// a: 4 sessions, the last still open.
	var open *Claim
	for i := range 4 {
		c := on(reqHigh, "a", "b")
		if i < 3 {
			if err := r.Release(ctx, pool, c.LeaseID); err != nil {
				t.Fatal(err)
			}
		}
		open = c
	}
	// max_lifetime lowered to 3: claims put a in the retiring set and
	// start its hold.
	low := reqHigh
	low.Limits.MaxLifetime = 3
	low.ConfigTime = time.Now()
	for range 2 {
		_, _ = r.Claim(ctx, low)
	}
	if _, err := r.rdb.HGet(ctx, r.Key(pool, keyConfig), "drain_seen:a").Result(); err != nil {
		t.Fatalf("no hold started for a past the lowered limit with a session: %v", err)
	}
	// Raised to 10 again by a newer config; a's heartbeat takes it out.
	raised := reqHigh
	raised.ConfigTime = time.Now().Add(time.Second)
	if _, _, err := r.StoreLimits(ctx, raised); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Heartbeat(ctx, pool, "a", time.Minute); err != nil {
		t.Fatal(err)
	}
	if got := retiringSet(t, r, pool); len(got) != 0 {
		t.Fatalf("retiring set %v after the raise, want none", got)
	}
	if err := r.Release(ctx, pool, open.LeaseID); err != nil {
		t.Fatal(err)
	}
	// Past the old hold: b one short of its last session, a takes its
	// last with it left open.
	later := raised
	later.Now = time.Now().Add(hold + 500*time.Millisecond)
	for {
		w, err := r.Worker(ctx, pool, "b")
		if err != nil {
			t.Fatal(err)
		}
		if w.Lifetime == high.MaxLifetime-1 {
			break
		}
		if err := r.Release(ctx, pool, on(later, "b", "a").LeaseID); err != nil {
			t.Fatal(err)
		}
	}
	for {
		c := on(later, "a", "b")
		if c.Drain {
			break
		}
		if err := r.Release(ctx, pool, c.LeaseID); err != nil {
			t.Fatal(err)
		}
	}
	refused(t, r, later, "b's last session as a retires again with a session left")
	inside := later
	inside.Now = later.Now.Add(hold - time.Millisecond)
	refused(t, r, inside, "b's last session just inside a's new hold")
}
