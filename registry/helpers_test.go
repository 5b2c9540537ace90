package registry

import (
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
	"github.com/browsergrid/caddy-browser-grid/selection"
	"github.com/redis/go-redis/v9"
)

//go:embed testdata/put.lua
var luaPut string

// scriptPut is put.lua, in a library of its own (common.lua and put):
// tests load it beside the registry's, another library on the same Redis.
var scriptPut = newLibrary([]libScript{{name: "put", body: luaPut}}).function("put")

// startRegistry starts a redis-server for the test and a Registry on it.
func startRegistry(t testing.TB, opts Options) (*Registry, redis.UniversalClient) {
	t.Helper()
	return registryAt(t, testenv.StartRedis(t).URL(), opts)
}

// registryAt is a Registry over a client of url (any NewClient URL:
// single node, Sentinel, Cluster), closed when the test ends.
func registryAt(t testing.TB, url string, opts Options) (*Registry, redis.UniversalClient) {
	t.Helper()
	rdb, err := NewClient(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rdb.Close() })
	return New(rdb, opts), rdb
}

// redisURL is the URL of a single-node registry's server.
func redisURL(r *Registry) string {
	return "redis://" + r.rdb.(*redis.Client).Options().Addr + "/0"
}

// put writes a worker with chosen figures (the test hook): w's fields are
// stored as they are, with its record TTL at expires (zero: far ahead).
func put(t testing.TB, r *Registry, pool string, w selection.Worker, v int, expires time.Time) {
	t.Helper()
	if v == 0 {
		v = defaultVirtualNodes
	}
	if expires.IsZero() {
		expires = time.UnixMilli(1 << 50)
	}
	rec := map[string]any{
		"id": w.ID, "browser": "chromium", "addr": "127.0.0.1:1", "path": "/playwright",
		"status": string(w.Status), "gen": "g1", "capacity": w.Capacity, "vnodes": v,
		"heartbeat": toMS(w.LastHeartbeat), "registered": toMS(w.LastHeartbeat), "expires": toMS(expires),
		"suspect_until": toMS(w.SuspectUntil), "predicted_end": toMS(w.PredictedEnd),
	}
	b, _ := json.Marshal(rec)
	var durs []string
	for _, d := range w.Durations {
		durs = append(durs, fmt.Sprint(d.Milliseconds()))
	}
	n, err := r.run(context.Background(), scriptPut, pool, 0, w.ID, string(b), w.Active, w.Lifetime,
		strings.Join(durs, ","), strings.Join(ringPositions(w.ID, v), " ")).Int()
	if err != nil || n != 1 {
		t.Fatalf("put %s: %v (%d)", w.ID, err, n)
	}
}

func register(t testing.TB, r *Registry, pool, id string, capacity int) {
	t.Helper()
	err := r.Register(context.Background(), Registration{
		Pool: pool, ID: id, BrowserType: "chromium", Addr: "127.0.0.1:9" + fmt.Sprint(len(id)),
		Path: "/playwright", Capacity: capacity, TTL: time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
}

func counts(t testing.TB, r *Registry, pool string) map[string][2]int {
	t.Helper()
	info, err := r.Inspect(context.Background(), pool)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][2]int{}
	for _, w := range info.Workers {
		out[w.ID] = [2]int{w.Active, w.Lifetime}
	}
	return out
}

// renewal is what a lease's holder knows of claim c.
func renewal(c *Claim) LeaseRenewal {
	return LeaseRenewal{ID: c.LeaseID, Worker: c.Worker.ID, Gen: c.Gen, Claimed: time.Now(), Lifetime: c.Worker.Lifetime}
}

// sorted returns a sorted copy of ss.
func sorted(ss []string) []string {
	out := slices.Clone(ss)
	slices.Sort(out)
	return out
}

// startReplica starts a redis-server replicating r's and returns a
// registry on it (and its client): reads may go there, writes are refused.
func startReplica(t testing.TB, r *Registry) (*Registry, redis.UniversalClient) {
	t.Helper()
	addr := strings.TrimSuffix(strings.TrimPrefix(redisURL(r), "redis://"), "/0")
	host, port, _ := strings.Cut(addr, ":")
	replica := testenv.StartRedis(t, "--replicaof", host, port)
	rc, err := NewClient(replica.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rc.Close() })
	return New(rc, Options{NoStaleExpiry: true}), rc
}

// suspectHead puts 30 suspect workers with 50 sessions behind them at the
// head of pool p's idx:lifetime, 600 free ones behind them, and settles
// the pool on lifetime_first (so it keeps no other index).
func suspectHead(t testing.TB, r *Registry, now time.Time) {
	t.Helper()
	for i := range 30 {
		put(t, r, "p", selection.Worker{ID: fmt.Sprintf("s%02d", i), Status: selection.Available, Capacity: 2,
			Lifetime: 50, LastHeartbeat: now, SuspectUntil: now.Add(time.Hour)}, 0, time.Time{})
	}
	for i := range 600 {
		put(t, r, "p", selection.Worker{ID: fmt.Sprintf("f%03d", i), Status: selection.Available, Capacity: 2,
			LastHeartbeat: now}, 0, time.Time{})
	}
	if _, err := r.Claim(context.Background(), ClaimRequest{Pool: "p", Policy: LifetimeFirst, Now: now, LeaseTTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
}
