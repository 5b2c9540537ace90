// Package selection holds the pure worker-selection algorithms of the grid:
// lifetime-first, the vnode ring with power-of-K choices, fair share and
// weighted round robin (poolifier's strategies), and a fleet simulator
// that shows what each does to a pool over time.
//
// Every function works on a snapshot of workers and takes its randomness and
// clock from the caller, so the same inputs always give the same answer. That
// is what lets the registry's Lua scripts be checked against this package: the
// registry draws the random inputs in Go, hands the same values to Redis and
// to these functions, and the two must agree.
//
// Time is compared at millisecond precision everywhere (Redis stores
// milliseconds), and durations are whole milliseconds.
package selection

import "time"

// Status is what a worker's agent says about it.
type Status string

// The statuses a worker record may carry. Anything else is a bad record.
const (
	// Available workers take new sessions.
	Available Status = "available"
	// Draining workers finish their sessions and take no new ones; they
	// count as retiring (StaggerDrains).
	Draining Status = "draining"
	// Replaced workers drain too, but their replacement already serves:
	// they do not count as retiring.
	Replaced Status = "replaced"
)

// Worker is one worker's figures at the instant of a decision.
type Worker struct {
	// ID is unique within a pool.
	ID string
	// Status as the worker's agent last reported it.
	Status Status
	// Active is the number of live sessions on the worker.
	Active int
	// Lifetime is the number of sessions ever claimed on the worker since it
	// registered (it only grows; the worker restarts at the pool's limit).
	Lifetime int
	// Capacity is how many sessions the worker accepts at once, as its agent
	// registered it. 0 means the worker sets no limit of its own.
	Capacity int
	// Weight is the worker's share of turns in interleaved weighted round
	// robin, 1-MaxWeight, as its agent registered it; 0 counts as 1.
	Weight int
	// LastHeartbeat is when the agent last heartbeated.
	LastHeartbeat time.Time
	// SuspectUntil: a proxy failed to reach the worker, so it is not
	// eligible before this instant. Zero means not suspect.
	SuspectUntil time.Time
	// Durations are the most recent session durations, oldest first (fair
	// share). At most the policy's window is kept.
	Durations []time.Duration
	// PredictedEnd is fair share's predicted end of the worker's queue.
	PredictedEnd time.Time
	// Hold keeps the worker from its last session: its agent still runs
	// the browser it replaced, and runs at most two.
	Hold bool
}

// Limits are the pool-wide rules every policy applies to decide whether a
// worker may take a session at all.
type Limits struct {
	// MaxConcurrent caps live sessions per worker. A worker's effective cap
	// is the smaller of MaxConcurrent and its own Capacity, ignoring either
	// when it is 0. Both 0: no cap.
	MaxConcurrent int
	// MaxLifetime is the number of sessions after which a worker restarts.
	// 0: no limit.
	MaxLifetime int
	// StaleAfter is the heartbeat age past which a worker is not fresh.
	// A heartbeat exactly StaleAfter old is still fresh. 0: never stale.
	StaleAfter time.Duration
	// MaxScan bounds how many indexed-but-unusable workers (not fresh, or
	// suspect) a decision walks past before it gives up and reports none,
	// as the vnode design's max_scan does. 0: unbounded.
	MaxScan int
	// StaggerDrains keeps restarts one at a time: while any fresh worker of
	// the pool is retiring (IsRetiring: draining, or at MaxLifetime waiting
	// for its agent to see the shutdown command), a claim may not bring
	// another worker to MaxLifetime. That worker's last session waits (or
	// goes elsewhere) until the retiring one is gone, so two workers never
	// drain at once, whatever the load. Needs MaxLifetime > 0.
	StaggerDrains bool
	// Retiring is state of the pool at the instant of a decision, not
	// configuration: whether some fresh worker of the pool is retiring.
	// Decisions that see the whole pool (LifetimeFirst, FairShare,
	// VnodeSelector) work it out from their snapshot with AnyRetiring;
	// Vnode.Select, which sees only the ring entries it walks, takes it from
	// here (the registry's scripts read it from the pool's retiring set).
	Retiring bool
}

// Rand is the randomness a decision may consume. *math/rand/v2.Rand
// satisfies it; tests pass a scripted source.
type Rand interface {
	Uint64() uint64
	IntN(n int) int
}

// Decision is what a policy chose and what it walked past on the way.
type Decision struct {
	// Index into the snapshot slice, or -1 (ring decisions: -1).
	Index int
	// ID of the chosen worker; "" when none.
	ID string
	// OK is false when nothing was eligible.
	OK bool
	// Stale lists workers walked past whose heartbeat was too old, in the
	// order seen, without repeats, so a caller can expire them.
	Stale []string
	// Scanned counts index entries examined (ring entries for vnode).
	Scanned int
	// Wraps counts ring walks that wrapped past the end (vnode).
	Wraps int
	// Effective counts unique candidates (vnode, K >= 2).
	Effective int
	// Dedupes counts samples that resolved to an already chosen worker.
	Dedupes int
	// TiedMin is true when two or more candidates tied at the minimum and
	// the random tiebreak decided (vnode, K >= 2).
	TiedMin bool
}

// Vnode is the ring with power-of-K choices of the vnode design (Rivet pegboard). Its scan budget is
// Limits.MaxScan.
type Vnode struct {
	Limits
	// VirtualNodes is V, ring positions per worker. Default: 8.
	VirtualNodes int
	// Samples is K, independent pivots per decision. Default: 2.
	Samples int
	// SlotJitter adds a random integer in [0, SlotJitter) to each
	// candidate's active count before comparing. Default: 4.
	SlotJitter int
}

// FairShare picks the worker with the earliest predicted end (poolifier).
type FairShare struct {
	Limits
	// Window is how many recent session durations are averaged. Default: 20.
	Window int
	// Median uses the moving median instead of the moving average.
	Median bool
	// Default is the estimate for a worker with no history. Default: 30s.
	Default time.Duration
}
