package selection

import (
	"math/rand/v2"
	"testing"
	"time"
)

func TestStaggerDrainsHoldsBackTheNextLastSession(t *testing.T) {
	now := time.UnixMilli(1_700_000_000_000)
	fresh, old := now.Add(-time.Second), now.Add(-time.Minute)
	base := Limits{MaxLifetime: 20, MaxConcurrent: 2, StaleAfter: 10 * time.Second, StaggerDrains: true}
	cases := []struct {
		name    string
		limits  Limits
		workers []Worker
		want    string // "" for none
	}{
		{
			name:   "a draining worker holds back the one a session short of the limit",
			limits: base,
			workers: []Worker{
				{ID: "a", Status: Draining, Lifetime: 20, Active: 1, LastHeartbeat: fresh},
				{ID: "b", Status: Available, Lifetime: 19, LastHeartbeat: fresh},
				{ID: "c", Status: Available, Lifetime: 4, LastHeartbeat: fresh},
			},
			want: "c",
		},
		{
			name:   "a worker at the limit awaiting its command counts as retiring",
			limits: base,
			workers: []Worker{
				{ID: "a", Status: Available, Lifetime: 20, Active: 1, LastHeartbeat: fresh},
				{ID: "b", Status: Available, Lifetime: 19, LastHeartbeat: fresh},
			},
			want: "",
		},
		{
			name:   "a stale draining worker is dead, not retiring",
			limits: base,
			workers: []Worker{
				{ID: "a", Status: Draining, Lifetime: 20, LastHeartbeat: old},
				{ID: "b", Status: Available, Lifetime: 19, LastHeartbeat: fresh},
			},
			want: "b",
		},
		{
			name:   "nothing retiring: the last session is granted",
			limits: base,
			workers: []Worker{
				{ID: "b", Status: Available, Lifetime: 19, LastHeartbeat: fresh},
				{ID: "c", Status: Available, Lifetime: 4, Active: 2, LastHeartbeat: fresh},
			},
			want: "b",
		},
		{
			name: "without StaggerDrains the seed's rule alone decides",
			limits: func() Limits {
				l := base
				l.StaggerDrains = false
				return l
			}(),
			workers: []Worker{
				{ID: "a", Status: Draining, Lifetime: 20, Active: 1, LastHeartbeat: fresh},
				{ID: "b", Status: Available, Lifetime: 19, LastHeartbeat: fresh},
			},
			want: "b",
		},
		{
			name:   "sessions that do not reach the limit are never held back",
			limits: base,
			workers: []Worker{
				{ID: "a", Status: Draining, Lifetime: 20, Active: 1, LastHeartbeat: fresh},
				{ID: "b", Status: Available, Lifetime: 18, LastHeartbeat: fresh},
			},
			want: "b",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			policies := map[string]Selector{
				"lifetime_first": LifetimeFirst{tc.limits},
				"fair_share":     func() FairShare { f := FairShare{Limits: tc.limits}; f.SetDefaults(); return f }(),
				"vnode": &VnodeSelector{Vnode: func() Vnode {
					v := Vnode{Limits: tc.limits}
					v.SetDefaults()
					v.MaxScan = 64
					return v
				}(), Rand: rand.New(rand.NewPCG(1, 2))},
			}
			for name, p := range policies {
				d := p.Select(tc.workers, now)
				if d.ID != tc.want || d.OK != (tc.want != "") {
					t.Errorf("%s chose %q (ok %v), want %q", name, d.ID, d.OK, tc.want)
				}
			}
		})
	}
}

func TestVnodeTakesRetiringFromTheCaller(t *testing.T) {
	now := time.UnixMilli(1_700_000_000_000)
	w := Worker{ID: "b", Status: Available, Lifetime: 9, LastHeartbeat: now}
	v := Vnode{Limits: Limits{MaxLifetime: 10, StaggerDrains: true}}
	v.SetDefaults()
	ring := NewRing()
	ring.Add("b", v.VirtualNodes)
	lookup := func(string) (*Worker, bool) { return &w, true }
	draw := v.Draw(rand.New(rand.NewPCG(3, 4)))
	if d := v.Select(ring, lookup, draw, now); !d.OK {
		t.Fatalf("nothing retiring: want b, got none")
	}
	v.Retiring = true
	if d := v.Select(ring, lookup, draw, now); d.OK {
		t.Fatalf("pool retiring: b's last session must wait, got %q", d.ID)
	}
}

// TestStaggerDrainsKeepsOneWorkerDownUnderHeavyLoad: the load at which
// the lifetime-first rule's margin alone lets restarts overlap (ten workers of four slots,
// sessions of 5-15 s arriving every 400 ms on average: about 60% busy)
// keeps exactly one worker down at a time with StaggerDrains, and turns
// away hardly more sessions (the simulator does not queue them, as the
// grid would).
func TestStaggerDrainsKeepsOneWorkerDownUnderHeavyLoad(t *testing.T) {
	rejected := map[bool]float64{}
	for _, stagger := range []bool{false, true} {
		worst := 0
		var turnedAway, arrivals int
		for seed := uint64(1); seed <= 4; seed++ {
			l := Limits{MaxLifetime: 100, MaxConcurrent: 4, StaggerDrains: stagger}
			res, err := Simulate(SimConfig{
				Workers:      10,
				Limits:       l,
				Interarrival: Exponential(400 * time.Millisecond),
				Duration:     Uniform(5*time.Second, 15*time.Second),
				RestartDelay: 3 * time.Second,
				Warmup:       10 * time.Minute,
				Length:       time.Hour,
				Policy:       LifetimeFirst{l},
				Rand:         rand.New(rand.NewPCG(seed, 9)),
			})
			if err != nil {
				t.Fatal(err)
			}
			if res.Restarts < 20 {
				t.Fatalf("only %d restarts: the scenario does not exercise restarts", res.Restarts)
			}
			worst = max(worst, res.MaxDown)
			turnedAway += res.Rejected
			arrivals += res.Arrivals
		}
		rejected[stagger] = float64(turnedAway) / float64(arrivals)
		t.Logf("StaggerDrains %v: most workers down at once %d, sessions finding no slot %.2f%%", stagger, worst, 100*rejected[stagger])
		if stagger && worst != 1 {
			t.Errorf("with StaggerDrains %d workers were down at once, want 1", worst)
		}
		if !stagger && worst < 2 {
			t.Errorf("without StaggerDrains at most %d down: the scenario is too light to show the difference", worst)
		}
	}
	if rejected[true] > rejected[false]+0.01 {
		t.Errorf("StaggerDrains left %.2f%% of sessions without a slot, against %.2f%% without it", 100*rejected[true], 100*rejected[false])
	}
}
