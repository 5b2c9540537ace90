package selection

import (
	"fmt"
	"slices"
	"sync"
	"time"
)

// MaxWeight bounds a worker's weight for InterleavedWeightedRoundRobin
// (the registry keeps weights as 6 decimal digits).
const MaxWeight = 10000

// InterleavedWeightedRoundRobin is poolifier's interleaved weighted round
// robin: rather than giving a worker weight consecutive picks
// (WeightedRoundRobin), it deals the picks in rounds, so heavy workers'
// extra turns are spread between the light ones'.
//
// Exactly: round r (1 ≤ r ≤ W, W the largest weight among the Indexed
// workers) holds the Indexed workers whose weight is at least r, in order
// of (weight, ID) ascending. The policy remembers the round it is in and
// the (weight, ID) of its last pick, the cursor. A decision walks the
// sequence that follows the cursor: the rest of its round after the
// cursor, rounds r+1 … W, rounds 1 … r-1, then round r up to the cursor
// (with no cursor yet, or r > W: rounds 1 … W). Each worker is examined
// once, the first time the walk meets it: the first Usable one is picked
// and becomes the cursor, in the round it was met in; unusable ones cost
// one unit of the MaxScan budget, as in every policy, and are passed over
// for free when met again in a later round. The cursor need not be a
// current worker: the walk resumes after its (weight, ID).
//
// A worker's weight is Worker.Weight (0 counts as 1). Over W rounds with
// every worker usable, a worker of weight w is picked w times.
//
// It is safe for concurrent use; do not copy it after first use.
type InterleavedWeightedRoundRobin struct {
	Limits
	mu  sync.Mutex
	cur IWRRCursor
}

// IWRRCursor is InterleavedWeightedRoundRobin's state: the round and the
// (weight, ID) of the last pick. The zero value is "no pick yet".
type IWRRCursor struct {
	Round  int
	Weight int
	ID     string
}

// WeightOf is a worker's weight for interleaved weighted round robin.
func WeightOf(w *Worker) int { return max(w.Weight, 1) }

// ValidWeight checks a registered weight (0: none given).
func ValidWeight(w int) error {
	if w < 0 || w > MaxWeight {
		return fmt.Errorf("weight %d: must be 0-%d", w, MaxWeight)
	}
	return nil
}

// Cursor returns the policy's state.
func (p *InterleavedWeightedRoundRobin) Cursor() IWRRCursor {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cur
}

// Select picks from ws and moves the cursor.
func (p *InterleavedWeightedRoundRobin) Select(ws []Worker, now time.Time) Decision {
	p.mu.Lock()
	defer p.mu.Unlock()
	d, next := p.Limits.NextIWRR(p.cur, ws, now)
	if d.OK {
		p.cur = next
	}
	return d
}

// NextIWRR is one interleaved weighted round robin decision from cursor
// cur over ws, and the cursor after it (cur when nothing was picked).
func (l Limits) NextIWRR(cur IWRRCursor, ws []Worker, now time.Time) (Decision, IWRRCursor) {
	d := none()
	s := newScan(l, now, &d)
	top := 0
	var order []int // Indexed workers by (weight, ID), then slice order
	for i := range ws {
		if l.Indexed(&ws[i]) {
			order = append(order, i)
			top = max(top, WeightOf(&ws[i]))
		}
	}
	if top == 0 {
		return d, cur
	}
	slices.SortFunc(order, func(a, b int) int {
		if wa, wb := WeightOf(&ws[a]), WeightOf(&ws[b]); wa != wb {
			return wa - wb
		}
		if ws[a].ID != ws[b].ID {
			if ws[a].ID < ws[b].ID {
				return -1
			}
			return 1
		}
		return a - b
	})
	after := func(i int) bool { // (weight, ID) after the cursor's
		w := WeightOf(&ws[i])
		return w > cur.Weight || w == cur.Weight && ws[i].ID > cur.ID
	}
	type pass struct {
		round int
		from  int // 0: whole round; 1: after the cursor; -1: up to and including it
	}
	var passes []pass
	if cur.Round == 0 || cur.Round > top {
		for r := 1; r <= top; r++ {
			passes = append(passes, pass{r, 0})
		}
	} else {
		passes = append(passes, pass{cur.Round, 1})
		for r := cur.Round + 1; r <= top; r++ {
			passes = append(passes, pass{r, 0})
		}
		for r := 1; r < cur.Round; r++ {
			passes = append(passes, pass{r, 0})
		}
		passes = append(passes, pass{cur.Round, -1})
	}
	examined := map[int]bool{}
	for _, ps := range passes {
		for _, i := range order {
			if WeightOf(&ws[i]) < ps.round || examined[i] {
				continue
			}
			if ps.from == 1 && !after(i) || ps.from == -1 && after(i) {
				continue
			}
			examined[i] = true
			ok, exhausted := s.step(ws[i].ID, &ws[i])
			if ok {
				d.Index, d.ID, d.OK = i, ws[i].ID, true
				return d, IWRRCursor{Round: ps.round, Weight: WeightOf(&ws[i]), ID: ws[i].ID}
			}
			if exhausted {
				return d, cur
			}
		}
	}
	return d, cur
}

// Interface guards.
var _ Selector = (*InterleavedWeightedRoundRobin)(nil)
