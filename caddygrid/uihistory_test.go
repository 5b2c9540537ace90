package caddygrid

import (
	"math"
	"testing"
	"time"
)

// TestHistoryDerivesSessionsAndDrains: sessions per second come from the
// workers' lifetime increases between samples, a new worker's lifetime
// counting when it registered since the previous sample; a worker that
// left is a drain, and its line ends at its last sample, marked gone.
func TestHistoryDerivesSessionsAndDrains(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	before := t0.Add(-time.Hour)
	h := newGridHistory(historyLimits{Window: 15 * time.Minute, MaxPoints: 1000, MaxWorkers: 10, MaxPools: 4})
	obs := func(ws ...workerObservation) []poolObservation {
		return []poolObservation{{Pool: "chromium", Workers: ws}}
	}
	type step struct {
		name         string
		at           time.Duration
		workers      []workerObservation
		wantSessions int
		wantDrains   int
	}
	steps := []step{
		{"first sample: nothing to compare with", 0, []workerObservation{{"a", 5, before}, {"b", 2, before}}, 0, 0},
		{"lifetimes grow", 2 * time.Second, []workerObservation{{"a", 7, before}, {"b", 3, before}}, 3, 0},
		{"a's replacement a2 registers beside it with 1 session", 4 * time.Second, []workerObservation{{"a", 8, before}, {"a2", 1, t0.Add(3 * time.Second)}, {"b", 4, before}}, 3, 0},
		{"a leaves", 6 * time.Second, []workerObservation{{"a2", 2, t0.Add(3 * time.Second)}, {"b", 4, before}}, 1, 1},
		{"d was registered before the sampler saw it", 8 * time.Second, []workerObservation{{"a2", 2, t0.Add(3 * time.Second)}, {"b", 4, before}, {"d", 9, before}}, 0, 0},
		{"b and d leave, c registers with 2 sessions", 10 * time.Second, []workerObservation{{"a2", 3, t0.Add(3 * time.Second)}, {"c", 2, t0.Add(9 * time.Second)}}, 3, 2},
	}
	for _, s := range steps {
		h.add(t0.Add(s.at), obs(s.workers...))
		pts := h.pools["chromium"].points
		got := pts[len(pts)-1]
		if got.Sessions != s.wantSessions || got.Drains != s.wantDrains {
			t.Errorf("%s: sessions %d drains %d, want %d and %d", s.name, got.Sessions, got.Drains, s.wantSessions, s.wantDrains)
		}
		if s.at > 0 {
			if want := float64(s.wantSessions) / 2; math.Abs(got.SessionsPerSec-want) > 1e-9 {
				t.Errorf("%s: %v sessions/s, want %v", s.name, got.SessionsPerSec, want)
			}
		}
	}
	out := h.series("chromium")
	if len(out.Series.T) != len(steps) {
		t.Errorf("%d pool points, want %d", len(out.Series.T), len(steps))
	}
	lines := map[string]workerSeries{}
	for _, w := range out.Workers {
		lines[w.ID] = w
	}
	for id, want := range map[string]struct {
		points int
		gone   bool
	}{"a": {3, true}, "b": {5, true}, "d": {1, true}, "a2": {4, false}, "c": {1, false}} {
		l := lines[id]
		if len(l.T) != want.points || l.Gone != want.gone {
			t.Errorf("worker %s's line: %d points, gone %v; want %d and %v", id, len(l.T), l.Gone, want.points, want.gone)
		}
	}
	if a := lines["a"]; len(a.T) > 0 && a.T[len(a.T)-1] != t0.Add(4*time.Second).UnixMilli() {
		t.Errorf("worker a's line ends at %d, want its last sample %d", a.T[len(a.T)-1], t0.Add(4*time.Second).UnixMilli())
	}
}

// TestHistoryIsBounded: per worker and per pool at most MaxPoints samples
// and nothing older than the window; at most MaxWorkers workers charted
// per pool and MaxPools pools; workers and pools not seen for a window
// are forgotten.
func TestHistoryIsBounded(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	l := historyLimits{Window: time.Minute, MaxPoints: 20, MaxWorkers: 3, MaxPools: 2}
	h := newGridHistory(l)
	workers := func(n int) []workerObservation {
		ws := make([]workerObservation, n)
		for i := range ws {
			ws[i] = workerObservation{ID: string(rune('a' + i)), Lifetime: i, Registered: t0}
		}
		return ws
	}
	step := 2 * time.Second
	for i := 0; i < 100; i++ {
		h.add(t0.Add(time.Duration(i)*step), []poolObservation{
			{Pool: "p1", Workers: workers(5)}, {Pool: "p2", Workers: workers(1)}, {Pool: "p3", Workers: workers(1)},
		})
	}
	if len(h.pools) != 2 || !h.untrackedPools["p3"] {
		t.Errorf("pools %d (untracked %v), want 2 with p3 untracked", len(h.pools), h.untrackedPools)
	}
	p1 := h.pools["p1"]
	if len(p1.workers) != 3 || len(p1.untracked) != 2 {
		t.Errorf("p1 charts %d workers, %d untracked; want 3 and 2", len(p1.workers), len(p1.untracked))
	}
	if len(p1.points) != l.MaxPoints {
		t.Errorf("p1 keeps %d points, want %d", len(p1.points), l.MaxPoints)
	}
	for id, w := range p1.workers {
		if len(w.points) != l.MaxPoints {
			t.Errorf("worker %s keeps %d points, want %d", id, len(w.points), l.MaxPoints)
		}
	}
	// A longer step: the window, not MaxPoints, bounds.
	last := t0.Add(99 * step)
	for i := 1; i <= 3; i++ {
		h.add(last.Add(time.Duration(i)*25*time.Second), []poolObservation{{Pool: "p1", Workers: workers(1)}})
	}
	now := last.Add(75 * time.Second)
	for _, x := range h.pools["p1"].points {
		if x.At.Before(now.Add(-l.Window)) {
			t.Errorf("a point at %s is older than the window ending %s", x.At, now)
		}
	}
	if _, ok := h.pools["p2"]; ok {
		t.Error("pool p2, unseen for more than the window, is still kept")
	}
	if got := len(h.pools["p1"].workers); got != 1 {
		t.Errorf("p1 still charts %d workers, want 1 (the others left a window ago)", got)
	}
}
