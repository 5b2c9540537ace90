package registry

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"
)

// sessionsOf lists the IDs of a pool's sessions on worker.
func sessionsOf(t *testing.T, r *Registry, pool, worker string) []string {
	t.Helper()
	ss, _, err := r.Sessions(context.Background(), pool, 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, s := range ss {
		if s.Worker == worker {
			out = append(out, s.ID)
		}
	}
	slices.Sort(out)
	return out
}

func TestAfterRedisLostItsDataTheAgentRestoresItsCounts(t *testing.T) {
	r, _ := newTestRegistry(t)
	ctx := context.Background()
	rec := register(t, r, "p", "w1", 4)
	a, b := claim(t, r, ClaimRequest{Group: "p"}), claim(t, r, ClaimRequest{Group: "p"})
	live := AgentState{Lifetime: 2, Sessions: live(a.Session, b.Session)}
	if _, err := r.Heartbeat(ctx, "p", "w1", live); err != nil {
		t.Fatal(err)
	}
	if err := r.rdb.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Heartbeat(ctx, "p", "w1", live); !errors.Is(err, ErrNotRegistered) {
		t.Fatalf("heartbeat after the loss: %v", err)
	}
	if err := r.Register(ctx, rec, live, ""); err != nil {
		t.Fatal(err)
	}
	st := state(t, r, "p", "w1")
	if st.Active != 2 || st.Lifetime != 2 {
		t.Fatalf("after registering again: %+v", st)
	}
	if got, want := sessionsOf(t, r, "p", "w1"), []string{a.Session, b.Session}; !slices.Equal(got, slices.Sorted(slices.Values(want))) {
		t.Fatalf("sessions %v, want %v", got, want)
	}
}

func TestAHeartbeatKeepsAClaimOnItsWayAndEndsOneThatNeverArrived(t *testing.T) {
	r, _ := newTestRegistry(t)
	ctx := context.Background()
	register(t, r, "p", "w1", 4)
	claim(t, r, ClaimRequest{Group: "p"})
	if _, err := r.Heartbeat(ctx, "p", "w1", AgentState{}); err != nil {
		t.Fatal(err)
	}
	if st := state(t, r, "p", "w1"); st.Active != 1 || st.Lifetime != 1 {
		t.Fatalf("a claim on its way: %+v", st)
	}
	time.Sleep(PendingGrace + 50*time.Millisecond)
	if _, err := r.Heartbeat(ctx, "p", "w1", AgentState{}); err != nil {
		t.Fatal(err)
	}
	if st := state(t, r, "p", "w1"); st.Active != 0 || st.Lifetime != 0 {
		t.Fatalf("a claim that never arrived: %+v", st)
	}
	if ss := sessionsOf(t, r, "p", "w1"); len(ss) != 0 {
		t.Fatalf("sessions left: %v", ss)
	}
}

func TestAHeartbeatEndsALiveSessionTheAgentNoLongerHolds(t *testing.T) {
	r, _ := newTestRegistry(t)
	ctx := context.Background()
	register(t, r, "p", "w1", 4)
	c := claim(t, r, ClaimRequest{Group: "p"})
	if _, err := r.Heartbeat(ctx, "p", "w1", AgentState{Lifetime: 1, Sessions: live(c.Session)}); err != nil {
		t.Fatal(err)
	}
	if s, _, _ := r.GetSession(ctx, "p", c.Session); s.State != "live" {
		t.Fatalf("reported session: %+v", s)
	}
	// Its Caddy died and the agent's end was lost: the next heartbeat no
	// longer reports it.
	if _, err := r.Heartbeat(ctx, "p", "w1", AgentState{Lifetime: 1}); err != nil {
		t.Fatal(err)
	}
	if st := state(t, r, "p", "w1"); st.Active != 0 || st.Lifetime != 1 {
		t.Fatalf("after the heartbeat: %+v", st)
	}
}

func TestAHeartbeatCountsWhatTheAgentReportsOverWhatRedisSays(t *testing.T) {
	r, _ := newTestRegistry(t)
	ctx := context.Background()
	register(t, r, "p", "w1", 2)
	// Redis knows of no session, but the agent serves two (a snapshot
	// restored from before they were claimed).
	if _, err := r.Heartbeat(ctx, "p", "w1", AgentState{Lifetime: 5, Sessions: live("x1", "x2")}); err != nil {
		t.Fatal(err)
	}
	if st := state(t, r, "p", "w1"); st.Active != 2 || st.Lifetime != 5 {
		t.Fatalf("state: %+v", st)
	}
	if _, _, err := tryClaim(r, ClaimRequest{Group: "p"}); !errors.Is(err, ErrNoWorker) {
		t.Fatalf("claim of a full worker: %v", err)
	}
}

func TestAnOperatorsDrainAndEndReachTheAgentByItsHeartbeat(t *testing.T) {
	r, _ := newTestRegistry(t)
	ctx := context.Background()
	register(t, r, "p", "w1", 4)
	c := claim(t, r, ClaimRequest{Group: "p"})
	if _, err := r.Heartbeat(ctx, "p", "w1", AgentState{Lifetime: 1, Sessions: live(c.Session)}); err != nil {
		t.Fatal(err)
	}
	if ok, err := r.EndSession(ctx, "p", c.Session, 1000, "ended by the operator"); err != nil || !ok {
		t.Fatalf("end session: %v %v", ok, err)
	}
	if ok, _ := r.EndSession(ctx, "p", "nosuch", 1000, "x"); ok {
		t.Fatal("ended a session that does not exist")
	}
	if ok, err := r.Drain(ctx, "p", "w1"); err != nil || !ok {
		t.Fatalf("drain: %v %v", ok, err)
	}
	if _, _, err := tryClaim(r, ClaimRequest{Group: "p"}); !errors.Is(err, ErrNoWorker) {
		t.Fatalf("claim of a drained worker: %v", err)
	}
	rep, err := r.Heartbeat(ctx, "p", "w1", AgentState{Lifetime: 1, Sessions: live(c.Session)})
	if err != nil || !rep.Drain || !slices.Equal(rep.End, []string{c.Session}) {
		t.Fatalf("heartbeat reply %+v %v", rep, err)
	}
	// Once the agent drains, the drain is not sent again.
	rep, _ = r.Heartbeat(ctx, "p", "w1", AgentState{Status: Draining, Lifetime: 1})
	if rep.Drain {
		t.Fatalf("drain sent to a draining agent: %+v", rep)
	}
	if st := state(t, r, "p", "w1"); st.Status != "draining" {
		t.Fatalf("status %s", st.Status)
	}
}

func TestALastClaimThatNeverArrivedStopsTheRetirement(t *testing.T) {
	r, _ := newTestRegistry(t)
	ctx := context.Background()
	register(t, r, "p", "w1", 0)
	req := ClaimRequest{Group: "p", Limits: Limits{MaxLifetime: 1}}
	c := claim(t, r, req)
	if !c.Last {
		t.Fatal("not the last claim")
	}
	if _, err := r.GiveBack(ctx, "p", "w1", false, 0, c.Session); err != nil {
		t.Fatal(err)
	}
	if st := state(t, r, "p", "w1"); st.Status != "available" || st.Lifetime != 0 {
		t.Fatalf("after giving back the last claim: %+v", st)
	}
	if c := claim(t, r, req); !c.Last {
		t.Fatal("the worker did not take its last session again")
	}
}

func TestTheReaperRemovesStaleWorkersAndTheirSessions(t *testing.T) {
	r, _ := newTestRegistry(t)
	ctx := context.Background()
	register(t, r, "p", "old", 4)
	register(t, r, "p", "fresh", 4)
	claim(t, r, ClaimRequest{Group: "p"})
	claim(t, r, ClaimRequest{Group: "p"})
	time.Sleep(300 * time.Millisecond)
	if _, err := r.Heartbeat(ctx, "p", "fresh", AgentState{}); err != nil {
		t.Fatal(err)
	}
	n, err := r.Reap(ctx, "p", 200*time.Millisecond)
	if err != nil || n != 1 {
		t.Fatalf("reaped %d, %v", n, err)
	}
	info, _ := r.Inspect(ctx, "p")
	if len(info.Workers) != 1 || info.Workers[0].ID != "fresh" {
		t.Fatalf("workers left: %+v", info.Workers)
	}
	if ss := sessionsOf(t, r, "p", "old"); len(ss) != 0 {
		t.Fatalf("sessions of the reaped worker: %v", ss)
	}
}

func TestAClientLimitCountsAcrossVersionGroups(t *testing.T) {
	r, _ := newTestRegistry(t)
	register(t, r, "p@1.64", "a", 0)
	register(t, r, "p@1.65", "b", 0)
	req := ClaimRequest{Group: "p@1.64", Client: "c1", ClientLimit: 2}
	claim(t, r, req)
	req.Group = "p@1.65"
	claim(t, r, req)
	if _, _, err := tryClaim(r, req); !errors.Is(err, ErrClientLimit) {
		t.Fatalf("third session of a client limited to 2: %v", err)
	}
	req.Client = "c2"
	claim(t, r, req)
}

// live lists sessions an agent reports, with no client.
func live(ids ...string) []LiveSession {
	out := make([]LiveSession, len(ids))
	for i, id := range ids {
		out[i].ID = id
	}
	return out
}

// TestASessionRedisLostComesBackWithItsClient: after Redis lost a live
// session (its record, or everything: a restart, an older snapshot), the
// agent's heartbeat or registration brings it back with its client's
// hash, so it counts against the client's client_limit again and a
// second session of that client is refused.
func TestASessionRedisLostComesBackWithItsClient(t *testing.T) {
	for _, lost := range []string{"the session", "everything"} {
		t.Run(lost, func(t *testing.T) {
			r, _ := newTestRegistry(t)
			ctx := context.Background()
			rec := register(t, r, "p", "w1", 0)
			c := claim(t, r, ClaimRequest{Group: "p", Client: "alice", ClientLimit: 1})
			st := AgentState{Lifetime: 1, Sessions: []LiveSession{{ID: c.Session, Client: "alice"}}}
			rdb := r.Client()
			if lost == "the session" {
				rdb.HDel(ctx, r.Key("p", keySessions), c.Session)
				rdb.ZRem(ctx, r.Key("p", keySIndex), "w w1 "+c.Session, "c alice "+c.Session)
				if _, err := r.Heartbeat(ctx, "p", "w1", st); err != nil {
					t.Fatal(err)
				}
			} else {
				rdb.FlushAll(ctx)
				if err := r.Register(ctx, rec, st, ""); err != nil {
					t.Fatal(err)
				}
			}
			if _, _, err := tryClaim(r, ClaimRequest{Group: "p", Client: "alice", ClientLimit: 1}); !errors.Is(err, ErrClientLimit) {
				t.Fatalf("a second claim of the client: %v, want ErrClientLimit", err)
			}
		})
	}
}
