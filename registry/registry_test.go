package registry

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestAClaimCountsUntilTheAgentEndsTheSession(t *testing.T) {
	r, _ := newTestRegistry(t)
	ctx := context.Background()
	register(t, r, "chromium", "w1", 2)
	c := claim(t, r, ClaimRequest{Group: "chromium"})
	if c.Worker.ID != "w1" || c.Worker.Addr != "127.0.0.1:9" || c.Worker.Path != "/playwright" || c.Lifetime != 1 {
		t.Fatalf("claim = %+v", c)
	}
	if st := state(t, r, "chromium", "w1"); st.Active != 1 || st.Lifetime != 1 {
		t.Fatalf("after the claim: %+v", st)
	}
	s, ok, err := r.GetSession(ctx, "chromium", c.Session)
	if err != nil || !ok || s.State != "pending" || s.Worker != "w1" {
		t.Fatalf("session = %+v %v %v", s, ok, err)
	}
	n, err := r.EndServed(ctx, "chromium", "w1", []Ended{{Session: c.Session, Duration: 1500 * time.Millisecond}})
	if err != nil || n != 1 {
		t.Fatalf("end = %d %v", n, err)
	}
	if st := state(t, r, "chromium", "w1"); st.Active != 0 || st.Lifetime != 1 {
		t.Fatalf("after the end: %+v", st)
	}
	// Ending again counts nothing.
	if n, _ := r.EndServed(ctx, "chromium", "w1", []Ended{{Session: c.Session}}); n != 0 {
		t.Fatalf("second end ended %d", n)
	}
	if st := state(t, r, "chromium", "w1"); st.Active != 0 {
		t.Fatalf("after a second end: %+v", st)
	}
}

func TestAFullWorkerTakesNoClaim(t *testing.T) {
	r, _ := newTestRegistry(t)
	register(t, r, "p", "w1", 2)
	req := ClaimRequest{Group: "p", Limits: Limits{MaxConcurrent: 5}}
	claim(t, r, req)
	claim(t, r, req)
	if _, _, err := tryClaim(r, req); !errors.Is(err, ErrNoWorker) {
		t.Fatalf("third claim at capacity 2: %v", err)
	}
	// The claim's own cap applies when it is the smaller.
	register(t, r, "p", "w2", 0)
	req.Limits.MaxConcurrent = 1
	if c := claim(t, r, req); c.Worker.ID != "w2" {
		t.Fatalf("claim went to %s", c.Worker.ID)
	}
	if _, _, err := tryClaim(r, req); !errors.Is(err, ErrNoWorker) {
		t.Fatalf("claim past max_concurrent 1: %v", err)
	}
}

func TestAGivenBackClaimReturnsItsLifetime(t *testing.T) {
	r, _ := newTestRegistry(t)
	ctx := context.Background()
	register(t, r, "p", "w1", 1)
	c := claim(t, r, ClaimRequest{Group: "p"})
	if _, err := r.GiveBack(ctx, "p", "w1", true, 5*time.Second, c.Session); err != nil {
		t.Fatal(err)
	}
	st := state(t, r, "p", "w1")
	if st.Active != 0 || st.Lifetime != 0 || !st.SuspectUntil.After(time.Now().Add(4*time.Second)) {
		t.Fatalf("after a failed claim: %+v", st)
	}
	// A suspect worker takes no claim.
	if _, _, err := tryClaim(r, ClaimRequest{Group: "p"}); !errors.Is(err, ErrNoWorker) {
		t.Fatalf("claim of a suspect worker: %v", err)
	}
}

func TestTheClaimThatReachesMaxLifetimeRetiresTheWorker(t *testing.T) {
	r, _ := newTestRegistry(t)
	register(t, r, "p", "w1", 0)
	req := ClaimRequest{Group: "p", Limits: Limits{MaxLifetime: 3}}
	for i := 1; i <= 3; i++ {
		if c := claim(t, r, req); c.Last != (i == 3) || c.Lifetime != i {
			t.Fatalf("claim %d = lifetime %d, last %v", i, c.Lifetime, c.Last)
		}
	}
	if st := state(t, r, "p", "w1"); st.Status != "retiring" {
		t.Fatalf("status = %s", st.Status)
	}
	if _, _, err := tryClaim(r, req); !errors.Is(err, ErrNoWorker) {
		t.Fatalf("claim of a retiring worker: %v", err)
	}
	// A second worker serves, but not its own last session while the
	// first retires (stagger_drains).
	register(t, r, "p", "w2", 0)
	req.Limits.StaggerDrains = true
	for i := 0; i < 2; i++ {
		if c := claim(t, r, req); c.Worker.ID != "w2" {
			t.Fatalf("claim %d went to %s", i, c.Worker.ID)
		}
	}
	if _, _, err := tryClaim(r, req); !errors.Is(err, ErrNoWorker) {
		t.Fatalf("last session of the second worker while the first retires: %v", err)
	}
	req.Limits.StaggerDrains = false
	if c := claim(t, r, req); !c.Last {
		t.Fatalf("without stagger_drains: %+v", c)
	}
}

func TestAReplacementEndsTheRetiringHold(t *testing.T) {
	r, _ := newTestRegistry(t)
	ctx := context.Background()
	register(t, r, "p", "old", 0)
	req := ClaimRequest{Group: "p", Limits: Limits{MaxLifetime: 2, StaggerDrains: true}}
	claim(t, r, req)
	if c := claim(t, r, req); !c.Last {
		t.Fatalf("second claim = %+v", c)
	}
	register(t, r, "p", "a-other", 0)
	claim(t, r, req) // other: 1
	if _, _, err := tryClaim(r, req); !errors.Is(err, ErrNoWorker) {
		t.Fatalf("held claim: %v", err)
	}
	rec := NewRecord(Record{ID: "new", Pool: "p", Browser: "chromium", Addr: "127.0.0.1:9", Path: "/playwright"}, 0, nil)
	if err := r.Register(ctx, rec, AgentState{}, "old"); err != nil {
		t.Fatal(err)
	}
	if st := state(t, r, "p", "old"); st.Status != "replaced" {
		t.Fatalf("old worker: %s", st.Status)
	}
	// The other worker may take its last session now.
	got := map[string]bool{}
	for i := 0; i < 2; i++ {
		got[claim(t, r, req).Worker.ID] = true
	}
	if !got["a-other"] {
		t.Fatalf("claims went to %v", got)
	}
}

func TestSchemaMismatchIsRefusedNamingBoth(t *testing.T) {
	r, _ := newTestRegistry(t)
	ctx := context.Background()
	register(t, r, "p", "w1", 0)
	r.rdb.HSet(ctx, r.Key("p", keyState), " schema", "7")
	_, _, err := tryClaim(r, ClaimRequest{Group: "p"})
	if !errors.Is(err, ErrSchema) {
		t.Fatalf("claim on schema 7: %v", err)
	}
	for _, want := range []string{"schema 7", "schema 1"} {
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("error %q does not name %q", err, want)
		}
	}
}

func TestAWorkerPastALoweredMaxLifetimeIsToldToDrainOneAtATime(t *testing.T) {
	r, _ := newTestRegistry(t)
	register(t, r, "p", "a", 0)
	register(t, r, "p", "b", 0)
	register(t, r, "p", "c", 0)
	for range 6 {
		claim(t, r, ClaimRequest{Group: "p"}) // no limit: lifetime_first fills one worker
	}
	req := ClaimRequest{Group: "p", Limits: Limits{MaxLifetime: 3, StaggerDrains: true}}
	c, info, err := tryClaim(r, req)
	if err != nil || info.Drained == "" || c.Worker.ID == info.Drained {
		t.Fatalf("claim under a lowered max_lifetime: %v on %s, drained %q", err, c.Worker.ID, info.Drained)
	}
	if st := state(t, r, "p", info.Drained); st.Status != "draining" {
		t.Fatalf("status of %s: %s", info.Drained, st.Status)
	}
	// While it retires, the next claim tells no other to drain.
	if _, info2, _ := tryClaim(r, req); info2.Drained != "" {
		t.Fatalf("a second worker told to drain: %s", info2.Drained)
	}
}

// TestOnlyFairShareWorkersKeepTheirDurations: a worker's session durations
// serve fair share's estimate alone. A worker no fair_share claim chose
// keeps none, whatever it served; one that a fair_share claim chose keeps
// its last window of them, and its estimate is their mean.
func TestOnlyFairShareWorkersKeepTheirDurations(t *testing.T) {
	r, _ := newTestRegistry(t)
	ctx := context.Background()
	register(t, r, "p", "plain", 0)
	serve := func(id string, n int, d time.Duration) {
		t.Helper()
		var ends []Ended
		for range n {
			c := claim(t, r, ClaimRequest{Group: "p", Avoid: others(id)})
			ends = append(ends, Ended{Session: c.Session, Duration: d})
		}
		if _, err := r.EndServed(ctx, "p", id, ends); err != nil {
			t.Fatal(err)
		}
	}
	serve("plain", 5, 3*time.Second)
	if ds := state(t, r, "p", "plain").Durations; len(ds) != 0 {
		t.Errorf("a worker no fair_share claim chose keeps durations %v", ds)
	}

	register(t, r, "p", "fair", 0)
	c := claim(t, r, ClaimRequest{Group: "p", Policy: FairShare, Options: FairShareOptions{Window: 3}, Avoid: []string{"plain"}})
	if c.Worker.ID != "fair" {
		t.Fatalf("the fair_share claim chose %s", c.Worker.ID)
	}
	if _, err := r.EndServed(ctx, "p", "fair", []Ended{{Session: c.Session, Duration: time.Second}}); err != nil {
		t.Fatal(err)
	}
	serve("fair", 4, 4*time.Second)
	st := state(t, r, "p", "fair")
	if want := []time.Duration{4 * time.Second, 4 * time.Second, 4 * time.Second}; !slices.Equal(st.Durations, want) {
		t.Errorf("the fair_share worker keeps durations %v, want its last window %v", st.Durations, want)
	}
	if st.Estimate != 4*time.Second {
		t.Errorf("its estimate is %s, want 4s, the mean of its window", st.Estimate)
	}
}

// others lists the workers a test avoids to send a claim to id.
func others(id string) []string {
	if id == "plain" {
		return []string{"fair"}
	}
	return []string{"plain"}
}

// TestAChangedMaxConcurrentFindsTheFreeSlots: the cap hint a claim leaves
// on a worker cannot hide free capacity for long, nor let full workers
// hide a free one. Workers full under max_concurrent 2 take sessions
// again under 4 once one of their sessions has ended; workers with room
// under 4 but full under a lowered 2 are passed in one claim however many
// they are, to the idle ones behind them; and heartbeats that report full
// workers unchanged do not put them back in the way of a free one.
func TestAChangedMaxConcurrentFindsTheFreeSlots(t *testing.T) {
	ctx := context.Background()
	t.Run("raised", func(t *testing.T) {
		r, _ := newTestRegistry(t)
		var sessions = map[string][]LiveSession{}
		for i := range 10 {
			register(t, r, "p", fmt.Sprintf("w%02d", i), 4)
		}
		for range 20 {
			c := claim(t, r, ClaimRequest{Group: "p", Limits: Limits{MaxConcurrent: 2}})
			sessions[c.Worker.ID] = append(sessions[c.Worker.ID], LiveSession{ID: c.Session})
		}
		for id, ss := range sessions {
			// both live, then one of them ended
			for _, live := range [][]LiveSession{ss, ss[:1]} {
				if _, err := r.Heartbeat(ctx, "p", id, AgentState{Lifetime: len(ss), Sessions: live}); err != nil {
					t.Fatal(err)
				}
			}
		}
		for i := range 30 {
			if _, _, err := tryClaim(r, ClaimRequest{Group: "p", Limits: Limits{MaxConcurrent: 4}}); err != nil {
				t.Fatalf("claim %d under the raised max_concurrent 4: %v", i+1, err)
			}
		}
	})
	t.Run("lowered", func(t *testing.T) {
		r, _ := newTestRegistry(t)
		for i := range 100 {
			register(t, r, "p", fmt.Sprintf("w%03d", i), 4)
		}
		// 70 workers hold 3 sessions each: room under 4, full under 2
		for i := range 70 {
			var ss []LiveSession
			for j := range 3 {
				ss = append(ss, LiveSession{ID: fmt.Sprintf("s%d-%d", i, j)})
			}
			if _, err := r.Heartbeat(ctx, "p", fmt.Sprintf("w%03d", i), AgentState{Lifetime: 3, Sessions: ss}); err != nil {
				t.Fatal(err)
			}
		}
		for i := range 30 {
			c, _, err := tryClaim(r, ClaimRequest{Group: "p", Limits: Limits{MaxConcurrent: 2, MaxLifetime: 1000}, MaxScan: 16})
			if err != nil {
				t.Fatalf("claim %d under the lowered max_concurrent 2: %v", i+1, err)
			}
			if st := state(t, r, "p", c.Worker.ID); st.Active > 2 {
				t.Fatalf("claim %d went to %s, at %d sessions", i+1, c.Worker.ID, st.Active)
			}
		}
	})
	t.Run("reported full", func(t *testing.T) {
		r, _ := newTestRegistry(t)
		var full []string
		for i := range 200 {
			id := fmt.Sprintf("w%03d", i)
			register(t, r, "p", id, 0)
			full = append(full, id)
		}
		for range 400 {
			claim(t, r, ClaimRequest{Group: "p", Limits: Limits{MaxConcurrent: 2, MaxLifetime: 1000}})
		}
		// a fresh worker, last in lifetime_first's order
		register(t, r, "p", "fresh", 0)
		for _, id := range full {
			st := state(t, r, "p", id)
			ss := make([]LiveSession, st.Active)
			for j := range ss {
				ss[j] = LiveSession{ID: fmt.Sprintf("%s-%d", id, j)}
			}
			if _, err := r.Heartbeat(ctx, "p", id, AgentState{Lifetime: st.Lifetime, Sessions: ss}); err != nil {
				t.Fatal(err)
			}
		}
		c, _, err := tryClaim(r, ClaimRequest{Group: "p", Limits: Limits{MaxConcurrent: 2, MaxLifetime: 1000}})
		if err != nil || c.Worker.ID != "fresh" {
			t.Fatalf("after the full workers' heartbeats: %v %v, want the fresh worker at once", c.Worker.ID, err)
		}
	})
}

// TestARecordMovedToAnotherGroupIsNeverClaimed: a Redis writer who copies
// a worker's record into another pool or Playwright version gains
// nothing. The claim refuses the record, and its signature, which covers
// the version, does not verify once the version is rewritten.
func TestARecordMovedToAnotherGroupIsNeverClaimed(t *testing.T) {
	ctx := context.Background()
	r, _ := newTestRegistry(t)
	secret := []byte("s3cret")
	rec := NewRecord(Record{ID: "w1", Pool: "chromium", Version: "1.64", Browser: "chromium", Addr: "127.0.0.1:9", Path: "/", Capacity: 2}, 0, secret)
	if err := r.Register(ctx, rec, AgentState{}, ""); err != nil {
		t.Fatal(err)
	}
	register(t, r, "chromium@1.65", "w1", 2)
	raw, err := r.rdb.HGet(ctx, r.Key("chromium@1.64", "workers"), "w1").Result()
	if err != nil {
		t.Fatal(err)
	}
	if err := r.rdb.HSet(ctx, r.Key("chromium@1.65", "workers"), "w1", raw).Err(); err != nil {
		t.Fatal(err)
	}
	if c, _, err := tryClaim(r, ClaimRequest{Group: "chromium@1.65"}); err == nil {
		t.Fatalf("claimed %s in chromium@1.65 from a record of chromium@1.64", c.Worker.ID)
	}
	moved := rec
	moved.Version = "1.65"
	if err := moved.CheckSignature(secret); err == nil {
		t.Fatal("a record's signature verifies with its version rewritten")
	}
}
