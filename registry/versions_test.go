package registry

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/browsergrid/caddy-browser-grid/selection"
)

func TestGroupNames(t *testing.T) {
	r := New(nil, Options{})
	for _, tc := range []struct{ pool, version, key string }{
		{"chromium", "", "{grid:chromium}:lifetime"},
		{"chromium", "1.65", "{grid:chromium}:v=1.65:lifetime"},
	} {
		g := GroupPool(tc.pool, tc.version)
		if got := r.Key(g, keyLifetime); got != tc.key {
			t.Errorf("Key(%q, lifetime) = %q, want %q", g, got, tc.key)
		}
		if p, v := SplitGroup(g); p != tc.pool || v != tc.version {
			t.Errorf("SplitGroup(%q) = %q, %q", g, p, v)
		}
		// One hash tag, one slot; one config (limits, epoch) and one
		// wake-up channel for the pool and its groups.
		if got := r.Key(g, keyConfig); got != "{grid:chromium}:config" {
			t.Errorf("Key(%q, config) = %q", g, got)
		}
		if got := r.channel(g); got != "{grid:chromium}:wakeup" {
			t.Errorf("channel(%q) = %q", g, got)
		}
	}
	for _, bad := range []string{"p@", "p@1", "p@1.x", "p@1.65.1", "@1.65", "p@1.65@1.64", "p@12345.1"} {
		if err := checkPool(bad); !errors.Is(err, ErrBadPool) {
			t.Errorf("checkPool(%q) = %v, want ErrBadPool", bad, err)
		}
	}
	if got := []string{"1.9", "1.65", "1.10", "2.0"}; true {
		slices.SortFunc(got, CompareVersions)
		if want := []string{"1.9", "1.10", "1.65", "2.0"}; !slices.Equal(got, want) {
			t.Errorf("sorted versions %v, want %v", got, want)
		}
	}
}

// TestVersionGroups: a claim in a version group chooses only among that
// group's workers, a pool without the version has no group to claim in,
// and a claim without a version reaches every group.
func TestVersionGroups(t *testing.T) {
	ctx := context.Background()
	r, _ := startRegistry(t, Options{})
	p64, p65 := GroupPool("p", "1.64"), GroupPool("p", "1.65")
	register(t, r, p64, "a1", 2)
	register(t, r, p64, "a2", 2)
	register(t, r, p65, "b1", 2)
	register(t, r, p65, "b2", 2)
	register(t, r, "p", "cdp", 1)

	vs, err := r.Versions(ctx, "p")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(vs.Versions, []string{"1.64", "1.65"}) || vs.Workers["1.64"] != 2 || vs.Workers[""] != 1 {
		t.Fatalf("versions %+v, want 1.64 and 1.65 with 2 workers each and 1 without", vs)
	}
	if vs.Has("1.63") || !vs.Has("1.65") {
		t.Fatalf("Has: 1.63 %v, 1.65 %v", vs.Has("1.63"), vs.Has("1.65"))
	}
	if got, want := vs.Groups("p"), []string{"p", p65, p64}; !slices.Equal(got, want) {
		t.Fatalf("groups %v, want %v", got, want)
	}

	for _, policy := range []Policy{LifetimeFirst, Vnode, FairShare} {
		t.Run(string(policy), func(t *testing.T) {
			for _, g := range []struct {
				pool   string
				prefix string
			}{{p64, "a"}, {p65, "b"}} {
				var leases []*Claim
				// 4 slots in the group: all go to its workers, the 5th claim finds none.
				for i := 0; i < 4; i++ {
					c, err := r.Claim(ctx, ClaimRequest{Pool: g.pool, Policy: policy})
					if err != nil {
						t.Fatalf("claim %d in %s: %v", i, g.pool, err)
					}
					if !strings.HasPrefix(c.Worker.ID, g.prefix) || c.Pool != g.pool ||
						c.Worker.PlaywrightVersion != strings.TrimPrefix(g.pool, "p@") {
						t.Fatalf("claim in %s got worker %s (pool %s, version %q)", g.pool, c.Worker.ID, c.Pool, c.Worker.PlaywrightVersion)
					}
					leases = append(leases, c)
				}
				if _, err := r.Claim(ctx, ClaimRequest{Pool: g.pool, Policy: policy}); !errors.Is(err, ErrNoWorker) {
					t.Fatalf("5th claim in %s: %v, want ErrNoWorker (the other groups are free)", g.pool, err)
				}
				for _, c := range leases {
					if err := r.Release(ctx, c.Pool, c.LeaseID); err != nil {
						t.Fatal(err)
					}
				}
			}
		})
	}

	t.Run("unknown version claims nothing", func(t *testing.T) {
		before := map[string]map[string][2]int{}
		for _, g := range []string{"p", p64, p65} {
			before[g] = counts(t, r, g)
		}
		if _, err := r.Claim(ctx, ClaimRequest{Pool: GroupPool("p", "1.63"), Policy: LifetimeFirst}); !errors.Is(err, ErrNoWorker) {
			t.Fatalf("claim in an empty group: %v, want ErrNoWorker", err)
		}
		for _, g := range []string{"p", p64, p65} {
			if got := counts(t, r, g); !mapsEqual(got, before[g]) {
				t.Fatalf("%s counts %v after a claim of an unknown version, want %v", g, got, before[g])
			}
		}
	})

	t.Run("no version: any worker, every group", func(t *testing.T) {
		seen := map[string]int{}
		var leases []*Claim
		// 1 + 4 + 4 slots in all.
		for i := 0; i < 9; i++ {
			c, err := claimAny(ctx, r, ClaimRequest{Pool: "p", Policy: LifetimeFirst})
			if err != nil {
				t.Fatalf("claim %d without a version: %v", i, err)
			}
			seen[c.Worker.ID]++
			leases = append(leases, c)
		}
		if _, err := claimAny(ctx, r, ClaimRequest{Pool: "p", Policy: LifetimeFirst}); !errors.Is(err, ErrNoWorker) {
			t.Fatalf("10th claim without a version: %v, want ErrNoWorker", err)
		}
		if want := map[string]int{"cdp": 1, "a1": 2, "a2": 2, "b1": 2, "b2": 2}; !mapsEqual(seen, want) {
			t.Fatalf("sessions per worker %v, want %v", seen, want)
		}
		// The pool's own workers first, then the newest version.
		if leases[0].Worker.ID != "cdp" || leases[1].Pool != p65 {
			t.Fatalf("order: %s then %s (%s), want cdp then 1.65", leases[0].Worker.ID, leases[1].Worker.ID, leases[1].Pool)
		}
		for _, c := range leases {
			if err := r.Release(ctx, c.Pool, c.LeaseID); err != nil {
				t.Fatal(err)
			}
		}
	})

	t.Run("the reaper's pool list holds the groups", func(t *testing.T) {
		ps, err := r.Pools(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if want := []string{"p", p64, p65}; !slices.Equal(ps, want) {
			t.Fatalf("pools %v, want %v", ps, want)
		}
	})

	t.Run("reconcile repairs a group's indexes", func(t *testing.T) {
		if err := r.rdb.ZRem(ctx, r.Key(p65, keyIdxLifetime), "b1").Err(); err != nil {
			t.Fatal(err)
		}
		res, err := r.Reconcile(ctx, p65)
		if err != nil {
			t.Fatal(err)
		}
		if res.CountersFixed != 1 {
			t.Fatalf("reconcile of %s: %+v, want 1 fix", p65, res)
		}
		if err := r.rdb.ZScore(ctx, r.Key(p65, keyIdxLifetime), "b1").Err(); err != nil {
			t.Fatalf("b1 not back in %s's lifetime index: %v", p65, err)
		}
	})

	t.Run("a version stays served a while after its last worker left", func(t *testing.T) {
		for _, id := range []string{"a1", "a2"} {
			if err := r.Deregister(ctx, p64, id); err != nil {
				t.Fatal(err)
			}
		}
		vs, err := r.Versions(ctx, "p")
		if err != nil {
			t.Fatal(err)
		}
		if !vs.Has("1.64") || vs.Workers["1.64"] != 0 || slices.Contains(vs.Groups("p"), p64) {
			t.Fatalf("versions %+v groups %v: want 1.64 still served (registered just now), with no group to claim in", vs, vs.Groups("p"))
		}
		// An hour later it is not.
		if err := r.rdb.ZAdd(ctx, r.Key("p", keyVersions), redisZ(time.Now().Add(-time.Hour).UnixMilli(), "1.64")).Err(); err != nil {
			t.Fatal(err)
		}
		if vs, _ := r.Versions(ctx, "p"); vs.Has("1.64") {
			t.Fatalf("versions %v: 1.64 has had no worker for an hour", vs.Versions)
		}
	})
}

// TestStaggerDrainsPerGroup: restarts are one at a time within each
// version group, and a group's retiring worker holds back no other group.
func TestStaggerDrainsPerGroup(t *testing.T) {
	ctx := context.Background()
	r, _ := startRegistry(t, Options{})
	p64, p65 := GroupPool("p", "1.64"), GroupPool("p", "1.65")
	for _, g := range []string{p64, p65} {
		register(t, r, g, "x1", 0)
		register(t, r, g, "x2", 0)
	}
	lim := selection.Limits{MaxLifetime: 2, StaggerDrains: true}
	for _, g := range []string{p64, p65} {
		req := ClaimRequest{Pool: g, Policy: LifetimeFirst, Limits: lim}
		// 4 sessions in the group: the first that reaches the limit is told
		// to drain (the other group's retiring worker does not hold it
		// back); the other worker's last session then waits for it.
		drained := ""
		var nw *NoWorkerError
		for i := 0; ; i++ {
			c, err := r.Claim(ctx, req)
			if errors.As(err, &nw) {
				if !nw.Retiring || drained == "" || i != 3 {
					t.Fatalf("claim %d in %s: %v (retiring %v, drained %q); want the 4th held back by the retiring worker", i, g, err, nw.Retiring, drained)
				}
				break
			}
			if err != nil || i == 3 {
				t.Fatalf("claim %d in %s: %+v, %v", i, g, c, err)
			}
			if c.Drain {
				if drained != "" {
					t.Fatalf("%s: %s told to drain while %s retires", g, c.Worker.ID, drained)
				}
				drained = c.Worker.ID
			}
		}
		if got := retiringSet(t, r, g); !slices.Equal(got, []string{drained}) {
			t.Fatalf("%s retiring set %v, want [%s]", g, got, drained)
		}
	}
}

// claimAny is a claim without a version, as the Caddy handler makes it:
// the groups of the pool in Groups' order, the first that grants.
func claimAny(ctx context.Context, r *Registry, req ClaimRequest) (*Claim, error) {
	vs, err := r.Versions(ctx, req.Pool)
	if err != nil {
		return nil, err
	}
	err = ErrNoWorker
	for _, g := range vs.Groups(req.Pool) {
		req.Pool = g
		var c *Claim
		if c, err = r.Claim(ctx, req); err == nil || !errors.Is(err, ErrNoWorker) {
			return c, err
		}
	}
	return nil, err
}

func mapsEqual[K comparable, V comparable](a, b map[K]V) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// A pool filled with versions (a Redis writer making them up, one worker
// record each) is routed to, read and labelled by its newest
// MaxVersionGroups alone: a claim of a client without a version tries at
// most that many groups and the pool's own (found by a red team: 1,000
// made-up versions made one CDP request run 18,389 Redis commands and
// created 46,000 metric series).
func TestVersionsAreCapped(t *testing.T) {
	ctx := context.Background()
	r, rdb := startRegistry(t, Options{NoStaleExpiry: true})
	const n = MaxVersionGroups + 4
	var all []string
	for i := range n {
		v := fmt.Sprintf("2.%d", i)
		all = append(all, v)
		if err := r.Register(ctx, Registration{Pool: GroupPool("p", v), ID: "w" + v, Addr: "h:1", Path: "/", TTL: time.Hour}); err != nil {
			t.Fatal(err)
		}
	}
	// made-up versions past what is read, noted long ago: never read
	for i := range 200 {
		rdb.ZAdd(ctx, r.Key("p", keyVersions), redis.Z{Score: 1, Member: fmt.Sprintf("9.%d", i)})
	}
	// made-up versions "registered" far in the future, and names that are
	// no version: neither read nor served
	for i := range 2 * maxVersionsRead {
		rdb.ZAdd(ctx, r.Key("p", keyVersions), redis.Z{Score: 1e15, Member: fmt.Sprintf("8.%d", i)})
		rdb.ZAdd(ctx, r.Key("p", keyVersions), redis.Z{Score: 1e15, Member: fmt.Sprintf("x%d", i)})
	}
	// made-up versions newer than every real one, registered just now but
	// with no worker: they rank after every version with workers
	for i := range MaxVersionGroups {
		rdb.ZAdd(ctx, r.Key("p", keyVersions), redis.Z{Score: float64(time.Now().UnixMilli()), Member: fmt.Sprintf("7.%d", i)})
	}
	vs, err := r.Versions(ctx, "p")
	if err != nil {
		t.Fatal(err)
	}
	if vs.Unread == 0 {
		t.Errorf("unread %d: the set holds more than is read", vs.Unread)
	}
	if want := all[n-MaxVersionGroups:]; !slices.Equal(vs.Versions, want) {
		t.Fatalf("versions %v, want the newest %d: %v", vs.Versions, MaxVersionGroups, want)
	}
	if want := []string{"2.3", "2.2", "2.1", "2.0"}; len(vs.Omitted) != 4+MaxVersionGroups || !slices.Equal(vs.Omitted[:4], want) {
		t.Fatalf("omitted %v, want %v, then the %d made-up ones without workers", vs.Omitted, want, MaxVersionGroups)
	}
	if g := vs.Groups("p"); len(g) != MaxVersionGroups || g[0] != GroupPool("p", all[n-1]) {
		t.Fatalf("groups %v: want the %d newest, newest first", g, MaxVersionGroups)
	}
	_, _, groups, err := r.InspectGroups(ctx, "p")
	if err != nil {
		t.Fatal(err)
	}
	if len(groups) > maxVersionsRead+1 || slices.Contains(groups, GroupPool("p", "2.0")) {
		t.Fatalf("InspectGroups read %d groups (%v): an omitted one, or more than are read", len(groups), groups)
	}
}
