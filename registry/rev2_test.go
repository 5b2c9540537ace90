package registry

// Review of the kept-index fixes (982196d, a6005df): cases the red-team
// tests do not cover. Each test names what it found in its comment.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/selection"
)

// A build step calls INFO (server_id), the only command of the scripts in
// ACL category @dangerous. docs/redis.md asks the ACL user for "the
// commands the scripts run"; a user made with the usual "+@all
// -@dangerous" claims and releases as before, but the first claim that
// has to build an index (a policy switch, or an hour unused) fails with
// NOPERM, and so does every later one with that policy: the index is
// never built.
func TestRev2BuildingClaimUnderACLWithoutDangerous(t *testing.T) {
	ctx := context.Background()
	r, rdb := startRegistry(t, Options{NoStaleExpiry: true})
	for i := range 300 {
		redRegister(t, r, "p", fmt.Sprintf("w%03d", i), 4, 1)
	}
	if _, err := r.Claim(ctx, ClaimRequest{Pool: "p", Policy: LifetimeFirst}); err != nil {
		t.Fatal(err)
	}
	if err := rdb.Do(ctx, "ACL", "SETUSER", "grid", "on", ">pw", "~*", "&*", "+@all", "-@dangerous").Err(); err != nil {
		t.Fatal(err)
	}
	url := strings.Replace(redisURL(r), "redis://", "redis://grid:pw@", 1)
	gr, _ := registryAt(t, url, Options{NoStaleExpiry: true})
	// the ACL user is otherwise enough: lifetime_first claims and releases
	c, err := gr.Claim(ctx, ClaimRequest{Pool: "p", Policy: LifetimeFirst})
	if err != nil {
		t.Fatalf("lifetime_first claim as an ACL user with +@all -@dangerous: %v", err)
	}
	if err := gr.Release(ctx, "p", c.LeaseID); err != nil {
		t.Fatal(err)
	}
	for _, p := range []Policy{Vnode, FairShare, InterleavedWeightedRoundRobin} {
		if _, err := gr.Claim(ctx, ClaimRequest{Pool: "p", Policy: p}); err != nil {
			t.Errorf("%s claim that builds its index, as an ACL user with +@all -@dangerous: %v", p, err)
		}
	}
}

// While the ring is built a vnode claim walks idx:lifetime as
// lifetime_first would, its scan budget included (docs/redis.md). Caddy
// sent vnode's own default (16) as Limits.MaxScan, so the registry took
// it for the request's budget and the building claim found no worker
// where lifetime_first (64) finds one. Caddy now sends the configured
// max_scan only (caddygrid TestVnodeRequestLeavesMaxScanToTheRegistry);
// the requests below are built as caddygrid builds them.
func TestRev2CaddyVnodeBuildingClaimScanBudget(t *testing.T) {
	ctx := context.Background()
	r, _ := startRegistry(t, Options{NoStaleExpiry: true})
	now := time.Now()
	suspectHead(t, r, now)
	// caddygrid: VnodeSelection.Provision and Select
	v := selection.Vnode{}
	v.SetDefaults()
	vreq := ClaimRequest{Pool: "p", Policy: Vnode, Vnode: v, Now: now, LeaseTTL: time.Hour}
	// caddygrid: lifetime_first with no max_scan (opts.MaxScan 0)
	lreq := ClaimRequest{Pool: "p", Policy: LifetimeFirst, Now: now}
	want, _, err := r.Pick(ctx, lreq)
	if err != nil {
		t.Fatal(err)
	}
	c, err := r.Claim(ctx, vreq)
	var nw *NoWorkerError
	switch {
	case errors.As(err, &nw) && nw.IndexBuilding:
		t.Fatalf("vnode claim as Caddy sends it, ring building: no worker (scanned %d); Caddy's lifetime_first chooses %s",
			nw.Decision.Scanned, want.ID)
	case err != nil:
		t.Fatal(err)
	case !c.IndexBuilding:
		t.Fatal("want a building claim")
	case c.Worker.ID != want.ID:
		t.Fatalf("building claim chose %s, lifetime_first %s", c.Worker.ID, want.ID)
	}
}

// ix_step bounds a step by ZSCAN batches of COUNT 32, but ZSCAN of a
// listpack-encoded sorted set ignores COUNT and returns every member at
// once. With the default zset-max-listpack-entries (128) that is at most
// 128 workers; an operator who raised it (a memory tuning) gets the whole
// pool in one step, as docs/redis.md ("Kept indexes") says. The step
// still builds the index right; figures: how long the first fair_share
// claim takes with zset-max-listpack-entries 4096 and 3,000 workers.
func TestRev2ListpackBuildStep(t *testing.T) {
	ctx := context.Background()
	r, rdb := startRegistry(t, Options{NoStaleExpiry: true})
	if err := rdb.ConfigSet(ctx, "zset-max-listpack-entries", "4096").Err(); err != nil {
		t.Fatal(err)
	}
	const n = 3000
	for i := range n {
		redRegister(t, r, "p", fmt.Sprintf("w%04d", i), 4, 1)
	}
	enc, _ := rdb.ObjectEncoding(ctx, r.Key("p", keyIdxLifetime)).Result()
	if _, err := r.Claim(ctx, ClaimRequest{Pool: "p", Policy: LifetimeFirst}); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	c, err := r.Claim(ctx, ClaimRequest{Pool: "p", Policy: FairShare})
	if err != nil {
		t.Fatal(err)
	}
	d := time.Since(t0)
	added := keptMembers(t, r, "p", "fair") // (busy workers count twice: fair_busy and fair_end)
	t.Logf("idx:lifetime %s, %d workers: first fair_share claim added %d (building after it: %v) in %s",
		enc, n, added, c.IndexBuilding, d)
	if enc != "listpack" || c.IndexBuilding || added < n {
		t.Fatalf("a listpack idx:lifetime (%s) of %d workers: the first step added %d, building %v; want all of them at once",
			enc, n, added, c.IndexBuilding)
	}
	checkIndexExact(t, r, "p", "fair")
}
