package registry

// Red-team tests of the kept indexes (lua/common.lua, "Kept indexes"):
// hostile config fields, policy switches under load, version groups,
// limits changed while an index is built, the reaper during a build, a
// Pick on a replica, a failover in the middle of a build. Written by a
// reviewer against the first cut; the four that failed then are fixed
// (their comments say what they caught).

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
	"github.com/browsergrid/caddy-browser-grid/selection"
	"github.com/redis/go-redis/v9"
)

var redisNil = redis.Nil

var redPolicies = []Policy{LifetimeFirst, Vnode, FairShare, InterleavedWeightedRoundRobin}

// redField is the config hash field of index name (” : the 'ix' field)
// for pool or version group.
func redField(pool, name string) string {
	_, ver := SplitGroup(pool)
	f := "ix"
	if ver != "" {
		f = "v=" + ver + ":ix"
	}
	if name != "" {
		f += ":" + name
	}
	return f
}

func redState(t testing.TB, r *Registry, pool, name string) string {
	t.Helper()
	v, err := r.rdb.HGet(context.Background(), r.Key(pool, keyConfig), redField(pool, name)).Result()
	if err != nil && !errors.Is(err, errRedisNil()) {
		t.Fatal(err)
	}
	return v
}

func errRedisNil() error {
	// go-redis' Nil, without importing the package here twice
	return redisNil
}

// redDiff is checkIndexExact without failing: how many entries index name
// misses and how many it has beyond idx:lifetime's workers.
func redDiff(t testing.TB, r *Registry, pool, name string) (missing, extra int) {
	t.Helper()
	ctx := context.Background()
	zr := func(k string) []string {
		v, err := r.rdb.ZRange(ctx, r.Key(pool, k), 0, -1).Result()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	lf := zr(keyIdxLifetime)
	want, got := map[string]int{}, map[string]int{}
	switch name {
	case "ring":
		for _, id := range lf {
			pos, _ := r.rdb.HGet(ctx, r.Key(pool, keyVnodes), id).Result()
			for _, p := range strings.Fields(pos) {
				want[p+":"+id]++
			}
		}
		for _, m := range zr(keyIdxRing) {
			got[m]++
		}
	case "iwrr":
		for _, id := range lf {
			w, _ := r.rdb.HGet(ctx, r.Key(pool, keyIWRR), id).Int()
			want[fmt.Sprintf("%06d:%s", max(w, 1), id)]++
		}
		for _, m := range zr(keyIdxIWRR) {
			got[m]++
		}
	case "fair":
		for _, id := range lf {
			want[id]++
		}
		busy, end := zr(keyIdxBusy), zr(keyIdxEnd)
		for _, m := range zr(keyIdxIdle) {
			got[m]++
		}
		for _, m := range busy {
			got[m]++
		}
		if len(busy) != len(end) {
			extra += abs(len(busy) - len(end))
		}
	}
	for m := range want {
		if got[m] == 0 {
			missing++
		}
	}
	for m, n := range got {
		if want[m] == 0 {
			extra += n
		} else if n > 1 {
			extra += n - 1
		}
	}
	return missing, extra
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

// redAudit checks every optional index of pool: a complete one ('on')
// holds exactly idx:lifetime's workers; a settled pool holds no keys of
// an index it does not keep. It returns what it found wrong.
func redAudit(t testing.TB, r *Registry, pool string) (missing, extra, leaked int, notes []string) {
	t.Helper()
	settled := redState(t, r, pool, "") != ""
	for _, o := range optKeys {
		st := redState(t, r, pool, o.name)
		switch {
		case strings.HasPrefix(st, "on "):
			m, e := redDiff(t, r, pool, o.name)
			if m+e > 0 {
				notes = append(notes, fmt.Sprintf("%s %s (%s): %d missing, %d extra", pool, o.name, st, m, e))
			}
			missing += m
			extra += e
		case st == "" && settled:
			if n := keptMembers(t, r, pool, o.name); n != -1 {
				leaked += n
				notes = append(notes, fmt.Sprintf("%s %s not kept but holds %d members", pool, o.name, n))
			}
		}
	}
	return missing, extra, leaked, notes
}

func redRegister(t testing.TB, r *Registry, pool, id string, capacity, weight int) {
	t.Helper()
	if err := r.Register(context.Background(), Registration{Pool: pool, ID: id, Addr: "127.0.0.1:1",
		Capacity: capacity, Weight: weight, TTL: 100 * time.Hour}); err != nil {
		t.Fatal(err)
	}
}

func effCap(capacity, mc int) int {
	switch {
	case capacity == 0:
		return mc
	case mc == 0:
		return capacity
	}
	return min(capacity, mc)
}

// Policy switches back and forth under load, on the pool and a version
// group of it, by several "Caddy configurations" with different limits
// (lowered and raised while an index is being built), with sessions
// starting and ending, workers registering, leaving and heartbeating, the
// reaper's Reconcile and Picks in between. After every operation each
// complete index must hold exactly idx:lifetime's workers and an index
// not kept must have no keys; no claim may error or over-admit; a claim
// made while its index is built must choose as lifetime_first (a Pick
// with the same limits just before it).
func TestRedChurnPolicyFlipFlop(t *testing.T) {
	ctx := context.Background()
	r, _ := startRegistry(t, Options{NoStaleExpiry: true})
	rng := rand.New(rand.NewPCG(7, 11))
	pools := []string{"p", GroupPool("p", "1.65")}
	caps := map[string]int{}
	var ids []string
	next := 0
	add := func(pool string) {
		id := fmt.Sprintf("w%05d", next)
		next++
		c := 1 + rng.IntN(4)
		redRegister(t, r, pool, id, c, 1+rng.IntN(5))
		caps[pool+"/"+id] = c
		ids = append(ids, pool+"/"+id)
	}
	for range 650 {
		add("p")
	}
	for range 300 {
		add(pools[1])
	}
	type held struct{ pool, lease string }
	var leases []held
	stats := map[string]int{}
	var first []string
	mcs := []int{0, 1, 2, 3}
	const ops = 250
	for i := range ops {
		pool := pools[rng.IntN(2)]
		switch k := rng.IntN(100); {
		case k < 45:
			p := redPolicies[rng.IntN(len(redPolicies))]
			lim := selection.Limits{MaxConcurrent: mcs[rng.IntN(len(mcs))]}
			req := ClaimRequest{Pool: pool, Policy: p, Limits: lim, LeaseTTL: 100 * time.Hour}
			want, _, perr := r.Pick(ctx, ClaimRequest{Pool: pool, Policy: LifetimeFirst, Limits: lim})
			c, err := r.Claim(ctx, req)
			stats["claims"]++
			var nw *NoWorkerError
			switch {
			case errors.As(err, &nw):
				stats["no_worker"]++
				if nw.IndexBuilding {
					stats["building"]++
					if perr == nil {
						stats["building_mismatch"]++
						first = append(first, fmt.Sprintf("op %d %s %s: none while building, lifetime_first picks %s", i, pool, p, want.ID))
					}
				}
			case err != nil:
				stats["claim_errors"]++
				first = append(first, fmt.Sprintf("op %d %s %s: %v", i, pool, p, err))
			default:
				leases = append(leases, held{pool, c.LeaseID})
				if c.IndexBuilding {
					stats["building"]++
					if perr != nil || c.Worker.ID != want.ID {
						stats["building_mismatch"]++
						first = append(first, fmt.Sprintf("op %d %s %s: chose %s while building, lifetime_first picks %s (%v)", i, pool, p, c.Worker.ID, want.ID, perr))
					}
				}
				if ec := effCap(caps[pool+"/"+c.Worker.ID], c.PoolLimits.MaxConcurrent); ec > 0 && c.Worker.Active > ec {
					stats["over_admitted"]++
					first = append(first, fmt.Sprintf("op %d %s %s: %s has %d sessions, cap %d", i, pool, p, c.Worker.ID, c.Worker.Active, ec))
				}
			}
		case k < 70 && len(leases) > 0:
			j := rng.IntN(len(leases))
			if err := r.Release(ctx, leases[j].pool, leases[j].lease); err != nil {
				t.Fatal(err)
			}
			leases = append(leases[:j], leases[j+1:]...)
		case k < 78:
			add(pool)
		case k < 86:
			j := rng.IntN(len(ids))
			pl, id, _ := strings.Cut(ids[j], "/")
			if err := r.Deregister(ctx, pl, id); err != nil {
				t.Fatal(err)
			}
			ids = append(ids[:j], ids[j+1:]...)
		case k < 90:
			if _, err := r.Reconcile(ctx, pool); err != nil {
				stats["reconcile_errors"]++
				first = append(first, fmt.Sprintf("op %d reconcile %s: %v", i, pool, err))
			}
		case k < 95:
			p := redPolicies[rng.IntN(len(redPolicies))]
			if _, _, err := r.Pick(ctx, ClaimRequest{Pool: pool, Policy: p}); err != nil && !errors.Is(err, ErrNoWorker) {
				stats["pick_errors"]++
				first = append(first, fmt.Sprintf("op %d pick %s %s: %v", i, pool, p, err))
			}
		default:
			j := rng.IntN(len(ids))
			pl, id, _ := strings.Cut(ids[j], "/")
			if _, err := r.Heartbeat(ctx, pl, id, 100*time.Hour); err != nil {
				t.Fatal(err)
			}
		}
		for _, pl := range pools {
			m, e, l, notes := redAudit(t, r, pl)
			stats["missing"] += m
			stats["extra"] += e
			stats["leaked"] += l
			if len(first) < 12 {
				for _, n := range notes {
					first = append(first, fmt.Sprintf("after op %d: %s", i, n))
				}
			}
		}
	}
	t.Logf("%d ops: %v", ops, stats)
	for _, pl := range pools {
		for _, o := range optKeys {
			t.Logf("%s ix:%s = %q", pl, o.name, redState(t, r, pl, o.name))
		}
	}
	if stats["claim_errors"]+stats["reconcile_errors"]+stats["pick_errors"]+stats["over_admitted"]+
		stats["building_mismatch"]+stats["missing"]+stats["extra"]+stats["leaked"] > 0 {
		t.Fatalf("broken: %v\nfirst: %s", stats, strings.Join(first[:min(len(first), 12)], "\n"))
	}
}

// The same over simulated hours (ClaimRequest.Now): claims with
// different policies minutes to an hour apart, so that indexes are
// dropped, rebuilt, dropped while being built, and refreshed, with
// churn in between.
func TestRedRetentionFlipFlop(t *testing.T) {
	ctx := context.Background()
	r, _ := startRegistry(t, Options{NoStaleExpiry: true})
	rng := rand.New(rand.NewPCG(5, 3))
	for i := range 600 {
		redRegister(t, r, "p", fmt.Sprintf("w%04d", i), 2, 1+i%4)
	}
	at := time.Now()
	var leases []string
	stats := map[string]int{}
	var first []string
	for i := range 200 {
		at = at.Add(time.Duration(rng.IntN(50)) * time.Minute / time.Duration(1+rng.IntN(8)))
		p := redPolicies[rng.IntN(len(redPolicies))]
		want, _, perr := r.Pick(ctx, ClaimRequest{Pool: "p", Policy: LifetimeFirst, Now: at})
		c, err := r.Claim(ctx, ClaimRequest{Pool: "p", Policy: p, Now: at, LeaseTTL: 10000 * time.Hour})
		stats["claims"]++
		if err == nil && c.IndexBuilding && (perr != nil || want.ID != c.Worker.ID) {
			stats["building_mismatch"]++
			first = append(first, fmt.Sprintf("claim %d %s: chose %s while building, lifetime_first %s %v", i, p, c.Worker.ID, want.ID, perr))
		}
		if err != nil && !errors.Is(err, ErrNoWorker) {
			stats["claim_errors"]++
			first = append(first, fmt.Sprintf("claim %d %s: %v", i, p, err))
		} else if err == nil {
			leases = append(leases, c.LeaseID)
			if c.IndexBuilding {
				stats["building"]++
			}
		}
		if len(leases) > 0 && rng.IntN(3) > 0 {
			j := rng.IntN(len(leases))
			if err := r.Release(ctx, "p", leases[j]); err != nil {
				t.Fatal(err)
			}
			leases = append(leases[:j], leases[j+1:]...)
		}
		if rng.IntN(4) == 0 {
			redRegister(t, r, "p", fmt.Sprintf("x%04d", i), 2, 3)
			if err := r.Deregister(ctx, "p", fmt.Sprintf("w%04d", rng.IntN(600))); err != nil {
				t.Fatal(err)
			}
		}
		m, e, l, notes := redAudit(t, r, "p")
		stats["missing"] += m
		stats["extra"] += e
		stats["leaked"] += l
		if len(first) < 12 {
			for _, n := range notes {
				first = append(first, fmt.Sprintf("after claim %d (%s): %s", i, p, n))
			}
		}
	}
	t.Logf("%v (simulated %s)", stats, time.Until(at).Round(time.Minute))
	if stats["claim_errors"]+stats["missing"]+stats["extra"]+stats["leaked"]+stats["building_mismatch"] > 0 {
		t.Fatalf("broken: %v\nfirst: %s", stats, strings.Join(first[:min(len(first), 12)], "\n"))
	}
}

// Hostile values in the config hash's kept-index fields (and the 'ix'
// field itself, and a version group's): no claim, Pick, release,
// registration or Reconcile errors, and within a few claims every index
// a policy walks is complete and exact. Values a parser may choke on:
// huge numbers, negative, floats, whitespace, control bytes, a megabyte.
func TestRedHostileConfigFields(t *testing.T) {
	ctx := context.Background()
	r, _ := startRegistry(t, Options{NoStaleExpiry: true})
	g := GroupPool("p", "1.7")
	for i := range 300 {
		redRegister(t, r, "p", fmt.Sprintf("w%03d", i), 3, 1+i%3)
		if i < 40 {
			redRegister(t, r, g, fmt.Sprintf("g%03d", i), 3, 2)
		}
	}
	bad := []string{
		"", "on", "on ", " on 1", "on 1 ", "on\n1", "on 1\n", "ON 1", "on -1", "on 1.5", "on 1e300",
		"on " + strings.Repeat("9", 400), "b 1", "b0", "b-0 1", "b0x10 1", "b1.5 1", "b 1 1", "b\x00 1",
		"b" + strings.Repeat("9", 400) + " 1", "b1 " + strings.Repeat("9", 400), "\xff\xfe", "nan",
		strings.Repeat("x", 1<<20), "b0 -5", "b0 0", "on 0",
	}
	stats := map[string]int{}
	var first []string
	note := func(f string, a ...any) {
		if len(first) < 12 {
			first = append(first, fmt.Sprintf(f, a...))
		}
	}
	for _, pool := range []string{"p", g} {
		for bi, v := range bad {
			for _, name := range []string{"", "ring", "fair", "iwrr"} {
				if err := r.rdb.HSet(ctx, r.Key(pool, keyConfig), redField(pool, name), v).Err(); err != nil {
					t.Fatal(err)
				}
				for _, p := range redPolicies {
					if _, _, err := r.Pick(ctx, ClaimRequest{Pool: pool, Policy: p}); err != nil {
						stats["pick_errors"]++
						note("%s %s=%.20q Pick %s: %v", pool, name, v, p, err)
					}
					for range 4 {
						c, err := r.Claim(ctx, ClaimRequest{Pool: pool, Policy: p})
						stats["claims"]++
						if err != nil {
							stats["claim_errors"]++
							note("%s %s=%.20q claim %s: %v", pool, name, v, p, err)
							break
						}
						if err := r.Release(ctx, pool, c.LeaseID); err != nil {
							stats["release_errors"]++
							note("release: %v", err)
						}
						if !c.IndexBuilding {
							break
						}
					}
				}
				if bi%5 == 0 {
					if _, err := r.Reconcile(ctx, pool); err != nil {
						stats["reconcile_errors"]++
						note("%s %s=%.20q Reconcile: %v", pool, name, v, err)
					}
					if _, err := r.Heartbeat(ctx, pool, map[string]string{"p": "w001", g: "g001"}[pool], time.Hour); err != nil {
						stats["heartbeat_errors"]++
						note("heartbeat: %v", err)
					}
				}
				m, e, _, notes := redAudit(t, r, pool)
				stats["missing"] += m
				stats["extra"] += e
				for _, n := range notes {
					note("%s=%.20q: %s", name, v, n)
				}
			}
		}
	}
	t.Logf("%d values × 4 fields × 2 pools: %v", len(bad), stats)
	if stats["claims"] == 0 || len(first) > 0 {
		t.Fatalf("broken: %v\nfirst: %s", stats, strings.Join(first, "\n"))
	}
}

// A well-formed but false 'ix:<name>' value. A cursor that is not this
// build's (no server id) and a deleted 'ix' in the middle of a build are
// caught: the build starts again, and the next claims find every worker.
// 'on <ms>' written on a pool that keeps no ring is trusted (checking it
// would cost every claim): vnode claims find no worker until the
// reaper's Reconcile, which repairs the ring of a pool whose config says
// it is kept (docs/redis.md, "Kept indexes"). The first cut trusted all
// three.
func TestRedPlausibleHandEditIsTrusted(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		name string
		edit func(r *Registry)
	}{
		{"on-without-index", func(r *Registry) {
			r.rdb.HSet(ctx, r.Key("p", keyConfig), "ix:ring", fmt.Sprintf("on %d", time.Now().UnixMilli()))
		}},
		{"foreign-cursor", func(r *Registry) {
			// a cursor a ZSCAN of this idx:lifetime returns midway
			cur := uint64(0)
			for range 3 {
				_, c, err := r.rdb.ZScan(ctx, r.Key("p", keyIdxLifetime), cur, "", 128).Result()
				if err != nil {
					panic(err)
				}
				cur = c
			}
			r.rdb.HSet(ctx, r.Key("p", keyConfig), "ix:ring", fmt.Sprintf("b%d %d", cur, time.Now().UnixMilli()))
		}},
		{"ix-deleted-mid-build", func(r *Registry) {
			if c, err := r.Claim(ctx, ClaimRequest{Pool: "p", Policy: Vnode}); err != nil || !c.IndexBuilding {
				panic(fmt.Sprint("want a building claim: ", err))
			}
			r.rdb.HDel(ctx, r.Key("p", keyConfig), "ix")
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r, _ := startRegistry(t, Options{NoStaleExpiry: true})
			for i := range 800 {
				redRegister(t, r, "p", fmt.Sprintf("w%04d", i), 2, 1)
			}
			if _, err := r.Claim(ctx, ClaimRequest{Pool: "p", Policy: LifetimeFirst}); err != nil {
				t.Fatal(err)
			}
			tc.edit(r)
			none := 0
			for range 20 {
				c, err := r.Claim(ctx, ClaimRequest{Pool: "p", Policy: Vnode})
				if errors.Is(err, ErrNoWorker) {
					none++
					continue
				}
				if err != nil {
					t.Fatal(err)
				}
				if err := r.Release(ctx, "p", c.LeaseID); err != nil {
					t.Fatal(err)
				}
			}
			m, e := redDiff(t, r, "p", "ring")
			if _, err := r.Reconcile(ctx, "p"); err != nil {
				t.Fatal(err)
			}
			m2, e2 := redDiff(t, r, "p", "ring")
			t.Logf("ix:ring = %q; %d of 20 vnode claims found no worker in a pool of 800 idle ones; ring misses %d entries, %d extra (after a Reconcile: %d, %d)",
				redState(t, r, "p", "ring"), none, m, e, m2, e2)
			if tc.name == "on-without-index" {
				// trusted until the reaper passes; Reconcile repairs it
				if m2 > 0 || e2 > 0 {
					t.Fatalf("Reconcile left the ring of a pool that keeps it wrong")
				}
				return
			}
			if none > 0 || m > 0 || e > 0 {
				t.Fatalf("a plausible but false ix:ring was trusted")
			}
		})
	}
}

// Index keys written while the pool does not keep that index (older
// versions' scripts, still running during an upgrade, write every index)
// are cleared: every 15 minutes a claim UNLINKs the keys of the indexes
// the pool does not keep. Simulated by writing what an older heartbeat
// writes (ring positions, iwrr member, a fair_idle entry) for every
// worker, then claiming over simulated hours. The first cut kept them
// for ever.
func TestRedUnkeptIndexWrittenByOlderVersionNeverDropped(t *testing.T) {
	ctx := context.Background()
	r, _ := startRegistry(t, Options{NoStaleExpiry: true})
	for i := range 50 {
		redRegister(t, r, "p", fmt.Sprintf("w%02d", i), 2, 1)
	}
	t0 := time.Now()
	if _, err := r.Claim(ctx, ClaimRequest{Pool: "p", Policy: LifetimeFirst, Now: t0, LeaseTTL: 10 * time.Hour}); err != nil {
		t.Fatal(err)
	}
	lf, _ := r.rdb.ZRange(ctx, r.Key("p", keyIdxLifetime), 0, -1).Result()
	for _, id := range lf {
		pos, _ := r.rdb.HGet(ctx, r.Key("p", keyVnodes), id).Result()
		for _, p := range strings.Fields(pos) {
			r.rdb.ZAdd(ctx, r.Key("p", keyIdxRing), redisZ(0, p+":"+id))
		}
		r.rdb.ZAdd(ctx, r.Key("p", keyIdxIWRR), redisZ(0, "000001:"+id))
		r.rdb.ZAdd(ctx, r.Key("p", keyIdxIdle), redisZ(30000, id))
	}
	for m := 0; m <= 180; m += 10 {
		if _, err := r.Claim(ctx, ClaimRequest{Pool: "p", Policy: LifetimeFirst, Now: t0.Add(time.Duration(m) * time.Minute),
			LeaseTTL: 10 * time.Hour}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := r.Reconcile(ctx, "p"); err != nil {
		t.Fatal(err)
	}
	_, _, leaked, notes := redAudit(t, r, "p")
	t.Logf("after 3 simulated hours of lifetime_first claims and a Reconcile: %d entries of unkept indexes: %v", leaked, notes)
	if leaked > 0 {
		t.Fatal("index keys the pool does not keep are never dropped")
	}
}

// A build that spans idx:lifetime's key being deleted (every worker
// full) and re-created (sessions end: it comes back as a listpack and is
// converted to a skiplist with a new hash table) while the stored cursor
// is the old table's; meanwhile limits are lowered then raised and the
// reaper reconciles. The completed index must be exact.
func TestRedBuildAcrossLifetimeKeyRecreated(t *testing.T) {
	ctx := context.Background()
	for _, o := range optKeys {
		t.Run(o.name, func(t *testing.T) {
			r, _ := startRegistry(t, Options{NoStaleExpiry: true})
			const n = 2500
			for i := range n {
				redRegister(t, r, "p", fmt.Sprintf("w%04d", i), 1, 1+i%3)
			}
			if _, err := r.Claim(ctx, ClaimRequest{Pool: "p", Policy: LifetimeFirst, LeaseTTL: time.Hour}); err != nil {
				t.Fatal(err)
			}
			// two steps of the build
			var leases []string
			for range 2 {
				c, err := r.Claim(ctx, ClaimRequest{Pool: "p", Policy: o.policy, LeaseTTL: time.Hour})
				if err != nil || !c.IndexBuilding {
					t.Fatalf("want a building claim: %v", err)
				}
				leases = append(leases, c.LeaseID)
			}
			t.Logf("ix:%s = %q mid-build", o.name, redState(t, r, "p", o.name))
			// fill every worker: idx:lifetime goes (lifetime_first claims)
			for {
				c, err := r.Claim(ctx, ClaimRequest{Pool: "p", Policy: LifetimeFirst, LeaseTTL: time.Hour})
				if errors.Is(err, ErrNoWorker) {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
				leases = append(leases, c.LeaseID)
			}
			if x, _ := r.rdb.Exists(ctx, r.Key("p", keyIdxLifetime)).Result(); x != 0 {
				t.Fatalf("idx:lifetime still exists with every worker full")
			}
			// sessions end in another order than they started
			rng := rand.New(rand.NewPCG(1, 2))
			rng.Shuffle(len(leases), func(i, j int) { leases[i], leases[j] = leases[j], leases[i] })
			for _, l := range leases {
				if err := r.Release(ctx, "p", l); err != nil {
					t.Fatal(err)
				}
			}
			enc, _ := r.rdb.ObjectEncoding(ctx, r.Key("p", keyIdxLifetime)).Result()
			t.Logf("idx:lifetime re-created (%s)", enc)
			// limits lowered to 0 sessions? no: MaxConcurrent 1 = capacity; lower MaxLifetime instead, then lift it
			for i := 0; ; i++ {
				lim := selection.Limits{}
				if i%3 == 1 {
					lim.MaxLifetime = 3
				}
				c, err := r.Claim(ctx, ClaimRequest{Pool: "p", Policy: o.policy, Limits: lim, LeaseTTL: time.Hour})
				if err != nil {
					t.Fatal(err)
				}
				if err := r.Release(ctx, "p", c.LeaseID); err != nil {
					t.Fatal(err)
				}
				if i%4 == 0 {
					if _, err := r.Reconcile(ctx, "p"); err != nil {
						t.Fatal(err)
					}
				}
				if !c.IndexBuilding {
					break
				}
				if i > 20 {
					t.Fatal("still building after 20 claims")
				}
			}
			m, e := redDiff(t, r, "p", o.name)
			if m+e > 0 {
				t.Fatalf("index %s complete (%q) but %d missing, %d extra", o.name, redState(t, r, "p", o.name), m, e)
			}
		})
	}
}

// A Pick on a read-only replica while the index is half built (and on
// one that keeps none): no error, and it chooses as lifetime_first.
func TestRedPickOnReplicaDuringBuild(t *testing.T) {
	ctx := context.Background()
	r, _ := startRegistry(t, Options{NoStaleExpiry: true})
	for i := range 700 {
		redRegister(t, r, "p", fmt.Sprintf("w%04d", i), 2, 1+i%3)
	}
	if _, err := r.Claim(ctx, ClaimRequest{Pool: "p", Policy: LifetimeFirst}); err != nil {
		t.Fatal(err)
	}
	if c, err := r.Claim(ctx, ClaimRequest{Pool: "p", Policy: Vnode}); err != nil || !c.IndexBuilding {
		t.Fatalf("want a building vnode claim: %v", err)
	}
	ro, rc := startReplica(t, r)
	want := redState(t, r, "p", "ring")
	testenv.Eventually(t, 60*time.Second, "the replica to hold the build state", func() bool {
		v, _ := rc.HGet(ctx, ro.Key("p", keyConfig), "ix:ring").Result()
		return v == want
	})
	lf, _, err := r.Pick(ctx, ClaimRequest{Pool: "p", Policy: LifetimeFirst})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range redPolicies {
		w, _, err := ro.Pick(ctx, ClaimRequest{Pool: "p", Policy: p})
		if err != nil {
			t.Fatalf("%s: Pick on a replica mid-build: %v", p, err)
		}
		if p != LifetimeFirst && w.ID != lf.ID {
			t.Fatalf("%s: Pick on a replica mid-build chose %s, lifetime_first %s", p, w.ID, lf.ID)
		}
	}
}

// While vnode's ring is built, a vnode claim walks idx:lifetime as
// lifetime_first does, with lifetime_first's scan budget (DefaultMaxScan
// or the request's own MaxScan), not vnode's (16): with more than 16
// unusable workers (suspect here) at the head of idx:lifetime the first
// cut reported no worker where lifetime_first chooses one.
func TestRedBuildingClaimKeepsVnodeScanBudget(t *testing.T) {
	ctx := context.Background()
	r, _ := startRegistry(t, Options{NoStaleExpiry: true})
	now := time.Now()
	suspectHead(t, r, now)
	refused, building := 0, 0
	for range 6 {
		want, _, err := r.Pick(ctx, ClaimRequest{Pool: "p", Policy: LifetimeFirst, Now: now})
		if err != nil {
			t.Fatal(err)
		}
		c, err := r.Claim(ctx, ClaimRequest{Pool: "p", Policy: Vnode, Now: now, LeaseTTL: time.Hour})
		var nw *NoWorkerError
		switch {
		case errors.As(err, &nw):
			if nw.IndexBuilding {
				building++
				refused++
				t.Logf("vnode claim, ring building: no worker; lifetime_first chooses %s", want.ID)
			}
		case err != nil:
			t.Fatal(err)
		case c.IndexBuilding:
			building++
			if c.Worker.ID != want.ID {
				t.Errorf("building claim chose %s, lifetime_first %s", c.Worker.ID, want.ID)
			}
		}
	}
	t.Logf("%d building claims, %d refused", building, refused)
	if refused > 0 {
		t.Fatalf("%d vnode claims made while the ring was built found no worker where lifetime_first finds one", refused)
	}
}

// A build's ZSCAN cursor means something only to the Redis process that
// returned it (SCAN's guarantee holds within one server's hash table,
// whose order depends on its random hash seed). After a failover in the
// middle of a build, the first cut resumed the new master's table at the
// old cursor and marked the index complete without the workers before it
// (17-20 % of them). The state now names the server ('b<cursor>@<run_id>')
// and a build on another server starts again from the start. Reconcile
// also checks fair-share membership now.
func TestRedBuildResumedAfterFailover(t *testing.T) {
	ctx := context.Background()
	r, _ := startRegistry(t, Options{NoStaleExpiry: true})
	const n = 5000
	for i := range n {
		redRegister(t, r, "p", fmt.Sprintf("w%04d", i), 2, 1+i%3)
	}
	if _, err := r.Claim(ctx, ClaimRequest{Pool: "p", Policy: LifetimeFirst}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []Policy{Vnode, InterleavedWeightedRoundRobin, FairShare} {
		for range 3 {
			if c, err := r.Claim(ctx, ClaimRequest{Pool: "p", Policy: p}); err != nil || !c.IndexBuilding {
				t.Fatalf("%s: want a building claim: %v", p, err)
			}
		}
	}
	ringState, iwrrState := redState(t, r, "p", "ring"), redState(t, r, "p", "iwrr")
	nr, rc := startReplica(t, r)
	testenv.Eventually(t, 60*time.Second, "the replica to hold the build state", func() bool {
		a, _ := rc.HGet(ctx, nr.Key("p", keyConfig), "ix:ring").Result()
		b, _ := rc.HGet(ctx, nr.Key("p", keyConfig), "ix:iwrr").Result()
		return a == ringState && b == iwrrState
	})
	// the failover: the replica is promoted and the Caddys claim there
	if err := rc.Do(ctx, "REPLICAOF", "NO", "ONE").Err(); err != nil {
		t.Fatal(err)
	}
	t.Logf("mid-build at the failover: ix:ring %q, ix:iwrr %q", ringState, iwrrState)
	for _, o := range []struct {
		p    Policy
		name string
	}{{Vnode, "ring"}, {InterleavedWeightedRoundRobin, "iwrr"}, {FairShare, "fair"}} {
		for i := 0; ; i++ {
			c, err := nr.Claim(ctx, ClaimRequest{Pool: "p", Policy: o.p})
			if heldOut(err) {
				continue // the promoted replica is another server: held a moment
			}
			if err != nil {
				t.Fatal(err)
			}
			if !c.IndexBuilding {
				break
			}
			if i > n/256+3 {
				t.Fatalf("%s still building", o.p)
			}
		}
	}
	bad := false
	for _, name := range []string{"ring", "iwrr", "fair"} {
		m, e := redDiff(t, nr, "p", name)
		t.Logf("after the failover, %s complete (%q): %d entries missing, %d extra", name, redState(t, nr, "p", name), m, e)
		bad = bad || m+e > 0
	}
	if _, err := nr.Reconcile(ctx, "p"); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"ring", "iwrr", "fair"} {
		m, e := redDiff(t, nr, "p", name)
		t.Logf("after a Reconcile: %s %d missing, %d extra", name, m, e)
	}
	if bad {
		t.Fatal("an index resumed on another server after a failover was marked complete without workers indexed throughout")
	}
}

// Huge pool: how long the claims that build an index take, against a
// claim that walks a complete one (figures only; fails only on errors).
func TestRedHugePoolBuildCost(t *testing.T) {
	ctx := context.Background()
	r, _ := startRegistry(t, Options{NoStaleExpiry: true})
	const n = 20000
	for i := range n {
		redRegister(t, r, "p", fmt.Sprintf("w%05d", i), 4, 1+i%5)
	}
	if _, err := r.Claim(ctx, ClaimRequest{Pool: "p", Policy: LifetimeFirst}); err != nil {
		t.Fatal(err)
	}
	for _, o := range optKeys {
		var worst, total time.Duration
		steps := 0
		for {
			t0 := time.Now()
			c, err := r.Claim(ctx, ClaimRequest{Pool: "p", Policy: o.policy})
			d := time.Since(t0)
			if err != nil {
				t.Fatal(err)
			}
			if !c.IndexBuilding {
				break
			}
			steps++
			total += d
			worst = max(worst, d)
		}
		var after time.Duration
		for range 20 {
			t0 := time.Now()
			if _, err := r.Claim(ctx, ClaimRequest{Pool: "p", Policy: o.policy}); err != nil {
				t.Fatal(err)
			}
			after += time.Since(t0)
		}
		m, e := redDiff(t, r, "p", o.name)
		t.Logf("%s on %d workers: %d building claims, mean %s, worst %s; complete: mean %s; %d missing, %d extra",
			o.name, n, steps, total/time.Duration(max(steps, 1)), worst, after/20, m, e)
		if m+e > 0 {
			t.Errorf("%s not exact after the build", o.name)
		}
	}
}

// A build step is bounded in workers (256), not in the writes they cost:
// workers registered with the most ring positions (VirtualNodes 64, 8
// times the default) make one ring build claim write 16,384 ring
// entries. Figures only: how long such a claim blocks Redis (SLOWLOG,
// the script's own time) against one with the default 8 positions.
func TestRedRingBuildStepWithManyVnodes(t *testing.T) {
	ctx := context.Background()
	for _, v := range []int{8, 64} {
		r, _ := startRegistry(t, Options{NoStaleExpiry: true})
		for i := range 2000 {
			if err := r.Register(ctx, Registration{Pool: "p", ID: fmt.Sprintf("w%04d", i), Addr: "127.0.0.1:1",
				Capacity: 2, VirtualNodes: v, TTL: time.Hour}); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := r.Claim(ctx, ClaimRequest{Pool: "p", Policy: LifetimeFirst}); err != nil {
			t.Fatal(err)
		}
		r.rdb.ConfigSet(ctx, "slowlog-log-slower-than", "0")
		r.rdb.Do(ctx, "SLOWLOG", "RESET")
		steps := 0
		for {
			c, err := r.Claim(ctx, ClaimRequest{Pool: "p", Policy: Vnode})
			if err != nil {
				t.Fatal(err)
			}
			if !c.IndexBuilding {
				break
			}
			steps++
		}
		logs, err := r.rdb.SlowLogGet(ctx, 200).Result()
		if err != nil {
			t.Fatal(err)
		}
		var worst time.Duration
		for _, l := range logs {
			if len(l.Args) > 0 && strings.EqualFold(l.Args[0], "fcall") {
				worst = max(worst, l.Duration)
			}
		}
		m, e := redDiff(t, r, "p", "ring")
		t.Logf("V=%d, 2000 workers: %d building claims, worst claim in Redis %s; ring %d missing, %d extra", v, steps, worst, m, e)
	}
}

// Limits lowered and raised on every claim while each index is built over
// many claims, sessions ending and the reaper reconciling in between:
// no claim over-admits, building claims decide as lifetime_first, and the
// completed index is exact.
func TestRedLimitsFlipDuringBuild(t *testing.T) {
	ctx := context.Background()
	r, _ := startRegistry(t, Options{NoStaleExpiry: true})
	rng := rand.New(rand.NewPCG(9, 9))
	const n = 1500
	for i := range n {
		redRegister(t, r, "p", fmt.Sprintf("w%04d", i), 3, 1+i%4)
	}
	var leases []string
	for range 1200 {
		c, err := r.Claim(ctx, ClaimRequest{Pool: "p", Policy: LifetimeFirst, Limits: selection.Limits{MaxConcurrent: 3}, LeaseTTL: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, c.LeaseID)
	}
	mcs := []int{1, 3, 2, 0, 1}
	stats := map[string]int{}
	for _, o := range optKeys {
		for i := 0; ; i++ {
			lim := selection.Limits{MaxConcurrent: mcs[i%len(mcs)], MaxLifetime: []int{0, 4}[rng.IntN(2)]}
			want, _, perr := r.Pick(ctx, ClaimRequest{Pool: "p", Policy: LifetimeFirst, Limits: lim})
			c, err := r.Claim(ctx, ClaimRequest{Pool: "p", Policy: o.policy, Limits: lim, LeaseTTL: time.Hour})
			stats["claims"]++
			var nw *NoWorkerError
			if errors.As(err, &nw) {
				stats["no_worker"]++
				if nw.IndexBuilding && perr == nil {
					stats["building_mismatch"]++
				}
				if !nw.IndexBuilding {
					break
				}
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			leases = append(leases, c.LeaseID)
			if ec := effCap(3, c.PoolLimits.MaxConcurrent); c.Worker.Active > ec {
				stats["over_admitted"]++
			}
			if c.IndexBuilding {
				stats["building"]++
				if perr != nil || want.ID != c.Worker.ID {
					stats["building_mismatch"]++
				}
			} else {
				break
			}
			for range 3 {
				j := rng.IntN(len(leases))
				if err := r.Release(ctx, "p", leases[j]); err != nil {
					t.Fatal(err)
				}
				leases = append(leases[:j], leases[j+1:]...)
			}
			if i%7 == 3 {
				if _, err := r.Reconcile(ctx, "p"); err != nil {
					t.Fatal(err)
				}
			}
		}
		m, e := redDiff(t, r, "p", o.name)
		stats["missing"] += m
		stats["extra"] += e
	}
	t.Logf("%v", stats)
	if stats["over_admitted"]+stats["building_mismatch"]+stats["missing"]+stats["extra"] > 0 {
		t.Fatalf("broken: %v", stats)
	}
}
