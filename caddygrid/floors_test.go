package caddygrid_test

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
	"github.com/browsergrid/caddy-browser-grid/registry"
)

// Three sessions served and ended, then Redis loses everything and the
// worker registers again asserting the lifetime of a heartbeat that never
// saw them (0): Caddy's next claim finds the dataset epoch changed and
// re-asserts what it served before it claims, so the browser serves the 2
// sessions left of max_lifetime 5, not 5 more.
func TestLifetimeFloorsSurviveAnEmptyRestart(t *testing.T) {
	g := newGrid(t)
	reg := oneProcessWorker(t, g, "gen-1")
	c := floorCaddy(t, g)
	servedBefore(t, g, c)
	loseEverything(t, g, reg)
	servesWhatIsLeft(t, g, c, "after the loss")
}

// Redis comes back from a snapshot taken after the first of the three
// sessions (a crash, and a restart that loads its RDB file): the worker's
// record is there, at lifetime 1, under the epoch Caddy saw. Caddy's next
// claim is told the data came back on another server and re-asserts what
// it served before it claims, so the browser serves the 2 sessions left
// of max_lifetime 5, not 4.
func TestLifetimeFloorsSurviveARestoreFromAnOlderSnapshot(t *testing.T) {
	g := newGrid(t)
	oneProcessWorker(t, g, "gen-1")
	c := floorCaddy(t, g)
	restoreAfterServing(t, g, c)
	servesWhatIsLeftAfterTheHold(t, g, c, "after the restore")
}

// Two instances share Redis. A serves a session, Redis takes a snapshot,
// A serves two more, and its clients go to B; Redis then restarts from
// the snapshot (the worker back at lifetime 1). B's first claim gives the
// pool a new epoch, but B served nothing there: only A's epoch watch,
// up to a second later, re-asserts the lifetime 3 A served. The pool's
// claims are held meanwhile, so B serves the 2 sessions left of
// max_lifetime 5, not 4 (a review measured 4 before the hold).
func TestAnIdleInstanceReassertsBeforeARestoredPoolServes(t *testing.T) {
	g := newGrid(t)
	oneProcessWorker(t, g, "gen-1")
	a, b := floorCaddy(t, g), floorCaddy(t, g)
	restoreAfterServing(t, g, a)
	servesWhatIsLeftAfterTheHold(t, g, b, "B after the restore")
}

// restoreAfterServing serves a session through c on worker w1, has Redis
// take a snapshot, serves two more, and restarts Redis from the snapshot:
// the worker is back at lifetime 1 of the 3 it served.
func restoreAfterServing(t *testing.T, g *grid, c *caddy) {
	t.Helper()
	if n := serveOneByOne(t, g, c, 1); n != 1 {
		t.Fatalf("before the snapshot: %d sessions served, want 1", n)
	}
	if err := g.rdb.Save(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	if n, life := serveOneByOne(t, g, c, 2), g.info("chromium", "w1").Lifetime; n != 2 || life != 3 {
		t.Fatalf("after the snapshot: %d sessions served, lifetime %d; want 2 and 3", n, life)
	}
	g.redis.Restart()
	testenv.Eventually(t, 5*time.Second, "the snapshot loaded", func() bool {
		w, err := g.reg.Worker(context.Background(), "chromium", "w1")
		return err == nil && w.Lifetime == 1
	})
}

// The same as TestAnIdleInstanceReassertsBeforeARestoredPoolServes in
// twelve pools at once, with A's replies from Redis 25 ms late: A
// re-asserts every pool within the hold. It used to mark, store limits
// and send floors pool after pool, about 3 round trips each, and a red
// team measured 17 sessions served past what was left over 16 version
// groups at 25 ms (0 up to 8 ms).
func TestAnIdleInstanceReassertsManyPoolsWithinTheHold(t *testing.T) {
	const pools = 12
	g := newGrid(t)
	site := ""
	for i := range pools {
		site += fmt.Sprintf(`
	route /p%d/* {
		browser_grid p%d {
			select_timeout 300ms
			max_lifetime 5
		}
	}`, i, i)
		processWorker(t, g, fmt.Sprintf("p%d", i), fmt.Sprintf("w%d", i), "gen-1")
	}
	px := startReplyDropper(t, g.redis.Addr)
	a := startCaddy(t, caddyOpts{redisURL: "redis://" + px.addr + "/0", site: site})
	b := startCaddy(t, caddyOpts{redisURL: g.redis.URL(), site: site})
	serve := func(c *caddy, i, n int) int {
		return serveOneByOneAt(t, g, c, fmt.Sprintf("/p%d/x", i), fmt.Sprintf("p%d", i), fmt.Sprintf("w%d", i), n)
	}
	for i := range pools {
		if n := serve(a, i, 1); n != 1 {
			t.Fatalf("p%d before the snapshot: %d served, want 1", i, n)
		}
	}
	if err := g.rdb.Save(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	for i := range pools {
		if n := serve(a, i, 2); n != 2 {
			t.Fatalf("p%d after the snapshot: %d served, want 2", i, n)
		}
	}
	px.delay.Store(int64(25 * time.Millisecond))
	g.redis.Restart()
	testenv.Eventually(t, 5*time.Second, "the snapshot loaded", func() bool {
		w, err := g.reg.Worker(context.Background(), "p0", "w0")
		return err == nil && w.Lifetime == 1
	})
	served := make([]int, pools)
	var wg sync.WaitGroup
	for i := range pools {
		wg.Add(1)
		go func() {
			defer wg.Done()
			deadline := time.Now().Add(10 * time.Second)
			for served[i] == 0 && time.Now().Before(deadline) {
				served[i] = serve(b, i, 5)
			}
		}()
	}
	wg.Wait()
	over := 0
	for i, n := range served {
		if n != 2 {
			t.Errorf("p%d: B served %d after the restore, want the 2 left of max_lifetime 5", i, n)
		}
		over += max(0, n-2)
	}
	t.Logf("B served %v: %d past what was left", served, over)
}

// While the floors cannot be written again, the pool's claims on that
// Caddy fail (503) rather than land on a worker whose served sessions
// Redis lost, and once Redis takes them the worker serves only what is
// left of its lifetime. The floor calls are cut on their way to Redis (a
// proxy drops the connection of any request naming the floor op); every
// other call goes through.
func TestClaimsWaitWhileFloorsAreOwed(t *testing.T) {
	g := newGrid(t)
	reg := oneProcessWorker(t, g, "gen-1")
	ctx := context.Background()
	px := startReplyDropper(t, g.redis.Addr)
	c := startCaddy(t, caddyOpts{redisURL: "redis://" + px.addr + "/0", site: `
	route /playwright/* {
		browser_grid chromium {
			select_timeout 300ms
			max_lifetime 5
		}
	}`})
	servedBefore(t, g, c)
	loseEverything(t, g, reg)
	floorOp := []byte("$5\r\nfloor\r\n") // the op's argument, as RESP sends it
	px.cutOn.Store(&floorOp)
	for i := range 4 {
		s, err := dial(ctx, c.url("/playwright/chromium"))
		if err == nil {
			s.close()
			t.Fatalf("attempt %d: a session was served while the floors were owed", i+1)
		}
		if he := refusal(err); he == nil || he.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("attempt %d while the floors are owed: %v, want 503", i+1, err)
		}
	}
	if px.cut.Load() == 0 {
		t.Fatal("no floor call was cut: the test proves nothing")
	}
	// Claims that meet owed floors at once share one call: each floor
	// call now hangs a second before it fails, and eight claims arrive
	// meanwhile.
	px.cutAfter.Store(int64(time.Second))
	before := px.cut.Load()
	var wg sync.WaitGroup
	var servedOwed atomic.Int64
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if s, err := dial(ctx, c.url("/playwright/chromium")); err == nil {
				servedOwed.Add(1)
				s.close()
			}
		}()
	}
	wg.Wait()
	px.cutAfter.Store(0)
	// the epoch watch's own call may still hang: let it fail first
	testenv.Eventually(t, 5*time.Second, "no floor call held", func() bool { return px.holding.Load() == 0 })
	if n := servedOwed.Load(); n != 0 {
		t.Fatalf("%d of 8 concurrent sessions served while the floors were owed", n)
	}
	// the 8 claims' call, and the epoch watch's own (one a second)
	if calls := px.cut.Load() - before; calls > 4 {
		t.Errorf("8 concurrent claims sent the owed floors %d times, want them to share a call", calls)
	}
	if w := g.info("chromium", "w1"); w.Lifetime != 0 {
		t.Fatalf("lifetime %d while the floors were owed: a claim counted", w.Lifetime)
	}
	px.cutOn.Store(nil)
	served := serveOneByOne(t, g, c, 5)
	w := g.info("chromium", "w1")
	if served != 2 || w.Lifetime != 5 || w.Command != registry.CommandShutdown {
		t.Errorf("once Redis took the floors: %d sessions served, lifetime %d, command %q; want 2, 5 and shutdown", served, w.Lifetime, w.Command)
	}
	t.Logf("%d floor calls cut; then %d sessions served", px.cut.Load(), served)
}

// Two instances share Redis. A serves three sessions, then its clients go
// to B. Redis loses everything and the worker registers again at lifetime
// 0; A makes no claim after the loss, but its epoch watch learns of it and
// re-asserts what A served, so B serves the 2 sessions left of
// max_lifetime 5, not 5.
func TestAnInstanceThatStopsClaimingStillAssertsItsFloors(t *testing.T) {
	g := newGrid(t)
	reg := oneProcessWorker(t, g, "gen-1")
	a, b := floorCaddy(t, g), floorCaddy(t, g)
	reassertedWithoutClaiming(t, g, reg, a, b, "A", "B after the loss")
}

// reassertedWithoutClaiming: served serves three sessions on worker w1,
// Redis loses everything and the worker registers again (reg), served
// re-asserts the lifetime it served without a claim of its own, and other
// serves only the 2 sessions left of max_lifetime 5.
func reassertedWithoutClaiming(t *testing.T, g *grid, reg registry.Registration, served, other *caddy, servedName, what string) {
	t.Helper()
	servedBefore(t, g, served)
	loseEverything(t, g, reg)
	testenv.Eventually(t, 10*time.Second, servedName+" re-asserts the lifetime it served without claiming", func() bool {
		return g.info("chromium", "w1").Lifetime == 3
	})
	servesWhatIsLeft(t, g, other, what)
}

// Two instances share Redis with different configurations: A's, with
// max_lifetime 20, is older than B's, with 5, so B's limits are in force.
// B serves three sessions, then its clients go to A, and Redis loses
// everything. A's first claim after the loss stored its own limits over
// none, and served 5 more sessions on a worker B's config allows 2 (until
// B claimed again). B's epoch watch now stores B's limits again with its
// configuration's time beside its floors, so the newest configuration's
// limits are in force again whichever instance claims first.
func TestTheNewestLimitsWinAgainAfterALoss(t *testing.T) {
	g := newGrid(t)
	reg := oneProcessWorker(t, g, "gen-1")
	a := lifetimeCaddy(t, g, 20)
	time.Sleep(10 * time.Millisecond) // B's configuration is the newer
	b := floorCaddy(t, g)
	reassertedWithoutClaiming(t, g, reg, b, a, "B", "A, the older configuration, after the loss")
}

// A configuration replaced since its last claim in a pool does not bring
// its limits back after a loss. X claimed under max_lifetime 20 (newer
// than Y's 10), was reloaded to 3, and Redis lost everything: X's epoch
// watch re-asserts what it served but not the replaced configuration's
// limits, which carry a time newer than Y's and would override Y's claims
// for as long as X did not claim there again (an attacker-minded review
// measured Y serving 15 sessions under the replaced 20).
func TestAReplacedConfigsLimitsDoNotComeBackAfterALoss(t *testing.T) {
	g := newGrid(t)
	reg := oneProcessWorker(t, g, "gen-1")
	lifetimeCaddy(t, g, 10) // Y, the oldest configuration
	time.Sleep(10 * time.Millisecond)
	x := lifetimeCaddy(t, g, 20)
	if n := serveOneByOne(t, g, x, 1); n != 1 {
		t.Fatalf("X served %d sessions, want 1", n)
	}
	x.reload(lifetimeOpts(g, 3))
	loseEverything(t, g, reg)
	testenv.Eventually(t, 10*time.Second, "X re-asserts the lifetime it served", func() bool {
		return g.info("chromium", "w1").Lifetime == 1
	})
	if l := g.limits("chromium"); l.MaxLifetime == 20 {
		t.Errorf("after the loss the pool runs under the replaced configuration's max_lifetime 20")
	}
}

// Redis loses everything twice with no claim in the pool between the
// losses (a crash-looping Redis): the epoch watch re-asserts both. It
// used to note the first loss as "no epoch, re-asserted" and took the
// second, which looks the same, for it: B then served 5 sessions on a
// worker A had served 3 of (max_lifetime 5). The watch now gives the pool
// a new epoch once it re-asserted, so the second loss is another change.
func TestASecondLossBeforeAnyClaimIsReassertedToo(t *testing.T) {
	g := newGrid(t)
	reg := oneProcessWorker(t, g, "gen-1")
	ctx := context.Background()
	a, b := floorCaddy(t, g), floorCaddy(t, g)
	servedBefore(t, g, a)
	again := reg
	again.Hold = registry.ReassertHold // as the agent registers after a loss
	for loss := 1; loss <= 2; loss++ {
		if err := g.rdb.FlushAll(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		if err := g.reg.Register(ctx, again); err != nil { // the agent's last heartbeat: lifetime 0
			t.Fatal(err)
		}
		testenv.Eventually(t, 2*registry.ReassertHold, fmt.Sprintf("A re-asserts what it served after loss %d", loss), func() bool {
			return g.info("chromium", "w1").Lifetime == 3
		})
	}
	time.Sleep(registry.ReassertHold) // the last registration's hold over
	served := serveOneByOne(t, g, b, 5)
	if w := g.info("chromium", "w1"); served != 2 || w.Lifetime != 5 {
		t.Errorf("B after the second loss: %d sessions served, lifetime %d; want 2 and 5", served, w.Lifetime)
	}
}

// serveOneByOne opens up to n sessions through c on worker w1, one at a
// time, each closed and released before the next, and returns how many
// were served before the first refusal.
func serveOneByOne(t *testing.T, g *grid, c *caddy, n int) int {
	t.Helper()
	return serveOneByOneAt(t, g, c, "/playwright/chromium", "chromium", "w1", n)
}

// serveOneByOneAt is serveOneByOne at path, on worker id of pool.
func serveOneByOneAt(t *testing.T, g *grid, c *caddy, path, pool, id string, n int) int {
	t.Helper()
	served := 0
	for range n {
		s, err := dial(context.Background(), c.url(path))
		if err != nil {
			break
		}
		served++
		s.close()
		testenv.Eventually(t, 5*time.Second, "the session released", func() bool { return g.info(pool, id).Active == 0 })
	}
	return served
}

// servedBefore serves 3 sessions through c on worker w1, as before a loss.
func servedBefore(t *testing.T, g *grid, c *caddy) {
	t.Helper()
	if n, life := serveOneByOne(t, g, c, 3), g.info("chromium", "w1").Lifetime; n != 3 || life != 3 {
		t.Fatalf("before the loss: %d sessions served, lifetime %d; want 3 and 3", n, life)
	}
}

// loseEverything empties Redis, as a restart without persistence would,
// and registers worker w1 again as its agent does, asserting the lifetime
// of a heartbeat that saw none of the sessions served (0).
func loseEverything(t *testing.T, g *grid, reg registry.Registration) {
	t.Helper()
	if err := g.rdb.FlushAll(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	if err := g.reg.Register(context.Background(), reg); err != nil {
		t.Fatal(err)
	}
}

// servesWhatIsLeft checks that c serves the 2 sessions left of
// max_lifetime 5 on worker w1 after servedBefore's 3, and no more.
func servesWhatIsLeft(t *testing.T, g *grid, c *caddy, what string) {
	t.Helper()
	served := serveOneByOne(t, g, c, 5)
	if w := g.info("chromium", "w1"); served != 2 || w.Lifetime != 5 || w.Command != registry.CommandShutdown {
		t.Errorf("%s: %d sessions served, lifetime %d, command %q; want 2, 5 and shutdown", what, served, w.Lifetime, w.Command)
	}
}

// servesWhatIsLeftAfterTheHold is servesWhatIsLeft once the pool's claims
// are no longer held after a restore (registry.RestoreHold): c's claims
// answer 503 until then.
func servesWhatIsLeftAfterTheHold(t *testing.T, g *grid, c *caddy, what string) {
	t.Helper()
	start, served := time.Now(), 0
	testenv.Eventually(t, 10*time.Second, what+": a session served", func() bool {
		served = serveOneByOne(t, g, c, 5)
		return served > 0
	})
	if w := g.info("chromium", "w1"); served != 2 || w.Lifetime != 5 || w.Command != registry.CommandShutdown {
		t.Errorf("%s: %d sessions served, lifetime %d, command %q; want 2, 5 and shutdown", what, served, w.Lifetime, w.Command)
	}
	t.Logf("%s: the first session came %s after the first try", what, time.Since(start).Round(100*time.Millisecond))
}

// floorCaddy starts a Caddy serving pool chromium with max_lifetime 5.
func floorCaddy(t *testing.T, g *grid) *caddy { return lifetimeCaddy(t, g, 5) }

// lifetimeCaddy starts a Caddy serving pool chromium with max_lifetime ml.
func lifetimeCaddy(t *testing.T, g *grid, ml int) *caddy { return startCaddy(t, lifetimeOpts(g, ml)) }

// lifetimeOpts is lifetimeCaddy's config.
func lifetimeOpts(g *grid, ml int) caddyOpts {
	return caddyOpts{redisURL: g.redis.URL(), site: fmt.Sprintf(`
	route /playwright/* {
		browser_grid chromium {
			select_timeout 300ms
			max_lifetime %d
		}
	}`, ml)}
}
