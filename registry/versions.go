package registry

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Version groups (Playwright version routing). Playwright's browser server
// speaks only to clients of its own major.minor, so a pool's Playwright
// workers are kept in one group per version: "chromium@1.65" names the
// group of pool "chromium" whose workers serve Playwright 1.65. A group is
// a pool in its own right for every script (its own workers hash, indexes,
// retiring set, leases), with its keys inside the pool's hash tag
// ("{grid:chromium}:v=1.65:workers"), so a claim in a group stays one
// atomic O(log N) script in the pool's Cluster slot, and lifetime-first
// staggering and StaggerDrains hold within each group. The group shares
// the pool's config hash (limits, newest-config-wins, dataset epoch) and
// wake-up channel. Workers without a version (CDP, exec) stay in the pool
// itself. Every API taking a pool name takes a group name too.

// groupSep separates a pool from its version group in a pool name.
const groupSep = "@"

// keyVersions is the pool's ZSET of versions ever registered in it, score =
// the last registration (ms).
const keyVersions = "versions"

// versionGrace is how long after a version's last registration it counts
// as served although none of its workers is registered (a lone worker
// restarting): its clients queue rather than get "unknown version".
const versionGrace = time.Minute

// GroupPool returns the name of pool's group of workers serving a
// Playwright version ("1.65"): "chromium@1.65". An empty version is the
// pool itself.
func GroupPool(pool, version string) string {
	if version == "" {
		return pool
	}
	return pool + groupSep + version
}

// SplitGroup splits a pool or group name into the pool and the version
// ("" for the pool itself).
func SplitGroup(name string) (pool, version string) {
	pool, version, _ = strings.Cut(name, groupSep)
	return pool, version
}

// CheckVersion validates a Playwright version as groups name it:
// "<major>.<minor>", each 1-4 digits.
func CheckVersion(v string) error {
	major, minor, ok := strings.Cut(v, ".")
	if !ok || !digits(major) || !digits(minor) {
		return fmt.Errorf("invalid Playwright version %q (want major.minor, e.g. 1.65)", v)
	}
	return nil
}

func digits(s string) bool {
	if s == "" || len(s) > 4 {
		return false
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// CompareVersions orders "major.minor" versions numerically (-1, 0, 1);
// versions that do not parse sort first, by bytes.
func CompareVersions(a, b string) int {
	pa, oka := parseVersion(a)
	pb, okb := parseVersion(b)
	switch {
	case oka && okb:
		if c := pa[0] - pb[0]; c != 0 {
			return sign(c)
		}
		return sign(pa[1] - pb[1])
	case oka:
		return 1
	case okb:
		return -1
	}
	return strings.Compare(a, b)
}

func sign(n int) int {
	switch {
	case n < 0:
		return -1
	case n > 0:
		return 1
	}
	return 0
}

func parseVersion(v string) ([2]int, bool) {
	if CheckVersion(v) != nil {
		return [2]int{}, false
	}
	major, minor, _ := strings.Cut(v, ".")
	a, _ := strconv.Atoi(major)
	b, _ := strconv.Atoi(minor)
	return [2]int{a, b}, true
}

// PoolVersions says which groups of a pool serve sessions.
type PoolVersions struct {
	// Versions are the Playwright versions the pool serves, oldest first:
	// a group with a registered worker, or one registered within the last
	// minute (a lone worker restarting). At most MaxVersionGroups, the
	// newest.
	Versions []string
	// Omitted are the versions past MaxVersionGroups the pool would serve
	// too, those with workers first, the newest first: no claim, read or
	// metric goes to them. A pool that serves so many at once is most
	// likely one a Redis writer filled with made-up versions.
	Omitted []string
	// Unread counts the entries of the pool's set of versions that were
	// not read (past the maxVersionsRead most recent, or registered
	// later than this clock allows): a set so large is not one agents
	// wrote.
	Unread int
	// Workers counts the registered workers per version ("" for the pool's
	// workers without a version).
	Workers map[string]int
}

// Has reports whether the pool serves version v.
func (p PoolVersions) Has(v string) bool { return slices.Contains(p.Versions, v) }

// Groups returns the names of the groups with registered workers to try
// for a session of any version: the pool's own workers first (CDP and
// exec workers, the natural home of a client without a version), then the
// versions newest first.
func (p PoolVersions) Groups(pool string) []string {
	var out []string
	if p.Workers[""] > 0 {
		out = append(out, pool)
	}
	for i := len(p.Versions) - 1; i >= 0; i-- {
		if p.Workers[p.Versions[i]] > 0 {
			out = append(out, GroupPool(pool, p.Versions[i]))
		}
	}
	return out
}

// noteVersion records that a worker of group registered: the version
// joins the pool's versions with the time.
func (r *Registry) noteVersion(ctx context.Context, group string) error {
	pool, version := SplitGroup(group)
	if version == "" {
		return nil
	}
	return r.rdb.ZAdd(ctx, r.Key(pool, keyVersions), redis.Z{Score: float64(time.Now().UnixMilli()), Member: version}).Err()
}

// MaxVersionGroups bounds the Playwright versions a pool serves at once
// (PoolVersions.Versions): a claim of a client without a version tries
// each group, the admin API and the page read each, and metrics are
// labelled by each, so a set of versions a Redis writer filled must not
// make these unbounded. Releases of Playwright come monthly; a grid runs
// a few at once.
const MaxVersionGroups = 16

// maxVersionsRead bounds the versions read per pool: the most recently
// registered ones.
const maxVersionsRead = 4 * MaxVersionGroups

// versionSkew is how far ahead of this clock a version's registration
// time may be (an agent's clock runs ahead): later times, which no agent
// writes, are not read.
const versionSkew = time.Minute

// versions reads a pool's versions: the most recently registered (at
// most maxVersionsRead, none registered later than versionSkew from now)
// in one ZREVRANGEBYSCORE, with the set's size, and one pipelined HLEN
// each. Of those the pool serves, the versions with workers come first,
// the newest first, up to MaxVersionGroups.
func (r *Registry) versions(ctx context.Context, pool string) (PoolVersions, error) {
	if err := checkPool(pool); err != nil {
		return PoolVersions{}, fmt.Errorf("reading the versions of a pool: %w", err)
	}
	pool, _ = SplitGroup(pool)
	now := time.Now()
	key := r.Key(pool, keyVersions)
	pipe := r.rdb.Pipeline()
	read := pipe.ZRevRangeByScoreWithScores(ctx, key, &redis.ZRangeBy{
		Max: strconv.FormatInt(now.Add(versionSkew).UnixMilli(), 10), Min: "-inf", Count: maxVersionsRead})
	size := pipe.ZCard(ctx, key)
	if _, err := pipe.Exec(ctx); err != nil {
		return PoolVersions{}, fmt.Errorf("reading the versions of pool %q: %w", pool, err)
	}
	zs := read.Val()
	pipe = r.rdb.Pipeline()
	base := pipe.HLen(ctx, r.Key(pool, keyWorkers))
	lens := make([]*redis.IntCmd, len(zs))
	for i, z := range zs {
		v, _ := z.Member.(string)
		lens[i] = pipe.HLen(ctx, r.Key(GroupPool(pool, v), keyWorkers))
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return PoolVersions{}, fmt.Errorf("counting the workers of pool %q per version: %w", pool, err)
	}
	out := PoolVersions{Workers: map[string]int{"": int(base.Val())}, Unread: max(0, int(size.Val())-len(zs))}
	recent := float64(now.Add(-versionGrace).UnixMilli())
	for i, z := range zs {
		v, _ := z.Member.(string)
		if CheckVersion(v) != nil {
			continue
		}
		n := int(lens[i].Val())
		out.Workers[v] = n
		if n > 0 || z.Score >= recent {
			out.Versions = append(out.Versions, v)
		}
	}
	// Workers first, then the newest: a version with workers is never
	// left out for one that has none.
	slices.SortFunc(out.Versions, func(a, b string) int {
		if wa, wb := out.Workers[a] > 0, out.Workers[b] > 0; wa != wb {
			if wa {
				return -1
			}
			return 1
		}
		return CompareVersions(b, a)
	})
	if len(out.Versions) > MaxVersionGroups {
		out.Omitted = slices.Clone(out.Versions[MaxVersionGroups:])
		out.Versions = out.Versions[:MaxVersionGroups]
		for _, v := range out.Omitted {
			delete(out.Workers, v)
		}
	}
	slices.SortFunc(out.Versions, CompareVersions)
	return out, nil
}

// Versions reads which Playwright versions pool serves (its version
// groups with registered workers) and how many workers each has.
func (r *Registry) Versions(ctx context.Context, pool string) (PoolVersions, error) {
	return r.versions(ctx, pool)
}

// InspectGroups reads a pool and every Playwright version group of it as
// one pool: the workers of all groups (each with its PlaywrightVersion),
// their leases, bad records and retiring workers, the pool's limits, and
// the pool's versions. It also returns the group names it read, the pool's
// own first. Inspect reads one group.
func (r *Registry) InspectGroups(ctx context.Context, pool string) (PoolInfo, PoolVersions, []string, error) {
	vs, err := r.versions(ctx, pool)
	if err != nil {
		return PoolInfo{}, PoolVersions{}, nil, err
	}
	groups := []string{pool}
	for v := range vs.Workers {
		if v != "" {
			groups = append(groups, GroupPool(pool, v))
		}
	}
	slices.Sort(groups[1:])
	info := PoolInfo{Pool: pool}
	for i, g := range groups {
		gi, err := r.Inspect(ctx, g)
		if err != nil {
			return PoolInfo{}, PoolVersions{}, nil, err
		}
		if i == 0 {
			info.Limits = gi.Limits // one config for the pool and its groups
			info.Now = gi.Now
		}
		info.Workers = append(info.Workers, gi.Workers...)
		info.BadRecords = append(info.BadRecords, gi.BadRecords...)
		info.Retiring = append(info.Retiring, gi.Retiring...)
		info.Indexes = append(info.Indexes, gi.Indexes...)
		info.Leases += gi.Leases
	}
	return info, vs, groups, nil
}
