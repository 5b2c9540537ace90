package caddygrid

import (
	"math"
	"sort"
	"time"
)

// The history behind the browser_grid_ui page: what the sampler saw of
// each pool over the last window, kept in memory and bounded. It imports
// nothing from Caddy and takes every time as an argument, so that its
// arithmetic is tested on its own (uihistory_test.go).

// historyLimits bound a history.
type historyLimits struct {
	// Window is how far back samples are kept.
	Window time.Duration
	// MaxPoints is how many samples are kept per pool and per worker
	// (older ones are dropped first, whatever their age).
	MaxPoints int
	// MaxWorkers is how many workers of one pool get a lifetime history
	// (the sawtooth); a worker seen when that many are tracked gets none
	// and is counted in untracked. Every worker still counts in the pool's
	// sessions per second and drains.
	MaxWorkers int
	// MaxPools is how many pools get a history; others are counted in
	// the snapshot's untracked pools.
	MaxPools int
}

// workerObservation is one worker as one sample saw it. A worker is one
// browser: a restarted browser is a new worker, with a line of its own.
type workerObservation struct {
	ID       string
	Lifetime int
	// Registered is when the worker registered.
	Registered time.Time
}

// poolObservation is one pool as one sample saw it.
type poolObservation struct {
	Pool                                  string
	QueueDepth, Active, Capacity, Leaving int
	Workers                               []workerObservation
}

// poolPoint is one sample of a pool's figures.
type poolPoint struct {
	At                                    time.Time
	QueueDepth, Active, Capacity, Leaving int
	// Sessions is how many sessions started in the pool since the
	// previous sample; SessionsPerSec the same per second of the gap.
	Sessions       int
	SessionsPerSec float64
	// Drains is how many workers left the pool since the previous
	// sample (a browser that retired and closed, or one that died).
	Drains int
}

// lifePoint is one sample of a worker's lifetime (16 bytes: there may be
// many): At in Unix milliseconds.
type lifePoint struct {
	At       int64
	Lifetime int32
}

type workerHistory struct {
	points   []lifePoint
	lastSeen time.Time
}

type poolHistory struct {
	points []poolPoint
	// marks is the previous lifetime of every worker (not capped: it is
	// the size of the pool's records in Redis).
	marks     map[string]int
	workers   map[string]*workerHistory
	untracked map[string]bool
	lastSeen  time.Time
}

// gridHistory is the history of every pool. It is not safe for concurrent
// use: its owner locks.
type gridHistory struct {
	limits historyLimits
	pools  map[string]*poolHistory
	// untrackedPools are pools seen past MaxPools.
	untrackedPools map[string]bool
}

func newGridHistory(l historyLimits) *gridHistory {
	return &gridHistory{limits: l, pools: map[string]*poolHistory{}, untrackedPools: map[string]bool{}}
}

// trim drops the front of s past max elements or older than cutoff.
func trim[T any](s []T, max int, at func(T) time.Time, cutoff time.Time) []T {
	i := 0
	if len(s) > max {
		i = len(s) - max
	}
	for i < len(s) && at(s[i]).Before(cutoff) {
		i++
	}
	if i == 0 {
		return s
	}
	// Copy down so that the backing array does not keep growing.
	return append(s[:0], s[i:]...)
}

// add records one sample of every pool, taken at now.
func (h *gridHistory) add(now time.Time, pools []poolObservation) {
	cutoff := now.Add(-h.limits.Window)
	for _, o := range pools {
		p := h.pools[o.Pool]
		if p == nil {
			if len(h.pools) >= h.limits.MaxPools {
				h.untrackedPools[o.Pool] = true
				continue
			}
			p = &poolHistory{marks: map[string]int{}, workers: map[string]*workerHistory{}, untracked: map[string]bool{}}
			h.pools[o.Pool] = p
		}
		p.add(now, o, h.limits)
	}
	for name, p := range h.pools {
		p.points = trim(p.points, h.limits.MaxPoints, func(x poolPoint) time.Time { return x.At }, cutoff)
		for id, w := range p.workers {
			w.points = trim(w.points, h.limits.MaxPoints, func(x lifePoint) time.Time { return time.UnixMilli(x.At) }, cutoff)
			if w.lastSeen.Before(cutoff) {
				delete(p.workers, id)
			}
		}
		if p.lastSeen.Before(cutoff) {
			delete(h.pools, name)
		}
	}
}

// add derives the pool's sessions and drains since the previous sample
// from its workers' lifetimes, which Redis counts for the whole grid (every
// Caddy instance's claims), and records the sample.
func (p *poolHistory) add(now time.Time, o poolObservation, l historyLimits) {
	first := len(p.points) == 0
	var prevAt time.Time
	if !first {
		prevAt = p.points[len(p.points)-1].At
	}
	pt := poolPoint{At: now, QueueDepth: o.QueueDepth, Active: o.Active, Capacity: o.Capacity, Leaving: o.Leaving}
	seen := make(map[string]int, len(o.Workers))
	for _, w := range o.Workers {
		seen[w.ID] = w.Lifetime
		prev, known := p.marks[w.ID]
		switch {
		case first:
			// Nothing to compare with.
		case !known:
			// A worker new to the sampler: its lifetime counts when it
			// registered since the previous sample (else it was there
			// before this history began, or had been left out).
			if w.Registered.After(prevAt) {
				pt.Sessions += w.Lifetime
			}
		case w.Lifetime > prev:
			pt.Sessions += w.Lifetime - prev
		}
		p.trackWorker(now, w, l)
	}
	if !first {
		for id := range p.marks {
			if _, ok := seen[id]; !ok {
				pt.Drains++ // the worker left the pool
			}
		}
		if gap := now.Sub(prevAt).Seconds(); gap > 0 {
			pt.SessionsPerSec = float64(pt.Sessions) / gap
		}
	}
	for id := range p.untracked {
		if _, ok := seen[id]; !ok {
			delete(p.untracked, id)
		}
	}
	p.marks = seen
	p.points = append(p.points, pt)
	p.lastSeen = now
}

func (p *poolHistory) trackWorker(now time.Time, w workerObservation, l historyLimits) {
	wh := p.workers[w.ID]
	if wh == nil {
		if len(p.workers) >= l.MaxWorkers {
			p.untracked[w.ID] = true
			return
		}
		wh = &workerHistory{}
		p.workers[w.ID] = wh
	}
	wh.points = append(wh.points, lifePoint{At: now.UnixMilli(), Lifetime: int32(min(w.Lifetime, math.MaxInt32))})
	wh.lastSeen = now
}

// poolSeries is a pool's history as the page draws it: times in Unix
// milliseconds, one value per time in each list.
type poolSeries struct {
	T              []int64   `json:"t"`
	QueueDepth     []int     `json:"queue_depth"`
	Active         []int     `json:"active"`
	Capacity       []int     `json:"capacity"`
	Leaving        []int     `json:"leaving"`
	SessionsPerSec []float64 `json:"sessions_per_sec"`
	Drains         []int     `json:"drains"`
}

// workerSeries is one worker's lifetime over time, from its first sample
// to its last: a line ends where its worker left.
type workerSeries struct {
	ID       string  `json:"id"`
	T        []int64 `json:"t"`
	Lifetime []int   `json:"lifetime"`
	// Gone: the worker left the pool (the line ends at its last point).
	Gone bool `json:"gone,omitempty"`
}

// poolHistoryOut is what the page gets of a pool's history.
type poolHistoryOut struct {
	Series  poolSeries     `json:"series"`
	Workers []workerSeries `json:"lifetimes"`
	// Untracked counts the pool's workers that have no lifetime history
	// (past max_workers).
	Untracked int `json:"untracked_workers,omitempty"`
}

// series returns the history of pool, workers sorted by ID.
func (h *gridHistory) series(pool string) poolHistoryOut {
	var out poolHistoryOut
	p := h.pools[pool]
	if p == nil {
		return out
	}
	s := &out.Series
	for _, x := range p.points {
		s.T = append(s.T, x.At.UnixMilli())
		s.QueueDepth = append(s.QueueDepth, x.QueueDepth)
		s.Active = append(s.Active, x.Active)
		s.Capacity = append(s.Capacity, x.Capacity)
		s.Leaving = append(s.Leaving, x.Leaving)
		s.SessionsPerSec = append(s.SessionsPerSec, x.SessionsPerSec)
		s.Drains = append(s.Drains, x.Drains)
	}
	ids := make([]string, 0, len(p.workers))
	for id := range p.workers {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		_, live := p.marks[id]
		ws := workerSeries{ID: id, Gone: !live}
		for _, x := range p.workers[id].points {
			ws.T = append(ws.T, x.At)
			ws.Lifetime = append(ws.Lifetime, int(x.Lifetime))
		}
		out.Workers = append(out.Workers, ws)
	}
	out.Untracked = len(p.untracked)
	return out
}
