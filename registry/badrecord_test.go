package registry

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/selection"
)

// Records that do not parse are skipped and reported, never selected and
// never a script error, under every policy.
func TestBadRecordsSkippedAndReported(t *testing.T) {
	ctx := context.Background()
	var mu sync.Mutex
	reported := map[string]string{}
	r, rdb := startRegistry(t, Options{NoStaleExpiry: true, OnBadRecord: func(pool, id string, err error) {
		mu.Lock()
		defer mu.Unlock()
		if pool != "p" {
			t.Errorf("bad record reported for pool %q", pool)
		}
		reported[id] = err.Error()
	}})
	corrupt := map[string]func(){
		"bad-string": func() {
			rdb.HSet(ctx, r.Key("p", keyWorkers), "bad-string", `{"id":"bad-string","browser":"c","addr":"h:1","path":"/","status":"available","gen":"g","capacity":"abc","vnodes":8,"heartbeat":1,"registered":1,"expires":1,"suspect_until":0,"predicted_end":0}`)
		},
		"bad-missing": func() {
			rdb.HSet(ctx, r.Key("p", keyWorkers), "bad-missing", `{"id":"bad-missing","browser":"c","addr":"h:1","path":"/","status":"available","gen":"g","capacity":0,"vnodes":8,"registered":1,"expires":1,"suspect_until":0,"predicted_end":0}`)
		},
		"bad-status": func() {
			rdb.HSet(ctx, r.Key("p", keyWorkers), "bad-status", `{"id":"bad-status","browser":"c","addr":"h:1","path":"/","status":"sleeping","gen":"g","capacity":0,"vnodes":8,"heartbeat":1,"registered":1,"expires":1,"suspect_until":0,"predicted_end":0}`)
		},
		// a generation with a space: lease_owner's members could not hold it
		"bad-gen": func() {
			rdb.HSet(ctx, r.Key("p", keyWorkers), "bad-gen", `{"id":"bad-gen","browser":"c","addr":"h:1","path":"/","status":"available","gen":"g h","capacity":0,"vnodes":8,"heartbeat":1,"registered":1,"expires":1,"suspect_until":0,"predicted_end":0}`)
		},
		"bad-json": func() { rdb.HSet(ctx, r.Key("p", keyWorkers), "bad-json", `{"id":`) },
		// a valid record under another name than its id (a copy)
		"bad-name": func() {
			rdb.HSet(ctx, r.Key("p", keyWorkers), "bad-name", `{"id":"elsewhere","browser":"c","addr":"h:1","path":"/","status":"available","gen":"g","capacity":0,"vnodes":8,"heartbeat":1,"registered":1,"expires":1,"suspect_until":0,"predicted_end":0}`)
		},
		"bad-counter": func() { rdb.HSet(ctx, r.Key("p", keyActive), "bad-counter", "two") },
		"bad-durations": func() {
			rdb.HSet(ctx, r.Key("p", keyDurations), "bad-durations", "100,abc")
		},
	}
	var bad []string
	for id := range corrupt {
		bad = append(bad, id)
	}
	slices.Sort(bad)
	now := time.Now().Truncate(time.Millisecond)
	setup := func() {
		rdb.Del(ctx, r.poolKeys("p")...)
		rdb.HSet(ctx, r.Key("p", keyConfig), "max_concurrent", 5, "max_lifetime", 100)
		// The bad ones look best to every policy: highest lifetime below the
		// margin edge (100 - 100/7 = 86), no predicted end, many ring positions.
		for _, id := range bad {
			put(t, r, "p", selection.Worker{ID: id, Status: selection.Available, Lifetime: 80, LastHeartbeat: now}, 32, time.Time{})
			corrupt[id]()
		}
		put(t, r, "p", selection.Worker{ID: "good", Status: selection.Available, Lifetime: 1, LastHeartbeat: now,
			PredictedEnd: now.Add(time.Hour)}, 1, time.Time{})
	}
	for _, p := range []Policy{LifetimeFirst, Vnode, FairShare} {
		t.Run(string(p), func(t *testing.T) {
			setup()
			clear(reported)
			req := ClaimRequest{Pool: "p", Policy: p, Now: now, Limits: selection.Limits{MaxConcurrent: 5, MaxLifetime: 100, MaxScan: 256},
				Vnode: selection.Vnode{Samples: 1}}
			// 6 x 32 bad ring entries: the budget must cover them. Vnode walks
			// from random pivots, so it may not meet every bad worker.
			for i := range 20 {
				c, err := r.Claim(ctx, req)
				if err != nil {
					t.Fatalf("claim %d: %v", i, err)
				}
				if c.Worker.ID != "good" {
					t.Fatalf("claim %d chose %q", i, c.Worker.ID)
				}
				if err := r.Release(ctx, "p", c.LeaseID); err != nil {
					t.Fatal(err)
				}
			}
			mu.Lock()
			for id := range reported {
				if !slices.Contains(bad, id) {
					t.Errorf("%q reported bad", id)
				}
			}
			if p != Vnode && len(reported) != len(bad) {
				t.Errorf("reported %v, want all of %v", reported, bad)
			}
			mu.Unlock()
		})
	}
	setup()
	info, err := r.Inspect(ctx, "p")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, b := range info.BadRecords {
		got = append(got, b.ID)
		if b.Err == "" {
			t.Errorf("bad record %s without a reason", b.ID)
		}
	}
	if !slices.Equal(got, bad) || len(info.Workers) != 1 || info.Workers[0].ID != "good" {
		t.Fatalf("Inspect: bad %v workers %v", got, info.Workers)
	}
	t.Logf("reasons: %v", info.BadRecords)
	if _, err := r.Heartbeat(ctx, "p", "bad-status", time.Minute); !errors.Is(err, ErrNotRegistered) {
		t.Fatalf("heartbeat of a bad record: %v, want ErrNotRegistered (so its agent registers again)", err)
	}
	if _, err := r.Worker(ctx, "p", "bad-json"); err == nil {
		t.Fatal("Worker of a bad record gave no error")
	}
	// Expire with skip_if_fresh removes a bad record: it cannot prove it is fresh.
	if ok, err := r.Expire(ctx, "p", "bad-json", 30*time.Second); err != nil || !ok {
		t.Fatalf("Expire of a bad record: %v %v", ok, err)
	}
	if res, err := r.Reconcile(ctx, "p"); err != nil || len(res.BadRecords) != len(bad)-1 {
		t.Fatalf("Reconcile: %+v %v", res, err)
	}
}
