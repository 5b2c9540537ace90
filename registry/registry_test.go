package registry

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
	"github.com/browsergrid/caddy-browser-grid/selection"
)

func TestRegisterHeartbeatDrainDeregister(t *testing.T) {
	ctx := context.Background()
	r, _ := startRegistry(t, Options{})
	err := r.Register(ctx, Registration{Pool: "chromium", ID: "w1", BrowserType: "chromium",
		Addr: "10.0.0.1:3000", Path: "/playwright", Capacity: 3, TTL: 30 * time.Second, VirtualNodes: 4})
	if err != nil {
		t.Fatal(err)
	}
	w, err := r.Worker(ctx, "chromium", "w1")
	if err != nil {
		t.Fatal(err)
	}
	if w.Addr != "10.0.0.1:3000" || w.Path != "/playwright" || w.Capacity != 3 || w.VirtualNodes != 4 ||
		w.Status != selection.Available || w.Active != 0 || w.Lifetime != 0 || w.BrowserType != "chromium" {
		t.Fatalf("worker as stored: %+v", w)
	}
	if since := time.Since(w.LastHeartbeat); since < -time.Second || since > 5*time.Second {
		t.Fatalf("last heartbeat %s is not about now", w.LastHeartbeat)
	}
	if d := w.ExpiresAt.Sub(w.LastHeartbeat); d != 30*time.Second {
		t.Fatalf("record TTL: expires %s after the heartbeat, want 30s", d)
	}

	hb, err := r.Heartbeat(ctx, "chromium", "w1", 30*time.Second)
	if err != nil || hb != (HeartbeatReply{}) {
		t.Fatalf("first heartbeat: %+v, %v", hb, err)
	}
	if err := r.Drain(ctx, "chromium", "w1"); err != nil {
		t.Fatal(err)
	}
	if hb, err = r.Heartbeat(ctx, "chromium", "w1", 30*time.Second); err != nil || hb.Command != CommandShutdown {
		t.Fatalf("heartbeat after Drain: %+v, %v; want shutdown", hb, err)
	}
	if err := r.SetDraining(ctx, "chromium", "w1"); err != nil {
		t.Fatal(err)
	}
	if w, _ = r.Worker(ctx, "chromium", "w1"); w.Status != selection.Draining {
		t.Fatalf("status after SetDraining: %s", w.Status)
	}
	if _, err := r.Claim(ctx, ClaimRequest{Pool: "chromium", Policy: LifetimeFirst}); !errors.Is(err, ErrNoWorker) {
		t.Fatalf("claim on a draining-only pool: %v, want ErrNoWorker", err)
	}
	if err := r.Deregister(ctx, "chromium", "w1"); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Heartbeat(ctx, "chromium", "w1", 30*time.Second); !errors.Is(err, ErrNotRegistered) {
		t.Fatalf("heartbeat after Deregister: %v, want ErrNotRegistered", err)
	}
	if _, err := r.Worker(ctx, "chromium", "w1"); !errors.Is(err, ErrNotRegistered) {
		t.Fatalf("Worker after Deregister: %v, want ErrNotRegistered", err)
	}
	for _, op := range []func() error{
		func() error { return r.Drain(ctx, "chromium", "w1") },
		func() error { return r.SetDraining(ctx, "chromium", "w1") },
	} {
		if err := op(); !errors.Is(err, ErrNotRegistered) {
			t.Fatalf("command on a gone worker: %v, want ErrNotRegistered", err)
		}
	}
	// Deregister removed every key the registration wrote.
	keys, err := r.rdb.Keys(ctx, "{grid:chromium}:*").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if k != "{grid:chromium}:config" {
			t.Errorf("key %s left behind after Deregister", k)
		}
	}
	pools, err := r.Pools(ctx)
	if err != nil || !slices.Equal(pools, []string{"chromium"}) {
		t.Fatalf("Pools: %v, %v", pools, err)
	}
}

func TestHeartbeatAfterRecordTTL(t *testing.T) {
	ctx := context.Background()
	r, _ := startRegistry(t, Options{})
	if err := r.Register(ctx, Registration{Pool: "p", ID: "w", Addr: "h:1", TTL: 50 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	w, err := r.Worker(ctx, "p", "w")
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, "the record TTL to pass", func() bool {
		return time.Now().After(w.ExpiresAt.Add(10 * time.Millisecond))
	})
	if _, err := r.Heartbeat(ctx, "p", "w", time.Minute); !errors.Is(err, ErrNotRegistered) {
		t.Fatalf("heartbeat after the record TTL: %v, want ErrNotRegistered", err)
	}
}

func TestBadInputIsRefused(t *testing.T) {
	ctx := context.Background()
	r, _ := startRegistry(t, Options{})
	cases := map[string]Registration{
		"bad pool":     {Pool: "chr{om}", ID: "w", Addr: "h:1"},
		"empty id":     {Pool: "p", Addr: "h:1"},
		"space in id":  {Pool: "p", ID: "a b", Addr: "h:1"},
		"no addr":      {Pool: "p", ID: "w"},
		"negative cap": {Pool: "p", ID: "w", Addr: "h:1", Capacity: -1},
		"V too large":  {Pool: "p", ID: "w", Addr: "h:1", VirtualNodes: 65},
	}
	for name, reg := range cases {
		t.Run(name, func(t *testing.T) {
			if err := r.Register(ctx, reg); err == nil {
				t.Fatalf("Register(%+v) accepted", reg)
			}
		})
	}
	if err := r.Register(ctx, Registration{Pool: "a:b", ID: "w", Addr: "h:1"}); !errors.Is(err, ErrBadPool) {
		t.Fatalf("pool with ':' gave %v, want ErrBadPool", err)
	}
	if _, err := r.Claim(ctx, ClaimRequest{Pool: "p", Policy: "random"}); err == nil {
		t.Fatal("unknown policy accepted")
	}
	if _, err := r.Claim(ctx, ClaimRequest{Pool: "p", Policy: LifetimeFirst, Limits: selection.Limits{MaxScan: -1}}); err == nil {
		t.Fatal("negative max_scan accepted")
	}
}

// The seed-000 staircase: with claims and releases one at a time, the most
// used worker below the margin is pushed to the limit first, gets its
// shutdown command from the claim that reaches the limit, and only then the
// next one follows.
func TestLifetimeFirstStaircase(t *testing.T) {
	ctx := context.Background()
	r, _ := startRegistry(t, Options{})
	for _, id := range []string{"a", "b", "c", "d"} {
		register(t, r, "p", id, 0)
	}
	req := ClaimRequest{Pool: "p", Policy: LifetimeFirst, Limits: selection.Limits{MaxConcurrent: 2, MaxLifetime: 20}}
	var order []string
	drains := 0
	for range 20 {
		c, err := r.Claim(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		order = append(order, c.Worker.ID)
		if c.Drain {
			drains++
		}
		if err := r.Release(ctx, "p", c.LeaseID); err != nil {
			t.Fatal(err)
		}
	}
	// margin = 20/4 = 5: 'a' takes claims while lifetime < 15 (15 claims),
	// then 'b' (lifetime 0 is the highest below the margin)... 'a' is in the
	// margin zone and is used only when nothing is below it.
	got := counts(t, r, "p")
	if got["a"] != [2]int{0, 15} || got["b"] != [2]int{0, 5} {
		t.Fatalf("after 20 claims: %v (order %v)", got, order)
	}
	if drains != 0 {
		t.Fatalf("%d drains before any worker reached the limit", drains)
	}
	// Fill b to 15, c to 15, d to 15: then every worker is in the margin zone
	// and the fallback pushes 'a' (highest lifetime) to 20.
	for range 30 {
		c, err := r.Claim(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		_ = r.Release(ctx, "p", c.LeaseID)
	}
	got = counts(t, r, "p")
	if got["b"][1] != 15 || got["c"][1] != 15 || got["d"][1] != 5 {
		t.Fatalf("staircase after 50 claims: %v", got)
	}
	for range 10 {
		c, err := r.Claim(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		_ = r.Release(ctx, "p", c.LeaseID)
	}
	got = counts(t, r, "p")
	if got["d"][1] != 15 {
		t.Fatalf("after 60 claims d should be at 15: %v", got)
	}
	var drained []string
	for range 5 {
		c, err := r.Claim(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if c.Worker.ID != "a" {
			t.Fatalf("fallback chose %s, want a (highest lifetime): %v", c.Worker.ID, counts(t, r, "p"))
		}
		if c.Drain {
			drained = append(drained, c.Worker.ID)
		}
		_ = r.Release(ctx, "p", c.LeaseID)
	}
	if !slices.Equal(drained, []string{"a"}) {
		t.Fatalf("drain flags: %v, want exactly the claim that brought a to 20", drained)
	}
	if hb, err := r.Heartbeat(ctx, "p", "a", time.Minute); err != nil || hb.Command != CommandShutdown || hb.Lifetime != 20 {
		t.Fatalf("a's heartbeat after reaching the limit: %+v %v", hb, err)
	}
	// a is at the limit: it is never chosen again.
	c, err := r.Claim(ctx, req)
	if err != nil || c.Worker.ID == "a" {
		t.Fatalf("claim after a reached the limit: %+v %v", c, err)
	}
}

func TestClaimRespectsConcurrencyAndCapacity(t *testing.T) {
	ctx := context.Background()
	r, _ := startRegistry(t, Options{})
	register(t, r, "p", "small", 1)
	register(t, r, "p", "big", 0)
	req := ClaimRequest{Pool: "p", Policy: LifetimeFirst, Limits: selection.Limits{MaxConcurrent: 2}}
	var leases []string
	for range 3 {
		c, err := r.Claim(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, c.LeaseID)
	}
	_, err := r.Claim(ctx, req)
	var nw *NoWorkerError
	if !errors.As(err, &nw) || !errors.Is(err, ErrNoWorker) {
		t.Fatalf("fourth claim: %v, want NoWorkerError", err)
	}
	if got := counts(t, r, "p"); got["small"][0] != 1 || got["big"][0] != 2 {
		t.Fatalf("active: %v", got)
	}
	if err := r.Release(ctx, "p", leases[0]); err != nil {
		t.Fatal(err)
	}
	if err := r.Release(ctx, "p", leases[0]); err != nil {
		t.Fatalf("second release of the same lease: %v", err)
	}
	if err := r.Release(ctx, "p", "no-such-lease"); err != nil {
		t.Fatalf("release of an unknown lease: %v", err)
	}
	if _, err := r.Claim(ctx, req); err != nil {
		t.Fatalf("claim after a release: %v", err)
	}
	info, _ := r.Inspect(ctx, "p")
	if info.Leases != 3 || info.Limits.MaxConcurrent != 2 {
		t.Fatalf("inspect: %d leases, limits %+v", info.Leases, info.Limits)
	}
}

func TestUndoGivesLifetimeBackAndMarksSuspect(t *testing.T) {
	ctx := context.Background()
	r, _ := startRegistry(t, Options{})
	register(t, r, "p", "a", 0)
	register(t, r, "p", "b", 0)
	req := ClaimRequest{Pool: "p", Policy: LifetimeFirst, Limits: selection.Limits{MaxLifetime: 1}}
	c, err := r.Claim(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if !c.Drain || c.Worker.Command != CommandShutdown {
		t.Fatalf("a claim that reaches max_lifetime 1 must drain: %+v", c)
	}
	if err := r.Undo(ctx, "p", c.LeaseID, time.Minute); err != nil {
		t.Fatal(err)
	}
	w, err := r.Worker(ctx, "p", c.Worker.ID)
	if err != nil {
		t.Fatal(err)
	}
	if w.Active != 0 || w.Lifetime != 0 || w.Command != "" || time.Until(w.SuspectUntil) < 50*time.Second {
		t.Fatalf("after Undo: %+v", w)
	}
	// The suspect worker is skipped: the next claim goes to the other one.
	c2, err := r.Claim(ctx, req)
	if err != nil || c2.Worker.ID == c.Worker.ID {
		t.Fatalf("claim after Undo chose %+v, %v", c2, err)
	}
	// Undo without suspicion leaves the worker selectable.
	if err := r.Undo(ctx, "p", c2.LeaseID, 0); err != nil {
		t.Fatal(err)
	}
	c3, err := r.Claim(ctx, req)
	if err != nil || c3.Worker.ID != c2.Worker.ID {
		t.Fatalf("claim after Undo(0): %+v, %v", c3, err)
	}
}

// A holder that stops renewing: its leases expire and the workers' active
// counts return to the truth with nobody acting but the workers'
// heartbeats (and claims).
func TestLeasesHealWithoutReaper(t *testing.T) {
	ctx := context.Background()
	r, _ := startRegistry(t, Options{})
	for _, id := range []string{"a", "b", "c", "d", "e"} {
		register(t, r, "p", id, 0)
	}
	req := ClaimRequest{Pool: "p", Policy: LifetimeFirst, Limits: selection.Limits{MaxConcurrent: 20}, LeaseTTL: 300 * time.Millisecond, Holder: "crashed-proxy"}
	for range 50 {
		if _, err := r.Claim(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	// A live holder renews its own lease: it survives.
	live, err := r.Claim(ctx, ClaimRequest{Pool: "p", Policy: LifetimeFirst, Limits: req.Limits, LeaseTTL: time.Minute, Holder: "live"})
	if err != nil {
		t.Fatal(err)
	}
	total := func() int {
		n := 0
		for _, c := range counts(t, r, "p") {
			n += c[0]
		}
		return n
	}
	if total() != 51 {
		t.Fatalf("active after 51 claims: %d", total())
	}
	testenv.Eventually(t, 10*time.Second, "active counts to heal to the one live lease", func() bool {
		for _, id := range []string{"a", "b", "c", "d", "e"} {
			if _, err := r.Heartbeat(ctx, "p", id, time.Minute); err != nil {
				t.Fatal(err)
			}
		}
		return total() == 1
	})
	res, err := r.RenewLeases(ctx, "p", []LeaseRenewal{renewal(live)}, time.Minute)
	if err != nil || len(res.Recreated)+len(res.Ended) != 0 {
		t.Fatalf("RenewLeases: %+v %v", res, err)
	}
	info, _ := r.Inspect(ctx, "p")
	if info.Leases != 1 {
		t.Fatalf("%d leases left, want 1", info.Leases)
	}
	// Lifetimes are kept: the sessions did happen.
	lt := 0
	for _, w := range info.Workers {
		lt += w.Lifetime
	}
	if lt != 51 {
		t.Fatalf("lifetime total %d, want 51", lt)
	}
}

// The same crash healed by claims alone: the next claim of another proxy
// frees the expired leases before it decides, and sees true counts.
func TestLeasesHealByClaims(t *testing.T) {
	ctx := context.Background()
	r, _ := startRegistry(t, Options{})
	for _, id := range []string{"a", "b", "c", "d", "e"} {
		register(t, r, "p", id, 0)
	}
	lim := selection.Limits{MaxConcurrent: 10}
	// One clock for the 50 claims, so their leases lapse at the same instant.
	t0 := time.Now()
	for range 50 {
		if _, err := r.Claim(ctx, ClaimRequest{Pool: "p", Policy: LifetimeFirst, Limits: lim, LeaseTTL: 200 * time.Millisecond, Holder: "crashed", Now: t0}); err != nil {
			t.Fatal(err)
		}
	}
	// The pool is full: a claim now is refused.
	if _, err := r.Claim(ctx, ClaimRequest{Pool: "p", Policy: LifetimeFirst, Limits: lim, Now: t0}); !errors.Is(err, ErrNoWorker) {
		t.Fatalf("claim on a full pool: %v", err)
	}
	var c *Claim
	testenv.Eventually(t, 10*time.Second, "a claim to succeed once the crashed holder's leases lapse", func() bool {
		var err error
		c, err = r.Claim(ctx, ClaimRequest{Pool: "p", Policy: LifetimeFirst, Limits: lim, LeaseTTL: time.Minute, Holder: "alive"})
		return err == nil
	})
	if c.Worker.Active != 1 {
		t.Fatalf("the first claim after the lapse sees active %d on %s, want 1 (all 50 freed first)", c.Worker.Active, c.Worker.ID)
	}
	sum := 0
	for _, n := range counts(t, r, "p") {
		sum += n[0]
	}
	if sum != 1 {
		t.Fatalf("active total %d after healing, want 1", sum)
	}
}

func TestExpireLeases(t *testing.T) {
	ctx := context.Background()
	r, _ := startRegistry(t, Options{})
	register(t, r, "p", "a", 0)
	t0 := time.Now()
	for range 3 {
		if _, err := r.Claim(ctx, ClaimRequest{Pool: "p", Policy: LifetimeFirst, LeaseTTL: time.Second, Now: t0}); err != nil {
			t.Fatal(err)
		}
	}
	n, err := r.ExpireLeases(ctx, "p", 10)
	if err != nil || n != 0 {
		t.Fatalf("ExpireLeases before expiry: %d %v", n, err)
	}
	testenv.Eventually(t, 5*time.Second, "the leases to expire", func() bool {
		n, err := r.ExpireLeases(ctx, "p", 2)
		if err != nil {
			t.Fatal(err)
		}
		return n == 2
	})
	if got := counts(t, r, "p")["a"]; got != [2]int{1, 3} {
		t.Fatalf("after freeing 2 leases: %v", got)
	}
}

func TestWakeups(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r, _ := startRegistry(t, Options{})
	ch, err := r.Wakeups(ctx, "p", "q")
	if err != nil {
		t.Fatal(err)
	}
	register(t, r, "q", "w", 0)
	select {
	case p := <-ch:
		if p != "q" {
			t.Fatalf("wakeup for %q, want q", p)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no wakeup after a registration")
	}
	// capacity 1: the claim takes the worker out of the indexes and the
	// release puts it back, which is what wakes waiters (see
	// TestReleaseKeepingTheWorkerIndexedIsQuiet)
	register(t, r, "p", "w", 1)
	<-ch
	c, err := r.Claim(ctx, ClaimRequest{Pool: "p", Policy: LifetimeFirst})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Release(ctx, "p", c.LeaseID); err != nil {
		t.Fatal(err)
	}
	select {
	case p := <-ch:
		if p != "p" {
			t.Fatalf("wakeup for %q, want p", p)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no wakeup after a release")
	}
	cancel()
	testenv.Eventually(t, 5*time.Second, "the channel to close", func() bool {
		select {
		case _, ok := <-ch:
			return !ok
		default:
			return false
		}
	})
}

// A release that leaves its worker in the indexes (below its cap before
// and after) publishes nothing: a waiting claim could already take that
// worker. One that puts it back publishes once.
func TestReleaseKeepingTheWorkerIndexedIsQuiet(t *testing.T) {
	ctx := context.Background()
	r, rdb := startRegistry(t, Options{})
	register(t, r, "p", "roomy", 2)
	publishes := func() int64 {
		t.Helper()
		info, err := rdb.Info(ctx, "commandstats").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(info, "\n") {
			if rest, ok := strings.CutPrefix(line, "cmdstat_publish:calls="); ok {
				n, _, _ := strings.Cut(rest, ",")
				v, err := strconv.ParseInt(n, 10, 64)
				if err != nil {
					t.Fatalf("commandstats line %q: %v", line, err)
				}
				return v
			}
		}
		return 0
	}
	req := ClaimRequest{Pool: "p", Policy: LifetimeFirst}
	c, err := r.Claim(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	before := publishes()
	if err := r.Release(ctx, "p", c.LeaseID); err != nil {
		t.Fatal(err)
	}
	if n := publishes() - before; n != 0 {
		t.Fatalf("a release leaving its worker indexed published %d times, want 0", n)
	}
	// Two claims fill it; the first release puts it back in the indexes.
	c1, err := r.Claim(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Claim(ctx, req); err != nil {
		t.Fatal(err)
	}
	before = publishes()
	if err := r.Release(ctx, "p", c1.LeaseID); err != nil {
		t.Fatal(err)
	}
	if n := publishes() - before; n != 1 {
		t.Fatalf("a release putting its worker back published %d times, want 1", n)
	}
}

func TestExpireSkipIfFresh(t *testing.T) {
	ctx := context.Background()
	r, _ := startRegistry(t, Options{})
	register(t, r, "p", "fresh", 0)
	now := time.Now()
	put(t, r, "p", selection.Worker{ID: "old", Status: selection.Available, LastHeartbeat: now.Add(-time.Minute)}, 4, time.Time{})
	if ok, err := r.Expire(ctx, "p", "fresh", 30*time.Second); err != nil || ok {
		t.Fatalf("Expire of a fresh worker: %v %v", ok, err)
	}
	if ok, err := r.Expire(ctx, "p", "old", 30*time.Second); err != nil || !ok {
		t.Fatalf("Expire of a stale worker: %v %v", ok, err)
	}
	if ok, err := r.Expire(ctx, "p", "old", 30*time.Second); err != nil || ok {
		t.Fatalf("second Expire: %v %v", ok, err)
	}
	if ok, err := r.Expire(ctx, "p", "fresh", 0); err != nil || !ok {
		t.Fatalf("unconditional Expire: %v %v", ok, err)
	}
	ring, _ := r.rdb.ZCard(ctx, r.Key("p", keyIdxRing)).Result()
	lf, _ := r.rdb.ZCard(ctx, r.Key("p", keyIdxLifetime)).Result()
	if ring != 0 || lf != 0 {
		t.Fatalf("index entries left: ring %d, lifetime %d", ring, lf)
	}
}

// Stale workers are skipped under the max_scan budget and reported.
func TestStaleSkippedAndReported(t *testing.T) {
	ctx := context.Background()
	r, _ := startRegistry(t, Options{NoStaleExpiry: true})
	now := time.Now().Truncate(time.Millisecond)
	for i, id := range []string{"s1", "s2", "s3"} {
		// The stale ones have the highest lifetimes: lifetime-first walks them first.
		put(t, r, "p", selection.Worker{ID: id, Status: selection.Available, Lifetime: 10 - i, LastHeartbeat: now.Add(-time.Minute)}, 4, time.Time{})
	}
	put(t, r, "p", selection.Worker{ID: "ok", Status: selection.Available, Lifetime: 1, LastHeartbeat: now}, 4, time.Time{})
	req := ClaimRequest{Pool: "p", Policy: LifetimeFirst, Now: now, Limits: selection.Limits{StaleAfter: 30 * time.Second, MaxScan: 3}}
	_, err := r.Claim(ctx, req)
	var nw *NoWorkerError
	if !errors.As(err, &nw) || !slices.Equal(nw.Decision.Stale, []string{"s1", "s2", "s3"}) || nw.Decision.Scanned != 3 {
		t.Fatalf("budget 3 over 3 stale: %v %+v", err, nw)
	}
	req.Limits.MaxScan = 4
	c, err := r.Claim(ctx, req)
	if err != nil || c.Worker.ID != "ok" || !slices.Equal(c.Decision.Stale, []string{"s1", "s2", "s3"}) || c.Decision.Scanned != 4 {
		t.Fatalf("budget 4: %+v %v", c, err)
	}
}

// A release appends its duration to the worker's list and keeps the last
// DurationWindow of them, editing the stored string in place when it is
// tidy and rebuilding it when it is not.
func TestReleaseKeepsTheDurationWindow(t *testing.T) {
	ctx := context.Background()
	for _, window := range []int{1, 3} {
		r, rdb := startRegistry(t, Options{DurationWindow: window})
		register(t, r, "p", "w", 0)
		key := r.Key("p", keyDurations)
		stored := func() []string {
			t.Helper()
			s, err := rdb.HGet(ctx, key, "w").Result()
			if err != nil {
				t.Fatal(err)
			}
			return strings.Split(s, ",")
		}
		for i := 1; i <= 5; i++ {
			if i == 3 {
				// untidy, as a hand edit or an older writer may leave it
				rdb.HSet(ctx, key, "w", "7,,8,")
			}
			c, err := r.Claim(ctx, ClaimRequest{Pool: "p", Policy: LifetimeFirst, Now: time.Now().Add(-time.Duration(i) * time.Second)})
			if err != nil {
				t.Fatal(err)
			}
			if err := r.Release(ctx, "p", c.LeaseID); err != nil {
				t.Fatal(err)
			}
			got := stored()
			want := min(i, window)
			if i >= 3 {
				want = min(2+i-2, window) // 7, 8, then one per release since
			}
			if len(got) != want {
				t.Fatalf("window %d, release %d: stored %q, want %d entries", window, i, got, want)
			}
			last, err := strconv.Atoi(got[len(got)-1])
			if err != nil || last < (i-1)*1000 {
				t.Fatalf("window %d, release %d: stored %q, the last is not this session's ~%ds", window, i, got, i)
			}
			info, err := r.Inspect(ctx, "p")
			if err != nil || len(info.Workers) != 1 || len(info.Workers[0].Durations) != want {
				t.Fatalf("window %d, release %d: Inspect %+v %v", window, i, info.Workers, err)
			}
		}
	}
}
