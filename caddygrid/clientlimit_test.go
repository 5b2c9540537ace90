package caddygrid_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
)

// With client_limit 1 keyed on a header, a client's second session at
// once gets 429 with Retry-After and a sentence naming its limit, while
// another client is served; the 429 is counted under the pool's own
// label; once the first session ends, the client is served again.
func TestAClientAtItsClientLimitGets429AndOthersAreServed(t *testing.T) {
	t.Parallel()
	g := newGrid(t)
	g.agent("chromium", nil)
	c := startCaddy(t, caddyOpts{redisURL: g.redis.URL(),
		site: site("max_concurrent 4\n\t\t\tclient_limit 1\n\t\t\tclient_key {http.request.header.X-Client}")})
	u := c.url("/playwright/chromium")
	alice := http.Header{"X-Client": {"alice"}}

	first, err := dialHeader(context.Background(), u, alice)
	if err != nil {
		t.Fatalf("alice's first session: %v", err)
	}
	_, err = dialHeader(context.Background(), u, alice)
	r := refusal(err)
	if r == nil || r.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("alice's second session: %v, want 429", err)
	}
	if r.Header.Get("Retry-After") == "" || !strings.Contains(string(r.Body), "client_limit") {
		t.Errorf("429 without Retry-After or a sentence naming the limit: %v %q", r.Header, r.Body)
	}
	bob, err := dialHeader(context.Background(), u, http.Header{"X-Client": {"bob"}})
	if err != nil {
		t.Fatalf("bob, another client: %v", err)
	}
	defer bob.close()

	var limited []string
	for labels, v := range c.metricSamples("caddy_grid_rejections_total") {
		if strings.Contains(labels, `code="429"`) {
			limited = append(limited, labels)
			if v != 1 {
				t.Errorf("%s = %v, want 1", labels, v)
			}
		}
	}
	if len(limited) != 1 || !strings.Contains(limited[0], `pool="chromium"`) {
		t.Errorf("429s counted under %v, want one series with pool=\"chromium\"", limited)
	}
	for _, s := range g.sessions(t, "chromium") {
		if strings.Contains(s.Client, "alice") || strings.Contains(s.Client, "bob") {
			t.Errorf("session %s names its client %q in Redis, want only its key's hash", s.ID, s.Client)
		}
	}

	firstID := first.resp.Header.Get("Grid-Session")
	first.close()
	testenv.Eventually(t, 5*time.Second, "alice's first session ends in Redis", func() bool {
		_, ok, _ := g.reg.GetSession(context.Background(), "chromium", firstID)
		return !ok
	})
	again, err := dialHeader(context.Background(), u, alice)
	if err != nil {
		t.Fatalf("alice after her session ended: %v", err)
	}
	again.close()
}
