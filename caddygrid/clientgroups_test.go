package caddygrid_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/cmd/fakebrowser/fake"
	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
	"github.com/browsergrid/caddy-browser-grid/registry"
)

// TestClientLimitFreedAcrossGroupsAfterCaddyCrash: a client's sessions
// count in every version group of the pool (lease_client is pool-wide),
// but a claim frees expired leases of its own group only. A Caddy killed
// holding a client's two 1.64 sessions must not lock that client out of
// 1.65 once the leases expired, although nothing happens in the 1.64
// group any more (its workers retired during an upgrade; here they never
// heartbeat) and the reaper is far away: before the fix the 1.65 client
// got 429 for as long as the reaper interval (25 s of tries with a 3 s
// lease_ttl, still counted 2).
func TestClientLimitFreedAcrossGroupsAfterCaddyCrash(t *testing.T) {
	g := newGrid(t)
	p64, p65 := registry.GroupPool("chromium", "1.64"), registry.GroupPool("chromium", "1.65")
	for i := range 2 {
		g.worker(p64, fmt.Sprintf("a%d", i), fake.Behavior{})
		g.worker(p65, fmt.Sprintf("b%d", i), fake.Behavior{})
	}
	opts := caddyOpts{redisURL: g.redis.URL(), global: "lease_ttl 3s\n\t\treaper_interval 10m", site: clientSite}
	a, b := startCaddy(t, opts), startCaddy(t, opts)
	dialUA := func(c *caddy, ua string) (*session, error) {
		h := http.Header{}
		h.Set("X-Client", "client-A")
		h.Set("User-Agent", ua)
		return dialHeader(context.Background(), c.url("/playwright/chromium"), h)
	}
	for range 2 {
		if _, err := dialUA(a, ua164); err != nil {
			t.Fatalf("client A's 1.64 session through a: %v", err)
		}
	}
	if err := a.proc.Cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	tried, limited := 0, 0
	var s *session
	testenv.Eventually(t, 15*time.Second, "client A served at 1.65 through b once its dead 1.64 leases expired", func() bool {
		tried++
		var err error
		s, err = dialUA(b, ua165)
		if he := refusal(err); he != nil && he.StatusCode == http.StatusTooManyRequests {
			limited++
		}
		return err == nil
	})
	s.close()
	t.Logf("kill -> served at 1.65 after %s; tries %d, 429s %d", time.Since(killed).Round(100*time.Millisecond), tried, limited)
	testenv.Eventually(t, 10*time.Second, "client A's count back to 0", func() bool {
		return g.clientSessions(t, "client-A") == 0
	})
}
