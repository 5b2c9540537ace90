package caddygrid

import (
	"strings"
	"testing"
	"time"
)

func TestRenderStatusShowsTheStaircase(t *testing.T) {
	pools := []PoolDetail{{
		PoolSummary:   PoolSummary{Pool: "chromium", Available: 3, Draining: 1, Active: 3, Leases: 3},
		MaxConcurrent: 4,
		MaxLifetime:   20,
		WorkerStatuses: []WorkerStatus{
			{ID: "w-low", Status: "available", Lifetime: 3, Active: 0, Capacity: 5, HeartbeatAge: "0.2s"},
			{ID: "w-top", Status: "draining", Lifetime: 20, Active: 2, Capacity: 5, HeartbeatAge: "0.1s"},
			{ID: "w-mid", Status: "available", Lifetime: 12, Active: 1, Capacity: 2, HeartbeatAge: "0.9s"},
		},
		BadRecords: []BadRecordOut{{ID: "w-bad", Error: "field active: not a number"}},
	}}
	out := renderStatus(pools, time.Now())
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	if !strings.HasPrefix(lines[0], "pool chromium: 3 workers (3 available, 1 draining)") {
		t.Fatalf("header line = %q", lines[0])
	}
	// Workers by lifetime, highest first: the staircase reads downwards.
	order := []string{"w-top", "w-mid", "w-low"}
	for i, id := range order {
		if !strings.Contains(lines[2+i], id) {
			t.Fatalf("line %d = %q, want worker %s (highest lifetime first)\n%s", 2+i, lines[2+i], id, out)
		}
	}
	checks := map[string][]string{
		"w-top": {strings.Repeat("█", 20) + " 20/20", "██░░ 2/4", "draining"},
		"w-mid": {strings.Repeat("█", 12) + strings.Repeat("░", 8) + " 12/20", "█░ 1/2"},
		"w-low": {strings.Repeat("█", 3) + strings.Repeat("░", 17) + " 3/20", "░░░░ 0/4"},
	}
	for i, id := range order {
		for _, want := range checks[id] {
			if !strings.Contains(lines[2+i], want) {
				t.Errorf("row of %s = %q, want it to contain %q", id, lines[2+i], want)
			}
		}
	}
	if !strings.Contains(out, "w-bad") || !strings.Contains(out, "bad record skipped: field active: not a number") {
		t.Errorf("bad record not shown:\n%s", out)
	}
}

func TestRenderStatusWithoutPoolsOrLimits(t *testing.T) {
	if out := renderStatus(nil, time.Now()); !strings.Contains(out, "no pools") {
		t.Errorf("empty grid rendered as %q", out)
	}
	out := renderStatus([]PoolDetail{{
		PoolSummary:    PoolSummary{Pool: "firefox"},
		WorkerStatuses: []WorkerStatus{{ID: "f1", Status: "available", Lifetime: 7, Active: 3}},
	}}, time.Now())
	if !strings.Contains(out, "max_lifetime none") || !strings.Contains(out, "3 (no cap)") || !strings.Contains(out, strings.Repeat("█", 20)+" 7 ") {
		t.Errorf("pool without limits rendered as:\n%s", out)
	}
}
