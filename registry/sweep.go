package registry

import "sync/atomic"

// claimSweepEvery is how often a claim frees expired leases and forgets
// old tombstones before it walks (1 in this many claims of a Registry).
// The sweep is two range reads at the top of the claim script; on the
// other claims the script skips it (it receives 0 as its sweep size).
// Counts still heal within a bounded time: every heartbeat sweeps (a
// pool of N workers heartbeating every T sweeps every T/N), the reaper
// sweeps, and a claim that found no worker makes the next claim sweep,
// so a pool full of expired leases serves again at its next try.
const claimSweepEvery = 8

// claimSweeper chooses which claims sweep.
type claimSweeper struct {
	n    atomic.Uint64
	next atomic.Bool // the last claim found no worker
}

// size returns how many expired leases this claim frees first: max in 1
// of claimSweepEvery calls and after a claim that found no worker, else 0.
func (s *claimSweeper) size(max int) int {
	if s.next.Swap(false) || s.n.Add(1)%claimSweepEvery == 0 {
		return max
	}
	return 0
}

// noWorker records that a claim found no worker: the next one sweeps.
func (s *claimSweeper) noWorker() { s.next.Store(true) }
