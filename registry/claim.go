package registry

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
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
	// building: the policy's index was being built; the claim walked
	// lifetime_first's.
	building bool
}

// checkRequest checks the request and fills its defaults; it returns the
// policy's row of the table.
func (r *Registry) checkRequest(req *ClaimRequest) (PolicySpec, error) {
	if err := checkPool(req.Pool); err != nil {
		return PolicySpec{}, err
	}
	spec, ok := LookupPolicy(string(req.Policy))
	if !ok {
		return PolicySpec{}, &UnknownPolicyError{Name: string(req.Policy)}
	}
	// Whether the pool has a retiring worker is Redis' to say (the
	// retiring set, read inside the claim script): a caller's value is
	// ignored.
	req.Limits.Retiring = false
	if err := req.Limits.Validate(); err != nil {
		return spec, err
	}
	// lifetime_first's budget for this request, before the policy's
	// defaults: a claim walks as lifetime_first while its policy's index
	// is being built
	req.fallbackScan = req.Limits.MaxScan
	if req.fallbackScan == 0 {
		lf, _ := LookupPolicy(string(LifetimeFirst))
		req.fallbackScan = lf.DefaultMaxScan
	}
	if req.Limits.MaxScan == 0 {
		req.Limits.MaxScan = spec.DefaultMaxScan
	}
	if req.ClientLimit < 0 {
		return spec, fmt.Errorf("client limit %d is negative", req.ClientLimit)
	}
	if len(req.Avoid) > MaxAvoid {
		return spec, fmt.Errorf("%d workers to avoid: at most %d", len(req.Avoid), MaxAvoid)
	}
	for _, id := range req.Avoid {
		if err := checkID(id); err != nil {
			return spec, fmt.Errorf("worker to avoid: %w", err)
		}
	}
	if req.DrainHold < 0 {
		return spec, fmt.Errorf("drain hold %s is negative", req.DrainHold)
	}
	if req.LeaseTTL < 0 {
		return spec, fmt.Errorf("lease TTL %s is negative", req.LeaseTTL)
	}
	if spec.prepare != nil {
		if err := spec.prepare(req); err != nil {
			return spec, err
		}
	}
	if req.LeaseTTL == 0 {
		req.LeaseTTL = defaultLeaseTTL
	}
	if req.Rand == nil {
		req.Rand = globalRand{}
	}
	return spec, nil
}

func bit(b bool) int {
	if b {
		return 1
	}
	return 0
}

// decide runs claim.lua; dry selects without claiming, read-only
// (FCALL_RO of the no-writes claim_ro: it may run on a replica, and a
// write inside would fail).
func (r *Registry) decide(ctx context.Context, req ClaimRequest, dry bool, leaseID string) (outcome, error) {
	spec, err := r.checkRequest(&req)
	if err != nil {
		return outcome{}, err
	}
	// A claim frees expired leases first in 1 of claimSweepEvery calls (a
	// Pick, which writes nothing, never: the script skips it when dry).
	sweep := r.opts.LeaseSweep
	if !dry {
		sweep = r.sweep.size(sweep)
	}
	args, err := r.claimArgv(&req, spec, dry, leaseID, sweep)
	if err != nil {
		return outcome{}, err
	}
	res, err := r.claimCall(ctx, req, dry, args)
	if err == nil && !dry && sweep == 0 && r.sweep.retry(res) {
		// Refused without sweeping: expired leases may be what fills the
		// pool or the client's budget. Run once more, sweeping first, with
		// the same arguments otherwise (the same vnode draw).
		args[claimArgsLayout.index("lease_sweep")] = r.opts.LeaseSweep
		res, err = r.claimCall(ctx, req, dry, args)
	}
	if err != nil {
		return outcome{}, err
	}
	return r.decodeClaim(req, dry, leaseID, res)
}

// claimCall runs claim.lua once: a Pick read-only, a claim batched with
// the pool's other claims in flight (batch.go), one with a clock of its
// own (tests) alone.
func (r *Registry) claimCall(ctx context.Context, req ClaimRequest, dry bool, args []any) ([]any, error) {
	switch {
	case dry:
		return r.runRO(ctx, scriptClaim, req.Pool, toMS(req.Now), args...).Slice()
	case !req.Now.IsZero():
		return r.run(ctx, scriptClaim, req.Pool, toMS(req.Now), args...).Slice()
	}
	res, err := r.runBatched(ctx, scriptClaim, req.Pool, args...)
	if err != nil {
		return nil, err
	}
	s, ok := res.([]any)
	if !ok {
		return nil, fmt.Errorf("claim.lua replied %T, want an array", res)
	}
	return s, nil
}

// claimArgv is claim.lua's ARGV after the common three, for a checked
// request: contract.go's claimArgs by name, then the policy's own.
func (r *Registry) claimArgv(req *ClaimRequest, spec PolicySpec, dry bool, leaseID string, sweep int) ([]any, error) {
	a := newArgv(claimArgsLayout).
		set("policy", string(req.Policy)).set("dry", bit(dry)).set("limits_only", 0).
		set("max_concurrent", req.Limits.MaxConcurrent).set("max_lifetime", req.Limits.MaxLifetime).
		set("stale_after_ms", ms(req.Limits.StaleAfter)).set("max_scan", req.Limits.MaxScan).
		set("stagger", bit(req.Limits.StaggerDrains)).set("drain_hold_ms", ms(req.DrainHold)).
		set("fallback_max_scan", req.fallbackScan).
		set("fs_window", req.FairShare.Window).set("fs_median", bit(req.FairShare.Median)).
		set("fs_default_ms", ms(req.FairShare.Default)).
		set("lease_id", leaseID).set("lease_ttl_ms", ms(req.LeaseTTL)).set("holder", req.Holder).
		set("command_ttl_ms", ms(r.opts.CommandTTL)).set("durations_kept", r.opts.DurationWindow).
		set("lease_sweep", sweep).set("config_time_ms", toMS(req.ConfigTime)).
		set("config_supersedes_ms", toMS(req.Supersedes)).
		set("epoch_seen", req.Epoch).set("epoch_new", newToken(8)).
		set("client", ClientHash(req.ClientKey)).set("client_limit", req.ClientLimit).
		set("avoid", strings.Join(req.Avoid, " ")).set("restore_hold_ms", ms(RestoreHold))
	args, err := a.list()
	if err != nil {
		return nil, err
	}
	if spec.args != nil {
		args = append(args, spec.args(req)...)
	}
	return args, nil
}

// PickScript returns what Pick sends for req, for tools that time the
// claim script in Redis (cmd/gridbench's redis-profile): the pool's KEYS,
// the whole ARGV, and claim.lua as it runs after common.lua (its contract
// prologue and every policy's walk). Run common.lua + body with them
// read-only.
func (r *Registry) PickScript(req ClaimRequest) (keys []string, args []any, body string, err error) {
	spec, err := r.checkRequest(&req)
	if err != nil {
		return nil, nil, "", err
	}
	own, err := r.claimArgv(&req, spec, true, "", r.opts.LeaseSweep)
	if err != nil {
		return nil, nil, "", err
	}
	args = append([]any{toMS(req.Now), r.channel(req.Pool), req.Pool}, own...)
	return r.poolKeys(req.Pool), args, strings.TrimPrefix(claimSource(), luaCommon), nil
}

// decodeClaim decodes claim.lua's reply (contract.go's claimReply and the
// coded replies).
func (r *Registry) decodeClaim(req ClaimRequest, dry bool, leaseID string, res []any) (outcome, error) {
	if len(res) > 0 {
		switch x, _ := res[0].(int64); x {
		case claimCancelled:
			return outcome{}, fmt.Errorf("lease %q: %w", leaseID, ErrClaimCancelled)
		case claimReplayed:
			return decodeReplay(req.Pool, res)
		case claimEpoch:
			epoch := ""
			if len(res) > 1 {
				epoch, _ = res[1].(string)
			}
			return outcome{}, &EpochError{Seen: req.Epoch, Now: epoch}
		case claimClientLimit:
			live := int64(0)
			if len(res) > 1 {
				live, _ = res[1].(int64)
			}
			return outcome{}, &ClientLimitError{Live: int(live), Limit: req.ClientLimit}
		}
	}
	rep, err := decodeReply(claimReplyLayout, res)
	if err != nil {
		return outcome{}, err
	}
	var o outcome
	o.decision = selection.Decision{
		Index:     -1,
		Scanned:   int(rep.int("scanned")),
		Wraps:     int(rep.int("wraps")),
		Effective: int(rep.int("effective")),
		Dedupes:   int(rep.int("dedupes")),
		TiedMin:   rep.flag("tied"),
		Stale:     rep.strs("stale"),
	}
	r.badList(req.Pool, rep.get("bad"))
	o.retiring = rep.flag("retiring")
	o.overridden = rep.flag("overridden")
	o.epoch = rep.str("epoch")
	o.building = rep.flag("building")
	o.limits = PoolLimits{Limits: req.Limits, Window: int(rep.int("fs_window")), Median: rep.flag("fs_median"),
		Default: time.Duration(rep.int("fs_default_ms")) * time.Millisecond}
	o.limits.MaxConcurrent, o.limits.MaxLifetime = int(rep.int("max_concurrent")), int(rep.int("max_lifetime"))
	o.limits.StaggerDrains = rep.flag("stagger")
	if r.opts.OnStale != nil && !dry && (len(o.decision.Stale) > 0 || len(rep.strs("retired_stale")) > 0) {
		r.opts.OnStale(req.Pool)
	}
	if !r.opts.NoStaleExpiry && !dry {
		if len(o.decision.Stale) > 0 {
			r.expireInBackground(req.Pool, o.decision.Stale, req.Limits.StaleAfter)
		}
		// Dead retiring workers hold nothing back, but every StaggerDrains
		// claim reads them until they are gone.
		if ids := rep.strs("retired_stale"); len(ids) > 0 {
			r.expireInBackground(req.Pool, ids, req.Limits.StaleAfter)
		}
	}
	if !rep.flag("ok") {
		return o, &NoWorkerError{Decision: o.decision, Retiring: o.retiring, PoolLimits: o.limits, LimitsOverridden: o.overridden, Epoch: o.epoch,
			IndexBuilding: o.building, Registered: int(rep.int("registered")),
			Held: time.Duration(rep.int("held")) * time.Millisecond}
	}
	o.decision.OK = true
	o.decision.ID = rep.str("id")
	o.drain = rep.flag("drain")
	now := rep.int("now")
	cmd := ""
	if o.drain {
		cmd = string(CommandShutdown) + "|" + fmt.Sprint(now+ms(r.opts.CommandTTL))
	}
	raw := rawWorker{id: rep.str("id"), record: rep.str("record"), active: fmt.Sprint(rep.int("active")),
		lifetime: fmt.Sprint(rep.int("lifetime")), durations: rep.str("durations"), command: cmd, hot: rep.str("hot")}
	w, err := decodeWorker(req.Pool, raw, now)
	if err != nil {
		return o, fmt.Errorf("decoding the chosen worker %q: %w", raw.id, err)
	}
	o.worker = w
	return o, nil
}

// decodeReplay decodes claim.lua's answer to a lease ID it has seen: the
// claim that lease made (contract.go's claimReplayReply).
func decodeReplay(pool string, res []any) (outcome, error) {
	rep, err := decodeReply(claimReplayLayout, res)
	if err != nil {
		return outcome{}, fmt.Errorf("replay: %w", err)
	}
	var o outcome
	o.drain = rep.flag("drain")
	raw := rawWorker{id: rep.str("id"), record: rep.str("record"), active: fmt.Sprint(rep.int("active")),
		lifetime: fmt.Sprint(rep.int("lifetime")), durations: rep.str("durations"), hot: rep.str("hot")}
	w, err := decodeWorker(pool, raw, rep.int("now"))
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
		PoolLimits: o.limits, LimitsOverridden: o.overridden, Epoch: o.epoch, Client: ClientHash(req.ClientKey),
		IndexBuilding: o.building}, nil
}

func (r *Registry) storeLimits(ctx context.Context, req ClaimRequest) (PoolLimits, bool, error) {
	req.ClientKey, req.ClientLimit, req.Avoid, req.Epoch = "", 0, nil, ""
	spec, err := r.checkRequest(&req)
	if err != nil {
		return PoolLimits{}, false, fmt.Errorf("storing the limits of pool %q: %w", req.Pool, err)
	}
	args, err := r.claimArgv(&req, spec, false, "", 0)
	if err != nil {
		return PoolLimits{}, false, err
	}
	args[claimArgsLayout.index("limits_only")] = 1
	res, err := r.run(ctx, scriptClaim, req.Pool, toMS(req.Now), args...).Slice()
	if err == nil {
		var o outcome
		if o, err = r.decodeClaim(req, false, "", res); errors.Is(err, ErrNoWorker) {
			return o.limits, o.overridden, nil
		}
	}
	if err == nil {
		err = errors.New("claim.lua claimed a worker when asked to store limits only")
	}
	return PoolLimits{}, false, fmt.Errorf("storing the limits of pool %q: %w", req.Pool, err)
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
