package selection

import (
	"fmt"
	"slices"
	"time"
)

// Defaults of fair share.
const (
	// DefaultWindow is how many recent session durations fair share keeps.
	DefaultWindow = 20
	// DefaultEstimate is the estimate for a worker with no history.
	DefaultEstimate = 30 * time.Second
	// MaxWindow bounds Window: the registry keeps the durations in each
	// worker's record.
	MaxWindow = 1000
)

// Fair share (poolifier's "fair share" strategy): each worker's
// queue is predicted to end at max(now, its predicted end) plus its
// estimated session duration (the moving average, or optionally the moving
// median, of its last Window durations), and the worker whose predicted end
// is earliest takes the session. Its predicted end then moves to that
// instant (Claimed), so a worker that just took a session is less likely to
// take the next one unless its sessions are short.
//
// Keys are in whole milliseconds. Preference order: key ascending, then ID
// ascending (byte order), then slice index (equal IDs only in a malformed
// snapshot). Select walks the Indexed workers in that order and the first
// Usable one wins, under the MaxScan budget and with the Stale report of
// every policy.

// SetDefaults fills zero fields: Window 20, Default 30s.
func (f *FairShare) SetDefaults() {
	if f.Window == 0 {
		f.Window = DefaultWindow
	}
	if f.Default == 0 {
		f.Default = DefaultEstimate
	}
}

// Validate checks Window (1-1000), Default (> 0, whole milliseconds) and
// the Limits, naming the field that is wrong.
func (f FairShare) Validate() error {
	switch {
	case f.Window < 1 || f.Window > MaxWindow:
		return fmt.Errorf("window %d: must be 1-%d durations", f.Window, MaxWindow)
	case f.Default <= 0:
		return fmt.Errorf("default estimate %s: must be more than 0", f.Default)
	case f.Default%time.Millisecond != 0:
		return fmt.Errorf("default estimate %s: must be whole milliseconds", f.Default)
	}
	if err := f.Limits.Validate(); err != nil {
		return fmt.Errorf("fair share limits: %w", err)
	}
	return nil
}

// floorDiv is a/b rounded toward minus infinity (Lua's //), b > 0.
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}

// estimateMS is Estimate in whole milliseconds. scratch, when not nil, is
// reused for the median's sort.
func (f FairShare) estimateMS(w *Worker, scratch *[]int64) int64 {
	ds := w.Durations
	if f.Window > 0 && len(ds) > f.Window {
		ds = ds[len(ds)-f.Window:]
	}
	if len(ds) == 0 {
		return f.Default.Milliseconds()
	}
	if !f.Median {
		var sum int64
		for _, d := range ds {
			sum += d.Milliseconds()
		}
		return floorDiv(sum, int64(len(ds)))
	}
	var sorted []int64
	if scratch != nil {
		sorted = (*scratch)[:0]
	}
	for _, d := range ds {
		sorted = append(sorted, d.Milliseconds())
	}
	if scratch != nil {
		*scratch = sorted
	}
	slices.Sort(sorted)
	m := len(sorted) / 2
	if len(sorted)%2 == 1 {
		return sorted[m]
	}
	return floorDiv(sorted[m-1]+sorted[m], 2)
}

// Estimate is the worker's expected session duration: Default with no
// history; otherwise, over its last Window durations (each truncated to
// whole milliseconds; Window <= 0 uses all of them), the floor of their
// mean, or with Median their middle value (an even count: the floor of the
// mean of the two middle ones).
func (f FairShare) Estimate(w *Worker) time.Duration {
	return time.Duration(f.estimateMS(w, nil)) * time.Millisecond
}

// keyMS is max(now, w.PredictedEnd) + Estimate(w), in Unix milliseconds.
func (f FairShare) keyMS(w *Worker, now time.Time, scratch *[]int64) int64 {
	return max(ms(now), ms(w.PredictedEnd)) + f.estimateMS(w, scratch)
}

// Claimed is the worker's new PredictedEnd once it takes a session at now:
// max(now, w.PredictedEnd) + Estimate(w), at millisecond precision.
func (f FairShare) Claimed(w *Worker, now time.Time) time.Time {
	return time.UnixMilli(f.keyMS(w, now, nil))
}

// Select picks the Indexed, Usable worker with the earliest predicted end
// (see the order above). It never modifies ws.
func (f FairShare) Select(ws []Worker, now time.Time) Decision {
	d := none()
	f.Limits = f.Limits.withRetiring(ws, now)
	s := newScan(f.Limits, now, &d)
	keys := make([]int64, len(ws))
	in := make([]bool, len(ws))
	var scratch []int64
	for i := range ws {
		if in[i] = f.Indexed(&ws[i]); in[i] {
			keys[i] = f.keyMS(&ws[i], now, &scratch)
		}
	}
	less := func(a, b int) bool {
		if keys[a] != keys[b] {
			return keys[a] < keys[b]
		}
		if ws[a].ID != ws[b].ID {
			return ws[a].ID < ws[b].ID
		}
		return a < b
	}
	walkOrdered(len(ws), func(i int) bool { return in[i] }, less, func(i int) bool {
		ok, exhausted := s.step(ws[i].ID, &ws[i])
		if ok {
			d.Index, d.ID, d.OK = i, ws[i].ID, true
			return true
		}
		return exhausted
	})
	return d
}

// Interface guards.
var _ Selector = FairShare{}
