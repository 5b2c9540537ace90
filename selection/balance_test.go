package selection

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// keySet is n worker IDs shaped like real ones ("chromium-" and 12 random
// hex digits), drawn from a seeded source: not chosen for their ring
// positions.
func keySet(set uint64, n int) []Worker {
	r := rand.New(rand.NewPCG(set, 100))
	ws := make([]Worker, n)
	for i := range ws {
		ws[i] = Worker{ID: fmt.Sprintf("chromium-%012x", r.Uint64()&0xffffffffffff), Status: Available}
	}
	return ws
}

// allocate makes the given number of vnode allocations with no releases
// and returns the busiest worker's count over the mean.
func allocate(ws []Worker, v Vnode, allocations int, r Rand) float64 {
	ring := NewRing()
	byID := make(map[string]*Worker, len(ws))
	for i := range ws {
		ws[i].Active = 0
		ring.Add(ws[i].ID, v.VirtualNodes)
		byID[ws[i].ID] = &ws[i]
	}
	lookup := func(id string) (*Worker, bool) { w, ok := byID[id]; return w, ok }
	for range allocations {
		d := v.Select(ring, lookup, v.Draw(r), t0)
		if !d.OK {
			panic("no worker in an all-available pool")
		}
		byID[d.ID].Active++
	}
	most := 0
	for i := range ws {
		most = max(most, ws[i].Active)
	}
	return float64(most) * float64(len(ws)) / float64(allocations)
}

// TestRivetBound reproduces the vnode design's balance test (N = 100, V = 8,
// K = 1, 100,000 allocations) with real hashed ring positions.
//
// What holds, and is asserted: the seed states "max/mean <= 2.0", but its
// own test places ring positions deterministically. With xxh3 positions of
// real IDs the busiest worker's share over the mean varies with the key
// set: DESIGN.md measured a median of 2.04 (p90 2.6), and 41 key sets here
// gave a median of 2.07, with only a third to a half at or below 2.0. So for K = 1
// the test asserts the median over many key sets stays near 2 (1.8-2.3,
// where 1 + ln(N)/V = 1.58 is the seed's approximation and a single unlucky
// set may reach 2.6), not a per-set bound that only lucky IDs would pass.
// For K = 2, on the same rings: every key set is at or below 2.0 (measured:
// about 1.02) and strictly better than K = 1.
func TestRivetBound(t *testing.T) {
	sets := 15
	if testing.Short() {
		sets = 5
	}
	const n, allocations = 100, 100_000
	var k1 []float64
	atMost2 := 0
	for set := uint64(1); set <= uint64(sets); set++ {
		ws := keySet(set, n)
		one := allocate(ws, Vnode{VirtualNodes: 8, Samples: 1, SlotJitter: 4}, allocations, rand.New(rand.NewPCG(set, 1)))
		two := allocate(ws, Vnode{VirtualNodes: 8, Samples: 2, SlotJitter: 4}, allocations, rand.New(rand.NewPCG(set, 2)))
		t.Logf("key set %2d: K=1 max/mean %.3f, K=2 %.3f", set, one, two)
		if two > 2.0 {
			t.Errorf("key set %d: K=2 max/mean %.3f > 2.0", set, two)
		}
		if two >= one {
			t.Errorf("key set %d: K=2 (%.3f) not better than K=1 (%.3f)", set, two, one)
		}
		if one <= 2.0 {
			atMost2++
		}
		k1 = append(k1, one)
	}
	slices.Sort(k1)
	median := k1[len(k1)/2]
	t.Logf("K=1: median %.3f over %d key sets; %d of them at or below the seed's 2.0", median, sets, atMost2)
	if median < 1.8 || median > 2.3 {
		t.Errorf("K=1 median max/mean %.3f, want near 2 (1.8-2.3)", median)
	}
}

// TestVnodeKBeatsUniformUnderLoad checks power-of-K where it matters: with
// sessions ending, K >= 2 keeps the busiest worker near the mean while
// K = 1 follows the ring's arc shares.
func TestVnodeKBeatsUniformUnderLoad(t *testing.T) {
	ws := keySet(99, 50)
	peak := map[int]int{}
	for _, k := range []int{1, 2, 3} {
		for i := range ws {
			ws[i].Active = 0
		}
		r := rand.New(rand.NewPCG(99, uint64(k)))
		s := &VnodeSelector{Vnode: Vnode{VirtualNodes: 8, Samples: k, SlotJitter: 4}, Rand: r}
		// 500 sessions live at a time: each allocation ends a random
		// earlier session once 500 are live.
		var live []int
		for step := range 20_000 {
			d := s.Select(ws, t0)
			ws[d.Index].Active++
			live = append(live, d.Index)
			if len(live) > 500 {
				j := r.IntN(len(live))
				ws[live[j]].Active--
				live[j] = live[len(live)-1]
				live = live[:len(live)-1]
			}
			if step > 5000 {
				for i := range ws {
					peak[k] = max(peak[k], ws[i].Active)
				}
			}
		}
	}
	t.Logf("peak active per worker (mean 10): K=1 %d, K=2 %d, K=3 %d", peak[1], peak[2], peak[3])
	if !(peak[2] < peak[1] && peak[3] <= peak[2]) {
		t.Fatalf("peaks K=1 %d, K=2 %d, K=3 %d: want K=1 > K=2 >= K=3", peak[1], peak[2], peak[3])
	}
	if peak[2] > 20 {
		t.Fatalf("K=2 peak %d, want at most twice the mean of 10", peak[2])
	}
}
