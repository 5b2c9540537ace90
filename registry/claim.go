package registry

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/browsergrid/caddy-browser-grid/selection"
)

// globalRand is math/rand/v2's goroutine-safe source (seeded from the
// runtime's random source).
type globalRand struct{}

func (globalRand) Uint64() uint64 { return rand.Uint64() }
func (globalRand) IntN(n int) int { return rand.IntN(n) }

// ringPositions returns a worker's V ring positions as 32 hex characters
// each (the vnode design: xxh3-128 of the id with seeds 0..V-1, big-endian).
func ringPositions(id string, v int) []string {
	ps := selection.Positions(id, v)
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.String()
	}
	return out
}

// outcome is claim.lua's reply, decoded.
type outcome struct {
	worker   WorkerInfo
	decision selection.Decision
	drain    bool
	// retiring: StaggerDrains was in force and a worker was retiring.
	retiring bool
	// limits in force, and whether they are not the request's.
	limits     PoolLimits
	overridden bool
	epoch      string
}

func (r *Registry) checkRequest(req *ClaimRequest) error {
	if err := checkPool(req.Pool); err != nil {
		return err
	}
	switch req.Policy {
	case LifetimeFirst, Vnode, FairShare:
	default:
		return fmt.Errorf("unknown policy %q (want %s, %s or %s)", req.Policy, LifetimeFirst, Vnode, FairShare)
	}
	// Whether the pool has a retiring worker is Redis' to say (the
	// retiring set, read inside the claim script): a caller's value is
	// ignored.
	req.Limits.Retiring = false
	if err := req.Limits.Validate(); err != nil {
		return err
	}
	if req.Policy != Vnode && req.Limits.MaxScan == 0 {
		req.Limits.MaxScan = DefaultMaxScan
	}
	if req.ClientLimit < 0 {
		return fmt.Errorf("client limit %d is negative", req.ClientLimit)
	}
	if req.LeaseTTL < 0 {
		return fmt.Errorf("lease TTL %s is negative", req.LeaseTTL)
	}
	switch req.Policy {
	case Vnode:
		// The vnode design's max_scan is a vnode knob: it applies when the request's
		// Limits leave MaxScan at 0.
		if req.Limits.MaxScan == 0 {
			req.Limits.MaxScan = req.Vnode.MaxScan
		}
		req.Vnode.Limits = req.Limits
		req.Vnode.SetDefaults()
		if err := req.Vnode.Validate(); err != nil {
			return fmt.Errorf("vnode: %w", err)
		}
		req.Limits.MaxScan = req.Vnode.MaxScan
	case FairShare:
		req.FairShare.Limits = req.Limits
		req.FairShare.SetDefaults()
		if err := req.FairShare.Validate(); err != nil {
			return fmt.Errorf("fair share: %w", err)
		}
	}
	if req.LeaseTTL == 0 {
		req.LeaseTTL = defaultLeaseTTL
	}
	if req.Rand == nil {
		req.Rand = globalRand{}
	}
	return nil
}

// decide runs claim.lua; dry selects without claiming.
func (r *Registry) decide(ctx context.Context, req ClaimRequest, dry bool, leaseID string) (outcome, error) {
	if err := r.checkRequest(&req); err != nil {
		return outcome{}, err
	}
	d := 0
	if dry {
		d = 1
	}
	med := 0
	if req.FairShare.Median {
		med = 1
	}
	stagger := 0
	if req.Limits.StaggerDrains {
		stagger = 1
	}
	// A claim frees expired leases first in 1 of claimSweepEvery calls (a
	// Pick, which decides nothing for later, always).
	sweep := r.opts.LeaseSweep
	if !dry {
		sweep = r.sweep.size(sweep)
	}
	args := []any{string(req.Policy), d,
		req.Limits.MaxConcurrent, req.Limits.MaxLifetime, ms(req.Limits.StaleAfter), req.Limits.MaxScan,
		req.FairShare.Window, med, ms(req.FairShare.Default),
		leaseID, ms(req.LeaseTTL), req.Holder, ms(r.opts.CommandTTL),
		r.opts.DurationWindow, sweep, stagger, toMS(req.ConfigTime),
		req.Epoch, newToken(8)}
	if req.Policy == Vnode {
		k := req.Vnode.Samples
		dr := req.Vnode.Draw(req.Rand)
		args = append(args, k)
		for _, p := range dr.Pivots {
			args = append(args, p.String())
		}
		for _, j := range dr.Jitter {
			args = append(args, j)
		}
		// Lua numbers are doubles: pass Tiebreak % m for every tie count m
		// rather than the 64-bit value.
		for m := 1; m <= k; m++ {
			args = append(args, dr.Tiebreak%uint64(m))
		}
	} else {
		args = append(args, 0)
	}
	// The client's hash and limit come last (claim.lua's CB).
	args = append(args, ClientHash(req.ClientKey), req.ClientLimit)
	res, err := r.run(ctx, scriptClaim, req.Pool, toMS(req.Now), args...).Slice()
	if err == nil && sweep == 0 && r.sweep.retry(res) {
		// Refused without sweeping: expired leases may be what fills the
		// pool or the client's budget. Run once more, sweeping first.
		args[sweepArg] = r.opts.LeaseSweep
		res, err = r.run(ctx, scriptClaim, req.Pool, toMS(req.Now), args...).Slice()
	}
	if err != nil {
		return outcome{}, err
	}
	if len(res) > 0 {
		switch x, _ := res[0].(int64); x {
		case -1:
			return outcome{}, fmt.Errorf("lease %q: %w", leaseID, ErrClaimCancelled)
		case -2:
			return decodeReplay(req.Pool, res)
		case -3:
			epoch := ""
			if len(res) > 1 {
				epoch, _ = res[1].(string)
			}
			return outcome{}, &EpochError{Seen: req.Epoch, Now: epoch}
		case -4:
			live := int64(0)
			if len(res) > 1 {
				live, _ = res[1].(int64)
			}
			return outcome{}, &ClientLimitError{Live: int(live), Limit: req.ClientLimit}
		}
	}
	if len(res) != 25 {
		return outcome{}, fmt.Errorf("unexpected reply of %d items", len(res))
	}
	n := func(i int) int64 { x, _ := res[i].(int64); return x }
	s := func(i int) string { x, _ := res[i].(string); return x }
	var o outcome
	o.decision = selection.Decision{
		Index:     -1,
		Scanned:   int(n(7)),
		Wraps:     int(n(10)),
		Effective: int(n(11)),
		Dedupes:   int(n(12)),
		TiedMin:   n(13) == 1,
	}
	if st, _ := res[8].([]any); len(st) > 0 {
		for _, v := range st {
			id, _ := v.(string)
			o.decision.Stale = append(o.decision.Stale, id)
		}
	}
	r.badList(req.Pool, res[9])
	o.retiring = n(15) == 1
	o.overridden = n(17) == 1
	o.epoch = s(24)
	o.limits = PoolLimits{Limits: req.Limits, Window: int(n(21)), Median: n(22) == 1, Default: time.Duration(n(23)) * time.Millisecond}
	o.limits.MaxConcurrent, o.limits.MaxLifetime, o.limits.StaggerDrains = int(n(18)), int(n(19)), n(20) == 1
	if !r.opts.NoStaleExpiry && !dry {
		if len(o.decision.Stale) > 0 {
			r.expireInBackground(req.Pool, o.decision.Stale, req.Limits.StaleAfter)
		}
		// Dead retiring workers hold nothing back, but every StaggerDrains
		// claim reads them until they are gone.
		if st, _ := res[16].([]any); len(st) > 0 {
			ids := make([]string, 0, len(st))
			for _, v := range st {
				id, _ := v.(string)
				ids = append(ids, id)
			}
			r.expireInBackground(req.Pool, ids, req.Limits.StaleAfter)
		}
	}
	if n(0) != 1 {
		return o, &NoWorkerError{Decision: o.decision, Retiring: o.retiring, PoolLimits: o.limits, LimitsOverridden: o.overridden, Epoch: o.epoch}
	}
	o.decision.OK = true
	o.decision.ID = s(1)
	o.drain = n(6) == 1
	cmd := ""
	if o.drain {
		cmd = string(CommandShutdown) + "|" + fmt.Sprint(n(14)+ms(r.opts.CommandTTL))
	}
	raw := rawWorker{id: s(1), record: s(2), active: fmt.Sprint(n(3)), lifetime: fmt.Sprint(n(4)), durations: s(5), command: cmd}
	w, err := decodeWorker(req.Pool, raw, n(14))
	if err != nil {
		return o, fmt.Errorf("decoding the chosen worker %q: %w", raw.id, err)
	}
	o.worker = w
	return o, nil
}

// decodeReplay decodes claim.lua's answer to a lease ID it has seen: the
// claim that lease made, {-2, id, record, active, lifetime, durations,
// drain, now}.
func decodeReplay(pool string, res []any) (outcome, error) {
	if len(res) != 8 {
		return outcome{}, fmt.Errorf("unexpected replay reply of %d items", len(res))
	}
	n := func(i int) int64 { x, _ := res[i].(int64); return x }
	s := func(i int) string { x, _ := res[i].(string); return x }
	var o outcome
	o.drain = n(6) == 1
	raw := rawWorker{id: s(1), record: s(2), active: fmt.Sprint(n(3)), lifetime: fmt.Sprint(n(4)), durations: s(5)}
	w, err := decodeWorker(pool, raw, n(7))
	if err != nil {
		return o, fmt.Errorf("decoding the claimed worker %q: %w", raw.id, err)
	}
	o.worker = w
	o.decision = selection.Decision{Index: -1, OK: true, ID: w.ID}
	return o, nil
}

func (r *Registry) claim(ctx context.Context, req ClaimRequest) (*Claim, error) {
	// The lease ID is chosen here, before the script runs, so that a retry
	// of the same call (go-redis after a dropped connection) resends it and
	// the script recognises its own claim.
	lease := req.LeaseID
	if lease == "" {
		lease = NewLeaseID()
	} else if err := checkToken(lease); err != nil {
		return nil, fmt.Errorf("claiming a worker in pool %q: lease id: %w", req.Pool, err)
	}
	o, err := r.decide(ctx, req, false, lease)
	if err != nil {
		return nil, fmt.Errorf("claiming a worker in pool %q: %w", req.Pool, err)
	}
	return &Claim{LeaseID: lease, Pool: req.Pool, Worker: o.worker, Gen: o.worker.gen, Drain: o.drain, Decision: o.decision,
		PoolLimits: o.limits, LimitsOverridden: o.overridden, Epoch: o.epoch, Client: ClientHash(req.ClientKey)}, nil
}

func (r *Registry) pick(ctx context.Context, req ClaimRequest) (WorkerInfo, selection.Decision, error) {
	o, err := r.decide(ctx, req, true, "")
	if err != nil {
		return WorkerInfo{}, o.decision, fmt.Errorf("picking a worker in pool %q: %w", req.Pool, err)
	}
	return o.worker, o.decision, nil
}

// Interface guards.
var _ selection.Rand = globalRand{}
