package caddygrid_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/cmd/fakebrowser/fake"
	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
	"github.com/browsergrid/caddy-browser-grid/registry"
)

// TestReloadBetweenRedisUnderTraffic: Caddy is reloaded back and forth
// between two Redis while clients keep coming: served sessions, clients
// that leave mid-claim or mid-queue, refused upgrades retried on another
// worker, 428 (unknown version), 429 (client_limit, full queue), 503
// (select_timeout). Once the traffic is over, nothing the reloads left
// behind lives on: no slot or lease stays taken in either Redis (lease_ttl
// is 60s: a leaked lease shows), and Caddy holds no connection to the
// Redis it no longer uses (a reference left on its backend would keep the
// client, the lease keeper and the wake-up subscriptions alive forever).
func TestReloadBetweenRedisUnderTraffic(t *testing.T) {
	p65 := registry.GroupPool("chromium", "1.65")
	grids := []*grid{newGrid(t), newGrid(t)}
	proxies := make([]*redisProxy, 2)
	for i, g := range grids {
		for _, id := range []string{"ok1", "ok2"} {
			g.worker(p65, id, fake.Behavior{AcceptDelay: 50 * time.Millisecond})
		}
		g.worker(p65, "bad", fake.Behavior{Refuse: http.StatusInternalServerError})
		proxies[i] = startRedisProxy(t, g.redis.Addr)
	}
	workers := []string{"ok1", "ok2", "bad"}
	config := func(i int) caddyOpts {
		return caddyOpts{redisURL: "redis://" + proxies[i].addr() + "/0",
			global: "lease_ttl 60s\n\t\treaper_interval 10m", site: `
	route /playwright/* {
		browser_grid chromium {
			max_concurrent 1
			select_timeout 1500ms
			queue_size 4
			client_limit 2
			client_key {http.request.header.X-Client}
		}
	}`}
	}
	c := startCaddy(t, config(0))
	u := c.url("/playwright/chromium")

	var mu sync.Mutex
	outcomes := map[string]int{}
	count := func(k string) {
		mu.Lock()
		outcomes[k]++
		mu.Unlock()
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				h := http.Header{}
				h.Set("X-Client", fmt.Sprint("c", rand.IntN(4)))
				ctx, cancel := context.WithCancel(context.Background())
				switch kind := rand.IntN(10); {
				case kind == 0: // 428
					h.Set("User-Agent", "Playwright/1.63.0 (x64; debian 12) node/20.20")
				case kind <= 2: // leaves mid-claim or mid-queue
					cancel()
					ctx, cancel = context.WithTimeout(context.Background(), time.Duration(5+rand.IntN(300))*time.Millisecond)
				case kind <= 6:
					h.Set("User-Agent", ua165)
				}
				s, err := dialHeader(ctx, u, h)
				left := ctx.Err() != nil
				cancel()
				switch {
				case err == nil:
					count("served")
					time.Sleep(time.Duration(rand.IntN(150)) * time.Millisecond)
					s.close()
				case refusal(err) != nil:
					count(fmt.Sprint(refusal(err).StatusCode))
				case left:
					count("left")
				default:
					count("cut") // a reload may cut a handshake (docs/configuration.md)
				}
			}
		}()
	}
	const reloads = 15
	for i := 1; i <= reloads; i++ {
		time.Sleep(time.Duration(100+rand.IntN(300)) * time.Millisecond)
		c.reload(config(i % 2))
	}
	time.Sleep(500 * time.Millisecond)
	close(stop)
	wg.Wait()
	t.Logf("%d reloads; outcomes %v; dial retries %v", reloads, outcomes,
		c.metric(`caddy_grid_dial_retries_total{pool="`+p65+`"}`))
	if outcomes["served"] == 0 {
		t.Fatal("no session served")
	}

	start := time.Now()
	for i, g := range grids {
		testenv.Eventually(t, 15*time.Second, fmt.Sprintf("every slot and lease of Redis %d free (lease_ttl is 60s)", i), func() bool {
			for _, id := range workers {
				if g.info(p65, id).Active != 0 {
					return false
				}
			}
			info, err := g.reg.Inspect(t.Context(), p65)
			return err == nil && info.Leases == 0
		})
	}
	t.Logf("slots free %s after the traffic", time.Since(start).Round(time.Millisecond))
	old := proxies[(reloads+1)%2]
	if old.total.Load() == 0 {
		t.Fatal("Caddy never connected to the first Redis")
	}
	testenv.Eventually(t, 15*time.Second, "Caddy's connections to the Redis it no longer uses closed", func() bool {
		return old.live() == 0
	})
	t.Logf("old Redis let go %s after the traffic", time.Since(start).Round(time.Millisecond))
	if out := c.proc.Output(); strings.Contains(out, "panic") || strings.Contains(out, "DATA RACE") {
		t.Errorf("caddy panicked or raced (a -race build):\n%s", out)
	}
}
