package registry

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
	"github.com/browsergrid/caddy-browser-grid/selection"
	"github.com/redis/go-redis/v9"
)

// Counts survive a vanished record, a claim is keyed by its lease ID, and a
// cancelled claim leaves nothing (issue 9, items 2 and 3).

func capReg(id, gen string, capacity int) Registration {
	return Registration{Pool: "p", ID: id, BrowserType: "chromium", Addr: "127.0.0.1:1", Path: "/",
		Capacity: capacity, TTL: time.Minute, Generation: gen}
}

func mustRegister(t *testing.T, r *Registry, reg Registration) {
	t.Helper()
	if err := r.Register(context.Background(), reg); err != nil {
		t.Fatalf("registering %s (gen %q): %v", reg.ID, reg.Generation, err)
	}
}

// figures reads one worker's active, lifetime and command.
func figures(t *testing.T, r *Registry, id string) (active, lifetime int, cmd Command) {
	t.Helper()
	w, err := r.Worker(context.Background(), "p", id)
	if err != nil {
		t.Fatalf("reading %s: %v", id, err)
	}
	return w.Active, w.Lifetime, w.Command
}

// expireStale removes the worker's record as stale expiry (a claim's
// background expiry or the reaper) would once its heartbeat is older
// than the stale threshold.
func expireStale(t *testing.T, r *Registry, id string) {
	t.Helper()
	testenv.Eventually(t, 5*time.Second, "the record of "+id+" expired as stale", func() bool {
		ok, err := r.Expire(context.Background(), "p", id, time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	})
	if _, err := r.Worker(context.Background(), "p", id); !errors.Is(err, ErrNotRegistered) {
		t.Fatalf("record of %s still there after expiry: %v", id, err)
	}
}

var capLimits = selection.Limits{MaxLifetime: 10, StaleAfter: time.Minute}

func claimP(t *testing.T, r *Registry, leaseID string) (*Claim, error) {
	t.Helper()
	return r.Claim(context.Background(), ClaimRequest{Pool: "p", Policy: LifetimeFirst, Limits: capLimits, LeaseTTL: time.Minute, LeaseID: leaseID})
}

// A worker at capacity whose record expired (its agent paused past the
// stale threshold) registers again with the same generation: its two live
// sessions still count, so a third claim finds nothing.
func TestPausedWorkerKeepsItsSessionsAndLifetime(t *testing.T) {
	ctx := context.Background()
	r, _ := startRegistry(t, Options{})
	mustRegister(t, r, capReg("w", "gen-1", 2))
	for range 2 {
		if _, err := claimP(t, r, ""); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.Drain(ctx, "p", "w"); err != nil {
		t.Fatal(err)
	}
	expireStale(t, r, "w")
	// The reaper's pass meanwhile keeps the stale worker's live command
	// and its leases.
	if _, err := r.Reconcile(ctx, "p"); err != nil {
		t.Fatal(err)
	}

	mustRegister(t, r, capReg("w", "gen-1", 2))
	if a, l, cmd := figures(t, r, "w"); a != 2 || l != 2 || cmd != CommandShutdown {
		t.Fatalf("after the same generation registered again: active %d lifetime %d command %q; want 2, 2, shutdown", a, l, cmd)
	}
	if c, err := claimP(t, r, ""); !errors.Is(err, ErrNoWorker) {
		t.Fatalf("third claim on capacity 2: %+v %v; want ErrNoWorker", c, err)
	}

	// A new generation (a new browser process) starts from zero: the old
	// leases no longer count.
	mustRegister(t, r, capReg("w", "gen-2", 2))
	if a, l, cmd := figures(t, r, "w"); a != 0 || l != 0 || cmd != "" {
		t.Fatalf("after a new generation: active %d lifetime %d command %q; want 0, 0, none", a, l, cmd)
	}
	if _, err := claimP(t, r, ""); err != nil {
		t.Fatalf("claim on the new generation: %v", err)
	}
}

// The agent re-asserts the lifetime it last saw; at the pool's stored
// max_lifetime the worker is told to shut down.
func TestRegistrationReassertsLifetime(t *testing.T) {
	r, _ := startRegistry(t, Options{})
	mustRegister(t, r, capReg("w", "gen-1", 0))
	if _, err := claimP(t, r, ""); err != nil { // stores max_lifetime 10
		t.Fatal(err)
	}
	expireStale(t, r, "w")
	reg := capReg("w", "gen-1", 0)
	reg.Lifetime = 7
	mustRegister(t, r, reg)
	if a, l, cmd := figures(t, r, "w"); a != 1 || l != 7 || cmd != "" {
		t.Fatalf("re-asserted lifetime 7 with one live lease: active %d lifetime %d command %q", a, l, cmd)
	}
	// The same generation again, asserting less: the stored figure stays.
	reg.Lifetime = 3
	mustRegister(t, r, reg)
	if _, l, _ := figures(t, r, "w"); l != 7 {
		t.Fatalf("lifetime %d after asserting 3 over a stored 7", l)
	}
	reg.Lifetime = 10
	mustRegister(t, r, reg)
	if _, l, cmd := figures(t, r, "w"); l != 10 || cmd != CommandShutdown {
		t.Fatalf("re-asserted lifetime 10 = max_lifetime: lifetime %d command %q; want the shutdown command", l, cmd)
	}
	hb, err := r.Heartbeat(context.Background(), "p", "w", time.Minute)
	if err != nil || hb != (HeartbeatReply{Command: CommandShutdown, Lifetime: 10, Active: 1}) {
		t.Fatalf("heartbeat: %+v %v", hb, err)
	}
}

// An agent frozen past its record's TTL while its browser kept serving:
// the sessions claimed meanwhile, ended before it came back, are in no
// heartbeat reply it saw and in no lease. It registers again asserting
// the lifetime of its last heartbeat (0 here), and the worker must still
// count what it served: spent, it is told to shut down and not picked.
func TestFrozenAgentComesBackWithTheLifetimeItServed(t *testing.T) {
	ctx := context.Background()
	r, rdb := startRegistry(t, Options{})
	serve := func(n int) {
		t.Helper()
		for range n {
			c, err := claimP(t, r, "")
			if err != nil {
				t.Fatal(err)
			}
			if err := r.Release(ctx, "p", c.LeaseID); err != nil {
				t.Fatal(err)
			}
		}
	}
	mustRegister(t, r, capReg("w", "gen-1", 2))
	serve(6)
	expireStale(t, r, "w")
	// the reaper's pass meanwhile keeps what the comeback needs
	if _, err := r.Reconcile(ctx, "p"); err != nil {
		t.Fatal(err)
	}
	mustRegister(t, r, capReg("w", "gen-1", 2))
	if a, l, cmd := figures(t, r, "w"); a != 0 || l != 6 || cmd != "" {
		t.Fatalf("back after serving 6 sessions unseen: active %d lifetime %d command %q; want 0, 6, none", a, l, cmd)
	}
	serve(4) // max_lifetime 10: the last one sets the shutdown command
	expireStale(t, r, "w")
	// Later expiries of the gone record (a claim's background expiry,
	// another instance, the reaper) keep what the first one kept, and
	// report nothing removed.
	if got, err := r.ExpireStale(ctx, "p", []string{"w"}, time.Millisecond); err != nil || len(got) != 0 {
		t.Fatalf("a second stale expiry: removed %q, %v; want nothing", got, err)
	}
	if ok, err := r.Expire(ctx, "p", "w", time.Millisecond); err != nil || ok {
		t.Fatalf("a third, by Expire: removed %v, %v; want nothing", ok, err)
	}
	mustRegister(t, r, capReg("w", "gen-1", 2))
	if _, l, cmd := figures(t, r, "w"); l != 10 || cmd != CommandShutdown {
		t.Fatalf("back after serving its max_lifetime unseen: lifetime %d command %q; want 10, shutdown", l, cmd)
	}
	if c, err := claimP(t, r, ""); !errors.Is(err, ErrNoWorker) {
		t.Fatalf("claim on a worker back at max_lifetime: %+v %v; want ErrNoWorker", c, err)
	}

	// What was kept goes with the comeback, and a new browser process
	// starts from zero.
	expireStale(t, r, "w")
	mustRegister(t, r, capReg("w", "gen-2", 2))
	if _, l, _ := figures(t, r, "w"); l != 0 {
		t.Fatalf("a new generation after a lapse: lifetime %d, want 0", l)
	}
	if n := rdb.HLen(ctx, r.Key("p", keyLapsed)).Val(); n != 0 {
		t.Fatalf("%d lapsed entries after the comeback, want 0", n)
	}
	// A deregistration keeps nothing: the agent said the browser is gone.
	serve(3)
	if err := r.Deregister(ctx, "p", "w"); err != nil {
		t.Fatal(err)
	}
	mustRegister(t, r, capReg("w", "gen-2", 2))
	if _, l, _ := figures(t, r, "w"); l != 0 {
		t.Fatalf("registered after a deregistration: lifetime %d, want 0", l)
	}
	// One that never comes back is forgotten by the reaper once its time
	// is past (a day; written here as due), and one that does not parse
	// at once.
	rdb.HSet(ctx, r.Key("p", keyLapsed), "gone", "gen-9 4 1", "kept", "gen-9 4 99999999999999",
		"bad", "gen-9 -4 99999999999999")
	if _, err := r.Reconcile(ctx, "p"); err != nil {
		t.Fatal(err)
	}
	if got := rdb.HKeys(ctx, r.Key("p", keyLapsed)).Val(); !slices.Equal(got, []string{"kept"}) {
		t.Fatalf("lapsed entries after the reaper's pass: %q, want only the good one not yet due", got)
	}
}

// An empty Redis restart (FLUSHALL here) with live sessions: the agent
// registers again and the holders' renewals re-assert the leases, in
// either order; the counts come back whole.
func TestEmptyRedisHealsByRenewals(t *testing.T) {
	for _, order := range []string{"register first", "renew first"} {
		t.Run(order, func(t *testing.T) {
			ctx := context.Background()
			r, rdb := startRegistry(t, Options{})
			mustRegister(t, r, capReg("w", "gen-1", 2))
			var held []LeaseRenewal
			for range 2 {
				c, err := claimP(t, r, "")
				if err != nil {
					t.Fatal(err)
				}
				held = append(held, renewal(c))
			}
			if err := rdb.FlushAll(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			renew := func() {
				res, err := r.RenewLeases(ctx, "p", held, time.Minute)
				if err != nil || len(res.Recreated) != 2 || len(res.Ended) != 0 {
					t.Fatalf("renewal after the flush: %+v %v; want both re-created", res, err)
				}
			}
			if order == "renew first" {
				renew()
				mustRegister(t, r, capReg("w", "gen-1", 2))
			} else {
				mustRegister(t, r, capReg("w", "gen-1", 2))
				if a, l, _ := figures(t, r, "w"); a != 0 || l != 0 {
					t.Fatalf("registered on an empty Redis: active %d lifetime %d", a, l)
				}
				renew()
			}
			if a, l, _ := figures(t, r, "w"); a != 2 || l != 2 {
				t.Fatalf("after the renewal: active %d lifetime %d; want 2 and 2", a, l)
			}
			if _, err := claimP(t, r, ""); !errors.Is(err, ErrNoWorker) {
				t.Fatalf("claim on a worker whose 2 sessions were re-asserted: %v; want ErrNoWorker", err)
			}
			// Renewing again finds them live: nothing re-created twice.
			res, err := r.RenewLeases(ctx, "p", held, time.Minute)
			if err != nil || len(res.Recreated)+len(res.Ended) != 0 {
				t.Fatalf("second renewal: %+v %v", res, err)
			}
			for _, l := range held {
				if err := r.Release(ctx, "p", l.ID); err != nil {
					t.Fatal(err)
				}
			}
			if a, l, _ := figures(t, r, "w"); a != 0 || l != 2 {
				t.Fatalf("after releasing both: active %d lifetime %d; want 0 and 2", a, l)
			}
		})
	}
}

// A renewal that races a release (built before the release, run after it)
// must not bring the lease back: the release tombstoned it.
func TestRenewalAfterReleaseDoesNotResurrect(t *testing.T) {
	ctx := context.Background()
	r, _ := startRegistry(t, Options{})
	mustRegister(t, r, capReg("w", "gen-1", 2))
	c, err := claimP(t, r, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Release(ctx, "p", c.LeaseID); err != nil {
		t.Fatal(err)
	}
	res, err := r.RenewLeases(ctx, "p", []LeaseRenewal{renewal(c)}, time.Minute)
	if err != nil || !slices.Equal(res.Ended, []string{c.LeaseID}) || len(res.Recreated) != 0 {
		t.Fatalf("renewal after the release: %+v %v; want it ended", res, err)
	}
	if a, _, _ := figures(t, r, "w"); a != 0 {
		t.Fatalf("active %d after the release, want 0", a)
	}
}

// The same lease ID claims once: a second run returns the same claim.
func TestClaimIsKeyedByItsLeaseID(t *testing.T) {
	r, _ := startRegistry(t, Options{})
	mustRegister(t, r, capReg("a", "ga", 0))
	mustRegister(t, r, capReg("b", "gb", 0))
	first, err := claimP(t, r, "lease-1")
	if err != nil {
		t.Fatal(err)
	}
	again, err := claimP(t, r, "lease-1")
	if err != nil {
		t.Fatal(err)
	}
	if again.LeaseID != "lease-1" || again.Worker.ID != first.Worker.ID || again.Gen != first.Gen ||
		again.Worker.Active != 1 || again.Worker.Lifetime != 1 {
		t.Fatalf("second run: %+v (gen %s); first: %+v", again.Worker, again.Gen, first.Worker)
	}
	c := counts(t, r, "p")
	if c["a"][0]+c["b"][0] != 1 || c["a"][1]+c["b"][1] != 1 {
		t.Fatalf("counts after one lease ID claimed twice: %v; want one session", c)
	}
	if _, err := r.Claim(context.Background(), ClaimRequest{Pool: "p", Policy: LifetimeFirst, LeaseID: "has space"}); err == nil ||
		!strings.Contains(err.Error(), "lease id") {
		t.Fatalf("a lease ID with a space: %v; want it refused", err)
	}
}

// Cancel before the claim runs: the late claim claims nothing. Cancel
// after: the claim is given back, active and lifetime.
func TestCancelLeavesNothing(t *testing.T) {
	ctx := context.Background()
	r, _ := startRegistry(t, Options{})
	mustRegister(t, r, capReg("w", "gen-1", 2))

	if err := r.Cancel(ctx, "p", "late"); err != nil {
		t.Fatal(err)
	}
	if c, err := claimP(t, r, "late"); !errors.Is(err, ErrClaimCancelled) {
		t.Fatalf("claim after its cancel: %+v %v; want ErrClaimCancelled", c, err)
	}
	if a, l, _ := figures(t, r, "w"); a != 0 || l != 0 {
		t.Fatalf("a cancelled claim counted: active %d lifetime %d", a, l)
	}

	c, err := claimP(t, r, "lost-reply")
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Cancel(ctx, "p", "lost-reply"); err != nil {
		t.Fatal(err)
	}
	if err := r.Cancel(ctx, "p", "lost-reply"); err != nil { // a retry is harmless
		t.Fatal(err)
	}
	if a, l, _ := figures(t, r, "w"); a != 0 || l != 0 {
		t.Fatalf("after cancelling a claim that ran: active %d lifetime %d; want 0 and 0", a, l)
	}
	if info, _ := r.Inspect(ctx, "p"); info.Leases != 0 {
		t.Fatalf("%d leases left", info.Leases)
	}
	res, err := r.RenewLeases(ctx, "p", []LeaseRenewal{renewal(c)}, time.Minute)
	if err != nil || !slices.Equal(res.Ended, []string{"lost-reply"}) {
		t.Fatalf("renewing a cancelled lease: %+v %v; want it ended", res, err)
	}
}

// twiceHook runs every claim script twice, as a client retry after a
// connection dropped once the first run was done would.
type twiceHook struct{ runs *atomic.Int32 }

func (twiceHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h twiceHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		name := strings.ToLower(cmd.Name())
		if name == "fcall" && len(cmd.Args()) > 3 && cmd.Args()[1] == scriptClaim.name {
			h.runs.Add(1)
			if err := next(ctx, cmd); err != nil {
				return err
			}
		}
		return next(ctx, cmd)
	}
}
func (twiceHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func TestClaimRunTwiceByARetryCountsOnce(t *testing.T) {
	r, rdb := startRegistry(t, Options{})
	h := twiceHook{runs: new(atomic.Int32)}
	rdb.AddHook(h)
	mustRegister(t, r, capReg("w", "gen-1", 2))
	c, err := claimP(t, r, "")
	if err != nil {
		t.Fatal(err)
	}
	if h.runs.Load() == 0 {
		t.Fatal("the hook never saw the claim script")
	}
	if a, l, _ := figures(t, r, "w"); a != 1 || l != 1 || c.Worker.Active != 1 {
		t.Fatalf("a claim sent twice: active %d lifetime %d (reply %d); want 1 and 1", a, l, c.Worker.Active)
	}
}

// Reconcile makes lease_owner match the leases: an entry missing (a lease
// written by an older version) is added and counts, an entry of no lease is
// dropped.
func TestReconcileRepairsLeaseOwners(t *testing.T) {
	ctx := context.Background()
	r, rdb := startRegistry(t, Options{})
	mustRegister(t, r, capReg("w", "gen-1", 0))
	c, err := claimP(t, r, "")
	if err != nil {
		t.Fatal(err)
	}
	owners := r.Key("p", keyLeaseOwner)
	if err := rdb.Del(ctx, owners).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.ZAdd(ctx, owners, redis.Z{Member: "w gen-1 no-such-lease"}).Err(); err != nil {
		t.Fatal(err)
	}
	res, err := r.Reconcile(ctx, "p")
	// (the missing entry counts as a fix, the stray one as an orphan)
	if err != nil || res.CountersFixed < 1 || res.OrphansRemoved < 1 {
		t.Fatalf("reconcile: %+v %v; want the missing entry added and the stray one removed", res, err)
	}
	got, err := rdb.ZRange(ctx, owners, 0, -1).Result()
	if err != nil || !slices.Equal(got, []string{"w gen-1 " + c.LeaseID}) {
		t.Fatalf("lease_owner after reconcile: %v %v", got, err)
	}
	if a, _, _ := figures(t, r, "w"); a != 1 {
		t.Fatalf("active %d, want 1", a)
	}
}

// A command kept for a stale worker is for the process that left: a new
// process under the same id (no live session, no lifetime) does not get it.
func TestKeptCommandIsNotForANewProcess(t *testing.T) {
	ctx := context.Background()
	r, _ := startRegistry(t, Options{})
	mustRegister(t, r, capReg("w", "old-process", 2))
	if err := r.Drain(ctx, "p", "w"); err != nil {
		t.Fatal(err)
	}
	expireStale(t, r, "w")
	mustRegister(t, r, capReg("w", "new-process", 2))
	if _, _, cmd := figures(t, r, "w"); cmd != "" {
		t.Fatalf("a new process under a stale worker's id got its command %q", cmd)
	}
}
