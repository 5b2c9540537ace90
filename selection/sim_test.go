package selection

import (
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// staggerScenario is the lifetime-first rule's setting made concrete: 4 workers, a limit
// of 50 sessions (margin 12), 4 sessions at once per worker, sessions of
// 5-15 s arriving every 2-6 s, and a 3 s browser restart. A worker that
// reaches the limit is down for at most 15 s (its last session) + 3 s,
// while the next worker needs at least a margin of 12 sessions, >= 24 s,
// to get there: the condition under which lifetime-first can stagger.
func staggerScenario(p Selector, seed uint64) SimConfig {
	return SimConfig{
		Workers:      4,
		Limits:       Limits{MaxLifetime: 50, MaxConcurrent: 4},
		Interarrival: Uniform(2*time.Second, 6*time.Second),
		Duration:     Uniform(5*time.Second, 15*time.Second),
		RestartDelay: 3 * time.Second,
		Warmup:       30 * time.Minute,
		Length:       6 * time.Hour,
		Policy:       p,
		Rand:         rand.New(rand.NewPCG(seed, 3)),
		Trace:        time.Minute,
	}
}

// spread is the mean, over a trace, of the gap between the highest and
// lowest lifetime: a staircase is wide, lockstep is narrow.
func spread(tr []SimSample) float64 {
	var sum float64
	for _, s := range tr {
		lo, hi := s.Lifetimes[0], s.Lifetimes[0]
		for _, l := range s.Lifetimes {
			lo, hi = min(lo, l), max(hi, l)
		}
		sum += float64(hi - lo)
	}
	return sum / float64(len(tr))
}

// TestSimulatorLifetimeFirstStaggersRoundRobinDoesNot is the lifetime-first rule's first
// two pictures as numbers: in steady state lifetime-first never has more
// than one worker draining or restarting (capacity >= 3/4), while round
// robin keeps lifetimes in lockstep and takes workers down together.
func TestSimulatorLifetimeFirstStaggersRoundRobinDoesNot(t *testing.T) {
	l := Limits{MaxLifetime: 50, MaxConcurrent: 4}
	allDown := 0
	for seed := uint64(1); seed <= 8; seed++ {
		lf, err := Simulate(staggerScenario(LifetimeFirst{l}, seed))
		if err != nil {
			t.Fatal(err)
		}
		rr, err := Simulate(staggerScenario(&RoundRobin{Limits: l}, seed))
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("seed %d: lifetime-first most down %d, lowest capacity %.2f, restarts %d, spread %.1f; round robin %d, %.2f, %d, spread %.1f",
			seed, lf.MaxDown, lf.MinCapacity, lf.Restarts, spread(lf.Trace), rr.MaxDown, rr.MinCapacity, rr.Restarts, spread(rr.Trace))
		// The scenario exercised restarts: over 6 h about 2 per worker per 25 min.
		if lf.Restarts < 50 || rr.Restarts < 50 {
			t.Fatalf("seed %d: only %d / %d restarts; the scenario does not reach the limit", seed, lf.Restarts, rr.Restarts)
		}
		if lf.MaxDown != 1 || lf.MinCapacity != 0.75 {
			t.Errorf("seed %d: lifetime-first had %d workers down at once (capacity %.2f), want 1 (0.75)", seed, lf.MaxDown, lf.MinCapacity)
		}
		var lfTogether, rrTogether time.Duration
		for k := 2; k <= 4; k++ {
			lfTogether += lf.DownTime[k]
			rrTogether += rr.DownTime[k]
		}
		if lfTogether != 0 {
			t.Errorf("seed %d: lifetime-first spent %s with 2+ workers down", seed, lfTogether)
		}
		if rr.MaxDown < 3 || rrTogether < time.Minute {
			t.Errorf("seed %d: round robin had at most %d down, %s with 2+ down; want 3+ down together", seed, rr.MaxDown, rrTogether)
		}
		if rr.MaxDown == 4 {
			allDown++
		}
		// The lifetime-first rule's monitoring: a staircase of lifetimes, not lockstep.
		if s, r := spread(lf.Trace), spread(rr.Trace); s < 1.5*r {
			t.Errorf("seed %d: lifetime spread %.1f (lifetime-first) vs %.1f (round robin): no staircase", seed, s, r)
		}
	}
	if allDown < 4 {
		t.Errorf("round robin took all 4 workers down at once in %d of 8 runs, want most", allDown)
	}
}

func TestSimulatorDeterministicAndValid(t *testing.T) {
	l := Limits{MaxLifetime: 50, MaxConcurrent: 4}
	run := func(p Selector) SimResult {
		res, err := Simulate(staggerScenario(p, 7))
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	for name, mk := range map[string]func() Selector{
		"lifetime-first": func() Selector { return LifetimeFirst{l} },
		"fair share":     func() Selector { return FairShare{Limits: l, Window: 20, Default: 10 * time.Second} },
		"weighted rr":    func() Selector { return &WeightedRoundRobin{Limits: l} },
		"vnode": func() Selector {
			return &VnodeSelector{Vnode: Vnode{Limits: l, VirtualNodes: 8, Samples: 2, SlotJitter: 4}, Rand: rand.New(rand.NewPCG(1, 1))}
		},
	} {
		t.Run(name, func(t *testing.T) {
			a, b := run(mk()), run(mk())
			if a.Served != b.Served || a.MaxDown != b.MaxDown || a.DownTime[1] != b.DownTime[1] {
				t.Fatalf("same inputs, different results: %+v vs %+v", a.DownTime, b.DownTime)
			}
			if a.Served+a.Rejected != a.Arrivals || a.Arrivals < 3000 {
				t.Fatalf("served %d + rejected %d != arrivals %d", a.Served, a.Rejected, a.Arrivals)
			}
			var total time.Duration
			for _, d := range a.DownTime {
				total += d
			}
			if total != 6*time.Hour {
				t.Fatalf("down-time histogram covers %s, want the 6h measured", total)
			}
			if a.MeanCapacity <= a.MinCapacity || a.MeanCapacity > 1 {
				t.Fatalf("mean capacity %.3f outside (min %.3f, 1]", a.MeanCapacity, a.MinCapacity)
			}
		})
	}
	for _, c := range []struct {
		edit func(*SimConfig)
		err  string
	}{
		{func(c *SimConfig) { c.Workers = 0 }, "0 workers"},
		{func(c *SimConfig) { c.Policy = nil }, "Policy"},
		{func(c *SimConfig) { c.Duration = nil }, "Duration"},
		{func(c *SimConfig) { c.Length = 0 }, "length"},
	} {
		cfg := staggerScenario(LifetimeFirst{l}, 1)
		c.edit(&cfg)
		if _, err := Simulate(cfg); err == nil || !strings.Contains(err.Error(), c.err) {
			t.Errorf("error %v, want one naming %q", err, c.err)
		}
	}
}

func TestDists(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	u := Uniform(2*time.Second, 6*time.Second)
	e := Exponential(4 * time.Second)
	var ue, ee time.Duration
	const n = 20000
	for range n {
		x := u(r)
		if x < 2*time.Second || x > 6*time.Second || x%time.Millisecond != 0 {
			t.Fatalf("uniform gave %s", x)
		}
		ue += x
		y := e(r)
		if y < 0 {
			t.Fatalf("exponential gave %s", y)
		}
		ee += y
	}
	if m := ue / n; m < 3900*time.Millisecond || m > 4100*time.Millisecond {
		t.Fatalf("uniform mean %s, want about 4s", m)
	}
	if m := ee / n; m < 3800*time.Millisecond || m > 4200*time.Millisecond {
		t.Fatalf("exponential mean %s, want about 4s", m)
	}
	if Fixed(time.Second)(r) != time.Second {
		t.Fatal("fixed")
	}
}
