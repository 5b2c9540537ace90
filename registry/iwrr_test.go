package registry

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/browsergrid/caddy-browser-grid/selection"
)

// Workers registered with weights 3 and 1 (the second from its capacity)
// take turns as interleaved weighted round robin deals them, claim after
// claim, the cursor kept in Redis; a Pick between claims moves nothing.
func TestInterleavedWeightedRoundRobinClaims(t *testing.T) {
	ctx := context.Background()
	r, _ := startRegistry(t, Options{})
	for _, reg := range []Registration{
		{Pool: "p", ID: "a", Addr: "127.0.0.1:1", Weight: 3, TTL: time.Minute},
		{Pool: "p", ID: "b", Addr: "127.0.0.1:2", Capacity: 1, TTL: time.Minute},
	} {
		if err := r.Register(ctx, reg); err != nil {
			t.Fatal(err)
		}
	}
	req := ClaimRequest{Pool: "p", Policy: InterleavedWeightedRoundRobin, Limits: selection.Limits{MaxConcurrent: 4}}
	var got []string
	for range 8 {
		before := iwrrCursor(t, r, "p")
		if _, _, err := r.Pick(ctx, req); err != nil {
			t.Fatal(err)
		}
		if after := iwrrCursor(t, r, "p"); after != before {
			t.Fatalf("Pick moved the cursor from %+v to %+v", before, after)
		}
		c, err := r.Claim(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, c.Worker.ID)
		if err := r.Release(ctx, "p", c.LeaseID); err != nil {
			t.Fatal(err)
		}
	}
	if s := strings.Join(got, " "); s != "b a a a b a a a" {
		t.Fatalf("claims went to %q, want %q", s, "b a a a b a a a")
	}
	if err := r.Register(ctx, Registration{Pool: "p", ID: "c", Addr: "127.0.0.1:3", Weight: selection.MaxWeight + 1}); err == nil ||
		!strings.Contains(err.Error(), "weight") {
		t.Fatalf("a weight over the maximum: %v, want an error naming the weight", err)
	}
}

// The reaper's Reconcile puts back an indexed worker's missing idx:iwrr
// entry and removes an entry whose worker is gone.
func TestReconcileRepairsTheIWRRIndex(t *testing.T) {
	ctx := context.Background()
	r, rdb := startRegistry(t, Options{})
	if err := r.Register(ctx, Registration{Pool: "p", ID: "a", Addr: "127.0.0.1:1", Weight: 2, TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	key := r.Key("p", keyIdxIWRR)
	if err := rdb.ZRem(ctx, key, "000002:a").Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.ZAdd(ctx, key, redis.Z{Member: "000001:gone"}).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Reconcile(ctx, "p"); err != nil {
		t.Fatal(err)
	}
	if got, _ := rdb.ZRange(ctx, key, 0, -1).Result(); !slices.Equal(got, []string{"000002:a"}) {
		t.Fatalf("idx:iwrr after Reconcile: %v, want [000002:a]", got)
	}
}
