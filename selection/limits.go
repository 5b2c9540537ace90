package selection

import (
	"fmt"
	"time"
)

// This file holds the eligibility rules every policy shares. The registry keeps
// exactly the Indexed workers in its per-pool selection indexes and checks
// Usable while walking them, so these functions are the reference its Lua
// scripts are tested against.

// ms is t in Unix milliseconds: every comparison of instants is made at the
// millisecond precision Redis stores. The zero time maps to a very negative
// number, so a zero LastHeartbeat is never fresh (when StaleAfter > 0) and a
// zero PredictedEnd is always before now.
func ms(t time.Time) int64 { return t.UnixMilli() }

// Cap is the worker's effective concurrency cap: the smaller of
// l.MaxConcurrent and w.Capacity, ignoring whichever is 0 (or negative).
// 0 means no cap.
func (l Limits) Cap(w *Worker) int {
	a, b := l.MaxConcurrent, w.Capacity
	switch {
	case a <= 0 && b <= 0:
		return 0
	case a <= 0:
		return b
	case b <= 0:
		return a
	case a < b:
		return a
	default:
		return b
	}
}

// Indexed reports whether the worker belongs in the pool's selection index:
// status available, below its cap (when it has one) and below the lifetime
// limit (when there is one). Heartbeat age and suspicion are not part of it.
func (l Limits) Indexed(w *Worker) bool {
	if w.Status != Available {
		return false
	}
	if c := l.Cap(w); c > 0 && w.Active >= c {
		return false
	}
	if l.MaxLifetime > 0 && w.Lifetime >= l.MaxLifetime {
		return false
	}
	return true
}

// Fresh reports whether the worker's heartbeat is at most StaleAfter old at
// now (milliseconds; a heartbeat exactly StaleAfter old is fresh).
// StaleAfter 0 means every worker is fresh.
func (l Limits) Fresh(w *Worker, now time.Time) bool {
	if l.StaleAfter <= 0 {
		return true
	}
	return ms(now)-ms(w.LastHeartbeat) <= l.StaleAfter.Milliseconds()
}

// Usable reports whether the worker is fresh, not suspect and not held
// back by StaggerDrains at now: a worker is suspect until SuspectUntil
// (exclusive), and never when SuspectUntil is zero.
func (l Limits) Usable(w *Worker, now time.Time) bool {
	if !l.Fresh(w, now) || l.HeldBack(w) {
		return false
	}
	return w.SuspectUntil.IsZero() || ms(now) >= ms(w.SuspectUntil)
}

// HeldBack reports whether the worker's next session must wait because it
// would be its last (it would bring it to MaxLifetime) and a restart is
// under way: with StaggerDrains another worker of the pool is retiring
// (l.Retiring), or the worker's own agent still drains its previous
// browser (w.Hold).
func (l Limits) HeldBack(w *Worker) bool {
	return l.MaxLifetime > 0 && w.Lifetime+1 >= l.MaxLifetime && (w.Hold || l.StaggerDrains && l.Retiring)
}

// IsRetiring reports whether the worker is on its way out: fresh, and
// either draining or at the lifetime limit (its last claim on its way to
// its agent). A stale worker is not retiring: it is dead, and holding the
// pool back for it would stall restarts until it is reaped.
func (l Limits) IsRetiring(w *Worker, now time.Time) bool {
	if !l.Fresh(w, now) {
		return false
	}
	return w.Status == Draining || (w.Status == Available && l.MaxLifetime > 0 && w.Lifetime >= l.MaxLifetime)
}

// AnyRetiring reports whether some worker of ws IsRetiring at now.
func AnyRetiring(ws []Worker, l Limits, now time.Time) bool {
	for i := range ws {
		if l.IsRetiring(&ws[i], now) {
			return true
		}
	}
	return false
}

// withRetiring is l with Retiring worked out from a whole-pool snapshot,
// when StaggerDrains needs it.
func (l Limits) withRetiring(ws []Worker, now time.Time) Limits {
	if l.StaggerDrains && !l.Retiring {
		l.Retiring = AnyRetiring(ws, l, now)
	}
	return l
}

// Eligible reports whether the worker may take a session at now: Indexed
// and Usable.
func (l Limits) Eligible(w *Worker, now time.Time) bool {
	return l.Indexed(w) && l.Usable(w, now)
}

// Validate reports the first negative limit, naming its field.
func (l Limits) Validate() error {
	switch {
	case l.MaxConcurrent < 0:
		return fmt.Errorf("max_concurrent %d: must be 0 (no cap) or more", l.MaxConcurrent)
	case l.MaxLifetime < 0:
		return fmt.Errorf("max_lifetime %d: must be 0 (no limit) or more", l.MaxLifetime)
	case l.StaleAfter < 0:
		return fmt.Errorf("stale_after %s: must be 0 (never stale) or more", l.StaleAfter)
	case l.MaxScan < 0:
		return fmt.Errorf("max_scan %d: must be 0 (unbounded) or more", l.MaxScan)
	}
	return nil
}

// scan is the bookkeeping of one decision's walk: the shared MaxScan
// budget, the Stale report without repeats, and the Scanned count.
type scan struct {
	l   Limits
	now time.Time
	d   *Decision
	// left is the remaining budget; unbounded when the limit is 0.
	left      int
	unbounded bool
	// seen indexes d.Stale once it grows past a few entries.
	seen map[string]struct{}
}

func newScan(l Limits, now time.Time, d *Decision) scan {
	return scan{l: l, now: now, d: d, left: l.MaxScan, unbounded: l.MaxScan <= 0}
}

// step examines one entry (w nil: the record is missing) and reports
// whether it is eligible, and whether the budget has just run out (the
// decision must stop). Not-fresh and missing workers are reported as stale;
// they, and indexed-but-unusable ones, cost one unit of budget each time
// they are walked past.
func (s *scan) step(id string, w *Worker) (eligible, exhausted bool) {
	s.d.Scanned++
	if w == nil || !s.l.Fresh(w, s.now) {
		s.stale(id)
		return false, s.spend()
	}
	if !s.l.Indexed(w) || !s.l.Usable(w, s.now) {
		return false, s.spend()
	}
	return true, false
}

func (s *scan) spend() bool {
	if s.unbounded {
		return false
	}
	s.left--
	return s.left <= 0
}

func (s *scan) stale(id string) {
	if s.seen != nil {
		if _, ok := s.seen[id]; ok {
			return
		}
		s.seen[id] = struct{}{}
		s.d.Stale = append(s.d.Stale, id)
		return
	}
	for _, x := range s.d.Stale {
		if x == id {
			return
		}
	}
	s.d.Stale = append(s.d.Stale, id)
	// Past a handful a linear check would make an unbounded walk over a
	// mostly stale pool quadratic.
	if len(s.d.Stale) > 16 {
		s.seen = make(map[string]struct{}, 2*len(s.d.Stale))
		for _, x := range s.d.Stale {
			s.seen[x] = struct{}{}
		}
	}
}

// none is the empty decision.
func none() Decision { return Decision{Index: -1} }

// walkOrdered visits, in ascending order of less, the indices i in [0, n)
// for which in(i) holds, until visit returns true. The first (best) index
// is found with one linear pass and no allocation, which is all the common
// case needs; only when the best is passed over is a heap built of the
// rest, so a decision costs O(n + k log n) for k workers walked past.
// less must be a strict total order on the included indices.
func walkOrdered(n int, in func(i int) bool, less func(a, b int) bool, visit func(i int) (stop bool)) {
	best := -1
	for i := 0; i < n; i++ {
		if in(i) && (best < 0 || less(i, best)) {
			best = i
		}
	}
	if best < 0 || visit(best) {
		return
	}
	h := make([]int, 0, n)
	for i := 0; i < n; i++ {
		if i != best && in(i) {
			h = append(h, i)
		}
	}
	down := func(i, end int) {
		for {
			c := 2*i + 1
			if c >= end {
				return
			}
			if c+1 < end && less(h[c+1], h[c]) {
				c++
			}
			if !less(h[c], h[i]) {
				return
			}
			h[i], h[c] = h[c], h[i]
			i = c
		}
	}
	for i := len(h)/2 - 1; i >= 0; i-- {
		down(i, len(h))
	}
	for end := len(h); end > 0; end-- {
		top := h[0]
		h[0] = h[end-1]
		down(0, end-1)
		if visit(top) {
			return
		}
	}
}
