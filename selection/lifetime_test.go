package selection

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

var t0 = time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)

// fleet builds available, fresh workers named A, B, C... with the given
// lifetimes.
func fleet(lifetimes ...int) []Worker {
	ws := make([]Worker, len(lifetimes))
	for i, l := range lifetimes {
		ws[i] = Worker{ID: string(rune('A' + i)), Status: Available, Lifetime: l, LastHeartbeat: t0}
	}
	return ws
}

func TestMarginSeedExamples(t *testing.T) {
	// The lifetime-first rule's "Calculate Safety Margin", word for word, plus the visual
	// example's margin and the edges the formula's max(1, ...) covers.
	cases := []struct {
		name           string
		limit, workers int
		want           int
	}{
		{"4 workers, limit 50: margin = 12", 50, 4, 12},
		{"2 workers, limit 50: margin = 25", 50, 2, 25},
		{"10 workers, limit 100: margin = 10", 100, 10, 10},
		{"visual example: limit 20, 4 workers, margin 5", 20, 4, 5},
		{"more workers than the limit: at least 1", 10, 40, 1},
		{"no workers: 1", 50, 0, 1},
		{"floor, not round: 50/3 = 16", 50, 3, 16},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := Margin(c.limit, c.workers); got != c.want {
				t.Fatalf("Margin(%d, %d) = %d, want %d", c.limit, c.workers, got, c.want)
			}
		})
	}
}

func TestLifetimeFirstSeedExamples(t *testing.T) {
	cases := []struct {
		name   string
		limits Limits
		ws     []Worker
		want   string // "" = none
	}{
		{
			// "MAX_LIFETIME_SESSIONS = 20, Workers = 4, Margin = 5 ...
			// Worker B is selected because it's in the safe zone (below
			// margin) and it has the highest lifetime in the safe zone."
			name:   "visual example: limit 20, lifetimes 16/12/8/3 picks the one at 12",
			limits: Limits{MaxLifetime: 20},
			ws:     fleet(16, 12, 8, 3),
			want:   "B",
		},
		{
			// "margin = 5, limit = 20; Worker A: 18, B: 17, C: 16.
			// Fallback kicks in: Select Worker A (highest lifetime, won't
			// exceed limit)." With three workers the margin is 6, and all
			// three are still in the margin zone.
			name:   "all in the margin zone: fallback picks the highest",
			limits: Limits{MaxLifetime: 20},
			ws:     fleet(18, 17, 16),
			want:   "A",
		},
		{
			// "If somehow all workers are at exactly the limit ... No
			// worker is selectable."
			name:   "all at the limit: none",
			limits: Limits{MaxLifetime: 20},
			ws:     fleet(20, 20),
			want:   "",
		},
		{
			name:   "one below the limit is still picked by the fallback",
			limits: Limits{MaxLifetime: 20},
			ws:     fleet(20, 19, 20),
			want:   "B",
		},
		{
			name:   "no lifetime limit: highest lifetime",
			limits: Limits{},
			ws:     fleet(3, 900, 12),
			want:   "B",
		},
		{
			name:   "empty pool: none",
			limits: Limits{MaxLifetime: 20},
			ws:     nil,
			want:   "",
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := LifetimeFirst{c.limits}.Select(c.ws, t0)
			if d.ID != c.want || d.OK != (c.want != "") {
				t.Fatalf("picked %q (ok %v), want %q", d.ID, d.OK, c.want)
			}
			if d.OK && c.ws[d.Index].ID != d.ID {
				t.Fatalf("Index %d is %q, not the chosen %q", d.Index, c.ws[d.Index].ID, d.ID)
			}
			if !d.OK && d.Index != -1 {
				t.Fatalf("no pick but Index %d", d.Index)
			}
		})
	}
}

func TestLifetimeFirstClimbsOneWorkerAtATime(t *testing.T) {
	// The lifetime-first rule's second picture, made literal: four workers, limit 50, one
	// session at a time. The first worker climbs alone to 38 (50 - margin
	// 12), then each of the others climbs to 38, then the fallback pushes
	// one at a time to 50. Lifetimes never move in lockstep.
	ws := fleet(0, 0, 0, 0)
	p := LifetimeFirst{Limits{MaxLifetime: 50}}
	var order []string
	for range 4*38 + 12 {
		d := p.Select(ws, t0)
		if !d.OK {
			t.Fatal("no worker while all are below the limit")
		}
		ws[d.Index].Lifetime++
		if n := len(order); n == 0 || order[n-1] != d.ID {
			order = append(order, d.ID)
		}
	}
	got := fmt.Sprint(order, " ", ws[0].Lifetime, ws[1].Lifetime, ws[2].Lifetime, ws[3].Lifetime)
	if want := "[A B C D A] 50 38 38 38"; got != want {
		t.Fatalf("runs of picks and final lifetimes: %s, want %s", got, want)
	}
}

func TestLifetimeFirstTiebreaks(t *testing.T) {
	// Equal lifetimes: lowest active wins; equal active: lowest ID. Every
	// minimum is tested with descending and shuffled loads (STYLE.md: Caddy's
	// leastRequests keeps stale candidates when a lower count appears).
	for _, loads := range [][]int{{5, 4, 3, 2, 1, 0}, {3, 0, 5, 1, 4, 2}, {0, 1, 2, 3, 4, 5}, {4, 2, 0, 5, 3, 1}} {
		t.Run(fmt.Sprint("active ", loads), func(t *testing.T) {
			ws := fleet(7, 7, 7, 7, 7, 7)
			for i, a := range loads {
				ws[i].Active = a
			}
			d := LifetimeFirst{Limits{MaxLifetime: 50}}.Select(ws, t0)
			if want := slices.Index(loads, 0); d.Index != want {
				t.Fatalf("picked %d (active %d), want %d (active 0)", d.Index, loads[d.Index], want)
			}
		})
	}
	for _, lts := range [][]int{{30, 20, 10, 5}, {5, 10, 20, 30}, {10, 30, 5, 20}} {
		t.Run(fmt.Sprint("lifetime ", lts), func(t *testing.T) {
			d := LifetimeFirst{Limits{MaxLifetime: 100}}.Select(fleet(lts...), t0)
			if want := slices.Index(lts, 30); d.Index != want {
				t.Fatalf("picked lifetime %d, want 30", lts[d.Index])
			}
		})
	}
	t.Run("equal lifetime and active: lowest ID in byte order", func(t *testing.T) {
		ws := fleet(4, 4, 4)
		ws[0].ID, ws[1].ID, ws[2].ID = "w-b", "W-z", "w-a"
		if d := (LifetimeFirst{}).Select(ws, t0); d.ID != "W-z" {
			t.Fatalf("picked %q, want W-z ('W' < 'w')", d.ID)
		}
	})
}

func TestLifetimeFirstEligibility(t *testing.T) {
	stale := t0.Add(-time.Minute)
	cases := []struct {
		name    string
		limits  Limits
		edit    func(ws []Worker)
		now     time.Time
		want    string
		stale   []string
		scanned int
	}{
		{
			name:   "draining worker is skipped",
			limits: Limits{MaxLifetime: 100},
			edit:   func(ws []Worker) { ws[0].Status = Draining },
			want:   "B", scanned: 1,
		},
		{
			name:   "full worker is skipped (max_concurrent)",
			limits: Limits{MaxLifetime: 100, MaxConcurrent: 2},
			edit:   func(ws []Worker) { ws[0].Active = 2 },
			want:   "B", scanned: 1,
		},
		{
			name:   "full worker is skipped (its own capacity is lower)",
			limits: Limits{MaxLifetime: 100, MaxConcurrent: 5},
			edit:   func(ws []Worker) { ws[0].Capacity, ws[0].Active = 1, 1 },
			want:   "B", scanned: 1,
		},
		{
			name:   "stale worker is walked past, reported and charged",
			limits: Limits{MaxLifetime: 100, StaleAfter: 10 * time.Second},
			edit:   func(ws []Worker) { ws[0].LastHeartbeat = stale },
			want:   "B", stale: []string{"A"}, scanned: 2,
		},
		{
			name:   "heartbeat exactly StaleAfter old is fresh",
			limits: Limits{MaxLifetime: 100, StaleAfter: 10 * time.Second},
			edit:   func(ws []Worker) { ws[0].LastHeartbeat = t0.Add(-10 * time.Second) },
			want:   "A", scanned: 1,
		},
		{
			name:   "heartbeat 1ms past StaleAfter is stale",
			limits: Limits{MaxLifetime: 100, StaleAfter: 10 * time.Second},
			edit:   func(ws []Worker) { ws[0].LastHeartbeat = t0.Add(-10*time.Second - time.Millisecond) },
			want:   "B", stale: []string{"A"}, scanned: 2,
		},
		{
			// now is t0 + 0.9ms: truncated to t0, as Redis would see it.
			name:   "instants compare as whole milliseconds",
			limits: Limits{MaxLifetime: 100, StaleAfter: 10 * time.Second},
			edit:   func(ws []Worker) { ws[0].LastHeartbeat = t0.Add(-10 * time.Second) },
			now:    t0.Add(900 * time.Microsecond),
			want:   "A", scanned: 1,
		},
		{
			name:   "suspect worker is skipped until SuspectUntil",
			limits: Limits{MaxLifetime: 100},
			edit:   func(ws []Worker) { ws[0].SuspectUntil = t0.Add(time.Millisecond) },
			want:   "B", scanned: 2,
		},
		{
			name:   "suspect worker is usable again at SuspectUntil",
			limits: Limits{MaxLifetime: 100},
			edit:   func(ws []Worker) { ws[0].SuspectUntil = t0 },
			want:   "A", scanned: 1,
		},
		{
			name:   "budget of 2: two unusable workers end the decision",
			limits: Limits{MaxLifetime: 100, MaxScan: 2, StaleAfter: time.Second},
			edit: func(ws []Worker) {
				ws[0].LastHeartbeat = stale
				ws[1].SuspectUntil = t0.Add(time.Hour)
			},
			want: "", stale: []string{"A"}, scanned: 2,
		},
		{
			name:   "budget of 3 reaches the third",
			limits: Limits{MaxLifetime: 100, MaxScan: 3, StaleAfter: time.Second},
			edit: func(ws []Worker) {
				ws[0].LastHeartbeat = stale
				ws[1].SuspectUntil = t0.Add(time.Hour)
			},
			want: "C", stale: []string{"A"}, scanned: 3,
		},
		{
			name:   "budget is shared by both phases",
			limits: Limits{MaxLifetime: 40, MaxScan: 2, StaleAfter: time.Second},
			// margin 10, edge 30: primary = {C 20, D 10}, fallback = {A 39, B 35}.
			edit: func(ws []Worker) {
				ws[2].LastHeartbeat = stale
				ws[3].LastHeartbeat = stale
			},
			want: "", stale: []string{"C", "D"}, scanned: 2,
		},
		{
			name:   "not-indexed workers are not walked and cost nothing",
			limits: Limits{MaxLifetime: 40, MaxScan: 1, StaleAfter: time.Second},
			edit: func(ws []Worker) {
				ws[2].Status, ws[2].LastHeartbeat = Draining, stale
				ws[3].Active, ws[3].Capacity = 1, 1
			},
			want: "A", scanned: 1,
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ws := fleet(39, 35, 20, 10)
			if c.limits.MaxLifetime == 100 {
				ws = fleet(50, 40, 30, 20)
			}
			c.edit(ws)
			now := t0
			if !c.now.IsZero() {
				now = c.now
			}
			d := LifetimeFirst{c.limits}.Select(ws, now)
			if d.ID != c.want {
				t.Fatalf("picked %q, want %q", d.ID, c.want)
			}
			if !slices.Equal(d.Stale, c.stale) {
				t.Fatalf("stale %v, want %v", d.Stale, c.stale)
			}
			if d.Scanned != c.scanned {
				t.Fatalf("scanned %d, want %d", d.Scanned, c.scanned)
			}
		})
	}
}

func TestLifetimeFirstDoesNotModifySnapshot(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	ws := randomSnapshot(r, 50, t0)
	before := slices.Clone(ws)
	LifetimeFirst{Limits{MaxLifetime: 30, MaxConcurrent: 3, StaleAfter: 10 * time.Second}}.Select(ws, t0)
	for i := range ws {
		if ws[i].ID != before[i].ID || ws[i].Active != before[i].Active || ws[i].Lifetime != before[i].Lifetime {
			t.Fatalf("worker %d changed", i)
		}
	}
}
