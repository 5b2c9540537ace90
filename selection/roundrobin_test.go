package selection

import (
	"strings"
	"sync"
	"testing"
	"time"
)

func picks(p *WeightedRoundRobin, ws []Worker, n int) string {
	var out []string
	for range n {
		d := p.Select(ws, t0)
		if !d.OK {
			out = append(out, "-")
			continue
		}
		out = append(out, d.ID)
	}
	return strings.Join(out, "")
}

func TestWeightedRoundRobin(t *testing.T) {
	t.Run("weight is the reported capacity, consecutive picks", func(t *testing.T) {
		ws := fleet(0, 0, 0)
		ws[0].Capacity, ws[1].Capacity, ws[2].Capacity = 3, 1, 2
		p := &WeightedRoundRobin{}
		if got, want := picks(p, ws, 12), "AAABCCAAABCC"; got != want {
			t.Fatalf("picks %s, want %s", got, want)
		}
	})
	t.Run("max_concurrent lowers the weight to the effective cap", func(t *testing.T) {
		ws := fleet(0, 0)
		ws[0].Capacity, ws[1].Capacity = 5, 2
		p := &WeightedRoundRobin{Limits: Limits{MaxConcurrent: 3}}
		if got, want := picks(p, ws, 10), "AAABBAAABB"; got != want {
			t.Fatalf("picks %s, want %s", got, want)
		}
	})
	t.Run("no cap: weight 1, plain round robin in ID order", func(t *testing.T) {
		ws := fleet(0, 0, 0)
		ws[0].ID, ws[1].ID, ws[2].ID = "c", "a", "b"
		if got, want := picks(&WeightedRoundRobin{}, ws, 6), "abcabc"; got != want {
			t.Fatalf("picks %s, want %s", got, want)
		}
	})
	t.Run("ineligible workers are skipped and the turn moves on", func(t *testing.T) {
		ws := fleet(0, 0, 0, 0)
		ws[1].Status = Draining
		ws[2].SuspectUntil = t0.Add(time.Hour)
		p := &WeightedRoundRobin{}
		if got, want := picks(p, ws, 4), "ADAD"; got != want {
			t.Fatalf("picks %s, want %s", got, want)
		}
	})
	t.Run("a full worker ends its turn early", func(t *testing.T) {
		ws := fleet(0, 0)
		ws[0].Capacity, ws[1].Capacity = 3, 3
		p := &WeightedRoundRobin{}
		var got []string
		for range 5 {
			d := p.Select(ws, t0)
			got = append(got, d.ID)
			ws[d.Index].Active++ // sessions never end here
			if d.ID == "A" && ws[0].Active == 2 {
				ws[0].Active = 3 // A fills up after two
			}
		}
		if s := strings.Join(got, ""); s != "AABBB" {
			t.Fatalf("picks %s, want AABBB", s)
		}
	})
	t.Run("only one eligible: it starts a new turn", func(t *testing.T) {
		ws := fleet(0, 0)
		ws[1].Status = Draining
		if got := picks(&WeightedRoundRobin{}, ws, 3); got != "AAA" {
			t.Fatalf("picks %s, want AAA", got)
		}
	})
	t.Run("the current worker gone: the turn continues after its ID", func(t *testing.T) {
		ws := fleet(0, 0, 0)
		p := &WeightedRoundRobin{}
		picks(p, ws, 2) // A, B
		if got := picks(p, []Worker{ws[0], ws[2]}, 2); got != "CA" {
			t.Fatalf("picks %s, want CA", got)
		}
	})
	t.Run("nothing eligible: none, and Reset starts over", func(t *testing.T) {
		ws := fleet(0, 0)
		p := &WeightedRoundRobin{}
		picks(p, ws, 1)
		ws[0].Status, ws[1].Status = Draining, Draining
		if got := picks(p, ws, 1); got != "-" {
			t.Fatalf("picked %s from a draining pool", got)
		}
		ws[0].Status, ws[1].Status = Available, Available
		p.Reset()
		if got := picks(p, ws, 1); got != "A" {
			t.Fatalf("after Reset picked %s, want A", got)
		}
	})
	t.Run("stale current worker is reported and charged", func(t *testing.T) {
		ws := fleet(0, 0, 0)
		ws[0].Capacity = 2
		p := &WeightedRoundRobin{Limits: Limits{StaleAfter: time.Second, MaxScan: 1}}
		picks(p, ws, 1) // A, turn 1 of 2
		ws[0].LastHeartbeat = t0.Add(-time.Minute)
		d := p.Select(ws, t0)
		if d.OK || len(d.Stale) != 1 || d.Stale[0] != "A" || d.Scanned != 1 {
			t.Fatalf("budget 1 with stale A: %+v, want none, stale [A]", d)
		}
	})
}

func TestWeightedRoundRobinConcurrent(t *testing.T) {
	// Safe for concurrent use: run under -race; every pick is counted once
	// and the weights hold overall.
	ws := fleet(0, 0)
	ws[0].Capacity, ws[1].Capacity = 3, 1
	p := &WeightedRoundRobin{}
	var mu sync.Mutex
	count := map[string]int{}
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 1000 {
				d := p.Select(ws, t0)
				mu.Lock()
				count[d.ID]++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if count["A"] != 3000 || count["B"] != 1000 {
		t.Fatalf("counts %v, want A 3000 and B 1000", count)
	}
}

func TestRoundRobinIgnoresWeights(t *testing.T) {
	ws := fleet(0, 0, 0)
	ws[0].Capacity, ws[1].Capacity, ws[2].Capacity = 3, 1, 2
	p := &RoundRobin{}
	var got []string
	for range 6 {
		got = append(got, p.Select(ws, t0).ID)
	}
	if s := strings.Join(got, ""); s != "ABCABC" {
		t.Fatalf("picks %s, want ABCABC", s)
	}
	p.Reset()
	ws[0].Status = Draining
	if d := p.Select(ws, t0); d.ID != "B" {
		t.Fatalf("after Reset with A draining: %s, want B", d.ID)
	}
}
