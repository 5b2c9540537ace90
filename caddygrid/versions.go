package caddygrid

import (
	"context"
	"net/http"
	"regexp"
	"strings"
	"time"

	"github.com/browsergrid/caddy-browser-grid/registry"
)

// Playwright version routing. Playwright's browser server accepts only
// clients of its own major.minor (it answers 428 to any other), so workers
// register in their version's group of the pool and a Playwright client is
// claimed a worker of its group only. A version no worker serves is
// refused at once with 428 naming the versions the pool has. A client that
// sends no version (CDP, a plain WebSocket), and every client with
// version_routing off, tries the pool's groups in turn.

// playwrightUA finds the version a playwright-core client sends in its
// User-Agent, e.g. "Playwright/1.65.1 (x64; debian 12) node/20.20".
var playwrightUA = regexp.MustCompile(`^Playwright/(\d{1,4})\.(\d{1,4})(?:[.\s-]|$)`)

// clientVersion is the major.minor of the Playwright client that sent r,
// "" when it is not one.
func clientVersion(r *http.Request) string {
	m := playwrightUA.FindStringSubmatch(r.Header.Get("User-Agent"))
	if m == nil {
		return ""
	}
	return trimZeros(m[1]) + "." + trimZeros(m[2])
}

// trimZeros drops leading zeros but keeps one digit ("05" → "5").
func trimZeros(s string) string {
	if t := strings.TrimLeft(s, "0"); t != "" {
		return t
	}
	return "0"
}

// Version labels of caddy_grid_version_sessions_total that are no version.
const (
	versionNone         = "none"
	versionUnregistered = "unregistered"
)

// versionsMaxAge is how long this instance routes with a pool's groups
// read from Redis before it reads them again.
const versionsMaxAge = time.Second

type cachedVersions struct {
	at time.Time
	v  registry.PoolVersions
}

// poolVersions returns pool's version groups, read at most once per
// versionsMaxAge.
func (b *backend) poolVersions(ctx context.Context, pool string) (registry.PoolVersions, error) {
	b.mu.Lock()
	c, ok := b.versions[pool]
	b.mu.Unlock()
	if ok && time.Since(c.at) < versionsMaxAge {
		return c.v, nil
	}
	cctx, cancel := context.WithTimeout(ctx, claimCallTimeout)
	defer cancel()
	v, err := b.reg.Versions(cctx, pool)
	if err != nil {
		return registry.PoolVersions{}, err
	}
	b.mu.Lock()
	if len(b.versions) > 1000 {
		clear(b.versions)
	}
	b.versions[pool] = cachedVersions{at: time.Now(), v: v}
	b.mu.Unlock()
	return v, nil
}
