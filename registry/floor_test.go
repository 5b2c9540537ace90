package registry

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
	"github.com/browsergrid/caddy-browser-grid/selection"
)

// TestAssertLifetimesAfterAnEmptyRestart: sessions that ended between a
// worker's last heartbeat and an empty Redis restart are in no lease, and
// its agent re-asserts only the lifetime of that heartbeat. A claimer's
// floor brings them back, whether it comes before the agent registers
// again (kept in lapsed) or after (the record raised), and a worker so
// brought to max_lifetime is told to shut down instead of serving it
// again.
func TestAssertLifetimesAfterAnEmptyRestart(t *testing.T) {
	ctx := context.Background()
	r, rdb := startRegistry(t, Options{})
	req := ClaimRequest{Pool: "p", Policy: LifetimeFirst, Limits: capLimits, LeaseTTL: time.Minute}
	// serve n sessions on w and return the lifetime of the last claim
	serve := func(n int) int {
		t.Helper()
		life := 0
		for range n {
			c, err := r.Claim(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			if err := r.Release(ctx, "p", c.LeaseID); err != nil {
				t.Fatal(err)
			}
			life = c.Worker.Lifetime
		}
		return life
	}
	lifetime := func() int {
		t.Helper()
		_, l, _ := figures(t, r, "w")
		return l
	}
	restart := func() {
		t.Helper()
		if err := rdb.FlushAll(ctx).Err(); err != nil {
			t.Fatal(err)
		}
	}
	// what the agent heard at its last heartbeat: 6
	for _, floorFirst := range []bool{true, false} {
		restart()
		mustRegister(t, r, capReg("w", "gen-1", 2))
		serve(6)
		hb, err := r.Heartbeat(ctx, "p", "w", time.Minute)
		if err != nil || hb.Lifetime != 6 {
			t.Fatalf("heartbeat: %+v, %v", hb, err)
		}
		floor := serve(3) // ended before the restart: in no lease
		if floor != 9 {
			t.Fatalf("claimed at lifetime %d, want 9", floor)
		}
		restart()
		back := capReg("w", "gen-1", 2)
		back.Lifetime = hb.Lifetime
		floors := []LifetimeFloor{{Worker: "w", Gen: "gen-1", Lifetime: floor}}
		var res AssertResult
		if floorFirst {
			if res, err = r.AssertLifetimes(ctx, "p", floors); err != nil {
				t.Fatal(err)
			}
			if res != (AssertResult{Kept: 1}) {
				t.Errorf("floor before the registration: %+v, want it kept", res)
			}
			mustRegister(t, r, back)
		} else {
			mustRegister(t, r, back)
			if got := lifetime(); got != 6 {
				t.Fatalf("registered again at lifetime %d, want the agent's 6", got)
			}
			if res, err = r.AssertLifetimes(ctx, "p", floors); err != nil {
				t.Fatal(err)
			}
			if res != (AssertResult{Raised: 1}) {
				t.Errorf("floor after the registration: %+v, want the record raised", res)
			}
		}
		if got := lifetime(); got != 9 {
			t.Errorf("floor first %v: lifetime %d after the restart, want 9", floorFirst, got)
		}
		// one session left before max_lifetime 10, not four
		c, err := r.Claim(ctx, req)
		if err != nil || !c.Drain {
			t.Fatalf("floor first %v: claim %+v, %v; want the worker's last session", floorFirst, c, err)
		}
		if _, _, cmd := figures(t, r, "w"); cmd != CommandShutdown {
			t.Errorf("floor first %v: command %q after its last session, want shutdown", floorFirst, cmd)
		}
		// again: nothing more to raise
		if res, err = r.AssertLifetimes(ctx, "p", floors); err != nil || res != (AssertResult{}) {
			t.Errorf("floor first %v: repeated: %+v, %v; want nothing changed", floorFirst, res, err)
		}
	}

	// A floor that reaches the limit tells the worker to shut down.
	restart()
	if _, _, err := r.StoreLimits(ctx, req); err != nil {
		t.Fatal(err)
	}
	mustRegister(t, r, capReg("w", "gen-1", 2))
	if res, err := r.AssertLifetimes(ctx, "p", []LifetimeFloor{{Worker: "w", Gen: "gen-1", Lifetime: 10}}); err != nil || res.Raised != 1 {
		t.Fatalf("floor at the limit: %+v, %v", res, err)
	}
	if _, l, cmd := figures(t, r, "w"); l != 10 || cmd != CommandShutdown {
		t.Errorf("floor at the limit: lifetime %d, command %q; want 10 and shutdown", l, cmd)
	}
	if c, err := r.Claim(ctx, req); err == nil {
		t.Errorf("a spent worker was claimed: %+v", c)
	}

	// Another generation's floor changes nothing: neither the record of a
	// new browser process nor a lapsed entry kept for another one.
	restart()
	mustRegister(t, r, capReg("w", "gen-2", 2))
	if res, err := r.AssertLifetimes(ctx, "p", []LifetimeFloor{{Worker: "w", Gen: "gen-1", Lifetime: 8}}); err != nil || res != (AssertResult{}) {
		t.Errorf("an older generation's floor: %+v, %v; want nothing changed", res, err)
	}
	if got := lifetime(); got != 0 {
		t.Errorf("a new browser process's lifetime %d after an older one's floor, want 0", got)
	}
	restart()
	if _, err := r.AssertLifetimes(ctx, "p", []LifetimeFloor{{Worker: "w", Gen: "gen-2", Lifetime: 3}}); err != nil {
		t.Fatal(err)
	}
	if res, err := r.AssertLifetimes(ctx, "p", []LifetimeFloor{{Worker: "w", Gen: "gen-1", Lifetime: 8}}); err != nil || res != (AssertResult{}) {
		t.Errorf("a floor beside another generation's kept one: %+v, %v; want nothing changed", res, err)
	}
	mustRegister(t, r, capReg("w", "gen-2", 2))
	if got := lifetime(); got != 3 {
		t.Errorf("gen-2 came back at lifetime %d, want its floor 3", got)
	}

	// Floors a Redis writer could have planted in a record (IDs with
	// spaces, negative counts) are skipped; the good ones still count.
	restart()
	res, err := r.AssertLifetimes(ctx, "p", []LifetimeFloor{
		{Worker: "w x", Gen: "gen-1", Lifetime: 4},
		{Worker: "w", Gen: "", Lifetime: 4},
		{Worker: "w", Gen: "gen-1", Lifetime: -1},
		{Worker: "w", Gen: "gen-1", Lifetime: 4},
	})
	if err != nil || res != (AssertResult{Kept: 1}) {
		t.Errorf("floors with bad fields: %+v, %v; want the good one kept", res, err)
	}
}

// A session that ends while its worker has no record (lapsed, or lost by
// Redis before its agent registered again) leaves its lease's lifetime for
// the comeback: once the lease is gone nothing else carries it. An undone
// claim leaves nothing (its lifetime was given back).
func TestReleaseWithoutARecordKeepsItsLifetime(t *testing.T) {
	ctx := context.Background()
	r, _ := startRegistry(t, Options{})
	mustRegister(t, r, capReg("w", "gen-1", 4))
	var cs []*Claim
	for range 3 {
		c, err := claimP(t, r, "")
		if err != nil {
			t.Fatal(err)
		}
		cs = append(cs, c)
	}
	// the record goes as Redis losing it would (a deregistration keeps
	// nothing in lapsed)
	if err := r.Deregister(ctx, "p", "w"); err != nil {
		t.Fatal(err)
	}
	if err := r.Undo(ctx, "p", cs[2].LeaseID, 0); err != nil {
		t.Fatal(err)
	}
	for _, c := range cs[:2] {
		if err := r.Release(ctx, "p", c.LeaseID); err != nil {
			t.Fatal(err)
		}
	}
	mustRegister(t, r, capReg("w", "gen-1", 4)) // the agent, asserting 0
	if _, l, _ := figures(t, r, "w"); l != 2 {
		t.Errorf("lifetime %d after the comeback, want the 2 sessions released while it had no record", l)
	}
}

// An agent registering again after its record was lost is held (Hold):
// a claimer's floor that arrives meanwhile raises a lifetime no new
// session has counted on yet, so it is the whole count. Without the hold a
// claim landed first and the raise, taking the higher of the two, swallowed
// it: the browser served that session again past max_lifetime.
func TestARegistrationAfterALossIsHeld(t *testing.T) {
	ctx := context.Background()
	r, rdb := startRegistry(t, Options{})
	req := ClaimRequest{Pool: "p", Policy: LifetimeFirst, Limits: capLimits, LeaseTTL: time.Minute}
	mustRegister(t, r, capReg("w", "gen-1", 2))
	if _, err := r.Claim(ctx, req); err != nil {
		t.Fatalf("a first registration is not held: %v", err)
	}
	if err := rdb.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	const hold = 2 * time.Second
	back := capReg("w", "gen-1", 2)
	back.Hold = hold
	held := time.Now()
	mustRegister(t, r, back)
	if c, err := r.Claim(ctx, req); err == nil {
		t.Fatalf("claimed %s while held", c.Worker.ID)
	} else if !errors.Is(err, ErrNoWorker) {
		t.Fatal(err)
	}
	if _, err := r.AssertLifetimes(ctx, "p", []LifetimeFloor{{Worker: "w", Gen: "gen-1", Lifetime: 4}}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Until(held.Add(hold + 50*time.Millisecond)))
	c, err := r.Claim(ctx, req)
	if err != nil {
		t.Fatalf("after the hold: %v", err)
	}
	if c.Worker.Lifetime != 5 {
		t.Errorf("first session after the hold counted at lifetime %d, want 5 (the floor's 4, then it)", c.Worker.Lifetime)
	}
	// A record that merely lapsed (the pool's data kept, its epoch older
	// than the hold, or made by a version that kept no time) kept its
	// count in lapsed: it comes back at once.
	for _, at := range []string{"1", ""} {
		if at == "" {
			err = rdb.HDel(ctx, r.Key("p", "config"), "epoch_at").Err()
		} else {
			err = rdb.HSet(ctx, r.Key("p", "config"), "epoch_at", at).Err()
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Release(ctx, "p", c.LeaseID); err != nil {
			t.Fatal(err)
		}
		if _, err := r.Expire(ctx, "p", "w", 0); err != nil {
			t.Fatal(err)
		}
		mustRegister(t, r, back)
		if c, err = r.Claim(ctx, req); err != nil {
			t.Fatalf("epoch_at %q: a lapsed record held: %v", at, err)
		}
	}
	back.Hold = -time.Second
	if err := r.Register(ctx, back); err == nil || !strings.Contains(err.Error(), "Hold -1s is negative") {
		t.Errorf("a negative hold: %v", err)
	}
}

// An epoch ahead of Redis' clock (written before a failover to a replica
// whose clock is behind) does not make every registration of the skew
// look just after a loss: it is not held.
func TestAnEpochAheadOfTheClockHoldsNothing(t *testing.T) {
	ctx := context.Background()
	r, rdb := startRegistry(t, Options{})
	req := ClaimRequest{Pool: "p", Policy: LifetimeFirst, Limits: capLimits, LeaseTTL: time.Minute}
	mustRegister(t, r, capReg("w", "gen-1", 2))
	if _, err := r.Claim(ctx, req); err != nil { // makes the epoch
		t.Fatal(err)
	}
	ahead := time.Now().Add(time.Hour).UnixMilli()
	if err := rdb.HSet(ctx, r.Key("p", "config"), "epoch_at", ahead).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Expire(ctx, "p", "w", 0); err != nil {
		t.Fatal(err)
	}
	back := capReg("w", "gen-1", 2)
	back.Hold = ReassertHold
	mustRegister(t, r, back)
	if _, err := r.Claim(ctx, req); err != nil {
		t.Errorf("a registration with the epoch an hour ahead was held: %v", err)
	}
}

// MarkEpoch gives a pool with no epoch one, with its time (a registration
// just after is held), and leaves an existing one as it is.
func TestMarkEpoch(t *testing.T) {
	ctx := context.Background()
	r, rdb := startRegistry(t, Options{})
	e1, err := r.MarkEpoch(ctx, "p")
	if err != nil || e1 == "" {
		t.Fatalf("MarkEpoch on a pool with none: %q, %v", e1, err)
	}
	if at, _ := rdb.HGet(ctx, r.Key("p", "config"), "epoch_at").Result(); at == "" {
		t.Errorf("no epoch_at beside the marked epoch")
	}
	if e2, err := r.MarkEpoch(ctx, "p"); err != nil || e2 != e1 {
		t.Errorf("MarkEpoch again: %q, %v; want the same %q", e2, err, e1)
	}
	if got, err := r.Epochs(ctx, []string{"p", "p@1.65", "q"}); err != nil || got["p"] != e1 || got["p@1.65"] != e1 || got["q"] != "" {
		t.Errorf("Epochs: %v, %v; want %q for p and its group, none for q", got, err, e1)
	}
	// an empty epoch (a hand edit) is none: a watch taking "" as the
	// epoch would see a loss every second
	if err := rdb.HSet(ctx, r.Key("p", "config"), "epoch", "").Err(); err != nil {
		t.Fatal(err)
	}
	if e3, err := r.MarkEpoch(ctx, "p"); err != nil || e3 == "" || e3 == e1 {
		t.Errorf("MarkEpoch over an empty epoch: %q, %v; want a fresh one", e3, err)
	}
}

// Epochs fails when Redis refuses the connection's setup: go-redis then
// leaves each answer empty with no error of its own, and an epoch watch
// reading "" would take every pool for lost (a warning and a MarkEpoch per
// pool every second, while the password is wrong).
func TestEpochsFailWhenTheConnectionIsRefused(t *testing.T) {
	srv := testenv.StartRedis(t, "--requirepass", "s3cret")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ok, _ := registryAt(t, "redis://:s3cret@"+srv.Addr+"/0", Options{})
	if _, err := ok.MarkEpoch(ctx, "p"); err != nil {
		t.Fatal(err)
	}
	for _, url := range []string{"redis://:wrong@" + srv.Addr + "/0", "redis://" + srv.Addr + "/0"} {
		bad, _ := registryAt(t, url, Options{})
		if got, err := bad.Epochs(ctx, []string{"p", "q"}); err == nil {
			t.Errorf("Epochs through %s: %q and no error; want the refusal", strings.Replace(url, srv.Addr, "ADDR", 1), got)
		}
	}
}

// Redis comes back from a snapshot older than the last claims (a restart
// that loaded its RDB file): the pool's epoch is the one every claimer
// saw, and the lifetimes counted since the snapshot are gone. A claim on
// the restarted server is told to re-assert (an EpochError with a new
// epoch) before it is granted anything, as after an empty restart; once
// it holds the new epoch it claims as before. A restart of the same data
// would cost the same one re-assertion, which is harmless.
func TestAClaimNoticesDataRestoredFromAnOlderSnapshot(t *testing.T) {
	srv := testenv.StartRedis(t)
	r, rdb, req := oneWorkerPool(t, srv.URL())
	ctx := context.Background()
	claim := func() *Claim { return claimReleased(t, r, req) }
	claim()
	if err := rdb.Save(ctx).Err(); err != nil { // the snapshot: lifetime 1
		t.Fatal(err)
	}
	if c := claim(); c.Worker.Lifetime != 2 {
		t.Fatalf("after the snapshot: lifetime %d, want 2", c.Worker.Lifetime)
	}
	seen := req.Epoch
	srv.Restart() // loads the snapshot: lifetime 1, the same epoch
	var ee *EpochError
	testenv.Eventually(t, 5*time.Second, "a claim on the restarted server", func() bool {
		_, err := r.Claim(ctx, *req)
		if errors.As(err, &ee) {
			return true
		}
		if err == nil {
			t.Fatalf("a claim on data restored from the snapshot was granted: its claimer was not told to re-assert")
		}
		return false // still reconnecting
	})
	if ee.Now == "" || ee.Now == seen {
		t.Fatalf("EpochError epoch %q; want a new one (saw %q)", ee.Now, seen)
	}
	req.Epoch = ee.Now
	// The pool's claims are held for RestoreHold from then on, whoever
	// claims and whatever epoch they saw: another instance that served
	// the worker since the snapshot re-asserts it meanwhile.
	for _, q := range []ClaimRequest{*req, {Pool: "p", Policy: LifetimeFirst, Limits: req.Limits}} {
		_, err := r.Claim(ctx, q)
		var nw *NoWorkerError
		if !errors.As(err, &nw) || nw.Held <= 0 || nw.Held > RestoreHold {
			t.Fatalf("a claim just after the restore (epoch seen %q): %v; want no worker, held up to %s", q.Epoch, err, RestoreHold)
		}
	}
	if _, _, err := r.Pick(ctx, *req); !errors.Is(err, ErrNoWorker) {
		t.Fatalf("a Pick just after the restore: %v; want no worker", err)
	}
	if w, err := r.Worker(ctx, "p", "w1"); err != nil || w.Lifetime != 1 || w.Active != 0 {
		t.Fatalf("after the held claims: %+v, %v; want lifetime 1 and active 0", w, err)
	}
	req.Now = time.Now().Add(RestoreHold)
	if c := claim(); c.Epoch != ee.Now {
		t.Errorf("the next claim: epoch %q, want %q", c.Epoch, ee.Now)
	}
	// a claim on the same server process notices nothing more
	claim()
}

// A snapshot taken after the pool's epoch was made but before any claim
// (Caddy stored its limits as it started, or an epoch watch marked a loss)
// holds the epoch: it used to hold no server, so a claim after its
// restore took it for the pool's first and saw nothing lost. Whatever
// makes the epoch now notes the server too.
func TestARestoreOfASnapshotTakenBeforeTheFirstClaimIsNoticed(t *testing.T) {
	for _, made := range []string{"StoreLimits", "MarkEpoch"} {
		t.Run(made, func(t *testing.T) {
			srv := testenv.StartRedis(t)
			r, rdb, req := oneWorkerPool(t, srv.URL())
			ctx := context.Background()
			var err error
			if made == "StoreLimits" {
				_, _, err = r.StoreLimits(ctx, *req)
			} else {
				_, err = r.MarkEpoch(ctx, "p")
			}
			if err != nil {
				t.Fatal(err)
			}
			if err := rdb.Save(ctx).Err(); err != nil { // the snapshot: an epoch, lifetime 0
				t.Fatal(err)
			}
			for range 3 {
				claimReleased(t, r, req)
			}
			srv.Restart()
			testenv.Eventually(t, 5*time.Second, "a claim on the restarted server", func() bool {
				_, err = r.Claim(ctx, *req)
				var ee *EpochError
				return err == nil || errors.Is(err, ErrNoWorker) || errors.As(err, &ee)
			})
			var ee *EpochError
			if !errors.As(err, &ee) {
				t.Fatalf("a claim on data restored from the snapshot: %v; want an EpochError (re-assert first)", err)
			}
		})
	}
}

// oneWorkerPool is a registry at url with worker w1 (capacity 5) in pool
// p, and a lifetime_first request for it (max_lifetime 10).
func oneWorkerPool(t *testing.T, url string) (*Registry, redis.UniversalClient, *ClaimRequest) {
	t.Helper()
	r, rdb := registryAt(t, url, Options{})
	if err := r.Register(context.Background(), Registration{Pool: "p", ID: "w1", Addr: "h:1", Capacity: 5, TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	req := &ClaimRequest{Pool: "p", Policy: LifetimeFirst, Limits: selection.Limits{MaxConcurrent: 5, MaxLifetime: 10, StaleAfter: time.Minute}}
	return r, rdb, req
}

// claimReleased claims with req and releases the claim at once; req then
// carries the claim's epoch as seen.
func claimReleased(t *testing.T, r *Registry, req *ClaimRequest) *Claim {
	t.Helper()
	ctx := context.Background()
	c, err := r.Claim(ctx, *req)
	if err != nil {
		t.Fatalf("claim: %v", err)
	}
	if err := r.Release(ctx, req.Pool, c.LeaseID); err != nil {
		t.Fatal(err)
	}
	req.Epoch = c.Epoch
	return c
}

// Two versions of the library side by side (a rolling upgrade: the
// library's name carries a hash of its source) each note what they know
// of the server in their own state. Data that comes back older is told by
// the server's run_id, which changes only with the process (and every
// library is loaded anew with it), not by a value that changes while both
// run: a check of the replication id, which a master's first replica
// changes, gave the pool a new epoch on every claim of the other version
// (a red team: 1 session served and 870 rotations in 5 s). Here claims of
// the two versions alternate across a replica's attach, and the epoch
// stays the one they saw.
func TestTwoLibraryVersionsAgreeOnTheServerAcrossAReplicaAttach(t *testing.T) {
	srv := testenv.StartRedis(t)
	r, _, req := oneWorkerPool(t, srv.URL())
	v2 := slices.Clone(registryScripts)
	for i := range v2 {
		if v2[i].name == "claim" {
			v2[i].body += "\n-- the next version\n"
		}
	}
	one, two := scriptClaim, newLibrary(v2).function("claim")
	t.Cleanup(func() { scriptClaim = one })
	if one.lib.name == two.lib.name {
		t.Fatal("the two versions' libraries have one name: the test proves nothing")
	}
	claimReleased(t, r, req) // version one notes the server
	seen := req.Epoch
	startReplica(t, r)
	testenv.Eventually(t, 20*time.Second, "the replica attached", func() bool {
		info, _ := r.rdb.Info(context.Background(), "replication").Result()
		return strings.Contains(info, "connected_slaves:1")
	})
	// version two's first claim comes after the attach
	for i := range 6 { // 7 sessions in all, of max_lifetime 10
		scriptClaim = []function{two, one}[i%2]
		if c := claimReleased(t, r, req); c.Epoch != seen {
			t.Fatalf("claim %d, version %d: the pool's epoch went from %q to %q with no data lost", i+1, 2-i%2, seen, c.Epoch)
		}
	}
}
