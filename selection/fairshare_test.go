package selection

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

func msd(ms ...int) []time.Duration {
	out := make([]time.Duration, len(ms))
	for i, m := range ms {
		out[i] = time.Duration(m) * time.Millisecond
	}
	return out
}

func TestFairShareEstimate(t *testing.T) {
	cases := []struct {
		name   string
		f      FairShare
		ds     []time.Duration
		wantMS int64
	}{
		{"no history: Default", FairShare{Window: 20, Default: 30 * time.Second}, nil, 30000},
		{"mean", FairShare{Window: 20}, msd(1000, 2000, 6000), 3000},
		{"mean is floored", FairShare{Window: 20}, msd(1, 2), 1},
		{"mean of the last Window only", FairShare{Window: 2}, msd(100000, 10, 20), 15},
		{"sub-millisecond parts are dropped", FairShare{Window: 20}, []time.Duration{1500 * time.Microsecond, 2999 * time.Microsecond}, 1},
		{"median, odd count", FairShare{Window: 20, Median: true}, msd(9000, 10, 30), 30},
		{"median, even count: floor of the middle two's mean", FairShare{Window: 20, Median: true}, msd(10, 1000, 21, 5), 15},
		{"median resists an outlier the mean does not", FairShare{Window: 20, Median: true}, msd(100, 100, 100, 100, 3600000), 100},
		{"median of the last Window only", FairShare{Window: 3, Median: true}, msd(1, 1, 1, 50, 70, 60), 60},
		{"Window 0 uses everything", FairShare{}, msd(10, 20, 30, 40), 25},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := c.f.Estimate(&Worker{Durations: c.ds})
			if got != time.Duration(c.wantMS)*time.Millisecond {
				t.Fatalf("Estimate = %s, want %dms", got, c.wantMS)
			}
		})
	}
}

func TestFairShareClaimed(t *testing.T) {
	f := FairShare{Window: 20, Default: 30 * time.Second}
	w := &Worker{Durations: msd(4000)}
	if got := f.Claimed(w, t0); !got.Equal(t0.Add(4 * time.Second)) {
		t.Fatalf("idle worker: predicted end %s, want now+4s", got)
	}
	w.PredictedEnd = t0.Add(10 * time.Second)
	if got := f.Claimed(w, t0); !got.Equal(t0.Add(14 * time.Second)) {
		t.Fatalf("busy worker: predicted end %s, want its end+4s", got)
	}
	w.PredictedEnd = t0.Add(-time.Hour)
	if got := f.Claimed(w, t0.Add(123456*time.Microsecond)); !got.Equal(t0.Add(4123 * time.Millisecond)) {
		t.Fatalf("past end and sub-ms now: %s, want now (ms) + 4s", got)
	}
}

func TestFairShareSelect(t *testing.T) {
	f := FairShare{Window: 20, Default: 30 * time.Second}
	// Lowest key = max(now, predicted end) + estimate; every minimum
	// tested with descending and shuffled keys.
	for _, ends := range [][]int{{50, 40, 30, 20, 10}, {30, 10, 50, 20, 40}, {10, 20, 30, 40, 50}} {
		t.Run(fmt.Sprint("predicted ends ", ends), func(t *testing.T) {
			ws := fleet(0, 0, 0, 0, 0)
			for i, e := range ends {
				ws[i].PredictedEnd = t0.Add(time.Duration(e) * time.Second)
				ws[i].Durations = msd(1000)
			}
			d := f.Select(ws, t0)
			if want := slices.Index(ends, 10); d.Index != want {
				t.Fatalf("picked %d (end %ds), want %d", d.Index, ends[d.Index], want)
			}
		})
	}
	for _, est := range [][]int{{9, 7, 5, 3}, {5, 3, 9, 7}} {
		t.Run(fmt.Sprint("idle workers, estimates ", est), func(t *testing.T) {
			ws := fleet(0, 0, 0, 0)
			for i, e := range est {
				ws[i].Durations = msd(e * 1000)
			}
			if d := f.Select(ws, t0); d.Index != slices.Index(est, 3) {
				t.Fatalf("picked estimate %ds, want 3s", est[d.Index])
			}
		})
	}
	t.Run("a past predicted end counts as now", func(t *testing.T) {
		ws := fleet(0, 0)
		ws[0].PredictedEnd, ws[0].Durations = t0.Add(-time.Hour), msd(5000)
		ws[1].PredictedEnd, ws[1].Durations = t0.Add(time.Second), msd(3000)
		if d := f.Select(ws, t0); d.ID != "B" {
			t.Fatalf("picked %s, want B (key now+4s beats now+5s)", d.ID)
		}
	})
	t.Run("equal keys: lowest ID", func(t *testing.T) {
		ws := fleet(0, 0, 0)
		ws[0].ID, ws[1].ID, ws[2].ID = "c", "a", "b"
		if d := f.Select(ws, t0); d.ID != "a" {
			t.Fatalf("picked %s, want a", d.ID)
		}
	})
	t.Run("ineligible earliest is skipped, stale reported, budget applies", func(t *testing.T) {
		ws := fleet(0, 0, 0, 0)
		for i := range ws {
			ws[i].Durations = msd((i + 1) * 1000)
		}
		ws[0].LastHeartbeat = t0.Add(-time.Minute)
		ws[1].SuspectUntil = t0.Add(time.Minute)
		l := Limits{StaleAfter: 10 * time.Second}
		d := FairShare{Limits: l, Window: 20}.Select(ws, t0)
		if d.ID != "C" || !slices.Equal(d.Stale, []string{"A"}) || d.Scanned != 3 {
			t.Fatalf("got %s stale %v scanned %d, want C [A] 3", d.ID, d.Stale, d.Scanned)
		}
		l.MaxScan = 2
		if d := (FairShare{Limits: l, Window: 20}).Select(ws, t0); d.OK {
			t.Fatalf("budget 2 should end the decision, picked %s", d.ID)
		}
	})
}

func TestFairShareSpreadsBySessionLength(t *testing.T) {
	// A worker whose sessions are twice as short takes about twice the
	// sessions once its queue is predicted to end sooner.
	f := FairShare{Window: 20, Default: time.Second}
	ws := fleet(0, 0)
	ws[0].Durations, ws[1].Durations = msd(1000), msd(2000)
	count := map[string]int{}
	now := t0
	for range 300 {
		d := f.Select(ws, now)
		ws[d.Index].PredictedEnd = f.Claimed(&ws[d.Index], now)
		count[d.ID]++
		now = now.Add(100 * time.Millisecond)
	}
	if a, b := count["A"], count["B"]; a < 195 || a > 205 || b < 95 || b > 105 {
		t.Fatalf("picks A %d, B %d; want about 200 and 100", a, b)
	}
}

func TestFairShareDefaultsAndValidate(t *testing.T) {
	var f FairShare
	f.SetDefaults()
	if f.Window != 20 || f.Default != 30*time.Second || f.Median {
		t.Fatalf("defaults %+v, want window 20, default 30s, mean", f)
	}
	if err := f.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		f   FairShare
		err string
	}{
		{FairShare{Window: 0, Default: time.Second}, "window 0"},
		{FairShare{Window: 1001, Default: time.Second}, "window 1001"},
		{FairShare{Window: 5, Default: -time.Second}, "default estimate -1s"},
		{FairShare{Window: 5, Default: 1500 * time.Microsecond}, "whole milliseconds"},
		{FairShare{Window: 5, Default: time.Second, Limits: Limits{MaxScan: -1}}, "max_scan -1"},
	} {
		if err := c.f.Validate(); err == nil || !strings.Contains(err.Error(), c.err) {
			t.Errorf("%+v: error %v, want one naming %q", c.f, err, c.err)
		}
	}
}
