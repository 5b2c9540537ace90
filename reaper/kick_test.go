package reaper

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
	"github.com/browsergrid/caddy-browser-grid/registry"
	"github.com/browsergrid/caddy-browser-grid/selection"
)

// passLog records the passes of a running Reaper (passDone) and the
// starts of its kicked ones (KindKicked events).
type passLog struct {
	mu      sync.Mutex
	regular int
	ends    []time.Time // every pass's end, in order
	kicked  []kickedPass
}

type kickedPass struct {
	pool  string
	start time.Time
	// prevEnd is the end of the pass before it.
	prevEnd time.Time
}

func (l *passLog) watch(r *Reaper) {
	r.passDone = func(kicked bool, end time.Time) {
		l.mu.Lock()
		defer l.mu.Unlock()
		if !kicked {
			l.regular++
		}
		l.ends = append(l.ends, end)
	}
	r.OnEvent = func(e Event) {
		if e.Kind != KindKicked {
			return
		}
		now := time.Now()
		l.mu.Lock()
		defer l.mu.Unlock()
		var prev time.Time
		if n := len(l.ends); n > 0 {
			prev = l.ends[n-1]
		}
		l.kicked = append(l.kicked, kickedPass{pool: e.Pool, start: now, prevEnd: prev})
	}
}

func (l *passLog) counts() (regular, kicked int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.regular, len(l.kicked)
}

// startReaper runs r until the test ends and waits for its first regular
// pass to end.
func startReaper(t *testing.T, r *Reaper, l *passLog) {
	t.Helper()
	l.watch(r)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	testenv.Eventually(t, 30*time.Second, "the reaper's first pass", func() bool {
		n, _ := l.counts()
		return n >= 1
	})
}

// registerStale registers n workers of pool that never heartbeat and waits
// until they are older than staleAfter.
func registerStale(t *testing.T, reg *registry.Registry, pool string, n int, staleAfter time.Duration) {
	t.Helper()
	for i := range n {
		if err := reg.Register(context.Background(), registry.Registration{Pool: pool, ID: fmt.Sprintf("dead%03d", i),
			Addr: "127.0.0.1:1", Path: "/", TTL: time.Hour}); err != nil {
			t.Fatal(err)
		}
	}
	registered := time.Now()
	testenv.Eventually(t, 10*time.Second, "the workers going stale", func() bool {
		return time.Since(registered) > staleAfter+100*time.Millisecond
	})
}

func workerCount(t *testing.T, reg *registry.Registry, pool string) int {
	t.Helper()
	n, err := reg.Client().HLen(context.Background(), reg.Key(pool, "workers")).Result()
	if err != nil {
		t.Fatal(err)
	}
	return int(n)
}

// A kick makes Run reap the kicked pool long before its Interval (an
// hour), and only that pool.
func TestKickReapsEarly(t *testing.T) {
	reg, _ := newRegistry(t) // NoStaleExpiry: only the reaper removes
	const staleAfter = 300 * time.Millisecond
	var l passLog
	rp := &Reaper{Registry: reg, Interval: time.Hour, StaleAfter: staleAfter, MinKickGap: 200 * time.Millisecond}
	startReaper(t, rp, &l)
	registerStale(t, reg, "kicked", 3, staleAfter)
	registerStale(t, reg, "other", 2, staleAfter)

	rp.Kick("kicked")
	testenv.Eventually(t, 30*time.Second, "the kicked pool's stale workers removed", func() bool {
		return workerCount(t, reg, "kicked") == 0
	})
	l.mu.Lock()
	kicked := append([]kickedPass(nil), l.kicked...)
	l.mu.Unlock()
	if len(kicked) != 1 || kicked[0].pool != "kicked" {
		t.Fatalf("kicked passes %+v, want one over pool kicked", kicked)
	}
	if n := workerCount(t, reg, "other"); n != 2 {
		t.Fatalf("pool other has %d workers after a kick of another pool, want its 2 (reaped at the next Interval)", n)
	}
	if regular, _ := l.counts(); regular != 1 {
		t.Fatalf("%d regular passes, want 1 (the Interval is an hour)", regular)
	}
}

// A storm of kicks from many goroutines coalesces: each kicked pass starts
// at least MinKickGap after the previous pass ended, so a stale worker met
// by every claim costs at most one scan per MinKickGap; kicks keep being
// served while the storm lasts.
func TestKickStormOnePassPerGap(t *testing.T) {
	reg, _ := newRegistry(t)
	const gap = 500 * time.Millisecond
	var l passLog
	rp := &Reaper{Registry: reg, Interval: time.Hour, MinKickGap: gap}
	if err := reg.Register(context.Background(), registry.Registration{Pool: "p", ID: "w", Addr: "127.0.0.1:1", Path: "/", TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	startReaper(t, rp, &l)

	stop := make(chan struct{})
	var storm sync.WaitGroup
	var kicks sync.Map
	for g := range 4 {
		storm.Add(1)
		go func() {
			defer storm.Done()
			n := 0
			for {
				select {
				case <-stop:
					kicks.Store(g, n)
					return
				default:
				}
				rp.Kick("p")
				n++
				if n%8 == 0 {
					time.Sleep(time.Millisecond) // leave the shared cores some air
				}
			}
		}()
	}
	testenv.Eventually(t, 60*time.Second, "four kicked passes", func() bool {
		_, k := l.counts()
		return k >= 4
	})
	close(stop)
	storm.Wait()
	total := 0
	kicks.Range(func(_, v any) bool { total += v.(int); return true })

	l.mu.Lock()
	defer l.mu.Unlock()
	for i, k := range l.kicked {
		if k.pool != "p" {
			t.Errorf("kicked pass %d over pool %q, want p", i, k.pool)
		}
		if got := k.start.Sub(k.prevEnd); got < gap {
			t.Errorf("kicked pass %d started %s after the previous pass ended, want at least MinKickGap %s", i, got, gap)
		}
	}
	if total <= len(l.kicked) {
		t.Fatalf("%d kicks gave %d kicked passes: the storm did not test coalescing", total, len(l.kicked))
	}
	t.Logf("%d kicks, %d kicked passes, %d regular", total, len(l.kicked), l.regular)
}

// A claim that walks past stale workers tells the registry's OnStale,
// which kicks the reaper: the stale workers go although claims do not
// expire them (NoStaleExpiry) and the reaper's Interval is an hour.
func TestClaimMeetingStaleWorkersKicksReaper(t *testing.T) {
	srv := testenv.StartRedis(t)
	rdb, err := registry.NewClient(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rdb.Close() })
	rp := &Reaper{Interval: time.Hour, StaleAfter: 500 * time.Millisecond, MinKickGap: 200 * time.Millisecond}
	var told sync.Map
	reg := registry.New(rdb, registry.Options{NoStaleExpiry: true, OnStale: func(pool string) {
		told.Store(pool, true)
		rp.Kick(pool)
	}})
	rp.Registry = reg
	var l passLog
	startReaper(t, rp, &l)
	ctx := context.Background()
	const pool = "zone"
	registerStale(t, reg, pool, 20, rp.StaleAfter)
	// A fresh worker, full: a claim walks past every stale worker and is
	// refused.
	if err := reg.Register(ctx, registry.Registration{Pool: pool, ID: "alive", Addr: "127.0.0.1:2", Path: "/", TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	req := registry.ClaimRequest{Pool: pool, Policy: registry.LifetimeFirst, LeaseTTL: time.Hour, Limits: selection.Limits{MaxConcurrent: 1, StaleAfter: rp.StaleAfter}}
	held, err := reg.Claim(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if held.Worker.ID != "alive" {
		t.Fatalf("claimed %q, want the only fresh worker", held.Worker.ID)
	}
	if _, ok := told.Load(pool); ok {
		t.Fatal("OnStale told of a claim that met no stale worker")
	}
	testenv.Eventually(t, 30*time.Second, "the stale workers removed by a kicked pass", func() bool {
		// The fresh worker heartbeats meanwhile.
		if _, err := reg.Heartbeat(ctx, pool, "alive", time.Hour); err != nil {
			t.Fatal(err)
		}
		_, err := reg.Claim(ctx, req)
		if nw := (*registry.NoWorkerError)(nil); !errors.As(err, &nw) {
			t.Fatalf("claim with the fresh worker full: %v, want NoWorkerError", err)
		}
		return workerCount(t, reg, pool) == 1
	})
	if _, ok := told.Load(pool); !ok {
		t.Fatal("OnStale was never told")
	}
	if regular, kicked := l.counts(); regular != 1 || kicked < 1 {
		t.Fatalf("%d regular and %d kicked passes, want 1 and at least 1", regular, kicked)
	}
}
