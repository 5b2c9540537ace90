package registry

import (
	_ "embed"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"context"

	"github.com/browsergrid/caddy-browser-grid/selection"
)

// Policy names a select-and-claim algorithm.
type Policy string

// The policies, one row each in policies.
const (
	LifetimeFirst                 Policy = "lifetime_first"
	Vnode                         Policy = "vnode"
	FairShare                     Policy = "fair_share"
	InterleavedWeightedRoundRobin Policy = "interleaved_weighted_round_robin"
)

var (
	//go:embed lua/walk_lifetime_first.lua
	luaWalkLifetimeFirst string
	//go:embed lua/walk_vnode.lua
	luaWalkVnode string
	//go:embed lua/walk_fair_share.lua
	luaWalkFairShare string
	//go:embed lua/walk_interleaved_weighted_round_robin.lua
	luaWalkIWRR string
)

// policies is the policy table: a policy is its selection/ file, its Lua
// walk and this row (docs/adding-a-policy.md).
var policies = []struct {
	name Policy
	walk string
}{
	{LifetimeFirst, luaWalkLifetimeFirst},
	{Vnode, luaWalkVnode},
	{FairShare, luaWalkFairShare},
	{InterleavedWeightedRoundRobin, luaWalkIWRR},
}

// Policies lists the policies' names, in the table's order.
func Policies() []Policy {
	out := make([]Policy, len(policies))
	for i, p := range policies {
		out[i] = p.name
	}
	return out
}

// PolicyOptions are a policy's own options, encoded as the arguments of
// its walk.
type PolicyOptions interface {
	walkArgs(r selection.Rand) []any
}

// VnodeOptions are the vnode policy's options (selection.Vnode).
type VnodeOptions struct {
	Samples    int
	SlotJitter int
}

func (o VnodeOptions) walkArgs(r selection.Rand) []any {
	d := selection.Vnode{Samples: o.Samples, SlotJitter: o.SlotJitter}.Draw(r)
	args := []any{len(d.Pivots)}
	for _, p := range d.Pivots {
		args = append(args, p.String())
	}
	for _, j := range d.Jitter {
		args = append(args, j)
	}
	// Every count of tied candidates (1-8) divides 840: the walk's
	// tiebreak modulo it picks as selection's does with the whole value.
	return append(args, d.Tiebreak%840)
}

// FairShareOptions are fair share's options (selection.FairShare).
type FairShareOptions struct {
	Window  int
	Median  bool
	Default time.Duration
}

func (o FairShareOptions) walkArgs(selection.Rand) []any {
	med := 0
	if o.Median {
		med = 1
	}
	return []any{o.Window, med, o.Default.Milliseconds()}
}

// Limits are a claim's limits. The claim carries them to the agent too,
// which holds them exactly (docs/design.md).
type Limits struct {
	// MaxConcurrent caps a worker's live sessions with its own capacity
	// (the smaller wins; 0: no cap from this side).
	MaxConcurrent int
	// MaxLifetime is the sessions after which a worker retires (0: never).
	MaxLifetime int
	// StaggerDrains holds a worker's last session while another worker of
	// the group retires.
	StaggerDrains bool
}

// ClaimRequest is one select-and-claim.
type ClaimRequest struct {
	// Group is the pool, or its version group.
	Group  string
	Policy Policy
	// Options are the policy's own (nil for those that have none).
	Options PolicyOptions
	Limits  Limits
	// Session is the new session's ID.
	Session string
	// Client is the client's key hash ("" none); ClientLimit its live
	// sessions at most across the pool (0: no limit).
	Client      string
	ClientLimit int
	// Instance names the Caddy instance; Label the client's label for the
	// session (both for views).
	Instance, Label string
	// Avoid lists workers this request failed on already.
	Avoid []string
	// Waiter is the request's place in the pool's queue ("" none): see
	// QueueJoin.
	Waiter string
	// StaleAfter is the heartbeat age past which a worker is skipped.
	StaleAfter time.Duration
	// MaxScan bounds the unusable workers a walk passes (0: unbounded).
	MaxScan int
}

// Claim is a claimed worker.
type Claim struct {
	Session string
	Group   string
	Worker  Record
	// Lifetime is the worker's lifetime with this claim; Last says it
	// reached the claim's MaxLifetime.
	Lifetime int
	Last     bool
}

// ClaimInfo is what a claim saw, claimed or not.
type ClaimInfo struct {
	// Scanned counts the index entries examined.
	Scanned int
	// Stale lists the stale or missing workers walked past.
	Stale []string
	// Workers counts the group's registered workers.
	Workers int
	// Drained names a worker past the claim's max_lifetime the claim told
	// to drain ("" none).
	Drained string
}

// Claim selects a worker of req.Group and claims it for req.Session in one
// atomic call: ErrNoWorker when none may take it now, ErrClientLimit when
// the client holds its limit. A record that does not parse or decode is an
// error naming the worker; the claim is given back.
func (r *Registry) Claim(ctx context.Context, req ClaimRequest) (Claim, ClaimInfo, error) {
	return r.claim(ctx, req, false)
}

// Pick is Claim without the claim: the worker a claim would take now.
func (r *Registry) Pick(ctx context.Context, req ClaimRequest) (Claim, ClaimInfo, error) {
	return r.claim(ctx, req, true)
}

func (r *Registry) claim(ctx context.Context, req ClaimRequest, dry bool) (Claim, ClaimInfo, error) {
	if err := CheckPool(req.Group); err != nil {
		return Claim{}, ClaimInfo{}, err
	}
	if !dry {
		if err := CheckID(req.Session); err != nil {
			return Claim{}, ClaimInfo{}, fmt.Errorf("session %w", err)
		}
	}
	_, version := SplitGroup(req.Group)
	args := []any{
		string(req.Policy), flag(dry), orDash(req.Session), orDash(version), orDash(req.Client), req.ClientLimit,
		orDash(req.Instance), req.Label, req.Limits.MaxConcurrent, req.Limits.MaxLifetime,
		flag(req.Limits.StaggerDrains), req.StaleAfter.Milliseconds(), req.MaxScan, strings.Join(req.Avoid, " "),
		orDash(req.Waiter),
	}
	if req.Options != nil {
		args = append(args, req.Options.walkArgs(r.rand)...)
	}
	fn := "claim"
	if dry {
		fn = "pick"
	}
	res, err := r.fcall(ctx, fn, req.Group, dry, args...)
	if err != nil {
		return Claim{}, ClaimInfo{}, fmt.Errorf("claiming a worker of pool %q: %w", req.Group, err)
	}
	out, _ := res.([]any)
	if len(out) < 9 {
		return Claim{}, ClaimInfo{}, fmt.Errorf("claiming a worker of pool %q: reply of %d items", req.Group, len(out))
	}
	info := ClaimInfo{Scanned: toInt(out[5]), Workers: toInt(out[7])}
	if d, _ := out[8].(string); d != "" {
		info.Drained = d
		// its agent hears at once; should this be lost, at its heartbeat
		_ = r.rdb.Publish(ctx, r.AgentChannel(req.Group, d), CommandDrain).Err()
	}
	if stale, ok := out[6].([]any); ok {
		for _, s := range stale {
			if id, ok := s.(string); ok {
				info.Stale = append(info.Stale, id)
			}
		}
	}
	switch out[0] {
	case "client":
		return Claim{}, info, ErrClientLimit
	case "none":
		return Claim{}, info, ErrNoWorker
	case "behind":
		return Claim{}, info, ErrBehind
	}
	id, _ := out[1].(string)
	raw, _ := out[2].(string)
	c := Claim{Session: req.Session, Group: req.Group, Lifetime: toInt(out[3]), Last: toInt(out[4]) == 1}
	rec, err := DecodeRecord(id, raw)
	if err == nil && rec.Group() != req.Group {
		// a record moved from another group: what it signs is its own
		err = fmt.Errorf("worker %q: record of group %q stored in group %q", id, rec.Group(), req.Group)
	}
	if err != nil {
		if !dry {
			// never dialled: give it back, lifetime too
			_, _ = r.GiveBack(ctx, req.Group, id, true, BadRecordSuspect, req.Session)
		}
		return Claim{}, info, fmt.Errorf("claiming a worker of pool %q: %w", req.Group, err)
	}
	c.Worker = rec
	return c, info, nil
}

// BadRecordSuspect is how long every instance skips a worker whose record
// does not decode.
const BadRecordSuspect = time.Minute

func flag(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func toInt(x any) int {
	n, _ := x.(int64)
	return int(n)
}

// globalRand is math/rand/v2's global source, safe for concurrent use.
type globalRand struct{}

func (globalRand) Uint64() uint64 { return rand.Uint64() }
func (globalRand) IntN(n int) int { return rand.IntN(n) }
