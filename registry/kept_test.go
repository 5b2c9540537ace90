package registry

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// optKeys are the indexes kept only while a policy that walks them claims
// the pool (lua/common.lua, "Kept indexes"), by the name the config hash
// uses ('ix:<name>') and the policy that walks them.
var optKeys = []struct {
	name   string
	policy Policy
	keys   []string
}{
	{"ring", Vnode, []string{keyIdxRing}},
	{"fair", FairShare, []string{keyIdxIdle, keyIdxBusy, keyIdxEnd}},
	{"iwrr", InterleavedWeightedRoundRobin, []string{keyIdxIWRR}},
}

func optIndex(p Policy) (name string, keys []string) {
	for _, o := range optKeys {
		if o.policy == p {
			return o.name, o.keys
		}
	}
	return "", nil
}

// keptMembers is how many members index name's keys hold (-1 when none
// of them exists).
func keptMembers(t testing.TB, r *Registry, pool, name string) int {
	t.Helper()
	ctx := context.Background()
	var keys []string
	for _, o := range optKeys {
		if o.name == name {
			keys = o.keys
		}
	}
	n, exists := int64(0), false
	for _, k := range keys {
		c, err := r.rdb.ZCard(ctx, r.Key(pool, k)).Result()
		if err != nil {
			t.Fatal(err)
		}
		if c > 0 {
			exists = true
		}
		n += c
	}
	if !exists {
		return -1
	}
	return int(n)
}

// checkIndexExact fails unless index name holds exactly what it must for
// the workers in idx:lifetime: every ring position, one fair-share entry
// (idle or busy, busy ones also in fair_end), one idx:iwrr entry.
func checkIndexExact(t testing.TB, r *Registry, pool, name string) {
	t.Helper()
	ctx := context.Background()
	lf, err := r.rdb.ZRange(ctx, r.Key(pool, keyIdxLifetime), 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	zr := func(k string) []string {
		v, err := r.rdb.ZRange(ctx, r.Key(pool, k), 0, -1).Result()
		if err != nil {
			t.Fatal(err)
		}
		return sorted(v)
	}
	var want, got []string
	switch name {
	case "ring":
		for _, id := range lf {
			pos, _ := r.rdb.HGet(ctx, r.Key(pool, keyVnodes), id).Result()
			for _, p := range strings.Fields(pos) {
				want = append(want, p+":"+id)
			}
		}
		got = zr(keyIdxRing)
	case "iwrr":
		for _, id := range lf {
			w, _ := r.rdb.HGet(ctx, r.Key(pool, keyIWRR), id).Int()
			want = append(want, fmt.Sprintf("%06d:%s", max(w, 1), id))
		}
		got = zr(keyIdxIWRR)
	case "fair":
		want = append(want, lf...)
		idle, busy, end := zr(keyIdxIdle), zr(keyIdxBusy), zr(keyIdxEnd)
		got = append(append(got, idle...), busy...)
		if !slices.Equal(busy, end) {
			t.Fatalf("fair_busy %d members, fair_end %d: not the same workers", len(busy), len(end))
		}
	}
	if want, got = sorted(want), sorted(got); !slices.Equal(want, got) {
		t.Fatalf("index %s of pool %s: %d members, want %d (first differences: %v)", name, pool, len(got), len(want),
			firstDiff(want, got))
	}
}

func firstDiff(want, got []string) string {
	w, g := map[string]bool{}, map[string]bool{}
	for _, x := range want {
		w[x] = true
	}
	for _, x := range got {
		g[x] = true
	}
	var out []string
	for _, x := range want {
		if !g[x] && len(out) < 3 {
			out = append(out, "missing "+x)
		}
	}
	for _, x := range got {
		if !w[x] && len(out) < 6 {
			out = append(out, "extra "+x)
		}
	}
	return strings.Join(out, ", ")
}

// A pool claimed with lifetime_first keeps no ring, no fair-share sets and
// no idx:iwrr: its first claim drops them (every version before kept them
// all, and so does a pool no claim has settled), and nothing brings them
// back, not releases, registrations, heartbeats nor the reaper's
// Reconcile.
func TestLifetimeFirstKeepsOnlyItsIndex(t *testing.T) {
	ctx := context.Background()
	r, _ := startRegistry(t, Options{})
	for i := range 12 {
		register(t, r, "p", fmt.Sprintf("w%02d", i), 3)
	}
	for _, o := range optKeys {
		if keptMembers(t, r, "p", o.name) <= 0 {
			t.Fatalf("before any claim the pool keeps every index (as older versions did): %s is empty", o.name)
		}
	}
	req := ClaimRequest{Pool: "p", Policy: LifetimeFirst}
	var held []*Claim
	for range 30 {
		c, err := r.Claim(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if c.IndexBuilding {
			t.Fatal("a lifetime_first claim reported an index being built")
		}
		held = append(held, c)
	}
	for _, c := range held[:20] {
		if err := r.Release(ctx, "p", c.LeaseID); err != nil {
			t.Fatal(err)
		}
	}
	register(t, r, "p", "late", 2)
	if _, err := r.Heartbeat(ctx, "p", "w03", time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Reconcile(ctx, "p"); err != nil {
		t.Fatal(err)
	}
	for _, o := range optKeys {
		if n := keptMembers(t, r, "p", o.name); n != -1 {
			t.Errorf("index %s of a lifetime_first pool holds %d members, want none", o.name, n)
		}
		if v, _ := r.rdb.HGet(ctx, r.Key("p", keyConfig), "ix:"+o.name).Result(); v != "" {
			t.Errorf("config ix:%s = %q, want unset", o.name, v)
		}
	}
	// A Pick with another policy writes nothing and chooses as
	// lifetime_first (what a claim would do while it builds the index).
	lf, _, err := r.Pick(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range optKeys {
		w, _, err := r.Pick(ctx, ClaimRequest{Pool: "p", Policy: o.policy})
		if err != nil || w.ID != lf.ID {
			t.Fatalf("Pick %s on a pool that keeps no %s: %s %v, want lifetime_first's %s", o.policy, o.name, w.ID, err, lf.ID)
		}
		if n := keptMembers(t, r, "p", o.name); n != -1 {
			t.Fatalf("a Pick %s wrote index %s (%d members)", o.policy, o.name, n)
		}
	}
}

// On a live pool larger than one build step, a policy's index is built
// over a few claims while sessions start and end, workers register and
// leave: until it is complete its claims choose as lifetime_first does
// and say so, and once complete it holds exactly the indexed workers and
// stays complete.
func TestIndexBuiltInStepsOnALivePool(t *testing.T) {
	ctx := context.Background()
	r, _ := startRegistry(t, Options{NoStaleExpiry: true})
	const n = 2200
	for i := range n {
		if err := r.Register(ctx, Registration{Pool: "p", ID: fmt.Sprintf("w%04d", i), Addr: "127.0.0.1:1",
			Capacity: 2, Weight: 1 + i%3, TTL: time.Hour}); err != nil {
			t.Fatal(err)
		}
	}
	lfReq := ClaimRequest{Pool: "p", Policy: LifetimeFirst}
	var held []*Claim
	for range 60 {
		c, err := r.Claim(ctx, lfReq)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	for _, o := range optKeys {
		if m := keptMembers(t, r, "p", o.name); m != -1 {
			t.Fatalf("after lifetime_first claims index %s holds %d members", o.name, m)
		}
	}
	extra := 0
	for _, o := range optKeys {
		req := ClaimRequest{Pool: "p", Policy: o.policy}
		building := 0
		for i := 0; ; i++ {
			if i > n/150+3 {
				t.Fatalf("%s: index %s still building after %d claims", o.policy, o.name, i)
			}
			want, _, err := r.Pick(ctx, lfReq)
			if err != nil {
				t.Fatal(err)
			}
			c, err := r.Claim(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, c)
			// churn while the index is built: a session ends (its worker
			// may come back to the indexes), a worker registers, one leaves
			if err := r.Release(ctx, "p", held[0].LeaseID); err != nil {
				t.Fatal(err)
			}
			held = held[1:]
			if err := r.Register(ctx, Registration{Pool: "p", ID: fmt.Sprintf("x%03d", extra), Addr: "127.0.0.1:1",
				Capacity: 2, TTL: time.Hour}); err != nil {
				t.Fatal(err)
			}
			if err := r.Deregister(ctx, "p", fmt.Sprintf("w%04d", 100+extra)); err != nil {
				t.Fatal(err)
			}
			extra++
			if !c.IndexBuilding {
				break
			}
			building++
			if c.Worker.ID != want.ID {
				t.Fatalf("%s claim %d, index building, chose %s; lifetime_first picks %s", o.policy, i, c.Worker.ID, want.ID)
			}
		}
		if building < 2 {
			t.Fatalf("%s: %d claims saw index %s building; a pool of %d workers takes more than one step", o.policy, building, o.name, n)
		}
		t.Logf("%s: index %s built over %d claims", o.policy, o.name, building+1)
		checkIndexExact(t, r, "p", o.name)
		for range 40 {
			c, err := r.Claim(ctx, req)
			if err != nil || c.IndexBuilding {
				t.Fatalf("%s after the build: %v, building %v", o.policy, err, err == nil && c.IndexBuilding)
			}
			if err := r.Release(ctx, "p", c.LeaseID); err != nil {
				t.Fatal(err)
			}
		}
		checkIndexExact(t, r, "p", o.name)
	}
	if _, err := r.Reconcile(ctx, "p"); err != nil {
		t.Fatal(err)
	}
	for _, o := range optKeys {
		checkIndexExact(t, r, "p", o.name)
	}
}

// An index no claim has walked for an hour is dropped by the next claim;
// a claim with its policy at least every 45 minutes keeps it.
func TestUnwalkedIndexIsDroppedAfterAnHour(t *testing.T) {
	ctx := context.Background()
	r, _ := startRegistry(t, Options{NoStaleExpiry: true})
	for i := range 6 {
		if err := r.Register(ctx, Registration{Pool: "p", ID: fmt.Sprintf("w%d", i), Addr: "127.0.0.1:1",
			Capacity: 100, TTL: 6 * time.Hour}); err != nil {
			t.Fatal(err)
		}
	}
	t0 := time.Now()
	claim := func(p Policy, at time.Duration) {
		t.Helper()
		c, err := r.Claim(ctx, ClaimRequest{Pool: "p", Policy: p, Now: t0.Add(at), LeaseTTL: 8 * time.Hour})
		if err != nil {
			t.Fatalf("%s at +%s: %v", p, at, err)
		}
		if c.IndexBuilding {
			t.Fatalf("%s at +%s: building an index of 6 workers took more than one claim", p, at)
		}
	}
	kept := func(at time.Duration, want bool) {
		t.Helper()
		if got := keptMembers(t, r, "p", "ring") > 0; got != want {
			t.Fatalf("at +%s: ring kept %v, want %v", at, got, want)
		}
	}
	claim(Vnode, 0)
	kept(0, true)
	claim(LifetimeFirst, 50*time.Minute)
	kept(50*time.Minute, true)
	claim(Vnode, 55*time.Minute)
	claim(LifetimeFirst, 100*time.Minute)
	kept(100*time.Minute, true)
	claim(LifetimeFirst, 116*time.Minute)
	kept(116*time.Minute, false)
	if v, _ := r.rdb.HGet(ctx, r.Key("p", keyConfig), "ix:ring").Result(); v != "" {
		t.Fatalf("config ix:ring = %q after the drop, want unset", v)
	}
	claim(Vnode, 117*time.Minute)
	kept(117*time.Minute, true)
	checkIndexExact(t, r, "p", "ring")
}

// What a Redis writer puts in the config's ix:<name> fields (a cursor
// Redis refuses, no time, nonsense) makes the next claim build the index
// again from the start: no claim fails, and the index ends exact.
func TestBadKeptIndexStateIsRebuilt(t *testing.T) {
	ctx := context.Background()
	r, _ := startRegistry(t, Options{})
	for i := range 300 {
		register(t, r, "p", fmt.Sprintf("w%03d", i), 4)
	}
	if _, err := r.Claim(ctx, ClaimRequest{Pool: "p", Policy: LifetimeFirst}); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"b99999999999999999999999999 1", "b18446744073709551615 1", "on", "zzz", "b-1 5", "on 1e9", ""} {
		for _, o := range optKeys {
			if err := r.rdb.HSet(ctx, r.Key("p", keyConfig), "ix:"+o.name, bad).Err(); err != nil {
				t.Fatal(err)
			}
			done := false
			for range 6 {
				c, err := r.Claim(ctx, ClaimRequest{Pool: "p", Policy: o.policy})
				if err != nil {
					t.Fatalf("ix:%s = %q: claim %s: %v", o.name, bad, o.policy, err)
				}
				if err := r.Release(ctx, "p", c.LeaseID); err != nil {
					t.Fatal(err)
				}
				if !c.IndexBuilding {
					done = true
					break
				}
			}
			if !done {
				t.Fatalf("ix:%s = %q: index not complete after 6 claims", o.name, bad)
			}
			checkIndexExact(t, r, "p", o.name)
		}
	}
}

// The config hash is the pool's, the indexes each version group's: which
// indexes a group keeps is its own. A group claimed with lifetime_first
// and another claimed with vnode each keep their own, and a vnode claim
// in the first builds that group's ring rather than trusting the other's.
func TestVersionGroupsKeepTheirOwnIndexes(t *testing.T) {
	ctx := context.Background()
	r, _ := startRegistry(t, Options{})
	p64, p65 := GroupPool("p", "1.64"), GroupPool("p", "1.65")
	for i := range 5 {
		register(t, r, p64, fmt.Sprintf("a%d", i), 4)
		register(t, r, p65, fmt.Sprintf("b%d", i), 4)
		register(t, r, "p", fmt.Sprintf("c%d", i), 4)
	}
	claim := func(pool string, p Policy) {
		t.Helper()
		c, err := r.Claim(ctx, ClaimRequest{Pool: pool, Policy: p})
		if err != nil || c.IndexBuilding {
			t.Fatalf("%s in %s: %v (building %v)", p, pool, err, err == nil && c.IndexBuilding)
		}
	}
	claim(p65, LifetimeFirst)
	claim(p64, Vnode)
	claim("p", FairShare)
	if keptMembers(t, r, p65, "ring") != -1 || keptMembers(t, r, "p", "ring") != -1 {
		t.Fatal("a group claimed with lifetime_first, or the pool claimed with fair_share, keeps a ring")
	}
	checkIndexExact(t, r, p64, "ring")
	checkIndexExact(t, r, "p", "fair")
	claim(p65, Vnode)
	claim(p65, Vnode)
	checkIndexExact(t, r, p65, "ring")
	checkIndexExact(t, r, p64, "ring")
	if keptMembers(t, r, p64, "fair") != -1 || keptMembers(t, r, p65, "iwrr") != -1 {
		t.Fatal("a group keeps an index no claim in it walks")
	}
}

// Inspect says which optional indexes a pool and its version groups keep,
// and in which state: every one ("kept") before a claim settled the pool,
// none on a lifetime_first pool, "building" then "complete" for a policy
// that starts on a live pool.
func TestInspectReportsKeptIndexes(t *testing.T) {
	ctx := context.Background()
	r, _ := startRegistry(t, Options{})
	g := GroupPool("p", "1.65")
	for i := range 600 {
		register(t, r, "p", fmt.Sprintf("w%03d", i), 4)
	}
	register(t, r, g, "v1", 4)
	states := func() string {
		t.Helper()
		info, _, _, err := r.InspectGroups(ctx, "p")
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, ix := range info.Indexes {
			out = append(out, fmt.Sprintf("%s %s %s %s", ix.Pool, ix.Name, ix.Policy, ix.State))
			if ix.State != "kept" && ix.LastWalked.IsZero() {
				t.Fatalf("%s %s: %s without a last walk", ix.Pool, ix.Name, ix.State)
			}
		}
		return strings.Join(out, "; ")
	}
	want := "p ring vnode kept; p fair fair_share kept; p iwrr interleaved_weighted_round_robin kept; " +
		"p@1.65 ring vnode kept; p@1.65 fair fair_share kept; p@1.65 iwrr interleaved_weighted_round_robin kept"
	if got := states(); got != want {
		t.Fatalf("before any claim: %q, want %q", got, want)
	}
	if _, err := r.Claim(ctx, ClaimRequest{Pool: "p", Policy: LifetimeFirst}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Claim(ctx, ClaimRequest{Pool: g, Policy: FairShare}); err != nil {
		t.Fatal(err)
	}
	if got, want := states(), "p@1.65 fair fair_share complete"; got != want {
		t.Fatalf("after a lifetime_first claim in p and a fair_share claim in p@1.65: %q, want %q", got, want)
	}
	if c, err := r.Claim(ctx, ClaimRequest{Pool: "p", Policy: Vnode}); err != nil || !c.IndexBuilding {
		t.Fatalf("first vnode claim on 600 workers: %v, want its ring building", err)
	}
	if got, want := states(), "p ring vnode building; p@1.65 fair fair_share complete"; got != want {
		t.Fatalf("while the ring is built: %q, want %q", got, want)
	}
	for range 6 {
		if _, err := r.Claim(ctx, ClaimRequest{Pool: "p", Policy: Vnode}); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := states(), "p ring vnode complete; p@1.65 fair fair_share complete"; got != want {
		t.Fatalf("once built: %q, want %q", got, want)
	}
}

// The policy table's index (what Inspect reports) is the one the walk
// declares it reads (WALK_INDEX, what claims keep and build).
func TestPolicyTableNamesTheWalkIndex(t *testing.T) {
	for _, p := range Policies() {
		decl := "WALK_INDEX." + string(p.Name) + " = "
		has := strings.Contains(p.walk, decl)
		switch {
		case p.index == "" && has:
			t.Errorf("%s: its walk declares %s… but the table names no index", p.Name, decl)
		case p.index != "" && !strings.Contains(p.walk, decl+"'"+p.index+"'"):
			t.Errorf("%s: the table names index %q, its walk does not declare %s'%s'", p.Name, p.index, decl, p.index)
		}
		if name, _ := optIndex(p.Name); name != p.index {
			t.Errorf("%s: the table names index %q, the tests' optKeys %q", p.Name, p.index, name)
		}
	}
}

// Inspect and InspectGroups give Redis' time of the read, the clock the
// records' heartbeats are in: the reaper picks stale workers by it, and
// the admin API computes heartbeat ages with it.
func TestInspectGivesRedisTime(t *testing.T) {
	ctx := context.Background()
	r, _ := startRegistry(t, Options{})
	register(t, r, "p", "w1", 1)
	register(t, r, GroupPool("p", "1.65"), "v1", 1)
	one, err := r.Inspect(ctx, "p")
	if err != nil {
		t.Fatal(err)
	}
	all, _, _, err := r.InspectGroups(ctx, "p")
	if err != nil {
		t.Fatal(err)
	}
	// the same machine's clock: Redis' time is within a few seconds of it
	for name, now := range map[string]time.Time{"Inspect": one.Now, "InspectGroups": all.Now} {
		if d := time.Since(now); d < -5*time.Second || d > 5*time.Second {
			t.Errorf("%s: Now %v is %v from this machine's clock, want Redis' time of the read", name, now, d)
		}
	}
}
