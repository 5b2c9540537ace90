package caddygrid

import (
	"fmt"
	"slices"
	"sync"
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
	mu    sync.Mutex
	since map[string]time.Time
	// own holds the pools this config claimed for with limits first
	// configured at its provisioning (not inherited from an older config).
	own map[string]bool
	// floors is, per pool, the earliest time its claims carry: set when a
	// newer config that failed claimed for the pool with limits of its
	// own (see outrank).
	floors map[string]time.Time
}

// limitsTimes is what a config hands on to the next (snapshot).
type limitsTimes struct {
	since  map[string]time.Time // per set of limits (limitsKey)
	floors map[string]time.Time // per pool
}

// configTime returns when the limits (key) a claim for pool carries were
// configured: their time in the previous running config (prev) when it
// used them, else at (this config's provisioning); never before the
// pool's floor.
func (c *limitsClock) configTime(key, pool string, prev limitsTimes, at time.Time) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	t, ok := c.since[key]
	if !ok {
		t = at
		if p, ok := prev.since[key]; ok {
			t = p
		}
		if c.since == nil {
			c.since = map[string]time.Time{}
		}
		c.since[key] = t
	}
	if t.Equal(at) {
		if c.own == nil {
			c.own = map[string]bool{}
		}
		c.own[pool] = true
	}
	return laterOf(t, laterOf(c.floors[pool], prev.floors[pool]))
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

// outrank makes the claims for pools carry a time just after t: the
// running config's limits of these pools then win again over what a
// config provisioned at t, whose reload failed, stored for them while it
// served (its claims carried t, newer than the running config's times).
// Other pools keep their times: raising them would make the running
// config's limits win over a newer configuration from another instance
// that the failed config never overrode.
func (c *limitsClock) outrank(pools []string, t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.floors == nil {
		c.floors = map[string]time.Time{}
	}
	for _, p := range pools {
		c.floors[p] = laterOf(c.floors[p], t.Add(time.Millisecond))
	}
}

func laterOf(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// snapshot copies the times (a new config keeps a copy, not the previous
// app, so configs do not chain in memory). The times are learnt at claims:
// a config that served none hands on the times it was handed (prev), so
// that reloading an idle instance twice does not make its unchanged limits
// new again (and win over a newer configuration elsewhere). Floors are
// handed on too (the later of prev's and c's).
func (c *limitsClock) snapshot(prev limitsTimes) limitsTimes {
	c.mu.Lock()
	defer c.mu.Unlock()
	from := c.since
	if len(from) == 0 {
		from = prev.since
	}
	out := limitsTimes{since: make(map[string]time.Time, len(from))}
	for k, v := range from {
		out.since[k] = v
	}
	if len(prev.floors)+len(c.floors) > 0 {
		out.floors = make(map[string]time.Time, len(prev.floors)+len(c.floors))
		for _, m := range []map[string]time.Time{prev.floors, c.floors} {
			for p, v := range m {
				out.floors[p] = laterOf(out.floors[p], v)
			}
		}
	}
	return out
}

// limitsKey names a claim's limits (those the pool stores).
func limitsKey(req registry.ClaimRequest) string {
	k := fmt.Sprintf("%s mc=%d ml=%d stagger=%v", req.Policy, req.Limits.MaxConcurrent, req.Limits.MaxLifetime, req.Limits.StaggerDrains)
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
