package caddygrid

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/browsergrid/caddy-browser-grid/registry"
)

// Playwright version routing. Playwright's browser server accepts only
// clients of its own major.minor (it answers 428 to any other), so workers
// register in their version's group of the pool (registry.GroupPool) and a
// Playwright client is claimed a worker of its group only: one atomic
// claim among that group's workers. A version no worker of the pool
// serves is refused at once with 428 naming the versions the pool has
// (nothing is claimed, no worker is charged, nobody queues); a version
// whose workers are all busy queues as usual. A client that sends no
// Playwright version (CDP, a plain WebSocket), and every client when
// version_routing is off, is served by any worker of the pool: its groups
// are tried in turn (registry.PoolVersions.Groups: the pool's workers
// without a version first, then the newest version), each one atomic
// claim, so such a claim costs at most one script per group (a pool has a
// handful) and usually one.

// playwrightUA finds the version a playwright-core client sends in its
// User-Agent, e.g. "Playwright/1.65.1 (x64; debian 12) node/20.20" (seen on
// the wire from playwright-core 1.63.0, 1.64.1 and 1.65.1's connect()).
var playwrightUA = regexp.MustCompile(`^Playwright/(\d{1,4})\.(\d{1,4})(?:[.\s-]|$)`)

// clientVersion is the major.minor of the Playwright client that sent r,
// "" when it is not one.
func clientVersion(r *http.Request) string {
	m := playwrightUA.FindStringSubmatch(r.Header.Get("User-Agent"))
	if m == nil {
		return ""
	}
	return majorMinor(m[1], m[2])
}

// majorMinor is the group's name of a version: "01", "065" → "1.65".
func majorMinor(major, minor string) string {
	return trimZeros(major) + "." + trimZeros(minor)
}

// trimZeros drops leading zeros but keeps one digit ("05" → "5", "0" → "0").
func trimZeros(s string) string {
	t := strings.TrimLeft(s, "0")
	if t == "" {
		return "0"
	}
	return t
}

// versionsMaxAge is how long a pool's list of versions read from Redis
// serves the routing of this instance before it is read again, in the
// background: requests go on with the copy meanwhile, so a slow or stalled
// Redis never delays them by this read.
const versionsMaxAge = time.Second

// versionsRecheck is how old the copy may be before a client of a version
// the copy lacks makes this instance read the versions at once (a first
// worker of that version may have registered since). However many such
// clients come, at most one read per versionsRecheck (and one at a time).
const versionsRecheck = 250 * time.Millisecond

// versionRoute is one request's routing: in, whether version_routing is on
// and the client's version; out, the refusal's message.
type versionRoute struct {
	on      bool
	client  string
	refusal string
}

// unversioned labels sessions of workers without a version, unregistered
// the requests refused for a version no worker serves.
const (
	versionNone         = "none"
	versionUnregistered = "unregistered"
)

// versionSessions counts sessions by the version of the worker that served
// them, and the requests refused for their version. Labels are bounded by
// the versions registered: a client's version that no worker serves is
// counted as "unregistered", never by its own value.
var versionSessions = prometheus.NewCounterVec(prometheus.CounterOpts{
	Namespace: "caddy", Subsystem: "grid", Name: "version_sessions_total",
	Help: "Sessions claimed by the Playwright version of the serving worker (none: a worker without one), and requests refused with 428 for a version no worker of the pool serves (unregistered).",
}, []string{"pool", "version"})

type cachedVersions struct {
	at time.Time
	v  registry.PoolVersions
	// refreshing: a background read is under way.
	refreshing bool
}

// poolVersions returns pool's versions. A copy younger than maxAge is used
// as it is; an older one, when maxAge is versionsMaxAge or more, is used
// while a background read refreshes it; otherwise (no copy, or a recheck)
// the versions are read now, one read per pool at a time.
func (b *backend) poolVersions(ctx context.Context, pool string, maxAge time.Duration) (registry.PoolVersions, error) {
	b.mu.Lock()
	c, ok := b.versions[pool]
	if ok && time.Since(c.at) < maxAge {
		b.mu.Unlock()
		return c.v, nil
	}
	if ok && maxAge >= versionsMaxAge {
		if !c.refreshing {
			c.refreshing = true
			b.versions[pool] = c
			go func() { _, _ = b.readVersions(context.Background(), pool) }()
		}
		b.mu.Unlock()
		return c.v, nil
	}
	b.mu.Unlock()
	return b.readVersions(ctx, pool)
}

// readVersions reads pool's versions from Redis (one read per pool at a
// time: concurrent callers share it) and keeps the copy.
func (b *backend) readVersions(ctx context.Context, pool string) (registry.PoolVersions, error) {
	v, err, _ := b.versionReads.Do(pool, func() (any, error) {
		// A read started by one request serves others: it does not end
		// with the request that started it.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), claimCallTimeout)
		defer cancel()
		v, err := b.reg.Versions(cctx, pool)
		b.mu.Lock()
		defer b.mu.Unlock()
		if b.versions == nil {
			b.versions = map[string]cachedVersions{}
		}
		if err != nil {
			if c, ok := b.versions[pool]; ok {
				c.refreshing = false
				b.versions[pool] = c
			}
			return registry.PoolVersions{}, err
		}
		b.versions[pool] = cachedVersions{at: time.Now(), v: v}
		if (len(v.Omitted) > 0 || v.Unread > 0) && time.Since(b.omittedWarned[pool]) >= time.Minute {
			if b.omittedWarned == nil {
				b.omittedWarned = map[string]time.Time{}
			}
			b.omittedWarned[pool] = time.Now()
			b.logger.Warn("the pool has more Playwright versions than the grid routes to: those past the limit are left out (no claim goes to them, the admin API does not list their workers), and entries past the read window are not read; a Redis writer may have made them up",
				zap.String("pool", pool), zap.Int("max_version_groups", registry.MaxVersionGroups),
				zap.Strings("routed", v.Versions), zap.Int("omitted", len(v.Omitted)), zap.Int("unread", v.Unread),
				zap.Strings("omitted_newest", v.Omitted[:min(len(v.Omitted), 8)]))
		}
		return v, nil
	})
	if err != nil {
		metrics.redisErrors.WithLabelValues("versions").Inc()
		return registry.PoolVersions{}, err
	}
	return v.(registry.PoolVersions), nil
}

// limitGroups names the groups of pool that store limits of their own:
// the pool itself when it has workers without a version, and the group
// of each version it serves (registry.PoolVersions.Versions: with
// workers, or one registered within the last minute).
func (b *backend) limitGroups(ctx context.Context, pool string) ([]string, error) {
	v, err := b.reg.Versions(ctx, pool)
	if err != nil {
		return nil, err
	}
	var out []string
	if v.Workers[""] > 0 {
		out = append(out, pool)
	}
	for _, ver := range v.Versions {
		out = append(out, registry.GroupPool(pool, ver))
	}
	return out, nil
}

// acquireRouted is acquire with version routing: a Playwright client's
// claim goes to its version's group, any other to any group of the pool.
func (b *backend) acquireRouted(ctx context.Context, req registry.ClaimRequest, route *versionRoute, samples, queueSize int, deadline time.Time) (*registry.Claim, outcome, error) {
	pool := req.Pool
	if route != nil && route.on && route.client != "" {
		vs, err := b.poolVersions(ctx, pool, versionsMaxAge)
		if err == nil && !vs.Has(route.client) {
			vs, err = b.poolVersions(ctx, pool, versionsRecheck)
		}
		if err != nil {
			return nil, b.redisFailure(ctx, pool, err), err
		}
		switch {
		case vs.Has(route.client):
			req.Pool = registry.GroupPool(pool, route.client)
			c, o, err := b.acquire(ctx, req, samples, queueSize, deadline)
			if c != nil {
				versionSessions.WithLabelValues(pool, route.client).Inc()
			}
			return c, o, err
		case len(vs.Versions) > 0:
			versionSessions.WithLabelValues(pool, versionUnregistered).Inc()
			route.refusal = fmt.Sprintf("this grid has no %s browser for Playwright %s: its %s workers serve Playwright %s; connect with a playwright-core client of one of these versions",
				pool, route.client, pool, strings.Join(vs.Versions, ", "))
			return nil, outcomeUnknownVersion, fmt.Errorf("%w: %s (pool %s serves %v)", errUnknownVersion, route.client, pool, vs.Versions)
		}
		// The pool's workers register no version (exec, CDP): nothing
		// to route by, any worker serves.
	}
	c, o, err := b.acquireWith(ctx, req, func(ctx context.Context) (*registry.Claim, error) {
		return b.claimAny(ctx, req, samples)
	}, queueSize, deadline)
	if c != nil {
		_, v := registry.SplitGroup(c.Pool)
		if v == "" {
			v = versionNone
		}
		versionSessions.WithLabelValues(pool, v).Inc()
	}
	return c, o, err
}

// sweepInterval is how often a client-limit refusal may sweep a pool's
// version groups for expired leases.
const sweepInterval = time.Second

// sweepGroups frees the expired leases of every version group of group's
// pool but group itself, at most once per sweepInterval per pool, and
// reports whether it freed any. A client's live sessions are counted
// across the pool's groups, but a claim frees expired leases of its own
// group only: sessions of a Caddy that crashed would otherwise keep
// counting against their client in every other group until a claim or
// heartbeat of their own group, or the reaper, frees them, which never
// comes soon for a version whose workers are gone.
func (b *backend) sweepGroups(ctx context.Context, group string) bool {
	pool, _ := registry.SplitGroup(group)
	now := time.Now()
	b.mu.Lock()
	if b.swept == nil {
		b.swept = map[string]time.Time{}
	}
	if last, ok := b.swept[pool]; ok && now.Sub(last) < sweepInterval {
		b.mu.Unlock()
		return false
	}
	b.swept[pool] = now
	b.mu.Unlock()
	vs, err := b.poolVersions(ctx, pool, versionsMaxAge)
	if err != nil {
		return false
	}
	freed := 0
	for v := range vs.Workers {
		g := registry.GroupPool(pool, v)
		if g == group {
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, redisCallTimeout)
		n, err := b.reg.ExpireLeases(cctx, g, sweepMaxLeases)
		cancel()
		if err != nil {
			metrics.redisErrors.WithLabelValues("expire_leases").Inc()
			continue
		}
		freed += n
	}
	return freed > 0
}

// sweepMaxLeases bounds the expired leases one sweep frees per group.
const sweepMaxLeases = 100

// errUnknownVersion: the client's Playwright version is served by no
// worker of the pool.
var errUnknownVersion = errors.New("no worker serves this Playwright version")

// claimAny claims any worker of the pool: each group with workers in
// turn, the first that grants.
func (b *backend) claimAny(ctx context.Context, req registry.ClaimRequest, samples int) (*registry.Claim, error) {
	vs, err := b.poolVersions(ctx, req.Pool, versionsMaxAge)
	if err != nil {
		return nil, err
	}
	groups := vs.Groups(req.Pool)
	if len(groups) == 0 {
		return b.claim(ctx, req, samples)
	}
	err = registry.ErrNoWorker
	// A claim that avoids workers learns how many the pool has
	// (NoWorkerError.Registered): the avoided ones may be in any group,
	// so it is the sum over the groups, not the last group's count.
	registered := 0
	var last *registry.NoWorkerError
	for _, g := range groups {
		gr := req
		gr.Pool = g
		var c *registry.Claim
		c, err = b.claim(ctx, gr, samples)
		if err == nil || !errors.Is(err, registry.ErrNoWorker) {
			return c, err
		}
		if errors.As(err, &last) {
			registered += last.Registered
		}
	}
	if last != nil && len(req.Avoid) > 0 {
		nw := *last
		nw.Registered = registered
		return nil, &nw
	}
	return nil, err
}

// refuse records the 428 answer's body.
func (s *session) refuse(msg string) {
	s.mu.Lock()
	s.refusal = msg
	s.mu.Unlock()
}

func (s *session) refusalMessage() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.refusal
}

// inspectPool reads a pool and every version group of it as one pool
// (the admin API's view; registry.InspectGroups).
func inspectPool(ctx context.Context, b *backend, pool string) (registry.PoolInfo, []string, []string, error) {
	info, vs, groups, err := b.reg.InspectGroups(ctx, pool)
	return info, vs.Versions, groups, err
}

// basePools lists the pools of a pool list that holds version groups too.
// Names the registry would refuse (written into the set by hand or by a
// hostile Redis writer) are left out: one of them must not fail the views
// of every other pool. Linear in the names, sorted.
func basePools(names []string) []string {
	seen := make(map[string]bool, len(names))
	out := make([]string, 0, len(names))
	for _, n := range names {
		if registry.CheckPool(n) != nil {
			continue
		}
		p, _ := registry.SplitGroup(n)
		if !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	slices.Sort(out)
	return out
}
