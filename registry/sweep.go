package registry

import "sync/atomic"

// claimSweepEvery is how often a claim frees expired leases and forgets
// old tombstones before it walks (1 in this many claims of a Registry).
// The sweep is one range read of lease_expiry (expired leases and due
// tombstones both) at the top of the claim script; on the
// other claims the script skips it (it receives 0 as its sweep size).
// No answer depends on it: a claim that skipped the sweep and found no
// worker, or found its client at its limit, runs once more with the sweep
// (expired leases may be what filled them), so a claim is refused exactly
// when one that swept would be. Counts heal within a bounded time as
// before: every heartbeat and the reaper sweep too.
const claimSweepEvery = 8

// claimSweeper chooses which claims sweep.
type claimSweeper struct {
	n atomic.Uint64
}

// size returns how many expired leases this claim frees first: max in 1
// of claimSweepEvery calls, else 0.
func (s *claimSweeper) size(max int) int {
	if s.n.Add(1)%claimSweepEvery == 0 {
		return max
	}
	return 0
}

// retry reports whether claim.lua's reply is a refusal a sweep could turn
// into a grant: no worker ({0, ...}, the full reply) or a client at its
// limit ({-4, n}).
func (s *claimSweeper) retry(res []any) bool {
	if len(res) == 0 {
		return false
	}
	x, _ := res[0].(int64)
	return x == claimClientLimit || (x == 0 && len(res) == len(claimReply))
}
