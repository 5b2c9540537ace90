package selection

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"
	"time"
)

// Property tests: thousands of random snapshots per policy, each decision
// checked three ways: the pick is eligible; with an unbounded budget there
// is no pick only when nothing is eligible; and the whole decision (pick,
// Stale, Scanned, ...) equals a deliberately naive reference that sorts
// everything and walks it, which also proves the pick maximal in the
// stated order.

const propertyRounds = 4000

// randomSnapshot is n workers with every field drawn at random, including
// the odd ones: draining, full, stale, suspect, over the limit, duplicate
// looking loads.
func randomSnapshot(r *rand.Rand, n int, now time.Time) []Worker {
	ws := make([]Worker, n)
	perm := r.Perm(n)
	for i := range ws {
		w := Worker{
			ID:            fmt.Sprintf("w%03d", perm[i]),
			Status:        Available,
			Active:        r.IntN(6),
			Lifetime:      r.IntN(60),
			Capacity:      r.IntN(6),
			LastHeartbeat: now.Add(-time.Duration(r.IntN(20000)) * time.Millisecond),
		}
		if r.IntN(6) == 0 {
			w.Status = Draining
		}
		if r.IntN(5) == 0 {
			w.SuspectUntil = now.Add(time.Duration(r.IntN(2000)-1000) * time.Millisecond)
		}
		for range r.IntN(5) {
			w.Durations = append(w.Durations, time.Duration(r.IntN(60000))*time.Millisecond)
		}
		if r.IntN(2) == 0 {
			w.PredictedEnd = now.Add(time.Duration(r.IntN(60000)-20000) * time.Millisecond)
		}
		ws[i] = w
	}
	return ws
}

func randomLimits(r *rand.Rand) Limits {
	l := Limits{MaxConcurrent: r.IntN(6)}
	if r.IntN(4) != 0 {
		l.MaxLifetime = 10 + r.IntN(50)
	}
	if r.IntN(3) != 0 {
		l.StaleAfter = 10 * time.Second
	}
	if r.IntN(2) == 0 {
		l.MaxScan = 1 + r.IntN(5)
	}
	return l
}

// refWalk walks the given indices in order under the budget, the plain
// way.
func refWalk(l Limits, ws []Worker, now time.Time, order []int, d *Decision, left *int) (stop bool) {
	for _, i := range order {
		d.Scanned++
		w := &ws[i]
		if !l.Fresh(w, now) {
			if !slices.Contains(d.Stale, w.ID) {
				d.Stale = append(d.Stale, w.ID)
			}
		} else if l.Usable(w, now) {
			d.Index, d.ID, d.OK = i, w.ID, true
			return true
		}
		if l.MaxScan > 0 {
			*left--
			if *left <= 0 {
				return true
			}
		}
	}
	return false
}

func refLifetimeFirst(l Limits, ws []Worker, now time.Time) Decision {
	d := Decision{Index: -1}
	var all []int
	for i := range ws {
		if l.Indexed(&ws[i]) {
			all = append(all, i)
		}
	}
	sort.SliceStable(all, func(a, b int) bool {
		wa, wb := ws[all[a]], ws[all[b]]
		if wa.Lifetime != wb.Lifetime {
			return wa.Lifetime > wb.Lifetime
		}
		if wa.Active != wb.Active {
			return wa.Active < wb.Active
		}
		return wa.ID < wb.ID
	})
	order := all
	if l.MaxLifetime > 0 {
		edge := l.MaxLifetime - max(1, l.MaxLifetime/max(len(ws), 1))
		var primary, fallback []int
		for _, i := range all {
			if ws[i].Lifetime < edge {
				primary = append(primary, i)
			} else {
				fallback = append(fallback, i)
			}
		}
		order = append(primary, fallback...)
	}
	left := l.MaxScan
	refWalk(l, ws, now, order, &d, &left)
	return d
}

func anyEligible(l Limits, ws []Worker, now time.Time) bool {
	for i := range ws {
		if l.Eligible(&ws[i], now) {
			return true
		}
	}
	return false
}

func TestPropertyLifetimeFirst(t *testing.T) {
	r := rand.New(rand.NewPCG(2026, 11))
	for round := range propertyRounds {
		ws := randomSnapshot(r, r.IntN(30), t0)
		l := randomLimits(r)
		d := LifetimeFirst{l}.Select(ws, t0)
		if d.OK && !l.Eligible(&ws[d.Index], t0) {
			t.Fatalf("round %d: picked ineligible %+v", round, ws[d.Index])
		}
		if l.MaxScan == 0 && d.OK != anyEligible(l, ws, t0) {
			t.Fatalf("round %d: ok=%v but eligible exists=%v", round, d.OK, !d.OK)
		}
		if l.MaxScan == 0 && d.OK && l.MaxLifetime > 0 {
			// Maximal: no eligible worker beats it in its phase, and a
			// fallback pick means no eligible worker in the safe zone.
			edge := l.MaxLifetime - Margin(l.MaxLifetime, len(ws))
			c := ws[d.Index]
			for i, w := range ws {
				if i == d.Index || !l.Eligible(&w, t0) {
					continue
				}
				if (w.Lifetime < edge) != (c.Lifetime < edge) {
					if w.Lifetime < edge {
						t.Fatalf("round %d: fallback pick %+v while %+v is in the safe zone", round, c, w)
					}
					continue
				}
				if w.Lifetime > c.Lifetime || w.Lifetime == c.Lifetime && (w.Active < c.Active || w.Active == c.Active && w.ID < c.ID) {
					t.Fatalf("round %d: %+v beats the pick %+v", round, w, c)
				}
			}
		}
		if want := refLifetimeFirst(l, ws, t0); fmt.Sprint(d) != fmt.Sprint(want) {
			t.Fatalf("round %d: limits %+v\n got %+v\nwant %+v", round, l, d, want)
		}
	}
}

func refFairShare(f FairShare, ws []Worker, now time.Time) Decision {
	d := Decision{Index: -1}
	var order []int
	key := map[int]int64{}
	for i := range ws {
		if !f.Indexed(&ws[i]) {
			continue
		}
		order = append(order, i)
		// Estimate, the slow way.
		ds := ws[i].Durations
		if len(ds) > f.Window {
			ds = ds[len(ds)-f.Window:]
		}
		est := f.Default.Milliseconds()
		if len(ds) > 0 {
			var xs []int64
			for _, x := range ds {
				xs = append(xs, x.Milliseconds())
			}
			if f.Median {
				slices.Sort(xs)
				if len(xs)%2 == 1 {
					est = xs[len(xs)/2]
				} else {
					est = (xs[len(xs)/2-1] + xs[len(xs)/2]) / 2
				}
			} else {
				var s int64
				for _, x := range xs {
					s += x
				}
				est = s / int64(len(xs))
			}
		}
		key[i] = max(now.UnixMilli(), ws[i].PredictedEnd.UnixMilli()) + est
	}
	sort.SliceStable(order, func(a, b int) bool {
		if key[order[a]] != key[order[b]] {
			return key[order[a]] < key[order[b]]
		}
		return ws[order[a]].ID < ws[order[b]].ID
	})
	left := f.MaxScan
	refWalk(f.Limits, ws, now, order, &d, &left)
	return d
}

func TestPropertyFairShare(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 7))
	for round := range propertyRounds {
		ws := randomSnapshot(r, r.IntN(30), t0)
		f := FairShare{Limits: randomLimits(r), Window: 1 + r.IntN(4), Median: r.IntN(2) == 0, Default: time.Duration(r.IntN(60000)) * time.Millisecond}
		d := f.Select(ws, t0)
		if d.OK && !f.Eligible(&ws[d.Index], t0) {
			t.Fatalf("round %d: picked ineligible %+v", round, ws[d.Index])
		}
		if f.MaxScan == 0 && d.OK != anyEligible(f.Limits, ws, t0) {
			t.Fatalf("round %d: ok=%v disagrees with eligibility", round, d.OK)
		}
		if want := refFairShare(f, ws, t0); fmt.Sprint(d) != fmt.Sprint(want) {
			t.Fatalf("round %d: %+v\n got %+v\nwant %+v", round, f, d, want)
		}
	}
}

// refVnode is Select written the plain way: linear search for the
// pivot, the ring walked as a rotated list.
func refVnode(v Vnode, entries []RingEntry, ws map[string]*Worker, draw VnodeDraw, now time.Time) Decision {
	d := Decision{Index: -1}
	left := v.MaxScan
	type cand struct {
		id    string
		slots int
	}
	var cands []cand
	stop := false
	for i := 0; i < v.Samples && !stop; i++ {
		start := len(entries)
		for j, e := range entries {
			if e.Pos.Compare(draw.Pivots[i]) >= 0 {
				start = j
				break
			}
		}
		got := ""
		visit := func(j int) {
			d.Scanned++
			id := entries[j].ID
			w := ws[id]
			if w != nil && v.Eligible(w, now) {
				got = id
				return
			}
			if w == nil || !v.Fresh(w, now) {
				if !slices.Contains(d.Stale, id) {
					d.Stale = append(d.Stale, id)
				}
			}
			if v.MaxScan > 0 {
				left--
				stop = left <= 0
			}
		}
		for j := start; j < len(entries) && got == "" && !stop; j++ {
			visit(j)
		}
		if got == "" && !stop {
			d.Wraps++
			for j := 0; j < start && got == "" && !stop; j++ {
				visit(j)
			}
		}
		if got == "" {
			continue
		}
		dup := false
		for _, c := range cands {
			dup = dup || c.id == got
		}
		if dup {
			d.Dedupes++
			continue
		}
		cands = append(cands, cand{got, ws[got].Active + draw.Jitter[i]})
	}
	d.Effective = len(cands)
	if len(cands) == 0 {
		return d
	}
	if v.Samples == 1 {
		d.ID, d.OK = cands[0].id, true
		return d
	}
	best := cands[0].slots
	for _, c := range cands {
		best = min(best, c.slots)
	}
	var tied []string
	for _, c := range cands {
		if c.slots == best {
			tied = append(tied, c.id)
		}
	}
	d.ID, d.OK, d.TiedMin = tied[draw.Tiebreak%uint64(len(tied))], true, len(tied) > 1
	return d
}

func TestPropertyVnode(t *testing.T) {
	r := rand.New(rand.NewPCG(42, 0))
	for round := range propertyRounds {
		ws := randomSnapshot(r, r.IntN(12), t0)
		ring := NewRing()
		byID := map[string]*Worker{}
		for i := range ws {
			ring.Add(ws[i].ID, 1+r.IntN(4))
			if r.IntN(10) != 0 { // some ring entries have no record
				byID[ws[i].ID] = &ws[i]
			}
		}
		v := Vnode{Limits: randomLimits(r), Samples: 1 + r.IntN(4), SlotJitter: r.IntN(3)}
		draw := v.Draw(r)
		if r.IntN(4) == 0 && ring.Len() > 0 { // pivots exactly on entries
			es := ring.Entries()
			for i := range draw.Pivots {
				draw.Pivots[i] = es[r.IntN(len(es))].Pos
			}
		}
		lookup := func(id string) (*Worker, bool) { w, ok := byID[id]; return w, ok }
		d := v.Select(ring, lookup, draw, t0)
		if d.OK && !v.Eligible(byID[d.ID], t0) {
			t.Fatalf("round %d: picked ineligible %+v", round, byID[d.ID])
		}
		eligible := false
		for _, w := range byID {
			eligible = eligible || v.Eligible(w, t0)
		}
		if v.MaxScan == 0 && d.OK != eligible {
			t.Fatalf("round %d: ok=%v but eligible=%v", round, d.OK, eligible)
		}
		if v.MaxScan == 0 && d.OK && v.Samples == 1 {
			// K = 1: the first eligible entry at or after the pivot, cyclically.
			es := ring.Entries()
			for k := range es {
				e := es[k]
				if w := byID[e.ID]; w != nil && v.Eligible(w, t0) && e.Pos.Compare(draw.Pivots[0]) >= 0 {
					if e.ID != d.ID {
						t.Fatalf("round %d: K=1 picked %s, first eligible after the pivot is %s", round, d.ID, e.ID)
					}
					break
				}
			}
		}
		if want := refVnode(v, ring.Entries(), byID, draw, t0); fmt.Sprint(d) != fmt.Sprint(want) {
			t.Fatalf("round %d: %+v\n got %+v\nwant %+v", round, v, d, want)
		}
	}
}

func TestPropertyWeightedRoundRobin(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 5))
	for round := range propertyRounds / 4 {
		ws := randomSnapshot(r, 1+r.IntN(10), t0)
		l := randomLimits(r)
		l.MaxScan = 0
		p := &WeightedRoundRobin{Limits: l}
		// Over one full cycle of a fixed snapshot, each eligible worker gets
		// exactly its weight in picks, and nothing else is picked.
		total := 0
		for i := range ws {
			if l.Eligible(&ws[i], t0) {
				total += p.Weight(&ws[i])
			}
		}
		count := map[string]int{}
		for range total {
			d := p.Select(ws, t0)
			if !d.OK || !l.Eligible(&ws[d.Index], t0) {
				t.Fatalf("round %d: pick %+v not eligible or none", round, d)
			}
			count[d.ID]++
		}
		for i := range ws {
			want := 0
			if l.Eligible(&ws[i], t0) {
				want = p.Weight(&ws[i])
			}
			if count[ws[i].ID] != want {
				t.Fatalf("round %d: %s got %d picks in a cycle, want %d", round, ws[i].ID, count[ws[i].ID], want)
			}
		}
		if d := p.Select(ws, t0); d.OK != (total > 0) {
			t.Fatalf("round %d: ok=%v with %d eligible weight", round, d.OK, total)
		}
	}
}
