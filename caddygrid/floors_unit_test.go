package caddygrid

import (
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/registry"
)

// A floor is the lifetime Redis held for the worker generation after this
// process's sessions: a claim made before a served one and undone after it
// is taken off that one's lifetime (it counted the claim, and the undo gave
// it back in Redis); other undos are not (its lifetime never counted them).
// A client that leaves before its upgrade must not make a worker retire
// early after a loss, nor later claims' undos make it serve past its limit
// (the last two cases: a floor below what Redis held).
func TestFloorTakesOffWhatWasUndone(t *testing.T) {
	type step struct {
		op   string // "claim", "serve", "undo"
		name string
		life int
	}
	for _, tc := range []struct {
		name  string
		steps []step
		want  int
	}{
		{"three undone after the served one was claimed", []step{
			{"claim", "a", 1}, {"claim", "b", 2}, {"claim", "c", 3}, {"claim", "d", 4},
			{"undo", "a", 0}, {"undo", "b", 0}, {"undo", "c", 0}, {"serve", "d", 0},
		}, 1},
		{"undone before the next claim took its number", []step{
			{"claim", "a", 5}, {"undo", "a", 0}, {"claim", "c", 5}, {"serve", "c", 0},
		}, 5},
		{"an earlier claim undone after the served one ended", []step{
			{"claim", "x", 4}, {"claim", "y", 5}, {"serve", "y", 0}, {"undo", "x", 0},
		}, 4},
		{"a later claim undone", []step{
			{"claim", "x", 4}, {"serve", "x", 0}, {"claim", "y", 5}, {"undo", "y", 0},
		}, 4},
		{"served ones only", []step{
			{"claim", "x", 1}, {"claim", "y", 2}, {"serve", "y", 0}, {"serve", "x", 0},
		}, 2},
		{"a claim after the served one, with a lower lifetime, undone", []step{
			{"claim", "a", 3}, {"claim", "b", 4}, {"claim", "y", 5}, {"undo", "a", 0}, {"undo", "b", 0},
			{"claim", "z", 4}, {"undo", "z", 0}, {"serve", "y", 0},
		}, 3},
		{"a later served claim holds more than the highest one", []step{
			{"claim", "x", 4}, {"claim", "w", 5}, {"claim", "y", 6}, {"undo", "x", 0}, {"undo", "w", 0},
			{"claim", "z", 5}, {"serve", "z", 0}, {"serve", "y", 0},
		}, 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := &backend{leases: map[string]map[string]*liveLease{"p": {}}}
			claims := map[string]*registry.Claim{}
			for _, s := range tc.steps {
				time.Sleep(time.Millisecond) // each step after the last, as the clock sees it
				switch s.op {
				case "claim":
					c := &registry.Claim{LeaseID: s.name, Pool: "p", Gen: "g1",
						Worker: registry.WorkerInfo{ID: "w", Lifetime: s.life}}
					claims[s.name] = c
					began := time.Now()
					time.Sleep(time.Millisecond) // the claim call
					b.leases["p"][s.name] = &liveLease{renewal: registry.LeaseRenewal{Claimed: began}, done: time.Now()}
				case "serve", "undo":
					b.noteEnded(claims[s.name], s.op == "serve")
					delete(b.leases["p"], s.name)
				}
			}
			f := b.floors["p"][floorKey{"w", "g1"}]
			if f == nil || f.value() != tc.want {
				t.Fatalf("floor %+v, want %d", f, tc.want)
			}
			b.pruneFloors(time.Now())
			if got := b.floors["p"][floorKey{"w", "g1"}].value(); got != tc.want {
				t.Errorf("floor %d after pruning its undos, want %d", got, tc.want)
			}
		})
	}
}
