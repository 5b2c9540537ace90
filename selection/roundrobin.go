package selection

import (
	"sync"
	"time"
)

// WeightedRoundRobin is poolifier's weighted round robin with a worker's
// weight taken from the capacity it reports: weight(w) = Limits.Cap(w), or
// 1 when the worker has no cap. It lives in this process only (no Redis
// script), so several proxies each keep their own turn.
//
// Exactly: the policy remembers the worker whose turn it is (cur) and how
// many picks that turn has given (n).
//
//  1. If cur is in the snapshot, Indexed, and n < weight(cur), cur is
//     walked first; if it is Usable it is picked and n grows by one.
//  2. Otherwise (or when cur is walked past), the Indexed workers other than
//     the one walked in step 1 are walked in ID order starting after cur's
//     ID and wrapping around (IDs greater than cur ascending, then IDs
//     less than or equal to cur ascending); the first Usable one is picked,
//     becomes cur, and n = 1. So when no other worker can take it, cur
//     itself starts a new turn.
//  3. On the first call (no cur yet) the walk starts at the lowest ID.
//
// A worker thus receives up to weight consecutive picks among the eligible
// workers before the turn moves on. The MaxScan budget and Stale report
// apply to the whole walk as in every policy. Duplicate IDs in a snapshot
// are walked in slice order.
//
// It is safe for concurrent use; do not copy it after first use.
type WeightedRoundRobin struct {
	Limits
	t turns
}

// Weight is the worker's weight: its effective cap, or 1 with no cap.
func (p *WeightedRoundRobin) Weight(w *Worker) int {
	if c := p.Cap(w); c > 0 {
		return c
	}
	return 1
}

// Select picks the next worker in turn from ws and advances the turn.
func (p *WeightedRoundRobin) Select(ws []Worker, now time.Time) Decision {
	return p.t.next(p.Limits, ws, now, p.Weight)
}

// Reset forgets whose turn it is.
func (p *WeightedRoundRobin) Reset() { p.t.reset() }

// RoundRobin is plain round robin in ID order, one pick per worker per
// turn: WeightedRoundRobin with every weight 1. It is the "naive round
// robin" of the lifetime-first rule's first picture, kept as the baseline lifetime-first
// is measured against. Safe for concurrent use; do not copy after use.
type RoundRobin struct {
	Limits
	t turns
}

// Select picks the next worker in ID order after the previous pick.
func (p *RoundRobin) Select(ws []Worker, now time.Time) Decision {
	return p.t.next(p.Limits, ws, now, func(*Worker) int { return 1 })
}

// Reset forgets whose turn it is.
func (p *RoundRobin) Reset() { p.t.reset() }

// turns is the state of a round robin: whose turn it is and how many
// picks the turn has given.
type turns struct {
	mu  sync.Mutex
	cur string
	has bool
	n   int
}

func (p *turns) reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cur, p.has, p.n = "", false, 0
}

// next is the walk WeightedRoundRobin documents, with the given weights.
func (p *turns) next(l Limits, ws []Worker, now time.Time, weight func(*Worker) int) Decision {
	p.mu.Lock()
	defer p.mu.Unlock()
	d := none()
	s := newScan(l, now, &d)

	first := -1 // cur's index, walked in step 1
	if p.has {
		for i := range ws {
			if ws[i].ID == p.cur {
				if l.Indexed(&ws[i]) && p.n < weight(&ws[i]) {
					first = i
				}
				break
			}
		}
	}
	if first >= 0 {
		ok, exhausted := s.step(ws[first].ID, &ws[first])
		if ok {
			p.n++
			d.Index, d.ID, d.OK = first, ws[first].ID, true
			return d
		}
		if exhausted {
			return d
		}
	}
	// after reports whether an ID comes after cur in the wrapped order.
	after := func(id string) bool { return !p.has || id > p.cur }
	less := func(a, b int) bool {
		aa, ab := after(ws[a].ID), after(ws[b].ID)
		if aa != ab {
			return aa
		}
		if ws[a].ID != ws[b].ID {
			return ws[a].ID < ws[b].ID
		}
		return a < b
	}
	walkOrdered(len(ws), func(i int) bool { return i != first && l.Indexed(&ws[i]) }, less, func(i int) bool {
		ok, exhausted := s.step(ws[i].ID, &ws[i])
		if ok {
			d.Index, d.ID, d.OK = i, ws[i].ID, true
			return true
		}
		return exhausted
	})
	if d.OK {
		p.cur, p.has, p.n = d.ID, true, 1
	}
	return d
}

// Interface guards.
var (
	_ Selector = (*WeightedRoundRobin)(nil)
	_ Selector = (*RoundRobin)(nil)
)
