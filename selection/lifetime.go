package selection

import "time"

// LifetimeFirst is the lifetime-first rule: instead of spreading sessions evenly,
// it pushes one worker toward its lifetime limit at a time, so that workers
// reach the limit, drain and restart one after another rather than all
// together, and the pool keeps (N-1)/N of its capacity during restarts.
//
// Decision, for a snapshot ws of every registered worker of the pool:
//
//   - total = len(ws): every registered worker in the snapshot, eligible or
//     not. The lifetime-first rule says "total_workers" without saying which; counting all
//     of them keeps the margin steady while workers drain and restart (the
//     moment staggering matters), and it is what the registry can read in
//     O(1) (the size of the pool's member set).
//   - margin = Margin(MaxLifetime, total).
//   - Preference order: Lifetime descending, then Active ascending, then ID
//     ascending (byte order); equal IDs (a malformed snapshot) fall back to
//     the lower slice index. The order is total, so the decision is
//     deterministic and takes no randomness.
//   - MaxLifetime == 0: one phase over every Indexed worker in that order.
//   - Otherwise the primary phase walks the Indexed workers with
//     Lifetime < MaxLifetime - margin (the safe zone), in that order; the
//     first Usable one wins. If none does, the fallback phase walks the
//     Indexed workers with Lifetime >= MaxLifetime - margin (the margin zone;
//     being Indexed they also have Lifetime + 1 <= MaxLifetime), same order.
//     None there: no worker.
//   - With StaggerDrains, a worker one session short of the limit is not
//     Usable while another fresh worker of the pool is retiring (Retiring
//     is worked out from ws), so restarts never overlap.
//   - Each Indexed worker walked past because it is not Usable costs one unit
//     of the MaxScan budget shared by both phases; when it runs out the
//     decision is none. Workers walked past with an old heartbeat are listed
//     in Decision.Stale. Decision.Scanned counts the workers examined, the
//     chosen one included.
//
// When it staggers: a worker that reaches the limit is down for its drain
// (its last session, which started at the claim that hit the limit) plus
// its restart; the next worker in line sits at the margin edge and needs a
// margin's worth of sessions to follow it. So at most one worker is down
// at a time while margin sessions take longer to arrive than the longest
// session plus a restart. The margin shrinks as 1/N while a pool's arrival
// rate grows with N, so a large pool at a fixed MaxLifetime under heavy load
// can have two or three down at once; still fewer than round robin (see
// Simulate and docs/policies.md's Figures table). StaggerDrains removes the condition:
// it holds back the next worker's last session until the previous one is
// gone, trading that session's wait for the guarantee.
type LifetimeFirst struct{ Limits }

// Margin is the lifetime-first rule's safety margin, max(1, floor(maxLifetime/total)):
// the zone below the lifetime limit that the primary phase avoids, so that
// the next worker to hit the limit has a margin's worth of sessions to go
// before it gets there. total <= 0 gives 1.
//
// The lifetime-first rule's examples: 4 workers, limit 50: 12; 2 workers, limit 50: 25;
// 10 workers, limit 100: 10.
func Margin(maxLifetime, total int) int {
	if total <= 0 {
		return 1
	}
	if m := maxLifetime / total; m > 1 {
		return m
	}
	return 1
}

// Select picks a worker from ws at now (see LifetimeFirst for the rules).
// It never modifies ws.
func (p LifetimeFirst) Select(ws []Worker, now time.Time) Decision {
	d := none()
	p.Limits = p.Limits.withRetiring(ws, now)
	s := newScan(p.Limits, now, &d)
	less := func(a, b int) bool {
		wa, wb := &ws[a], &ws[b]
		if wa.Lifetime != wb.Lifetime {
			return wa.Lifetime > wb.Lifetime
		}
		if wa.Active != wb.Active {
			return wa.Active < wb.Active
		}
		if wa.ID != wb.ID {
			return wa.ID < wb.ID
		}
		return a < b
	}
	stop := false
	visit := func(i int) bool {
		ok, exhausted := s.step(ws[i].ID, &ws[i])
		if ok {
			d.Index, d.ID, d.OK = i, ws[i].ID, true
			return true
		}
		stop = exhausted
		return exhausted
	}
	if p.MaxLifetime <= 0 {
		walkOrdered(len(ws), func(i int) bool { return p.Indexed(&ws[i]) }, less, visit)
		return d
	}
	edge := p.MaxLifetime - Margin(p.MaxLifetime, len(ws))
	walkOrdered(len(ws), func(i int) bool { return ws[i].Lifetime < edge && p.Indexed(&ws[i]) }, less, visit)
	if d.OK || stop {
		return d
	}
	walkOrdered(len(ws), func(i int) bool { return ws[i].Lifetime >= edge && p.Indexed(&ws[i]) }, less, visit)
	return d
}

// Interface guards.
var _ Selector = LifetimeFirst{}
