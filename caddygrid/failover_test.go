package caddygrid_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/cmd/fakebrowser/fake"
	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
	"github.com/browsergrid/caddy-browser-grid/registry"
)

// Losing the Redis master costs clients no more than the failover itself:
// with Caddy on a Redis Cluster (the master owning the pool's slot killed)
// or on a Sentinel group (the master killed), sessions are served again
// within ~5 s of the replica's promotion while clients keep connecting.
func TestRedisFailoverThroughCaddy(t *testing.T) {
	cases := []struct {
		name string
		// start returns the Redis URL, a kill of the pool's master (once
		// its replica is in sync; it returns the time of the kill), and a
		// wait for the replica's promotion.
		start func(t *testing.T) (url string, kill func() time.Time, promoted func())
	}{
		{"cluster", func(t *testing.T) (string, func() time.Time, func()) {
			cl := testenv.StartClusterReplicas(t, 1)
			slot := cl.Slot("{grid:chromium}")
			m := cl.MasterOf(slot)
			return cl.URL(), func() time.Time { cl.WaitInSync(10 * time.Second); m.Kill(); return time.Now() },
				func() { cl.WaitPromoted(slot, m, 60*time.Second) }
		}},
		{"sentinel", func(t *testing.T) (string, func() time.Time, func()) {
			s := testenv.StartSentinel(t, 1)
			m := s.Master()
			return s.URL(), func() time.Time { s.WaitInSync(10 * time.Second); m.Kill(); return time.Now() },
				func() { s.WaitFailover(m, 60*time.Second) }
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			url, kill, promoted := tc.start(t)
			rdb, err := registry.NewClient(url)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { rdb.Close() })
			g := &grid{t: t, rdb: rdb, reg: registry.New(rdb, registry.Options{})}
			for _, id := range []string{"w1", "w2"} {
				g.worker("chromium", id, fake.Behavior{})
			}
			c := startCaddy(t, caddyOpts{redisURL: url, site: `
	route /playwright/* {
		browser_grid chromium {
			select_timeout 1s
		}
	}`})
			mustDial(t, c.url("/playwright/chromium")).close()

			// Clients keep connecting, one session at a time each.
			var mu sync.Mutex
			var served []time.Time // start of each served session
			stop := make(chan struct{})
			var wg sync.WaitGroup
			for range 3 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						select {
						case <-stop:
							return
						default:
						}
						start := time.Now()
						ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
						s, err := dial(ctx, c.url("/playwright/chromium"))
						cancel()
						if err != nil {
							time.Sleep(50 * time.Millisecond) // a client's pause before it tries again
							continue
						}
						s.close()
						mu.Lock()
						served = append(served, start)
						mu.Unlock()
					}
				}()
			}
			defer func() { close(stop); wg.Wait() }()
			firstAfter := func(at time.Time) time.Time {
				mu.Lock()
				defer mu.Unlock()
				for _, s := range served {
					if s.After(at) {
						return s
					}
				}
				return time.Time{}
			}
			testenv.Eventually(t, 10*time.Second, "sessions served", func() bool { return !firstAfter(time.Time{}).IsZero() })

			killed := kill()
			promoted()
			promotedAt := time.Now()
			var first time.Time
			testenv.Eventually(t, 90*time.Second, "a session served after the failover", func() bool {
				first = firstAfter(killed)
				return !first.IsZero()
			})
			t.Logf("kill -> promotion %s, kill -> first session served %s, promotion -> first session served %s",
				promotedAt.Sub(killed).Round(time.Millisecond), first.Sub(killed).Round(time.Millisecond), first.Sub(promotedAt).Round(time.Millisecond))
			if d := first.Sub(promotedAt); d > 5*time.Second {
				t.Errorf("sessions served again %s after the promotion, want within 5s", d)
			}
		})
	}
}
