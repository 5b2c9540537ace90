package registry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/selection"
	"github.com/redis/go-redis/v9"
)

// poolState is one random pool: workers with chosen figures and the limits
// and policy parameters a claim brings.
type poolState struct {
	ws     []selection.Worker
	v      map[string]int
	limits selection.Limits
	fs     selection.FairShare
	vn     selection.Vnode
	// iwrr is the interleaved weighted round robin's cursor the pool holds.
	iwrr selection.IWRRCursor
	// storeCfg writes the limits before the workers, so the indexes are
	// built under them. Always true: a claim no longer rebuilds the
	// indexes when the limits change (issue 9); they converge worker by
	// worker, so the contract holds for indexes written under the stored
	// limits (limits_test.go covers changes).
	storeCfg bool
}

func randomState(rng *rand.Rand, now time.Time) poolState {
	var st poolState
	st.limits = selection.Limits{MaxConcurrent: rng.IntN(5), MaxScan: rng.IntN(7)}
	if rng.IntN(4) > 0 {
		st.limits.MaxLifetime = 3 + rng.IntN(30)
	}
	if rng.IntN(3) > 0 {
		st.limits.StaleAfter = 10 * time.Second
	}
	st.fs = selection.FairShare{Window: 1 + rng.IntN(6), Median: rng.IntN(2) == 0, Default: time.Duration(1+rng.IntN(5000)) * time.Millisecond}
	st.vn = selection.Vnode{Samples: 1 + rng.IntN(4), SlotJitter: []int{-1, 1, 2, 4}[rng.IntN(4)]}
	st.storeCfg = true
	n := rng.IntN(14)
	if rng.IntN(10) == 0 {
		n = 20 + rng.IntN(40)
	}
	st.v = map[string]int{}
	coarse := rng.IntN(2) == 0
	if coarse {
		st.fs.Default = time.Duration(1+rng.IntN(3)) * time.Second
	}
	for i := range n {
		w := selection.Worker{ID: fmt.Sprintf("w%02d", rng.IntN(100)), Status: selection.Available}
		if i%3 == 0 {
			// ids with a shared prefix and odd bytes exercise the ID tiebreak
			w.ID = fmt.Sprintf("w%d-%c", i, "aAz_~"[rng.IntN(5)])
		}
		if slices.ContainsFunc(st.ws, func(x selection.Worker) bool { return x.ID == w.ID }) {
			continue
		}
		if rng.IntN(6) == 0 {
			w.Status = selection.Draining
		}
		w.Capacity = rng.IntN(5)
		w.Weight = rng.IntN(5)
		w.Active = rng.IntN(6)
		w.Lifetime = rng.IntN(35)
		if rng.IntN(4) == 0 && st.limits.MaxLifetime > 0 {
			w.Lifetime = st.limits.MaxLifetime - rng.IntN(3) // at, or just below, the limit
		}
		w.LastHeartbeat = now.Add(-time.Duration(rng.IntN(3000)) * time.Millisecond)
		switch rng.IntN(5) {
		case 0:
			w.LastHeartbeat = now.Add(-time.Duration(10000+rng.IntN(3)) * time.Millisecond) // stale edge
		case 1:
			w.LastHeartbeat = now.Add(-time.Duration(20000+rng.IntN(50000)) * time.Millisecond)
		}
		switch rng.IntN(8) {
		case 0:
			w.SuspectUntil = now.Add(time.Duration(1+rng.IntN(5000)) * time.Millisecond)
		case 1:
			w.SuspectUntil = now.Add(-time.Duration(1+rng.IntN(5000)) * time.Millisecond) // suspicion over
		case 2:
			// Suspicion ends exactly now: usable (SuspectUntil is exclusive).
			// Drawn on its own so an off-by-one in a script's suspect check
			// (< against <=) changes decisions the test sees.
			w.SuspectUntil = now
		case 3:
			w.SuspectUntil = now.Add(time.Millisecond) // suspect for one more millisecond
		}
		// Coarse values (whole seconds) in half the states make fair-share
		// keys tie across the idle and busy indexes, so the ID tiebreak runs.
		grain := 1
		if coarse {
			grain = 1000
		}
		for range rng.IntN(8) {
			w.Durations = append(w.Durations, time.Duration(rng.IntN(4000/grain)*grain)*time.Millisecond)
		}
		switch rng.IntN(3) {
		case 0:
			w.PredictedEnd = now.Add(time.Duration(rng.IntN(8000/grain)*grain) * time.Millisecond)
		case 1:
			w.PredictedEnd = now.Add(-time.Duration(grain+rng.IntN(8000/grain)*grain) * time.Millisecond)
		}
		st.v[w.ID] = 1 + rng.IntN(6)
		st.ws = append(st.ws, w)
	}
	st.iwrr = randomCursor(rng, st.ws)
	// StaggerDrains in half the states. The workers drawn above are often
	// retiring (draining, or at the limit); a third of the stagger states
	// have none retiring, and another third only dead (stale) ones, which
	// must hold nothing back.
	st.limits.StaggerDrains = rng.IntN(2) == 0
	if ml := st.limits.MaxLifetime; st.limits.StaggerDrains && ml > 0 {
		switch rng.IntN(3) {
		case 0:
			for i := range st.ws {
				w := &st.ws[i]
				w.Status = selection.Available
				w.Lifetime = min(w.Lifetime, ml-1)
			}
		case 1:
			for i := range st.ws {
				w := &st.ws[i]
				if w.Status == selection.Draining || w.Lifetime >= ml {
					w.LastHeartbeat = now.Add(-time.Duration(20000+rng.IntN(50000)) * time.Millisecond)
				}
			}
		}
	}
	return st
}

// randomCursor is none, a worker's place in a round (its weight's, or
// past it), or a place no worker holds.
func randomCursor(rng *rand.Rand, ws []selection.Worker) selection.IWRRCursor {
	switch rng.IntN(4) {
	case 0:
		return selection.IWRRCursor{}
	case 1:
		return selection.IWRRCursor{Round: 1 + rng.IntN(5), Weight: 1 + rng.IntN(4), ID: fmt.Sprintf("w%02d", rng.IntN(100))}
	}
	if len(ws) == 0 {
		return selection.IWRRCursor{}
	}
	w := ws[rng.IntN(len(ws))]
	return selection.IWRRCursor{Round: 1 + rng.IntN(selection.WeightOf(&w)+1), Weight: selection.WeightOf(&w), ID: w.ID}
}

// iwrrCursor reads the pool's interleaved weighted round robin cursor.
func iwrrCursor(t testing.TB, r *Registry, pool string) selection.IWRRCursor {
	t.Helper()
	v, err := r.rdb.HMGet(context.Background(), r.Key(pool, keyIWRR), " round", " cur").Result()
	if err != nil {
		t.Fatal(err)
	}
	var c selection.IWRRCursor
	if s, ok := v[0].(string); ok {
		c.Round, _ = strconv.Atoi(s)
	}
	if s, ok := v[1].(string); ok {
		c.Weight, _ = strconv.Atoi(s[:6])
		c.ID = s[7:]
	}
	return c
}

// write replaces the pool with the state.
func (st poolState) write(t testing.TB, r *Registry, pool string, now time.Time) {
	t.Helper()
	ctx := context.Background()
	if err := r.rdb.Del(ctx, r.poolKeys(pool)...).Err(); err != nil {
		t.Fatal(err)
	}
	cfg := []any{"fs_window", st.fs.Window, "fs_median", map[bool]int{true: 1}[st.fs.Median], "fs_default_ms", st.fs.Default.Milliseconds()}
	if st.storeCfg {
		cfg = append(cfg, "max_concurrent", st.limits.MaxConcurrent, "max_lifetime", st.limits.MaxLifetime)
	}
	if err := r.rdb.HSet(ctx, r.Key(pool, keyConfig), cfg...).Err(); err != nil {
		t.Fatal(err)
	}
	if err := scriptPut.lib.load(ctx, r.rdb, ""); err != nil {
		t.Fatal(err)
	}
	pipe := r.rdb.Pipeline()
	var cmds []*redis.Cmd
	for _, w := range st.ws {
		cmds = append(cmds, putCmd(ctx, pipe, r, pool, w, st.v[w.ID], now))
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatalf("writing the pool state: %v", err)
	}
	for _, c := range cmds {
		if n, _ := c.Int(); n != 1 {
			t.Fatalf("a worker did not parse: %v", c)
		}
	}
	if st.iwrr.Round > 0 {
		cur := fmt.Sprintf("%06d:%s", st.iwrr.Weight, st.iwrr.ID)
		if err := r.rdb.HSet(ctx, r.Key(pool, keyIWRR), " round", st.iwrr.Round, " cur", cur).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

func putCmd(ctx context.Context, c redis.Cmdable, r *Registry, pool string, w selection.Worker, v int, now time.Time) *redis.Cmd {
	rec := map[string]any{
		"id": w.ID, "browser": "chromium", "addr": "127.0.0.1:1", "path": "/p",
		"status": string(w.Status), "gen": "g", "capacity": w.Capacity, "vnodes": v,
		"heartbeat": toMS(w.LastHeartbeat), "registered": 1, "expires": int64(1) << 50,
		"suspect_until": toMS(w.SuspectUntil), "predicted_end": toMS(w.PredictedEnd),
	}
	b, _ := json.Marshal(rec)
	var durs []string
	for _, d := range w.Durations {
		durs = append(durs, fmt.Sprint(d.Milliseconds()))
	}
	args := []any{toMS(now), r.channel(pool), pool, w.ID, string(b), w.Active, w.Lifetime,
		strings.Join(durs, ","), strings.Join(ringPositions(w.ID, v), " "), selection.WeightOf(&w)}
	return c.FCall(ctx, scriptPut.name, r.poolKeys(pool), args...)
}

// expected is what the selection package decides on the same state.
func (st poolState) expected(policy Policy, now time.Time, seed uint64) selection.Decision {
	// The registry's max_scan 0 is the table's DefaultMaxScan (vnode's is
	// its own); selection's is unbounded.
	if spec, _ := LookupPolicy(string(policy)); st.limits.MaxScan == 0 && spec.DefaultMaxScan > 0 {
		st.limits.MaxScan = spec.DefaultMaxScan
	}
	return selectors[policy](st, now, seed)
}

// selectors are the selection package's side of every policy of the table
// (TestEquivalenceCoversTheTable checks there is one per row).
var selectors = map[Policy]func(st poolState, now time.Time, seed uint64) selection.Decision{
	LifetimeFirst: func(st poolState, now time.Time, _ uint64) selection.Decision {
		return selection.LifetimeFirst{Limits: st.limits}.Select(st.ws, now)
	},
	FairShare: func(st poolState, now time.Time, _ uint64) selection.Decision {
		f := st.fs
		f.Limits = st.limits
		return f.Select(st.ws, now)
	},
	Vnode: func(st poolState, now time.Time, seed uint64) selection.Decision {
		vn := st.vn
		vn.Limits = st.limits
		// Vnode.Select sees only the ring; the pool's retiring state is the
		// caller's to give, as the registry's script reads it from its set.
		vn.Retiring = selection.AnyRetiring(st.ws, st.limits, now)
		vn.SetDefaults()
		ring := selection.NewRing()
		byID := map[string]*selection.Worker{}
		for i := range st.ws {
			w := &st.ws[i]
			byID[w.ID] = w
			// The registry's ring holds the indexed workers (contract: the
			// per-pool selection indexes keep exactly those).
			if st.limits.Indexed(w) {
				ring.Add(w.ID, st.v[w.ID])
			}
		}
		draw := vn.Draw(rand.New(rand.NewPCG(seed, seed)))
		return vn.Select(ring, func(id string) (*selection.Worker, bool) { w, ok := byID[id]; return w, ok }, draw, now)
	},
	InterleavedWeightedRoundRobin: func(st poolState, now time.Time, _ uint64) selection.Decision {
		// The whole snapshot decides whether a worker is retiring, as for
		// lifetime_first and fair_share.
		l := st.limits
		l.Retiring = selection.AnyRetiring(st.ws, st.limits, now)
		d, _ := l.NextIWRR(st.iwrr, st.ws, now)
		return d
	},
}

func TestEquivalenceCoversTheTable(t *testing.T) {
	for _, p := range Policies() {
		if selectors[p.Name] == nil {
			t.Errorf("policy %s has no selection side in the equivalence test", p.Name)
		}
	}
}

func (st poolState) request(pool string, policy Policy, now time.Time, seed uint64) ClaimRequest {
	return ClaimRequest{
		Pool: pool, Policy: policy, Limits: st.limits, Vnode: st.vn, FairShare: st.fs,
		Rand: rand.New(rand.NewPCG(seed, seed)), Now: now, LeaseTTL: time.Minute, Holder: "equivalence",
	}
}

func sameDecision(a, b selection.Decision) bool {
	return a.ID == b.ID && a.OK == b.OK && slices.Equal(a.Stale, b.Stale) && a.Scanned == b.Scanned &&
		a.Wraps == b.Wraps && a.Effective == b.Effective && a.Dedupes == b.Dedupes && a.TiedMin == b.TiedMin
}

func describe(st poolState, now time.Time) string {
	var b strings.Builder
	fmt.Fprintf(&b, "limits %+v fs %+v vnode %+v iwrr %+v storeCfg %v retiring %v\n", st.limits, st.fs, st.vn, st.iwrr, st.storeCfg,
		selection.AnyRetiring(st.ws, st.limits, now))
	for _, w := range st.ws {
		fmt.Fprintf(&b, "  %s %s weight=%d cap=%d active=%d life=%d hbAge=%dms suspect=%dms pend=%dms durs=%v v=%d\n",
			w.ID, w.Status, w.Weight, w.Capacity, w.Active, w.Lifetime, now.Sub(w.LastHeartbeat).Milliseconds(),
			ms(w.SuspectUntil.Sub(now)), ms(w.PredictedEnd.Sub(now)), w.Durations, st.v[w.ID])
	}
	return b.String()
}

// retiringSet is what the pool's retiring set must hold for a state
// without commands: every worker draining or at the lifetime limit, fresh
// or not (a claim tells them apart).
func (st poolState) retiringSet() []string {
	var out []string
	for _, w := range st.ws {
		if w.Status == selection.Draining || st.limits.MaxLifetime > 0 && w.Lifetime >= st.limits.MaxLifetime {
			out = append(out, w.ID)
		}
	}
	slices.Sort(out)
	return out
}

// heldBackMatters reports how StaggerDrains bears on the state: whether it
// changes the policy's decision, and whether the state's retiring workers
// are all dead while a worker a session short of the limit is chosen.
func (st poolState) heldBackMatters(policy Policy, now time.Time, seed uint64, d selection.Decision) (changed, deadIgnored bool) {
	if !st.limits.StaggerDrains || st.limits.MaxLifetime == 0 {
		return false, false
	}
	off := st
	off.limits.StaggerDrains = false
	without := off.expected(policy, now, seed)
	changed = without.ID != d.ID || without.OK != d.OK
	if d.OK && !selection.AnyRetiring(st.ws, st.limits, now) && len(st.retiringSet()) > 0 {
		w := st.ws[slices.IndexFunc(st.ws, func(x selection.Worker) bool { return x.ID == d.ID })]
		deadIgnored = w.Lifetime+1 >= st.limits.MaxLifetime
	}
	return changed, deadIgnored
}

// For thousands of random pool states the scripts choose exactly what the
// selection package chooses, with the same scan figures, and a claim moves
// the chosen worker's figures as the contract says. Half the states bring
// StaggerDrains, with retiring workers fresh, stale or absent.
func TestEquivalenceWithSelection(t *testing.T) {
	ctx := context.Background()
	r, _ := startRegistry(t, Options{NoStaleExpiry: true})
	states := 2000
	if testing.Short() {
		states = 300
	}
	rng := rand.New(rand.NewPCG(42, 7))
	now := time.UnixMilli(1_700_000_000_000)
	var policies []Policy
	for _, p := range Policies() {
		policies = append(policies, p.Name)
	}
	tally := map[string]int{}
	for i := range states {
		st := randomState(rng, now)
		st.write(t, r, "eq", now)
		for _, p := range policies {
			seed := rng.Uint64()
			want := st.expected(p, now, seed)
			_, got, err := r.Pick(ctx, st.request("eq", p, now, seed))
			if err != nil && want.OK {
				t.Fatalf("state %d %s: Pick error %v, selection chose %+v\n%s", i, p, err, want, describe(st, now))
			}
			// No eligible worker is ErrNoWorker and nothing else: a script
			// error or a bad reply must not pass as "none".
			if !want.OK && !errors.Is(err, ErrNoWorker) {
				t.Fatalf("state %d %s: Pick error %v, want ErrNoWorker\n%s", i, p, err, describe(st, now))
			}
			if !sameDecision(got, want) {
				t.Fatalf("state %d %s:\n registry  %+v\n selection %+v\n%s", i, p, got, want, describe(st, now))
			}
			tally[fmt.Sprintf("%s ok=%v", p, want.OK)]++
			changed, deadIgnored := st.heldBackMatters(p, now, seed, want)
			if changed {
				tally[string(p)+" held back"]++
			}
			if deadIgnored {
				tally["dead retiring ignored"]++
			}
			if len(want.Stale) > 0 {
				tally[string(p)+" stale reported"]++
			}
			if want.TiedMin {
				tally["vnode tied"]++
			}
			if want.OK && st.ws[slices.IndexFunc(st.ws, func(x selection.Worker) bool { return x.ID == want.ID })].SuspectUntil.Equal(now) {
				tally["chosen as its suspicion ends"]++
			}
		}
		// The picks stored the limits (rebuilding the indexes if they
		// changed): the retiring set holds exactly the draining and at-limit
		// workers, as put.lua and the rebuild keep it.
		if set, err := r.rdb.SMembers(ctx, r.Key("eq", keyRetiring)).Result(); err != nil || !slices.Equal(sorted(set), st.retiringSet()) {
			t.Fatalf("state %d: retiring set %v (%v), want %v\n%s", i, sorted(set), err, st.retiringSet(), describe(st, now))
		}
		// Claim with one policy and check its effects. In every other
		// state the pool keeps no index but idx:lifetime (a lifetime_first
		// pool's), so the claim builds its policy's index first (these
		// pools are smaller than one build step) and must decide the same.
		p := policies[i%len(policies)]
		if name, keys := optIndex(p); name != "" && i/len(policies)%2 == 0 {
			for _, k := range keys {
				if err := r.rdb.Del(ctx, r.Key("eq", k)).Err(); err != nil {
					t.Fatal(err)
				}
			}
			if err := r.rdb.HSet(ctx, r.Key("eq", keyConfig), "ix", "1").Err(); err != nil {
				t.Fatal(err)
			}
			tally["claims building their index"]++
		}
		seed := rng.Uint64()
		want := st.expected(p, now, seed)
		c, err := r.Claim(ctx, st.request("eq", p, now, seed))
		if !want.OK {
			if err == nil {
				t.Fatalf("state %d %s: claimed %s where selection found none\n%s", i, p, c.Worker.ID, describe(st, now))
			}
			if !errors.Is(err, ErrNoWorker) {
				t.Fatalf("state %d %s: claim error %v, want ErrNoWorker\n%s", i, p, err, describe(st, now))
			}
			continue
		}
		if err == nil && c.IndexBuilding {
			t.Fatalf("state %d %s: the claim reported its index still building (%d workers)", i, p, len(st.ws))
		}
		if err != nil || !sameDecision(c.Decision, want) {
			t.Fatalf("state %d %s: claim %+v %v, selection %+v\n%s", i, p, c, err, want, describe(st, now))
		}
		w := st.ws[slices.IndexFunc(st.ws, func(x selection.Worker) bool { return x.ID == want.ID })]
		fs := st.fs
		wantEnd := fs.Claimed(&w, now)
		drain := st.limits.MaxLifetime > 0 && w.Lifetime+1 >= st.limits.MaxLifetime
		got, err := r.Worker(ctx, "eq", want.ID)
		// The command's expiry is claim time (the test's clock) + CommandTTL.
		cmd, _ := r.rdb.HGet(ctx, r.Key("eq", keyCommands), want.ID).Result()
		wantCmd := ""
		if drain {
			wantCmd = fmt.Sprintf("shutdown|%d", now.Add(defaultCommandTTL).UnixMilli())
		}
		if err != nil || got.Active != w.Active+1 || got.Lifetime != w.Lifetime+1 || !got.PredictedEnd.Equal(wantEnd) ||
			c.Drain != drain || cmd != wantCmd || c.Worker.Active != w.Active+1 {
			t.Fatalf("state %d %s: after the claim %+v (drain %v), want active %d lifetime %d end %s drain %v\n%s",
				i, p, got, c.Drain, w.Active+1, w.Lifetime+1, wantEnd, drain, describe(st, now))
		}
		// A claim that set the shutdown command put the worker in the
		// retiring set.
		if in, _ := r.rdb.SIsMember(ctx, r.Key("eq", keyRetiring), want.ID).Result(); drain && !in {
			t.Fatalf("state %d %s: %s reached the limit but is not in the retiring set", i, p, want.ID)
		}
		if p == InterleavedWeightedRoundRobin {
			l := st.limits
			l.Retiring = selection.AnyRetiring(st.ws, st.limits, now)
			if _, next := l.NextIWRR(st.iwrr, st.ws, now); iwrrCursor(t, r, "eq") != next {
				t.Fatalf("state %d: cursor after the claim %+v, want %+v\n%s", i, iwrrCursor(t, r, "eq"), next, describe(st, now))
			}
			tally["iwrr cursor checked"]++
		}
		tally["claims checked"]++
	}
	t.Logf("%d states: %v", states, tally)
	for _, k := range []string{"lifetime_first ok=true", "lifetime_first ok=false", "vnode ok=true", "vnode ok=false",
		"fair_share ok=true", "fair_share ok=false", "vnode tied",
		"interleaved_weighted_round_robin ok=true", "interleaved_weighted_round_robin ok=false", "iwrr cursor checked",
		"interleaved_weighted_round_robin held back", "lifetime_first stale reported", "claims checked",
		"lifetime_first held back", "vnode held back", "fair_share held back", "dead retiring ignored",
		"claims building their index",
		"chosen as its suspicion ends"} {
		if tally[k] == 0 {
			t.Errorf("the random states never produced %q: the test does not cover it", k)
		}
	}
}
