package registry

import (
	"fmt"
	"strings"
)

// PolicySpec is one row of the policy table: what the registry, the Caddy
// modules (directive names, JSON), the admin API and the equivalence tests
// need to know about a selection policy. Adding a policy is one row here,
// one file in selection/, one walk in lua/walk_<name>.lua and one Caddy
// module file (docs/adding-a-policy.md).
type PolicySpec struct {
	// Name is the policy's name: the Caddy module
	// http.reverse_proxy.selection_policies.<Name>, the browser_grid
	// directive's "policy <Name>", the admin API's ?policy=<Name>, and
	// the key of its walk in claim.lua (lua/walk_<Name>.lua).
	Name Policy
	// Summary says in one line what the policy prefers (docs, errors).
	Summary string
	// DefaultMaxScan is the max_scan budget of a claim whose
	// Limits.MaxScan is 0 (0: the policy sets its own in prepare).
	DefaultMaxScan int
	// StaggerByDefault is the default of the Caddy option stagger_drains
	// (restarts one at a time) for this policy.
	StaggerByDefault bool
	// prepare checks and defaults the request's policy parameters, after
	// the shared limits are checked (nil: the policy has none).
	prepare func(req *ClaimRequest) error
	// args are the policy's own claim.lua arguments, read by its walk as
	// PARG(1), PARG(2), … (nil: none).
	args func(req *ClaimRequest) []any
	// walk is the policy's Lua walk (lua/walk_<Name>.lua), inserted into
	// claim.lua.
	walk string
	// index names the optional index the walk reads (its WALK_INDEX in
	// the walk file; "" when it reads idx:lifetime only), kept while the
	// policy claims the pool (docs/redis.md, "Kept indexes").
	index string
}

// policies is the policy table. Order is the order names are listed in
// errors and docs.
var policies = []PolicySpec{
	{
		Name: LifetimeFirst, Summary: "the worker with the most sessions behind it, so workers retire one at a time",
		DefaultMaxScan: DefaultMaxScan, StaggerByDefault: true, walk: luaWalkLifetimeFirst,
	},
	{
		Name: Vnode, Summary: "a ring of virtual nodes with power-of-K choices on live sessions",
		prepare: prepareVnode, args: vnodeArgs, walk: luaWalkVnode, index: "ring",
	},
	{
		Name: FairShare, Summary: "the worker whose queue of sessions ends first (poolifier's fair share)",
		DefaultMaxScan: DefaultMaxScan, prepare: prepareFairShare, walk: luaWalkFairShare, index: "fair",
	},
	{
		Name: InterleavedWeightedRoundRobin, Summary: "turns dealt in rounds by the workers' weights (poolifier's interleaved weighted round robin)",
		DefaultMaxScan: DefaultMaxScan, walk: luaWalkIWRR, index: "iwrr",
	},
}

// Policies returns the policy table, in order.
func Policies() []PolicySpec { return append([]PolicySpec(nil), policies...) }

// LookupPolicy returns the table's row for name.
func LookupPolicy(name string) (PolicySpec, bool) {
	for _, p := range policies {
		if string(p.Name) == name {
			return p, true
		}
	}
	return PolicySpec{}, false
}

// PolicyNames lists the policies for messages: "a, b or c".
func PolicyNames() string {
	names := make([]string, len(policies))
	for i, p := range policies {
		names[i] = string(p.Name)
	}
	if len(names) == 1 {
		return names[0]
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}

// UnknownPolicyError is returned for a policy name the table does not have.
type UnknownPolicyError struct{ Name string }

func (e *UnknownPolicyError) Error() string {
	return fmt.Sprintf("unknown policy %q (want %s)", e.Name, PolicyNames())
}

func prepareVnode(req *ClaimRequest) error {
	// The vnode design's max_scan is a vnode knob: it applies when the
	// request's Limits leave MaxScan at 0.
	if req.Limits.MaxScan == 0 {
		req.Limits.MaxScan = req.Vnode.MaxScan
	}
	req.Vnode.Limits = req.Limits
	req.Vnode.SetDefaults()
	if err := req.Vnode.Validate(); err != nil {
		return fmt.Errorf("vnode: %w", err)
	}
	req.Limits.MaxScan = req.Vnode.MaxScan
	return nil
}

// vnodeArgs: K, then K pivots (32 hex), K jitters and, since Lua numbers
// are doubles, Tiebreak % m for every tie count m = 1..K rather than the
// 64-bit value.
func vnodeArgs(req *ClaimRequest) []any {
	k := req.Vnode.Samples
	dr := req.Vnode.Draw(req.Rand)
	args := make([]any, 0, 1+3*k)
	args = append(args, k)
	for _, p := range dr.Pivots {
		args = append(args, p.String())
	}
	for _, j := range dr.Jitter {
		args = append(args, j)
	}
	for m := 1; m <= k; m++ {
		args = append(args, dr.Tiebreak%uint64(m))
	}
	return args
}

func prepareFairShare(req *ClaimRequest) error {
	req.FairShare.Limits = req.Limits
	req.FairShare.SetDefaults()
	if err := req.FairShare.Validate(); err != nil {
		return fmt.Errorf("fair share: %w", err)
	}
	return nil
}
