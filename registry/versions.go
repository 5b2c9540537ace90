package registry

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Version groups (Playwright version routing). Playwright's browser server
// speaks only to clients of its own major.minor, so a pool's Playwright
// workers are kept in one group per version, "chromium@1.65", with keys of
// its own inside the pool's hash tag: a claim in a group is one atomic
// call, and lifetime-first staggering holds within each group. Workers
// without a version (CDP, exec) are in the pool itself.

// MaxVersionGroups bounds the versions a pool serves at once: a claim for a
// client without a version tries each group, and views and metrics read
// each, so a set a Redis writer filled must not make them unbounded.
const MaxVersionGroups = 16

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
		if pa[0] != pb[0] {
			return cmpInt(pa[0], pb[0])
		}
		return cmpInt(pa[1], pb[1])
	case oka:
		return 1
	case okb:
		return -1
	}
	return strings.Compare(a, b)
}

func cmpInt(a, b int) int {
	switch {
	case a < b:
		return -1
	case a > b:
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

// PoolVersions says which groups of a pool have workers.
type PoolVersions struct {
	// Versions are the Playwright versions with registered workers, oldest
	// first, at most MaxVersionGroups (the newest).
	Versions []string
	// Workers counts the registered workers per version ("" for the
	// pool's workers without one).
	Workers map[string]int
}

// Has reports whether the pool serves version v.
func (p PoolVersions) Has(v string) bool { return slices.Contains(p.Versions, v) }

// Groups are the groups to try, in order, for a client that names no
// version: the pool's own workers first, then the versions newest first.
func (p PoolVersions) Groups(pool string) []string {
	var out []string
	if p.Workers[""] > 0 {
		out = append(out, pool)
	}
	for i := len(p.Versions) - 1; i >= 0; i-- {
		out = append(out, GroupPool(pool, p.Versions[i]))
	}
	return out
}

// Versions reads a pool's version groups and how many workers each has.
func (r *Registry) Versions(ctx context.Context, pool string) (PoolVersions, error) {
	pool, _ = SplitGroup(pool)
	if err := CheckPool(pool); err != nil {
		return PoolVersions{}, err
	}
	names, err := r.rdb.SMembers(ctx, r.Key(pool, keyGroups)).Result()
	if err != nil {
		return PoolVersions{}, fmt.Errorf("reading the version groups of pool %q: %w", pool, err)
	}
	var vs []string
	for _, v := range names {
		if CheckVersion(v) == nil {
			vs = append(vs, v)
		}
	}
	slices.SortFunc(vs, CompareVersions)
	if len(vs) > MaxVersionGroups {
		vs = vs[len(vs)-MaxVersionGroups:]
	}
	pipe := r.rdb.Pipeline()
	base := pipe.HLen(ctx, r.Key(pool, keyWorkers))
	lens := make([]*redis.IntCmd, len(vs))
	for i, v := range vs {
		lens[i] = pipe.HLen(ctx, r.Key(GroupPool(pool, v), keyWorkers))
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return PoolVersions{}, fmt.Errorf("counting the workers of pool %q per version: %w", pool, err)
	}
	out := PoolVersions{Workers: map[string]int{"": int(base.Val())}}
	for i, v := range vs {
		if n := int(lens[i].Val()); n > 0 {
			out.Workers[v] = n
			out.Versions = append(out.Versions, v)
		}
	}
	return out, nil
}
