package registry

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
	"github.com/browsergrid/caddy-browser-grid/selection"
	"github.com/redis/go-redis/v9"
)

// overMaxmemory sets the server's maxmemory 1 MB below what it uses, so
// that Redis is out of memory for every command that may need more.
func overMaxmemory(t *testing.T, c *redis.Client) {
	t.Helper()
	ctx := context.Background()
	info, err := c.Info(ctx, "memory").Result()
	if err != nil {
		t.Fatal(err)
	}
	var used int64
	for _, l := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), "used_memory:"); ok {
			fmt.Sscan(v, &used)
		}
	}
	if used < 2<<20 {
		t.Fatalf("used_memory %d: too small to go 1 MB below", used)
	}
	if err := c.ConfigSet(ctx, "maxmemory", fmt.Sprint(used-1<<20)).Err(); err != nil {
		t.Fatal(err)
	}
}

// Above maxmemory (policy noeviction), what frees memory still runs: a
// session's release, lease expiry, a stale record's removal. Only what
// needs memory (a claim, a heartbeat) is refused, with Redis' OOM error.
// Refused as a whole (a function without allow-oom), releases could not
// shrink a full Redis: every ended session would keep its slot.
func TestReleaseRunsAboveMaxmemory(t *testing.T) {
	ctx := context.Background()
	srv := testenv.StartRedis(t, "--maxmemory-policy", "noeviction")
	r, _ := registryAt(t, srv.URL(), Options{})
	for _, id := range []string{"w1", "w2"} {
		if err := r.Register(ctx, Registration{Pool: "p", ID: id, Addr: "h:1", Path: "/", Capacity: 4, TTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
	}
	var cs []*Claim
	for range 3 {
		c, err := r.Claim(ctx, ClaimRequest{Pool: "p", Policy: LifetimeFirst, LeaseTTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		cs = append(cs, c)
	}
	// The third lease's holder stopped renewing: its expiry passes (set now: a
	// ZADD is refused above maxmemory).
	if err := srv.Client().ZAddXX(ctx, r.Key("p", keyLeaseExpiry), redis.Z{Score: 1, Member: cs[2].LeaseID}).Err(); err != nil {
		t.Fatal(err)
	}
	big := strings.Repeat("x", 64<<10)
	for i := range 48 {
		if err := srv.Client().Set(ctx, fmt.Sprintf("other-app-%d", i), big, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	overMaxmemory(t, srv.Client())

	if _, err := r.Claim(ctx, ClaimRequest{Pool: "p", Policy: LifetimeFirst, LeaseTTL: time.Minute}); err == nil || !strings.Contains(err.Error(), "OOM") {
		t.Fatalf("a claim above maxmemory: %v; want Redis' OOM error", err)
	}
	if err := r.Release(ctx, "p", cs[0].LeaseID); err != nil {
		t.Fatalf("a release above maxmemory: %v", err)
	}
	if err := r.Undo(ctx, "p", cs[1].LeaseID, 0); err != nil {
		t.Fatalf("an undo above maxmemory: %v", err)
	}
	if n, err := r.ExpireLeases(ctx, "p", 10); err != nil || n != 1 {
		t.Fatalf("expiring leases above maxmemory: %d %v; want 1 freed", n, err)
	}
	for id, c := range counts(t, r, "p") {
		if c[0] != 0 {
			t.Fatalf("%s still counts %d sessions after its releases above maxmemory", id, c[0])
		}
	}
	if bad, err := activeDrift(ctx, r, srv.Client(), "p"); err != nil || len(bad) > 0 {
		t.Fatalf("counts apart from the leases: %v %v", bad, err)
	}
	if _, err := r.Expire(ctx, "p", "w2", 0); err != nil {
		t.Fatalf("removing a record above maxmemory: %v", err)
	}
	if _, err := r.Heartbeat(ctx, "p", "w1", time.Minute); err == nil || !strings.Contains(err.Error(), "OOM") {
		t.Fatalf("a heartbeat above maxmemory: %v; want Redis' OOM error", err)
	}
	if err := srv.Client().ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Claim(ctx, ClaimRequest{Pool: "p", Policy: LifetimeFirst, LeaseTTL: time.Minute}); err != nil && !errors.Is(err, ErrNoWorker) {
		t.Fatalf("a claim once memory is back: %v", err)
	}
}

// Dropping a failed config's limits (ForgetLimits) only frees memory: it
// runs above maxmemory too, as releases do. Refused, Caddy's retries end
// (about 40 s) while Redis is full, and a pool no running config claims
// for keeps the failed config's limits once memory is back.
func TestForgetLimitsRunsAboveMaxmemory(t *testing.T) {
	ctx := context.Background()
	srv := testenv.StartRedis(t, "--maxmemory-policy", "noeviction")
	r, _ := registryAt(t, srv.URL(), Options{})
	at := time.Now().Add(-time.Minute)
	if _, err := r.Claim(ctx, ClaimRequest{Pool: "p", Policy: LifetimeFirst, LeaseTTL: time.Minute, ConfigTime: at,
		Limits: selection.Limits{MaxConcurrent: 5}}); !errors.Is(err, ErrNoWorker) {
		t.Fatalf("claim: %v", err)
	}
	big := strings.Repeat("x", 64<<10)
	for i := range 48 {
		if err := srv.Client().Set(ctx, fmt.Sprintf("other-app-%d", i), big, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	overMaxmemory(t, srv.Client())
	if dropped, err := r.ForgetLimits(ctx, "p", at); err != nil || !dropped {
		t.Fatalf("ForgetLimits above maxmemory: dropped %v, %v; want dropped", dropped, err)
	}
}
