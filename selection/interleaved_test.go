package selection

import (
	"strings"
	"testing"
	"time"
)

func TestInterleavedWeightedRoundRobin(t *testing.T) {
	now := time.UnixMilli(1_700_000_000_000)
	worker := func(id string, weight int) Worker {
		return Worker{ID: id, Status: Available, Weight: weight, LastHeartbeat: now}
	}
	tests := []struct {
		name  string
		ws    []Worker
		limit Limits
		picks int
		want  string
	}{
		{"weights 3 and 1 interleave", []Worker{worker("a", 3), worker("b", 1)}, Limits{}, 8, "b a a a b a a a"},
		{"equal weights are plain round robin", []Worker{worker("c", 2), worker("a", 2), worker("b", 2)}, Limits{}, 6,
			"a b c a b c"},
		{"weight 0 counts as 1", []Worker{worker("a", 0), worker("b", 2)}, Limits{}, 6, "a b b a b b"},
		{"lighter first in each round", []Worker{worker("x", 1), worker("y", 2), worker("z", 3)}, Limits{}, 6,
			"x y z y z z"},
		{"a worker at its cap is not in the rounds", []Worker{{ID: "a", Status: Available, Weight: 2, Active: 1, Capacity: 1,
			LastHeartbeat: now}, worker("b", 1)}, Limits{}, 3, "b b b"},
		{"nothing indexed", []Worker{{ID: "a", Status: Draining, Weight: 2, LastHeartbeat: now}}, Limits{}, 2, "- -"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := &InterleavedWeightedRoundRobin{Limits: tc.limit}
			var got []string
			for range tc.picks {
				d := p.Select(tc.ws, now)
				if !d.OK {
					got = append(got, "-")
					continue
				}
				got = append(got, d.ID)
			}
			if s := strings.Join(got, " "); s != tc.want {
				t.Fatalf("picks %q, want %q", s, tc.want)
			}
		})
	}
}

// An unusable worker costs one unit of budget however many rounds it is
// in, and the walk still reaches the usable one behind it.
func TestInterleavedWeightedRoundRobinBudget(t *testing.T) {
	now := time.UnixMilli(1_700_000_000_000)
	ws := []Worker{
		{ID: "a", Status: Available, Weight: 5, LastHeartbeat: now, SuspectUntil: now.Add(time.Second)},
		{ID: "b", Status: Available, Weight: 1, LastHeartbeat: now.Add(-time.Hour)},
		{ID: "c", Status: Available, Weight: 9, LastHeartbeat: now},
	}
	l := Limits{MaxScan: 3, StaleAfter: time.Minute}
	d, cur := l.NextIWRR(IWRRCursor{Round: 9, Weight: 9, ID: "c"}, ws, now)
	if !d.OK || d.ID != "c" || d.Scanned != 3 || len(d.Stale) != 1 || d.Stale[0] != "b" {
		t.Fatalf("decision %+v, want c after a and b, b reported stale", d)
	}
	if cur != (IWRRCursor{Round: 1, Weight: 9, ID: "c"}) {
		t.Fatalf("cursor %+v, want round 1 at c (the walk wrapped)", cur)
	}
	l.MaxScan = 2
	if d, _ := l.NextIWRR(IWRRCursor{}, ws, now); d.OK || d.Scanned != 2 {
		t.Fatalf("with max_scan 2: %+v, want none after 2 entries", d)
	}
}
