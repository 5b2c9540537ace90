package main

// The selection section: three tables from the pure algorithms of
// selection/ (no Redis, no network), each measured in this run.
//
//	gridbench -only selection          # about 40 s
//	gridbench -only selection -quick   # a few seconds, figures not meaningful

import (
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/browsergrid/caddy-browser-grid/selection"
)

func init() {
	register(section{name: "selection", order: 10, run: runSelection})
}

func runSelection(cfg *config) error {
	w := cfg.out
	for _, t := range []struct {
		what string
		run  func(io.Writer, bool) error
	}{
		{"timing decisions", selDecisionTable},
		{"measuring vnode imbalance", selImbalanceTable},
		{"simulating restarts", selStaggerTable},
	} {
		start := time.Now()
		if err := t.run(w, cfg.quick); err != nil {
			return fmt.Errorf("%s: %w", t.what, err)
		}
		fmt.Fprintf(w, "(%s took %s)\n\n", t.what, time.Since(start).Round(100*time.Millisecond))
	}
	return nil
}

var (
	selSizes  = []int{100, 1_000, 10_000}
	selLimits = selection.Limits{MaxLifetime: 100, MaxConcurrent: 4, StaleAfter: 10 * time.Second}
	selNow    = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
)

// selDecider makes a function that takes one decision over a pool of n.
type selDecider struct {
	name string
	make func(ws []selection.Worker) func() bool
}

func selSnapshot(p selection.Selector) func(ws []selection.Worker) func() bool {
	return func(ws []selection.Worker) func() bool {
		return func() bool { return p.Select(ws, selNow).OK }
	}
}

func selVnode(k int) func(ws []selection.Worker) func() bool {
	return func(ws []selection.Worker) func() bool {
		v := selection.Vnode{Limits: selLimits, Samples: k}
		v.SetDefaults()
		ring := selection.NewRing()
		byID := make(map[string]*selection.Worker, len(ws))
		for i := range ws {
			ring.Add(ws[i].ID, v.VirtualNodes)
			byID[ws[i].ID] = &ws[i]
		}
		lookup := func(id string) (*selection.Worker, bool) { w, ok := byID[id]; return w, ok }
		r := rand.New(rand.NewPCG(1, 2))
		return func() bool { return v.Select(ring, lookup, v.Draw(r), selNow).OK }
	}
}

// selTime is the mean time of one call of f: it runs f in growing batches
// until a batch takes at least target, three times, and keeps the fastest
// (the machine is shared; the slower runs measured the neighbours).
func selTime(f func() bool, target time.Duration) (time.Duration, error) {
	if !f() { // warm up: caches, and the ring's sort on first read
		return 0, fmt.Errorf("a decision found no worker")
	}
	best := time.Duration(math.MaxInt64)
	for range 3 {
		for n := 1; ; n *= 2 {
			start := time.Now()
			for range n {
				f()
			}
			if el := time.Since(start); el >= target || n >= 1<<30 {
				best = min(best, el/time.Duration(n))
				break
			}
		}
	}
	return best, nil
}

func selDecisionTable(w io.Writer, quick bool) error {
	target := 60 * time.Millisecond
	if quick {
		target = 2 * time.Millisecond
	}
	deciders := []selDecider{
		{"lifetime-first", selSnapshot(selection.LifetimeFirst{Limits: selLimits})},
		{"fair share (mean)", selSnapshot(selection.FairShare{Limits: selLimits, Window: 20, Default: 30 * time.Second})},
		{"fair share (median)", selSnapshot(selection.FairShare{Limits: selLimits, Window: 20, Default: 30 * time.Second, Median: true})},
		{"weighted round robin", selSnapshot(&selection.WeightedRoundRobin{Limits: selLimits})},
		{"vnode K=1", selVnode(1)},
		{"vnode K=2", selVnode(2)},
	}
	fmt.Fprintf(w, "### Decision time in Go, per policy and pool size\n\n")
	fmt.Fprintf(w, "One decision over a busy pool (selection.RandomFleet: max_lifetime 100, max_concurrent 4,\n")
	fmt.Fprintf(w, "every worker eligible), in this process: the Go reference the registry's scripts are\n")
	fmt.Fprintf(w, "checked against. Vnode includes its draw and a map lookup per ring entry walked.\n")
	fmt.Fprintf(w, "Ratio: time at N over time at N = 100 for the same policy.\n\n")
	fmt.Fprintf(w, "| policy | N = 100 | N = 1,000 | N = 10,000 |\n|---|---:|---:|---:|\n")
	for _, d := range deciders {
		var base time.Duration
		row := "| " + d.name + " |"
		for i, n := range selSizes {
			ws := selection.RandomFleet(n, selLimits, rand.New(rand.NewPCG(uint64(n), 1)), selNow)
			per, err := selTime(d.make(ws), target)
			if err != nil {
				return fmt.Errorf("%s at N=%d: %w", d.name, n, err)
			}
			if i == 0 {
				base = per
				row += fmt.Sprintf(" %s |", selNS(per))
				continue
			}
			row += fmt.Sprintf(" %s (%.1f×) |", selNS(per), float64(per)/float64(base))
		}
		fmt.Fprintln(w, row)
	}
	fmt.Fprintln(w)
	return nil
}

func selNS(d time.Duration) string {
	switch {
	case d >= time.Millisecond:
		return fmt.Sprintf("%.2f ms", float64(d)/1e6)
	case d >= 10*time.Microsecond:
		return fmt.Sprintf("%.1f µs", float64(d)/1e3)
	default:
		return fmt.Sprintf("%d ns", d.Nanoseconds())
	}
}

// selArcShare is the K = 1 selection probability of the busiest worker over
// the mean, exactly: a pivot uniform on the ring lands on the first entry
// at or after it, so each entry owns the arc from the previous entry
// (exclusive) to itself.
func selArcShare(ring *selection.Ring, n int) float64 {
	es := ring.Entries()
	pos := func(p selection.Pos) float64 { // fraction of the ring
		var x float64
		for _, b := range p {
			x = x*256 + float64(b)
		}
		return x / math.Pow(2, 128)
	}
	share := map[string]float64{}
	prev := pos(es[len(es)-1].Pos) - 1 // the wrap arc
	for _, e := range es {
		p := pos(e.Pos)
		share[e.ID] += p - prev
		prev = p
	}
	most := 0.0
	for _, s := range share {
		most = max(most, s)
	}
	return most * float64(n)
}

func selImbalanceTable(w io.Writer, quick bool) error {
	const n = 1_000
	rings, allocations := 5, 200_000
	if quick {
		rings, allocations = 1, 20_000
	}
	vs := []int{1, 4, 8, 16, 32, 64}
	seed := map[int]string{1: "~7", 4: "~2.7", 8: "~1.9", 16: "~1.4", 32: "~1.2", 64: "~1.1"}
	planning := map[int]string{1: "7.2", 4: "3.3", 8: "2.5", 16: "1.9", 32: "1.7", 64: "1.5"}
	fmt.Fprintf(w, "### Vnode imbalance at N = 1,000: busiest worker over the mean\n\n")
	fmt.Fprintf(w, "Median over %d rings of real-looking worker IDs (xxh3 positions). \"K=1 exact\" is the\n", rings)
	fmt.Fprintf(w, "busiest worker's share of the ring (its selection probability) over the mean; the K\n")
	fmt.Fprintf(w, "columns count %s allocations with no releases (K = 1 counts add sampling noise on top\n", selCount(allocations))
	fmt.Fprintf(w, "of the exact share). The vnode design's published column follows its 1 + ln(N)/V approximation; the\n")
	fmt.Fprintf(w, "planning column is DESIGN.md's independent simulation.\n\n")
	fmt.Fprintf(w, "| V | published (K=1) | planning (K=1) | K=1 exact | K=1 | K=2 | K=3 |\n|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, v := range vs {
		var exact []float64
		counts := map[int][]float64{}
		for ring := range rings {
			kr := rand.New(rand.NewPCG(uint64(ring), 1000))
			ws := make([]selection.Worker, n)
			r := selection.NewRing()
			for i := range ws {
				ws[i] = selection.Worker{ID: fmt.Sprintf("chromium-%012x", kr.Uint64()&0xffffffffffff), Status: selection.Available}
				r.Add(ws[i].ID, v)
			}
			exact = append(exact, selArcShare(r, n))
			byID := make(map[string]*selection.Worker, n)
			for i := range ws {
				byID[ws[i].ID] = &ws[i]
			}
			lookup := func(id string) (*selection.Worker, bool) { w, ok := byID[id]; return w, ok }
			for _, k := range []int{1, 2, 3} {
				for i := range ws {
					ws[i].Active = 0
				}
				vn := selection.Vnode{VirtualNodes: v, Samples: k, SlotJitter: selection.DefaultSlotJitter}
				rnd := rand.New(rand.NewPCG(uint64(ring), uint64(k)))
				most := 0
				for range allocations {
					d := vn.Select(r, lookup, vn.Draw(rnd), selNow)
					if !d.OK {
						return fmt.Errorf("V=%d K=%d: no worker", v, k)
					}
					byID[d.ID].Active++
					most = max(most, byID[d.ID].Active)
				}
				counts[k] = append(counts[k], float64(most)*n/float64(allocations))
			}
		}
		fmt.Fprintf(w, "| %d | %s | %s | %.2f | %.2f | %.2f | %.2f |\n", v, seed[v], planning[v],
			selMedian(exact), selMedian(counts[1]), selMedian(counts[2]), selMedian(counts[3]))
	}
	fmt.Fprintln(w)
	return nil
}

func selMedian(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func selCount(n int) string {
	if n >= 1000 && n%1000 == 0 {
		return fmt.Sprintf("%d,000", n/1000)
	}
	return fmt.Sprint(n)
}

func selStaggerTable(w io.Writer, quick bool) error {
	seeds, length := 5, 6*time.Hour
	if quick {
		seeds, length = 1, time.Hour
	}
	const capacity = 4
	meanSession := 10 * time.Second
	restart := 3 * time.Second
	fmt.Fprintf(w, "### Restarts: workers down at once (simulator)\n\n")
	fmt.Fprintf(w, "selection.Simulate: %d workers' slots each, sessions of 5-15 s (uniform) arriving as a\n", capacity)
	fmt.Fprintf(w, "Poisson process, a %.0f s browser restart after a drained worker's last session; a claim that\n", restart.Seconds())
	fmt.Fprintf(w, "reaches max_lifetime drains the worker. Load is the mean share of all slots in use. Worst\n")
	fmt.Fprintf(w, "of %d runs of %.0f simulated hours each after a 30 min warm-up (mean capacity: average of\n", seeds, length.Hours())
	fmt.Fprintf(w, "the runs).\n")
	fmt.Fprintf(w, "\"Down\" is draining or restarting; capacity is the share of workers taking sessions.\n\n")
	fmt.Fprintf(w, "| N | max_lifetime (margin) | load | policy | most down at once | lowest capacity | time with 2+ down | mean capacity | rejected |\n")
	fmt.Fprintf(w, "|---:|---:|---:|---|---:|---:|---:|---:|---:|\n")
	type policy struct {
		name string
		make func(l selection.Limits, r selection.Rand) selection.Selector
	}
	policies := []policy{
		{"lifetime-first", func(l selection.Limits, _ selection.Rand) selection.Selector {
			return selection.LifetimeFirst{Limits: l}
		}},
		{"lifetime-first + stagger_drains", func(l selection.Limits, _ selection.Rand) selection.Selector {
			l.StaggerDrains = true
			return selection.LifetimeFirst{Limits: l}
		}},
		{"round robin", func(l selection.Limits, _ selection.Rand) selection.Selector { return &selection.RoundRobin{Limits: l} }},
		{"weighted round robin", func(l selection.Limits, _ selection.Rand) selection.Selector {
			return &selection.WeightedRoundRobin{Limits: l}
		}},
		{"fair share", func(l selection.Limits, _ selection.Rand) selection.Selector {
			return selection.FairShare{Limits: l, Window: 20, Default: meanSession}
		}},
		{"vnode K=2", func(l selection.Limits, r selection.Rand) selection.Selector {
			v := selection.Vnode{Limits: l, VirtualNodes: 8, Samples: 2, SlotJitter: 4}
			return &selection.VnodeSelector{Vnode: v, Rand: r}
		}},
	}
	for _, pool := range []struct{ n, limit int }{{4, 50}, {10, 100}} {
		for _, load := range []float64{0.25, 0.6} {
			interarrival := time.Duration(float64(meanSession) / (load * float64(pool.n*capacity)))
			for _, p := range policies {
				worst, minCap, together, meanCap, rejected, arrivals := 0, 1.0, time.Duration(0), 0.0, 0, 0
				for s := range seeds {
					l := selection.Limits{MaxLifetime: pool.limit, MaxConcurrent: capacity}
					r := rand.New(rand.NewPCG(uint64(s), 3))
					res, err := selection.Simulate(selection.SimConfig{
						Workers: pool.n, Limits: l,
						Interarrival: selection.Exponential(interarrival),
						Duration:     selection.Uniform(5*time.Second, 15*time.Second),
						RestartDelay: restart, Warmup: 30 * time.Minute, Length: length,
						Policy: p.make(l, r), Rand: r,
					})
					if err != nil {
						return fmt.Errorf("%s, N=%d: %w", p.name, pool.n, err)
					}
					worst, minCap = max(worst, res.MaxDown), min(minCap, res.MinCapacity)
					for k := 2; k < len(res.DownTime); k++ {
						together += res.DownTime[k]
					}
					meanCap += res.MeanCapacity / float64(seeds)
					rejected += res.Rejected
					arrivals += res.Arrivals
				}
				fmt.Fprintf(w, "| %d | %d (%d) | %.0f%% | %s | %d | %.2f | %.2f%% | %.3f | %.2f%% |\n",
					pool.n, pool.limit, selection.Margin(pool.limit, pool.n), load*100, p.name, worst, minCap,
					100*together.Seconds()/(float64(seeds)*length.Seconds()), meanCap, 100*float64(rejected)/float64(max(arrivals, 1)))
			}
		}
	}
	fmt.Fprintln(w)
	return nil
}
