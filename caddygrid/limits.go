package caddygrid

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/browsergrid/caddy-browser-grid/registry"
)

// Which limits a pool runs under when Caddy instances (or the configs of
// one instance during a reload) disagree: the newest configuration's (see
// registry.ClaimRequest.ConfigTime). An instance's configuration time for
// a set of limits is when a config bringing them was first loaded: a
// reload that keeps the limits keeps their time, so reloading an instance
// for another reason does not make its limits win again.

// limitsClock remembers, per set of limits (policy and its limits), when
// the config that first brought them was provisioned.
type limitsClock struct {
	mu sync.Mutex
	// since is, per pool, when each set of limits (limitsKey) its claims
	// carried was first configured. Per pool: two pools with the same
	// limits were not necessarily configured at the same time.
	since map[string]map[string]time.Time
	// configured holds, per pool, the sets of limits (limitsKey) this
	// config's policies claim with for it; under "" those of policies
	// whose pools are not known (configures).
	configured map[string]map[string]bool
	// requests holds, per set of limits (limitsKey), a claim that brings
	// them, but for its pool (newLimits, onlyLimits).
	requests map[string]registry.ClaimRequest
	// own holds the pools this config claimed for with limits first
	// configured at its provisioning (not inherited from an older config).
	own map[string]bool
	// failed is, per pool, the provisioning time of the newest config
	// that failed after it claimed for the pool with limits of its own
	// (see handBack): the limits it stored carry that time.
	failed map[string]time.Time
	// gone is set once this config is known to have failed after it
	// started (handLimitsBack): its requests still under way (waiting in
	// the queue, or retrying after a failed dial) make no more claims,
	// which would store its limits with its time again after they were
	// dropped (errConfigGone).
	gone atomic.Bool
}

// errConfigGone: the claim's config failed after it started and Caddy went
// back to the running one (limitsClock.gone).
var errConfigGone = errors.New("the config of this request failed to load; Caddy went back to the running config")

// configKey carries, in a claim's context, the config the claim is made
// for (backend.claim checks and uses it before each call).
type configKey struct{}

// claimConfig is what configKey carries: the limitsClock of the config,
// and what sets a claim's limits and their time (policyCore.claimLimits).
type claimConfig struct {
	clock  *limitsClock
	limits func(*registry.ClaimRequest)
}

// withConfig marks ctx as a claim of the config whose limits c keeps;
// limits (nil: none) sets the limits of each claim made with ctx.
func withConfig(ctx context.Context, c *limitsClock, limits func(*registry.ClaimRequest)) context.Context {
	return context.WithValue(ctx, configKey{}, claimConfig{clock: c, limits: limits})
}

// configGone reports whether the config ctx's claim is made for has gone
// (see limitsClock.gone).
func configGone(ctx context.Context) bool {
	c, _ := ctx.Value(configKey{}).(claimConfig)
	return c.clock != nil && c.clock.gone.Load()
}

// claimClock is the limits of the config ctx's claim is made for (nil:
// none).
func claimClock(ctx context.Context) *limitsClock {
	c, _ := ctx.Value(configKey{}).(claimConfig)
	return c.clock
}

// setClaimLimits sets req's limits as the config of ctx's claim says now.
func setClaimLimits(ctx context.Context, req *registry.ClaimRequest) {
	if c, _ := ctx.Value(configKey{}).(claimConfig); c.limits != nil {
		c.limits(req)
	}
}

// limitsTimes is what a config hands on to the next (snapshot).
type limitsTimes struct {
	since  map[string]map[string]time.Time // per pool, per set of limits (limitsKey)
	failed map[string]time.Time            // per pool
}

// configTime returns when the limits (key) a claim for pool carries were
// configured: their time in the previous running config (prev) when it
// used them, else at (this config's provisioning). supersedes is the time
// of the newest failed config that stored limits for pool (zero: none),
// whose stored limits the claim's replace (registry.ClaimRequest.Supersedes).
func (c *limitsClock) configTime(key, pool string, prev limitsTimes, at time.Time) (t, supersedes time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	t, ok := c.since[pool][key]
	if !ok {
		t = at
		if p, ok := prev.since[pool][key]; ok {
			t = p
		} else if !strings.Contains(key, " window=") {
			// A claim that brings no fair-share options (another policy
			// than fair_share) keeps the time of the same limits brought
			// with them: its own are unchanged.
			for k, p := range prev.since[pool] {
				if strings.HasPrefix(k, key+" window=") && p.Before(t) {
					t = p
				}
			}
		}
		if c.since == nil {
			c.since = map[string]map[string]time.Time{}
		}
		if c.since[pool] == nil {
			c.since[pool] = map[string]time.Time{}
		}
		c.since[pool][key] = t
	}
	if t.Equal(at) {
		if c.own == nil {
			c.own = map[string]bool{}
		}
		c.own[pool] = true
	}
	return t, laterOf(c.failed[pool], prev.failed[pool])
}

// configures records that a policy of this config claims with the limits
// of req for pools (at provisioning, before the config runs); nil: pools
// not known, any pool.
func (c *limitsClock) configures(req registry.ClaimRequest, pools []string) {
	key := limitsKey(req)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.configured == nil {
		c.configured = map[string]map[string]bool{}
		c.requests = map[string]registry.ClaimRequest{}
	}
	c.requests[key] = req
	if pools == nil {
		pools = []string{""}
	}
	for _, p := range pools {
		if c.configured[p] == nil {
			c.configured[p] = map[string]bool{}
		}
		c.configured[p][key] = true
	}
}

// newLimits lists, per pool a policy of c names, the claims (req.Pool
// set) whose limits are new in this config (first configured at its
// provisioning, at): those the config stores as it starts (App.
// storeLimits). Every set of limits of a named pool gets its time, as at
// a claim (configTime); pools not known (placeholders) are left to their
// claims.
func (c *limitsClock) newLimits(prev limitsTimes, at time.Time) []registry.ClaimRequest {
	// the pools' claims, in order; timed below, outside the lock
	var claims []registry.ClaimRequest
	c.mu.Lock()
	for _, pool := range slices.Sorted(maps.Keys(c.configured)) {
		if pool == "" {
			continue
		}
		for _, key := range slices.Sorted(maps.Keys(c.configured[pool])) {
			req := c.requests[key]
			req.Pool = pool
			claims = append(claims, req)
		}
	}
	c.mu.Unlock()
	var out []registry.ClaimRequest
	for _, req := range claims {
		t, supersedes := c.configTime(limitsKey(req), req.Pool, prev, at)
		if t.Equal(at) {
			req.ConfigTime, req.Supersedes = t, supersedes
			out = append(out, req)
		}
	}
	return out
}

// onlyLimits returns the claim of c's policies for pool (a base pool)
// when they claim there with one set of limits only (counting those of
// policies whose pools are not known).
func (c *limitsClock) onlyLimits(pool string) (registry.ClaimRequest, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var only string
	n := 0
	for _, keys := range []map[string]bool{c.configured[pool], c.configured[""]} {
		for k := range keys {
			if k != only {
				only = k
				n++
			}
		}
	}
	if n != 1 {
		return registry.ClaimRequest{}, false
	}
	return c.requests[only], true
}

// servesPool reports whether a policy of this config names pool (a base
// pool, or a version group of it) among those it claims for: the pools
// an operator configured, as opposed to any name in Redis.
func (c *limitsClock) servesPool(pool string) bool {
	base, _ := registry.SplitGroup(pool)
	c.mu.Lock()
	defer c.mu.Unlock()
	return base != "" && c.configured[base] != nil
}

// configuresFor reports whether a policy of c claims with the limits key
// for pool (or for pools not known). c.mu held.
func (c *limitsClock) configuresFor(pool, key string) bool {
	return c.configured[pool][key] || c.configured[""][key]
}

// fairShareBase returns the limits of a fair_share key without its
// fair-share options, and whether key is one.
func fairShareBase(key string) (string, bool) {
	i := strings.Index(key, " window=")
	if i < 0 {
		return key, false
	}
	return key[:i], true
}

// claimedFairShare reports whether times holds fair_share limits with
// base's limits (a claim of c brought other fair-share options for them).
func claimedFairShare(times map[string]time.Time, base string) bool {
	for k := range times {
		if b, fs := fairShareBase(k); fs && b == base {
			return true
		}
	}
	return false
}

// ownPools lists the pools c claimed for with limits of its own (first
// configured at its provisioning), sorted.
func (c *limitsClock) ownPools() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]string, 0, len(c.own))
	for p := range c.own {
		out = append(out, p)
	}
	slices.Sort(out)
	return out
}

// handBack makes the claims for pools supersede t: what a config
// provisioned at t, whose reload failed, stored for them while it served
// (with t, newer than the running config's times) is replaced by the
// running config's limits at its next claim, and those keep their own
// time. So the pools go back to what they ran under before the failed
// config: a newer configuration from another instance wins again at its
// next claim (until then the running config's limits apply). Raising the
// running config's times instead would let them win over that newer
// configuration for good.
func (c *limitsClock) handBack(pools []string, t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.failed == nil {
		c.failed = map[string]time.Time{}
	}
	for _, p := range pools {
		c.failed[p] = laterOf(c.failed[p], t)
	}
}

func laterOf(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// snapshot copies the times (a new config keeps a copy, not the previous
// app, so configs do not chain in memory). The times are learnt at claims,
// pool by pool: for a pool c claimed for, c's times, and those of the
// fair_share limits (with their options) that c's claims without
// fair-share options kept the time of (a switch from fair_share and back
// keeps the options' time too); for a pool c served no claim of, the
// times it was handed (prev) of the limits c's policies still claim with
// for that pool,
// so that reloading an instance twice, with no claim for a pool in
// between, does not make that pool's unchanged limits new again (and win
// over a newer configuration elsewhere), while limits a config in between
// did not bring are new again when a later config brings them back. The
// failed configs' times are handed on too (the later of prev's and c's).
func (c *limitsClock) snapshot(prev limitsTimes) limitsTimes {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := limitsTimes{since: make(map[string]map[string]time.Time, len(prev.since)+len(c.since))}
	for pool, times := range prev.since {
		if _, claimed := c.since[pool]; claimed {
			continue
		}
		m := make(map[string]time.Time, len(times))
		for k, v := range times {
			base, _ := fairShareBase(k)
			if c.configuresFor(pool, k) || c.configuresFor(pool, base) {
				m[k] = v
			}
		}
		if len(m) > 0 {
			out.since[pool] = m
		}
	}
	for pool, times := range c.since {
		// c's times for a pool replace prev's: limits of the pool that c
		// did not claim with are no longer configured, but for the
		// fair-share options of limits c claimed with without them.
		m := make(map[string]time.Time, len(times))
		for k, v := range times {
			m[k] = v
		}
		for k, v := range prev.since[pool] {
			if base, fs := fairShareBase(k); fs {
				if _, ok := m[k]; !ok {
					if _, kept := times[base]; kept && !claimedFairShare(times, base) {
						m[k] = v
					}
				}
			}
		}
		out.since[pool] = m
	}
	if len(prev.failed)+len(c.failed) > 0 {
		out.failed = make(map[string]time.Time, len(prev.failed)+len(c.failed))
		for _, m := range []map[string]time.Time{prev.failed, c.failed} {
			for p, v := range m {
				out.failed[p] = laterOf(out.failed[p], v)
			}
		}
	}
	return out
}

// limitsKey names a claim's limits (those the pool stores). The policy is
// not one of them: a reload that switches the policy only keeps the
// limits' time. A fair_share claim also brings the fair-share options.
func limitsKey(req registry.ClaimRequest) string {
	k := fmt.Sprintf("mc=%d ml=%d stagger=%v", req.Limits.MaxConcurrent, req.Limits.MaxLifetime, req.Limits.StaggerDrains)
	if req.Policy == registry.FairShare {
		k += fmt.Sprintf(" window=%d median=%v default=%s", req.FairShare.Window, req.FairShare.Median, req.FairShare.Default)
	}
	return k
}

// limitsOverridden logs, at most once a minute per distinct pair, that a
// claim ran under the pool's stored limits (a newer configuration's), not
// the ones this config brought.
func (b *backend) limitsOverridden(req registry.ClaimRequest, inForce registry.PoolLimits) {
	if !b.firstReport("limits", req.Pool, fmt.Sprintf("%s\x00%+v", limitsKey(req), inForce)) {
		return
	}
	fields := []zap.Field{
		zap.String("pool", req.Pool),
		zap.Int("configured_max_concurrent", req.Limits.MaxConcurrent),
		zap.Int("pool_max_concurrent", inForce.MaxConcurrent),
		zap.Int("configured_max_lifetime", req.Limits.MaxLifetime),
		zap.Int("pool_max_lifetime", inForce.MaxLifetime),
		zap.Bool("configured_stagger_drains", req.Limits.StaggerDrains),
		zap.Bool("pool_stagger_drains", inForce.StaggerDrains),
		zap.Time("configured_at", req.ConfigTime),
	}
	if req.Policy == registry.FairShare {
		fields = append(fields,
			zap.Int("configured_window", req.FairShare.Window), zap.Int("pool_window", inForce.Window),
			zap.Bool("configured_median", req.FairShare.Median), zap.Bool("pool_median", inForce.Median),
			zap.Duration("configured_default", req.FairShare.Default), zap.Duration("pool_default", inForce.Default))
	}
	b.logger.Warn("this config's limits differ from the pool's, which a newer configuration set; claims use the pool's", fields...)
}

// indexBuilding logs, at most once a minute per pool and policy, that the
// pool's index for the policy is being built (the first claims with a
// policy on a pool of more than about 200 workers, or after an hour unused:
// docs/redis.md, "Kept indexes"), so its claims choose as lifetime_first.
func (b *backend) indexBuilding(req registry.ClaimRequest) {
	if !b.firstReport("index", req.Pool, string(req.Policy)) {
		return
	}
	b.logger.Info("building the pool's index for this policy; until it is complete claims choose as lifetime_first",
		zap.String("pool", req.Pool), zap.String("policy", string(req.Policy)))
}
