package registry

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
)

// newTestRegistry starts a Redis of its own and returns a registry on it.
func newTestRegistry(t testing.TB) (*Registry, *testenv.Redis) {
	t.Helper()
	srv := testenv.StartRedis(t)
	rdb, err := NewClient(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rdb.Close() })
	return New(rdb, Options{}), srv
}

// register adds worker id to group with capacity, as an agent would.
func register(t testing.TB, r *Registry, group, id string, capacity int) Record {
	t.Helper()
	pool, version := SplitGroup(group)
	rec := NewRecord(Record{ID: id, Pool: pool, Version: version, Browser: "chromium", Addr: "127.0.0.1:9", Path: "/playwright", Capacity: capacity}, 0, nil)
	if err := r.Register(context.Background(), rec, AgentState{}, ""); err != nil {
		t.Fatal(err)
	}
	return rec
}

var sessionSeq atomic.Int64

// newSession makes a session ID unique in the test binary.
func newSession() string { return fmt.Sprintf("s%d", sessionSeq.Add(1)) }

// claim claims with req (a new session unless req names one) and fails
// the test when nothing is claimed.
func claim(t testing.TB, r *Registry, req ClaimRequest) Claim {
	t.Helper()
	c, _, err := tryClaim(r, req)
	if err != nil {
		t.Fatalf("claim in %s: %v", req.Group, err)
	}
	return c
}

func tryClaim(r *Registry, req ClaimRequest) (Claim, ClaimInfo, error) {
	if req.Session == "" {
		req.Session = newSession()
	}
	if req.Policy == "" {
		req.Policy = LifetimeFirst
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return r.Claim(ctx, req)
}

// state reads one worker's state.
func state(t testing.TB, r *Registry, group, id string) WorkerState {
	t.Helper()
	info, err := r.Inspect(context.Background(), group)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range info.Workers {
		if w.ID == id {
			return w.WorkerState
		}
	}
	t.Fatalf("worker %s not in %s (bad records: %v)", id, group, info.BadRecords)
	return WorkerState{}
}
