package selection

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// Decision cost per policy at N = 100, 1,000 and 10,000 workers (figures,
// not assertions: `make bench`, or cmd/gridbench for the ratio table).

var (
	benchSizes  = []int{100, 1_000, 10_000}
	benchLimits = Limits{MaxLifetime: 100, MaxConcurrent: 4, StaleAfter: 10e9}
)

func benchFleet(n int) []Worker {
	return RandomFleet(n, benchLimits, rand.New(rand.NewPCG(uint64(n), 1)), t0)
}

func benchSnapshot(b *testing.B, p Selector) {
	for _, n := range benchSizes {
		b.Run(fmt.Sprintf("N=%d", n), func(b *testing.B) {
			ws := benchFleet(n)
			b.ReportAllocs()
			for b.Loop() {
				if d := p.Select(ws, t0); !d.OK {
					b.Fatal("no worker")
				}
			}
		})
	}
}

func BenchmarkLifetimeFirst(b *testing.B) { benchSnapshot(b, LifetimeFirst{benchLimits}) }

func BenchmarkFairShare(b *testing.B) {
	benchSnapshot(b, FairShare{Limits: benchLimits, Window: 20, Default: 30e9})
}

func BenchmarkFairShareMedian(b *testing.B) {
	benchSnapshot(b, FairShare{Limits: benchLimits, Window: 20, Default: 30e9, Median: true})
}

func BenchmarkWeightedRoundRobin(b *testing.B) {
	benchSnapshot(b, &WeightedRoundRobin{Limits: benchLimits})
}

// BenchmarkVnode times Draw plus Select over a prebuilt ring, with a map
// lookup per ring entry walked (what the registry's script does with
// HGETs).
func BenchmarkVnode(b *testing.B) {
	for _, k := range []int{1, 2} {
		for _, n := range benchSizes {
			b.Run(fmt.Sprintf("K=%d/N=%d", k, n), func(b *testing.B) {
				ws := benchFleet(n)
				v := Vnode{Limits: benchLimits, Samples: k}
				v.SetDefaults()
				ring := NewRing()
				byID := make(map[string]*Worker, n)
				for i := range ws {
					ring.Add(ws[i].ID, v.VirtualNodes)
					byID[ws[i].ID] = &ws[i]
				}
				lookup := func(id string) (*Worker, bool) { w, ok := byID[id]; return w, ok }
				r := rand.New(rand.NewPCG(1, 2))
				b.ReportAllocs()
				for b.Loop() {
					if d := v.Select(ring, lookup, v.Draw(r), t0); !d.OK {
						b.Fatal("no worker")
					}
				}
			})
		}
	}
}
