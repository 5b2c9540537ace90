package reaper

import (
	"context"
	"fmt"
	"maps"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
	"github.com/browsergrid/caddy-browser-grid/registry"
	"github.com/browsergrid/caddy-browser-grid/selection"
	"github.com/redis/go-redis/v9"
)

// TestMain runs the worker process of TestTwoReapersAndAKilledWorker when
// the test binary is re-executed with REAPER_HELPER_URL set, and the tests
// otherwise.
func TestMain(m *testing.M) {
	if url := os.Getenv("REAPER_HELPER_URL"); url != "" {
		if err := workerHelper(url); err != nil {
			fmt.Fprintln(os.Stderr, "worker helper:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// workerHelper registers a worker and heartbeats until it is killed.
func workerHelper(url string) error {
	rdb, err := registry.NewClient(url)
	if err != nil {
		return err
	}
	reg := registry.New(rdb, registry.Options{})
	ctx := context.Background()
	if err := reg.Register(ctx, registry.Registration{Pool: "p", ID: "victim", Addr: "127.0.0.1:1", Path: "/", TTL: 10 * time.Second}); err != nil {
		return err
	}
	fmt.Println("REGISTERED")
	for {
		if _, err := reg.Heartbeat(ctx, "p", "victim", 10*time.Second); err != nil {
			return err
		}
		time.Sleep(50 * time.Millisecond) // the heartbeat interval
	}
}

func newRegistry(t *testing.T) (*registry.Registry, *testenv.Redis) {
	t.Helper()
	srv := testenv.StartRedis(t)
	rdb, err := registry.NewClient(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rdb.Close() })
	return registry.New(rdb, registry.Options{NoStaleExpiry: true}), srv
}

// Two reapers run side by side while a worker process is killed with
// SIGKILL holding a session: the dead worker is removed exactly once, with
// its ring positions, counters and index entries; the live worker is never
// touched; neither reaper reports an error.
func TestTwoReapersAndAKilledWorker(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	reg, srv := newRegistry(t)
	helper := testenv.Start(t, []string{"REAPER_HELPER_URL=" + srv.URL()}, os.Args[0], "-test.run=^$", "-test.count=1")
	if !helper.WaitOutput("REGISTERED", 10*time.Second) {
		t.Fatalf("helper did not register:\n%s", helper.Output())
	}
	if err := reg.Register(ctx, registry.Registration{Pool: "p", ID: "survivor", Addr: "127.0.0.1:2", Path: "/", TTL: 10 * time.Second}); err != nil {
		t.Fatal(err)
	}
	var hbWG sync.WaitGroup
	hbWG.Add(1)
	go func() { // the survivor's agent
		defer hbWG.Done()
		for ctx.Err() == nil {
			if _, err := reg.Heartbeat(ctx, "p", "survivor", 10*time.Second); err != nil && ctx.Err() == nil {
				t.Errorf("survivor heartbeat: %v", err)
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
	defer hbWG.Wait()
	defer cancel()

	// A session on each worker (one slot each): the victim dies holding one.
	// (vnode claims, so the pool keeps its ring: the check below reads it)
	var lease, survivorLease string
	for range 2 {
		c, err := reg.Claim(ctx, registry.ClaimRequest{Pool: "p", Policy: registry.Vnode, LeaseTTL: time.Hour,
			Limits: selection.Limits{MaxConcurrent: 1}})
		if err != nil {
			t.Fatal(err)
		}
		if c.Worker.ID == "victim" {
			lease = c.LeaseID
		} else {
			survivorLease = c.LeaseID
		}
	}
	if err := helper.Cmd.Process.Kill(); err != nil { // SIGKILL: no cleanup
		t.Fatal(err)
	}
	<-helper.Done()

	var mu sync.Mutex
	var reports []Report
	var events []Event
	var wg sync.WaitGroup
	for i := range 2 {
		rp := &Reaper{Registry: reg, StaleAfter: 500 * time.Millisecond, OnEvent: func(e Event) {
			mu.Lock()
			defer mu.Unlock()
			events = append(events, e)
		}}
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Both reapers pass over and over until the victim is gone, and
			// a few times more.
			deadline := time.Now().Add(15 * time.Second)
			extra := 0
			for extra < 5 && time.Now().Before(deadline) {
				rep, err := rp.RunOnce(ctx)
				if err != nil {
					t.Errorf("reaper %d: %v", i, err)
					return
				}
				mu.Lock()
				reports = append(reports, rep)
				mu.Unlock()
				if _, err := reg.Worker(ctx, "p", "victim"); err != nil {
					extra++
				}
			}
		}()
	}
	wg.Wait()
	removed := 0
	busy := 0
	for _, rep := range reports {
		for _, w := range rep.Expired {
			if w.ID != "victim" {
				t.Errorf("reaped %v", w)
			}
			removed++
		}
		busy += len(rep.Busy)
	}
	if removed != 1 {
		t.Fatalf("victim removed %d times over %d passes", removed, len(reports))
	}
	kinds := map[string]int{}
	for _, e := range events {
		kinds[e.Kind]++
	}
	t.Logf("%d passes, %d found the pool busy; events %v", len(reports), busy, kinds)
	for _, e := range events {
		if e.Kind == KindError {
			t.Errorf("error event: %+v", e)
		}
	}
	info, err := reg.Inspect(ctx, "p")
	if err != nil {
		t.Fatal(err)
	}
	if len(info.Workers) != 1 || info.Workers[0].ID != "survivor" || len(info.BadRecords) != 0 {
		t.Fatalf("after reaping: %+v", info)
	}
	// Nothing of the victim is left in Redis; the survivor, its session
	// over, is back in every index.
	if err := reg.Release(ctx, "p", survivorLease); err != nil {
		t.Fatal(err)
	}
	rdb := reg.Client()
	ring, _ := rdb.ZRange(ctx, reg.Key("p", "idx:ring"), 0, -1).Result()
	if len(ring) != 8 || slices.ContainsFunc(ring, func(m string) bool { return m[33:] != "survivor" }) {
		t.Fatalf("ring after reaping: %v", ring)
	}
	for _, k := range []string{"active", "lifetime", "vnodes", "commands", "durations"} {
		if ok, _ := rdb.HExists(ctx, reg.Key("p", k), "victim").Result(); ok {
			t.Errorf("victim still in %s", k)
		}
	}
	for _, k := range []string{"idx:lifetime", "idx:fair_idle", "idx:fair_busy"} {
		if _, err := rdb.ZScore(ctx, reg.Key("p", k), "victim").Result(); err == nil {
			t.Errorf("victim still in %s", k)
		}
	}
	// The session the dead worker held moves no counter when its holder
	// releases it late: no count comes back for the victim and the
	// survivor's stay as they are.
	if ok, err := rdb.HExists(ctx, reg.Key("p", "leases"), lease).Result(); err != nil || !ok {
		t.Fatalf("the victim's lease is gone before its holder releases it (%v): the release below would test nothing", err)
	}
	before := counters(t, reg, "p")
	if _, ok := before["active"]["survivor"]; !ok {
		t.Fatalf("the survivor has no active count: %v", before)
	}
	if err := reg.Release(ctx, "p", lease); err != nil {
		t.Fatal(err)
	}
	if after := counters(t, reg, "p"); !maps.EqualFunc(before, after, maps.Equal) {
		t.Fatalf("a late release moved counters:\n before %v\n after  %v", before, after)
	}
}

// counters reads a pool's per-worker counters (active, lifetime and
// session durations), each as its hash of worker ID to value.
func counters(t *testing.T, reg *registry.Registry, pool string) map[string]map[string]string {
	t.Helper()
	out := map[string]map[string]string{}
	for _, k := range []string{"active", "lifetime", "durations"} {
		h, err := reg.Client().HGetAll(context.Background(), reg.Key(pool, k)).Result()
		if err != nil {
			t.Fatalf("reading the %s counters: %v", k, err)
		}
		out[k] = h
	}
	return out
}

// A reaper pass frees expired leases, sets active counts to the live leases,
// removes entries that belong to no worker, and rebuilds the retiring set
// (StaggerDrains) from the records.
func TestReaperFixesCountersAndOrphans(t *testing.T) {
	ctx := context.Background()
	reg, _ := newRegistry(t)
	rdb := reg.Client()
	for _, id := range []string{"a", "b"} {
		if err := reg.Register(ctx, registry.Registration{Pool: "p", ID: id, Addr: "h:1", TTL: time.Hour}); err != nil {
			t.Fatal(err)
		}
	}
	lim := selection.Limits{MaxConcurrent: 3}
	held, err := reg.Claim(ctx, registry.ClaimRequest{Pool: "p", Policy: registry.LifetimeFirst, Limits: lim, LeaseTTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	short, err := reg.Claim(ctx, registry.ClaimRequest{Pool: "p", Policy: registry.LifetimeFirst, Limits: lim, LeaseTTL: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	_ = short
	// Damage: a phantom count (as after a crash between writes of an older
	// version), a ring entry and counters of a worker that does not exist.
	rdb.HSet(ctx, reg.Key("p", "active"), "b", 3)
	rdb.ZAdd(ctx, reg.Key("p", "idx:ring"), redisZ("00000000000000000000000000000000:ghost"))
	rdb.HSet(ctx, reg.Key("p", "lifetime"), "ghost", 4)
	// c drains, but the retiring set lost it and holds a worker that is gone.
	if err := reg.Register(ctx, registry.Registration{Pool: "p", ID: "c", Addr: "h:1", TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if err := reg.SetDraining(ctx, "p", "c"); err != nil {
		t.Fatal(err)
	}
	rdb.SRem(ctx, reg.Key("p", "retiring"), "c")
	rdb.SAdd(ctx, reg.Key("p", "retiring"), "ghost")
	testenv.Eventually(t, 5*time.Second, "the short lease to expire", func() bool {
		n, _ := rdb.ZCount(ctx, reg.Key("p", "lease_expiry"), "-inf", fmt.Sprint(time.Now().Add(-10*time.Millisecond).UnixMilli())).Result()
		return n == 1
	})
	rp := New(reg)
	rep, err := rp.RunOnce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rep.LeasesFreed != 1 || rep.CountersFixed < 2 || rep.OrphansRemoved != 3 || len(rep.Expired) != 0 {
		t.Fatalf("report: %+v", rep)
	}
	info, _ := reg.Inspect(ctx, "p")
	for _, w := range info.Workers {
		want := 0
		if w.ID == held.Worker.ID {
			want = 1
		}
		if w.Active != want {
			t.Errorf("%s: active %d, want %d", w.ID, w.Active, want)
		}
	}
	if info.Leases != 1 {
		t.Errorf("%d leases, want 1", info.Leases)
	}
	if !slices.Equal(info.Retiring, []string{"c"}) {
		t.Errorf("retiring set %v, want [c]", info.Retiring)
	}
	// A second pass has nothing to do.
	rep, err = rp.RunOnce(ctx)
	if err != nil || rep.LeasesFreed+rep.CountersFixed+rep.OrphansRemoved+len(rep.Expired) != 0 {
		t.Fatalf("second pass: %+v %v", rep, err)
	}
}

// Run passes at once and then every Interval until its context ends.
func TestRunStopsWithContext(t *testing.T) {
	reg, _ := newRegistry(t)
	ctx, cancel := context.WithCancel(context.Background())
	passes := make(chan struct{}, 10)
	rp := &Reaper{Registry: reg, Interval: 20 * time.Millisecond, OnEvent: func(e Event) {}}
	rp.now = func() time.Time { passes <- struct{}{}; return time.Now() }
	if err := reg.Register(ctx, registry.Registration{Pool: "p", ID: "a", Addr: "h:1"}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error)
	go func() { done <- rp.Run(ctx) }()
	for range 3 {
		select {
		case <-passes:
		case <-time.After(10 * time.Second):
			t.Fatal("Run did not pass three times")
		}
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not stop with its context")
	}
	if err := (&Reaper{}).Run(context.Background()); err == nil {
		t.Fatal("a Reaper without a Registry ran")
	}
}

func redisZ(member string) redis.Z { return redis.Z{Score: 0, Member: member} }

// Two agents advertising one address (a copy-pasted PRIVATE_HOSTNAME send
// one browser the sessions of both) are reported by every pass, naming
// the address and both workers. An agent's own hand-over (its drained
// record, draining, beside its successor at the same address) is not.
func TestSharedAddressIsReported(t *testing.T) {
	reg, _ := newRegistry(t)
	ctx := context.Background()
	for _, w := range []struct{ pool, id, addr string }{
		{"p", "a2", "10.0.0.7:3000"}, {"p", "a1", "10.0.0.7:3000"},
		{"p", "old", "10.0.0.8:3000"}, {"p", "new", "10.0.0.8:3000"},
		{"p", "solo", "10.0.0.9:3000"}, {"q", "other-pool", "10.0.0.9:3000"},
	} {
		if err := reg.Register(ctx, registry.Registration{Pool: w.pool, ID: w.id, Addr: w.addr, Path: "/", TTL: time.Hour}); err != nil {
			t.Fatal(err)
		}
	}
	if err := reg.SetDraining(ctx, "p", "old"); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var events []Event
	r := &Reaper{Registry: reg, OnEvent: func(e Event) {
		mu.Lock()
		defer mu.Unlock()
		if e.Kind == KindSharedAddress {
			events = append(events, e)
		}
	}}
	rep, err := r.RunOnce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := []SharedAddress{{Pool: "p", Addr: "10.0.0.7:3000", Workers: []string{"a1", "a2"}}}
	if fmt.Sprint(rep.Shared) != fmt.Sprint(want) {
		t.Fatalf("report %+v, want %+v", rep.Shared, want)
	}
	if len(events) != 1 || events[0].Pool != "p" || events[0].Addr != "10.0.0.7:3000" || !slices.Equal(events[0].Workers, []string{"a1", "a2"}) {
		t.Fatalf("events %+v", events)
	}
	if err := reg.Deregister(ctx, "p", "a2"); err != nil {
		t.Fatal(err)
	}
	if rep, err := r.RunOnce(ctx); err != nil || len(rep.Shared) != 0 {
		t.Fatalf("after a2 left: %+v, %v", rep.Shared, err)
	}
}
