package caddygrid

import (
	"math"
	"testing"
	"time"
)

// TestHistoryDerivesSessionsAndDrains: sessions per second come from the
// workers' lifetime increases between samples; a new generation, a lower
// lifetime or a worker gone is a drain, and the new generation's
// lifetime counts as sessions.
func TestHistoryDerivesSessionsAndDrains(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	reg1, reg2 := t0.Add(-time.Hour), t0.Add(3*time.Second)
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
		{"first sample: nothing to compare with", 0, []workerObservation{{"a", 5, reg1}, {"b", 2, reg1}}, 0, 0},
		{"lifetimes grow", 2 * time.Second, []workerObservation{{"a", 7, reg1}, {"b", 3, reg1}}, 3, 0},
		{"a restarts (new generation, 1 session since)", 4 * time.Second, []workerObservation{{"a", 1, reg2}, {"b", 4, reg1}}, 2, 1},
		{"b's lifetime goes down under the same registration", 6 * time.Second, []workerObservation{{"a", 1, reg2}, {"b", 0, reg1}}, 0, 1},
		{"b leaves, c registers with 2 sessions", 8 * time.Second, []workerObservation{{"a", 2, reg2}, {"c", 2, t0.Add(7 * time.Second)}}, 3, 1},
		{"d was registered before the sampler saw it", 10 * time.Second, []workerObservation{{"a", 2, reg2}, {"c", 2, t0.Add(7 * time.Second)}, {"d", 9, reg1}}, 0, 0},
		{"a registers anew and serves more than before", 12 * time.Second, []workerObservation{{"a", 3, t0.Add(11 * time.Second)}, {"c", 2, t0.Add(7 * time.Second)}, {"d", 9, reg1}}, 3, 1},
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
	var a workerSeries
	for _, w := range out.Workers {
		if w.ID == "a" {
			a = w
		}
	}
	if len(a.Restarts) != 2 || a.Lifetime[a.Restarts[0]] != 1 || a.Lifetime[a.Restarts[1]] != 3 {
		t.Errorf("worker a's restarts %v over lifetimes %v, want them at the drop to 1 and the new generation at 3", a.Restarts, a.Lifetime)
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
